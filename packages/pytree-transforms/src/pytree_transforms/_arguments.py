"""Per-argument specs (`default`, `fn`, `args`, `kwargs`) resolved against a signature."""

import inspect
from collections.abc import Callable, Mapping
from typing import Any


class ArgumentSpecs:
    """The specs a filtered transform applies to `fun`, its arguments and keyword arguments.

    A `kwargs` entry names a parameter, and applies to it whether the caller passes it by
    keyword or by position; an `args` entry applies to the positional argument at its index;
    everything else gets `default`, and `fun` itself gets `fn`.
    """

    __slots__ = ("args", "default", "fn", "kwargs", "positional_names", "trivial")

    def __init__(
        self,
        transform: str,
        fun: Callable[..., Any],
        default: Any,
        fn: Any,
        args: tuple[Any, ...] | list[Any],
        kwargs: Mapping[str, Any] | None,
    ):
        if not isinstance(args, tuple | list):
            raise TypeError(
                f"{transform}(args=...) must be a tuple with one spec per positional "
                f"argument, e.g. `args=(True,)`; got {args!r}."
            )
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(
                f"{transform}(kwargs=...) must be a dict from parameter names to specs, e.g. "
                f"`kwargs=dict(x=False)`; got {kwargs!r}."
            )
        self.default = default
        self.fn = fn
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.positional_names, accepts_any = _parameters(fun)
        unknown = [k for k in self.kwargs if k not in self.positional_names and not accepts_any(k)]
        if unknown:
            raise TypeError(
                f"{transform}(kwargs=...) names {unknown}, which "
                f"{getattr(fun, '__name__', 'the function')} has no parameter for. Its "
                f"parameters: {list(self.positional_names) or 'none by name'}."
            )
        self.trivial = not self.args and not self.kwargs and fn is default

    def tree(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, tuple, dict]:
        """The prefix spec of `(fun, args, kwargs)` for one call."""
        names = self.positional_names
        specs = []
        for i in range(len(args)):
            name = names[i] if i < len(names) else None
            if name is not None and name in self.kwargs:
                specs.append(self.kwargs[name])
            elif i < len(self.args):
                specs.append(self.args[i])
            else:
                specs.append(self.default)
        keyword_specs = {k: self.kwargs.get(k, self.default) for k in kwargs}
        return self.fn, tuple(specs), keyword_specs


def _parameters(fun: Callable[..., Any]) -> tuple[tuple[str, ...], Callable[[str], bool]]:
    """Names of the parameters that can be passed by position, and a test for other names."""
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):
        return (), lambda name: True
    positional = tuple(
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    keyword_only = {p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY}
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return positional, lambda name: var_keyword or name in keyword_only
