"""Per-argument specs (`default`, `fn`, `args`, `kwargs`) resolved against a signature, and
the names of a call's leaves as the user's code spells them."""

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax

from pytree_filter import path_text


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


def named_arguments(
    fun: Callable[..., Any], tree: tuple[Any, tuple, dict]
) -> list[tuple[str, Any]]:
    """The parts of a call's `(fun, args, kwargs)`, each with its name as the user's code
    spells it: `self` for `fun`, then each argument, keyword arguments sorted by name.

    Arguments are named after `fun`'s parameters, as `jax.jit` names them; arguments
    without a parameter name get `args[i]` / `kwargs['k']`.
    """
    try:
        parameters = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [
        p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = next((p.name for p in parameters if p.kind is p.VAR_POSITIONAL), "args")
    var_keyword = next((p.name for p in parameters if p.kind is p.VAR_KEYWORD), "kwargs")
    by_keyword = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    fun_value, args, kwargs = tree
    named: list[tuple[str, Any]] = [("self", fun_value)]
    for i, arg in enumerate(args):
        extra = i - len(positional)
        named.append((positional[i] if extra < 0 else f"{var_positional}[{extra}]", arg))
    for key in sorted(kwargs):
        named.append((key if key in by_keyword else f"{var_keyword}[{key!r}]", kwargs[key]))
    return named


def leaf_names(fun: Callable[..., Any], tree: tuple[Any, tuple, dict]) -> list[tuple[str, Any]]:
    """Each leaf of a call's `(fun, args, kwargs)` with its name as the user's code spells
    it, in flat order: `params['layers'][1]`, `x`, `self.weight` for a leaf of `fun` (see
    `named_arguments`).
    """
    return [
        (name + path_text(path, root=""), leaf)
        for name, value in named_arguments(fun, tree)
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]
    ]


class TracedLeafNames(inspect.Signature):
    """The signature `jax.jit` reads argument names from, for a function that takes its
    traced leaves as flat tuples after one static argument: it names each leaf by its path
    in the user's call, so JAX's errors say `params['w']`, not `dynamic[3]`.

    `names()` gives the names of the traced leaves in order; JAX falls back to its own
    names where `bind` fails.
    """

    __slots__ = ("_names", "_static")

    def __init__(self, names: Callable[[], list[str]], static: bool = True):
        parameters = [inspect.Parameter("dynamic", inspect.Parameter.VAR_POSITIONAL)]
        if static:
            parameters.insert(0, inspect.Parameter("static", inspect.Parameter.POSITIONAL_ONLY))
        super().__init__(parameters)
        self._names = names
        self._static = static

    def bind(self, *args: Any, **kwargs: Any) -> inspect.BoundArguments:
        """Bind the static argument (if any) and the traced leaves, each under its name."""
        leaves = [leaf for group in args[1 if self._static else 0 :] for leaf in group]
        try:
            names = self._names()
        except Exception as error:  # a structure that cannot be rebuilt with placeholders
            raise TypeError("no names for these leaves") from error
        if kwargs or (self._static and not args) or len(names) != len(leaves):
            raise TypeError("not a call with this signature's leaves")
        return inspect.BoundArguments(self, dict(zip(names, leaves, strict=True)))
