"""Array-backed Variables, as Flax NNX 0.12 spells them: `var_defaults` (the `hijax` and
`ref` defaults of new Variables) and `with_vars` (a graph whose Variables are made
array-backed, or plain again). The storage itself is in `_array_refs`."""

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from pytree_filter import Path, path_text, to_predicate

from . import _array_refs
from ._pure_call import map as map_graph
from ._traverse import find_duplicates
from ._variables import Variable

F = TypeVar("F", bound=Callable[..., Any])
A = TypeVar("A")

_FLAGS = ("hijax", "ref")


@dataclasses.dataclass(frozen=True)
class VarDefaults(Mapping[str, bool]):
    """The `hijax` and `ref` defaults new Variables get, as `var_defaults()` returns them.

    A read-only mapping (`defaults["ref"]`, `dict(defaults)`) with the same entries as
    attributes (`defaults.ref`).

    Attributes:
        hijax: whether new Variables are made with `hijax=True`.
        ref: whether new Variables are made with `ref=True`.
    """

    hijax: bool
    ref: bool

    def __getitem__(self, key: str) -> bool:
        if key not in _FLAGS:
            raise KeyError(f"{key!r}: var_defaults has {list(_FLAGS)}.")
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FLAGS)

    def __len__(self) -> int:
        return len(_FLAGS)


class VarDefaultsContext:
    """What `var_defaults(hijax=..., ref=...)` returns: the new defaults are in force
    from the call on; as a `with` block it puts the previous ones back at the end, and as
    a decorator it sets them for each call of the function only."""

    def __init__(self, previous: dict[str, bool | None], new: dict[str, bool | None]):
        self._previous = previous
        self._new = new

    def __enter__(self) -> None:
        # The call already replaced the top of each stack; keep the previous value below
        # it, so that leaving the block finds it again.
        for name, value in self._new.items():
            if value is not None and self._previous[name] is not None:
                stack = getattr(_array_refs.defaults, name)
                stack.insert(len(stack) - 1, self._previous[name])

    def __exit__(self, *exc_info: Any) -> None:
        for name, value in self._new.items():
            if value is not None:
                getattr(_array_refs.defaults, name).pop()

    def __call__(self, function: F) -> F:
        # As a decorator the defaults apply inside the function only: undo the call's change.
        for name, value in self._new.items():
            if value is not None:
                stack = getattr(_array_refs.defaults, name)
                stack.pop()
                if self._previous[name] is not None:
                    stack.append(self._previous[name])
        new = self._new

        @functools.wraps(function)
        def with_defaults(*args: Any, **kwargs: Any) -> Any:
            pushed = [name for name, value in new.items() if value is not None]
            for name in pushed:
                getattr(_array_refs.defaults, name).append(new[name])
            try:
                return function(*args, **kwargs)
            finally:
                for name in pushed:
                    getattr(_array_refs.defaults, name).pop()

        return with_defaults  # type: ignore[return-value]


def var_defaults(
    *, hijax: bool | None = None, ref: bool | None = None
) -> "VarDefaults | VarDefaultsContext":
    """Read or set the `hijax` / `ref` defaults of new Variables, as Flax NNX's.

    Called with no argument, it returns the defaults in force (a `VarDefaults`; both
    false unless set). Called with `hijax=` or `ref=`, it sets them for new Variables (a
    Variable's own `hijax=` / `ref=` keyword wins) and returns a context manager that puts
    the previous defaults back when its `with` block ends; used as a decorator, it sets
    them for each call of the function only. Defaults are per thread.

    A Variable made with `ref=True` or `hijax=True` keeps its arrays in JAX mutable array
    references: see `Variable`. This needs a JAX with `jax.new_ref` (0.7.2 or newer).

    Arguments:
        hijax: the new default of `hijax` (None: unchanged).
        ref: the new default of `ref` (None: unchanged).

    Returns:
        The defaults in force (no argument), or the context manager / decorator.

    Raises:
        TypeError: `hijax` or `ref` is not a bool or None.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, var_defaults
        >>> var_defaults()
        VarDefaults(hijax=False, ref=False)
        >>> with var_defaults(ref=True):
        ...     inside = Param(jnp.zeros(2))
        >>> inside.ref, Param(jnp.zeros(2)).ref
        (True, False)
        >>> @var_defaults(ref=True)
        ... def make():
        ...     return Param(jnp.zeros(2))
        >>> make().ref, var_defaults().ref
        (True, False)
    """
    stacks = _array_refs.defaults
    if hijax is None and ref is None:
        return VarDefaults(
            hijax=stacks.hijax[-1] if stacks.hijax else False,
            ref=stacks.ref[-1] if stacks.ref else False,
        )
    new = {"hijax": hijax, "ref": ref}
    for name, value in new.items():
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"var_defaults({name}=...) takes True, False or None, got {value!r}.")
    _array_refs.defaults_set.on = True
    previous: dict[str, bool | None] = {}
    for name, value in new.items():
        stack = getattr(stacks, name)
        previous[name] = stack[-1] if value is not None and stack else None
        if value is not None:
            if stack:
                stack[-1] = value
            else:
                stack.append(value)
    return VarDefaultsContext(previous, new)


