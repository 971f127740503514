"""`filter_jit`: `jax.jit` for functions of any pytrees, as fast as `jax.jit` itself."""

import functools
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.core import Tracer
from jax.tree_util import PyTreeDef

from pytree_filter import flatten_with_mask, is_array, is_array_like

from ._arguments import ArgumentSpecs
from ._errors import check_pytree_objects, describe_leaf
from ._method import BindsAsMethod
from ._outputs import split_output

_DONATE = ("none", "all", "all-except-first", "warn")


def _tuple_getter(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    if len(indices) >= 2:
        return operator.itemgetter(*indices)
    if len(indices) == 1:
        (i,) = indices
        return lambda seq: (seq[i],)
    return lambda seq: ()


class _Plan:
    """How to split one input structure: which leaves are traced, which static.

    Interned per (treedef, mask) in each wrapper, so the static part of a call's cache key
    is `(plan, static leaves)` and hashes and compares cheaply: the plan by identity.
    """

    __slots__ = (
        "get_dynamic",
        "get_first",
        "get_rest",
        "get_static",
        "has_tracers",
        "mask",
        "treedef",
        "types",
    )

    def __init__(
        self, treedef: PyTreeDef, mask: list[Any], types: list[type] | None, first_leaves: int
    ):
        self.treedef = treedef
        self.mask = mask
        # With the default filter, the mask follows from the leaf types (`is_array` is
        # answered per type), so a call whose leaf types equal `types` can reuse the plan
        # without computing a mask. Tracers are the exception: always recompute for them.
        self.types = types
        self.has_tracers = types is not None and any(issubclass(t, Tracer) for t in types)
        dynamic = [i for i, m in enumerate(mask) if m]
        self.get_dynamic = _tuple_getter(dynamic)
        self.get_first = _tuple_getter([i for i in dynamic if i < first_leaves])
        self.get_rest = _tuple_getter([i for i in dynamic if i >= first_leaves])
        self.get_static = _tuple_getter([i for i, m in enumerate(mask) if not m])

    def merge(self, dynamic: Any, static: tuple[Any, ...]) -> list[Any]:
        """Interleave traced and static leaves back into flat order."""
        dynamic, static = iter(dynamic), iter(static)
        return [next(dynamic) if m else next(static) for m in self.mask]


class JitWrapper(BindsAsMethod):
    """The callable that `filter_jit` returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        specs: ArgumentSpecs,
        out: Any,
        donate: str,
        jitkwargs: dict[str, Any],
    ):
        self._fun = fun
        self._specs = specs
        self._out = out
        self._donate = donate
        self._plans: dict[PyTreeDef, list[_Plan]] = {}
        self._last: _Plan | None = None
        donate_argnums = {"none": (), "all": (1,), "warn": (1,), "all-except-first": (2,)}
        self._jitted = jax.jit(
            self._traced, static_argnums=0, donate_argnums=donate_argnums[donate], **jitkwargs
        )
        functools.update_wrapper(self, fun, updated=())

    def _traced(self, key: tuple[_Plan, tuple[Any, ...]], *dynamic: tuple[Any, ...]) -> Any:
        plan, static = key
        leaves = plan.merge(itertools.chain(*dynamic), static)
        fun, args, kwargs = plan.treedef.unflatten(leaves)
        return split_output(fun(*args, **kwargs), self._out, "filter_jit")

    def _plan(
        self,
        treedef: PyTreeDef,
        mask: list[Any],
        args: tuple[Any, ...],
        types: list[type] | None = None,
    ) -> _Plan:
        plans = self._plans.setdefault(treedef, [])
        for plan in plans:
            if plan.mask == mask:
                return plan
        first = 0
        if self._donate == "all-except-first":
            # Leaves of `fun` and of the first argument come first in flat order.
            fun_def, args_def, _ = treedef.children()
            first = fun_def.num_leaves + (args_def.children()[0].num_leaves if args else 0)
        plan = _Plan(treedef, mask, types, first)
        plans.append(plan)
        return plan

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        spec = is_array if self._specs.trivial else self._specs.tree(args, kwargs)
        tree = (self._fun, args, kwargs)
        leaves, mask, treedef = flatten_with_mask(tree, spec)
        plan = self._plan(treedef, mask, args)
        static = plan.get_static(leaves)
        if static:
            check_pytree_objects(static, "filter_jit")
        if self._donate == "all-except-first":
            dynamic: tuple[Any, ...] = (plan.get_first(leaves), plan.get_rest(leaves))
        else:
            dynamic = (plan.get_dynamic(leaves),)
        return tree, leaves, plan, static, dynamic

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree, leaves, plan, static, dynamic = self._split(args, kwargs)
        try:
            dynamic_out, static_out = self._jitted((plan, static), *dynamic)
        except (TypeError, ValueError):
            _diagnose_inputs(tree, leaves, plan, static)
            raise
        return static_out.rebuild(dynamic_out)

    def _call_default(self, *args: Any, **kwargs: Any) -> Any:
        """The hot path: default filter (arrays traced), no donation."""
        tree = (self._fun, args, kwargs)
        leaves, treedef = jax.tree.flatten(tree)
        types = list(map(type, leaves))
        plan = self._last
        if plan is None or plan.types != types or plan.has_tracers or plan.treedef != treedef:
            plan = self._last = self._default_plan(args, leaves, treedef, types)
        static = plan.get_static(leaves)
        try:
            dynamic_out, static_out = self._jitted((plan, static), plan.get_dynamic(leaves))
        except (TypeError, ValueError):
            _diagnose_inputs(tree, leaves, plan, static)
            raise
        if static_out.single:
            return dynamic_out[0]
        return static_out.rebuild(dynamic_out)

    def _default_plan(
        self, args: tuple[Any, ...], leaves: list[Any], treedef: PyTreeDef, types: list[type]
    ) -> _Plan:
        plan = self._plan(treedef, [is_array(x) for x in leaves], args, types)
        check_pytree_objects(plan.get_static(leaves), "filter_jit")
        return plan

    def lower(self, *args: Any, **kwargs: Any) -> "Lowered":
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking the same arguments.
        """
        _, _, plan, static, dynamic = self._split(args, kwargs)
        return Lowered(self, self._jitted.lower((plan, static), *dynamic), plan, static)


class _DefaultJitWrapper(JitWrapper):
    """`filter_jit` with the default filter and no donation: calls go straight to the hot
    path, saving a Python call per call."""

    __call__ = JitWrapper._call_default


class Lowered:
    """A `filter_jit` function lowered for one set of argument structures."""

    def __init__(self, wrapper: JitWrapper, lowered: Any, plan: _Plan, static: tuple):
        self._wrapper = wrapper
        self._lowered = lowered
        self._plan = plan
        self._static = static

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The lowered program as text (as `jax.stages.Lowered.as_text`)."""
        return self._lowered.as_text(*args, **kwargs)

    def compile(self) -> "Compiled":
        """Compile ahead of time."""
        return Compiled(self._wrapper, self._lowered.compile(), self._plan, self._static)


class Compiled:
    """A compiled `filter_jit` function: call it with arguments of the lowered structure."""

    def __init__(self, wrapper: JitWrapper, compiled: Any, plan: _Plan, static: tuple):
        self._wrapper = wrapper
        self._compiled = compiled
        self._plan = plan
        self._static = static

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _, _, plan, static, dynamic = self._wrapper._split(args, kwargs)
        if plan is not self._plan or static != self._static:
            raise ValueError(
                "This compiled function was lowered for arguments of another structure or "
                "with other static (non-array) values. Lower it again for these arguments."
            )
        dynamic_out, static_out = self._compiled(*dynamic)
        return static_out.rebuild(dynamic_out)

    def as_text(self) -> str:
        """The compiled program as text."""
        return self._compiled.as_text()


def _diagnose_inputs(tree: Any, leaves: list[Any], plan: _Plan, static: tuple) -> None:
    """After JAX refused the inputs, say which leaf was at fault and how to fix it."""
    for index, (leaf, traced) in enumerate(zip(leaves, plan.mask, strict=True)):
        if traced and not is_array_like(leaf):
            raise TypeError(
                f"filter_jit: {describe_leaf(tree, index, ('fun', 'args', 'kwargs'))} is "
                f"marked to be traced, but {type(leaf).__name__} {leaf!r:.60} is not a JAX "
                "type. Only arrays and Python scalars can be traced: mark it static with a "
                "`False` in the `args=`/`kwargs=`/`default=` specs."
            ) from None
    for value in static:
        try:
            hash(value)
        except TypeError:
            index = plan.get_static(range(len(leaves)))[static.index(value)]
            raise TypeError(
                f"filter_jit: {describe_leaf(tree, index, ('fun', 'args', 'kwargs'))} is "
                f"static (not an array), so it must be hashable, but {type(value).__name__} "
                "is not. Make it hashable, turn it into an array, or mark it traced."
            ) from None


def filter_jit(
    fun: Callable[..., Any] | None = None,
    *,
    donate: str = "none",
    default: Any = is_array,
    fn: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    out: Any = is_array,
    **jitkwargs: Any,
) -> Any:
    """`jax.jit` for functions of any pytrees: arrays are traced, everything else is static.

    Every array leaf of the arguments (and of `fun` itself, which may be a Module, a bound
    method or any callable pytree) is traced; every other leaf is held static, so it must be
    hashable, and a change in it retraces. Non-array outputs (strings, functions, Modules'
    static parts) are returned as they are. Calls never block: they return as soon as the
    computation is dispatched, like `jax.jit`.

    Arguments:
        fun: the function to compile. Omit it to get a decorator with these options.
        donate: `"none"`, `"all"` (donate every traced input buffer), `"all-except-first"`
            (all but those of the first argument), or `"warn"` (as `"all"`).
        default: the filter deciding what is traced in every argument without an override:
            `True`/`False`, a leaf predicate, or a prefix pytree of those.
        fn: the filter for `fun` itself (defaults to `default`).
        args: per-positional-argument overrides: a tuple of filters, one per argument.
        kwargs: per-parameter overrides, by parameter name; they apply whether the argument
            is passed by keyword or by position.
        out: the filter of the output: selected leaves come back as arrays, the rest as they
            were returned (they must not be tracers).
        **jitkwargs: passed on to `jax.jit`.

    Returns:
        The compiled function. Its `.lower(*args, **kwargs)` lowers ahead of time.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jit
        >>> @filter_jit
        ... def scale(x, factor, name):
        ...     return x * factor, name.upper()
        >>> scale(jnp.ones(2), 3, "done")
        (Array([3., 3.], dtype=float32), 'DONE')
        >>> @filter_jit(args=(True,))
        ... def traced(x):
        ...     return x + 1
        >>> traced(1)
        Array(2, dtype=int32, weak_type=True)
    """
    options = dict(donate=donate, default=default, fn=fn, args=args, kwargs=kwargs, out=out)
    if fun is None:
        return lambda f: filter_jit(f, **options, **jitkwargs)
    if not callable(fun):
        raise TypeError(f"filter_jit expects a callable to compile, got {fun!r}.")
    if donate not in _DONATE:
        raise ValueError(f"filter_jit(donate=...) must be one of {_DONATE}, got {donate!r}.")
    for name in ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames"):
        if name in jitkwargs:
            raise TypeError(
                f"filter_jit does not take {name}: non-array arguments are static already; "
                "choose what is traced with `args=`/`kwargs=`/`default=`, and donation with "
                "`donate=`."
            )
    specs = ArgumentSpecs("filter_jit", fun, default, default if fn is None else fn, args, kwargs)
    if specs.trivial and donate == "none" and out is is_array:
        return _DefaultJitWrapper(fun, specs, out, donate, jitkwargs)
    return JitWrapper(fun, specs, out, donate, jitkwargs)