def with_vars(
    node: A,
    /,
    *,
    hijax: bool | None = None,
    ref: bool | None = None,
    mutable: bool | None = None,
    only: Any = ...,
    allow_duplicates: bool = False,
) -> A:
    """A copy of `node` whose Variables are made array-backed (or plain again), as Flax
    NNX's `with_vars`.

    Each Variable matching `only` whose `hijax`, `ref` or `mutable` metadata differs
    from what is given is replaced by a new Variable of the same type with those entries
    set: with `ref=True` (or `hijax=True`) its value is kept in new JAX mutable array
    references, with both false it holds plain arrays again (read from the refs). Other
    Variables are kept, shared with `node`. The Modules are new; `node` is not changed.
    (`mutable` is kept as metadata only, as in Flax NNX 0.12.)

    A Variable reached by two paths would become two Variables with two refs, so that
    is refused unless `allow_duplicates=True` (then it is converted once and stays
    shared). Plain `jax.jit` refuses the same ref passed twice anyway.

    Arguments:
        node: a Module, a Variable, or a list, dict or tuple of them.
        hijax: the new `hijax` (None: unchanged).
        ref: the new `ref` (None: unchanged).
        mutable: the new `mutable` metadata (None: unchanged).
        only: a filter choosing the Variables to convert (all by default).
        allow_duplicates: convert shared Variables too.

    Returns:
        The new graph (a new Variable, for a Variable).

    Raises:
        ValueError: a Variable to convert is reached by more than one path.
        RuntimeError: the installed JAX has no mutable array references.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, with_vars
        >>> class Counter(Module):
        ...     def __init__(self):
        ...         self.count = Param(jnp.array(0))
        >>> counter = with_vars(Counter(), ref=True)
        >>> @jax.jit
        ... def step(counter):
        ...     counter.count[...] += 1
        >>> step(counter); step(counter)
        >>> counter.count.value.item()
        2
        >>> with_vars(counter, ref=False).count.ref
        False
    """
    wanted = {name: value for name, value in (("hijax", hijax), ("ref", ref)) if value is not None}
    if (hijax or ref) and wanted:
        _array_refs.require_refs(f"with_vars({'ref' if ref else 'hijax'}=True)")
    chosen = to_predicate(only)

    def differs(variable: Variable) -> bool:
        if any(getattr(variable, name) != value for name, value in wanted.items()):
            return True
        return mutable is not None and variable.get_metadata("mutable", True) != mutable

    def converted(variable: Variable) -> Variable:
        metadata = dict(variable.metadata)
        flags = {"hijax": variable.hijax, "ref": variable.ref, **wanted}
        metadata.update((name, True) for name, value in flags.items() if value)
        for name in (name for name, value in flags.items() if not value):
            metadata.pop(name, None)
        if mutable is not None:
            metadata["mutable"] = mutable
        return type(variable).from_metadata(variable.value, metadata)

    if isinstance(node, Variable):
        return converted(node) if chosen((), node) and differs(node) else node  # type: ignore[return-value]

    if not allow_duplicates:
        groups = {tuple(paths[0]): paths for paths in find_duplicates(node)}
        if groups:
            shared: list[list[Path]] = []

            def find_shared(path: Path, leaf: Any) -> Any:
                paths = groups.get(tuple(path))
                if paths and isinstance(leaf, Variable) and chosen(path, leaf) and differs(leaf):
                    shared.append(paths)
                return leaf

            map_graph(find_shared, node)
            if shared:
                listed = "\n".join(
                    "  " + ", ".join(path_text(p) for p in paths) for paths in shared
                )
                raise ValueError(
                    f"Found duplicate at paths (each line one Variable, reached by each "
                    f"path):\n{listed}\nwith_vars would make a separate copy (with its own "
                    "refs) for each path. Pass `allow_duplicates=True` to convert it once "
                    "and keep it shared, or narrow `only` to leave it out."
                )

    def convert(path: Path, leaf: Any) -> Any:
        if isinstance(leaf, Variable) and chosen(path, leaf) and differs(leaf):
            return converted(leaf)
        return leaf

    return map_graph(convert, node)


def vars_as(node: A, /, **kwargs: Any) -> A:
    """Flax NNX's older name for `with_vars` (deprecated there): the same, with a
    `DeprecationWarning`.

    Arguments:
        node: as for `with_vars`.
        **kwargs: as for `with_vars`.

    Returns:
        What `with_vars` returns.

    Examples:
        >>> import warnings
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, vars_as
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     vars_as([Param(jnp.zeros(2))], ref=True)[0].ref
        True
    """
    warnings.warn(
        "vars_as is Flax NNX's deprecated name for with_vars: call with_vars(node, ...).",
        DeprecationWarning,
        stacklevel=2,
    )
    return with_vars(node, **kwargs)
