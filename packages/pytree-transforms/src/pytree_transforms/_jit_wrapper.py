"""The general `filter_jit` wrapper: flatten, split traced from static leaves, call `jax.jit`."""

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
from ._jit_stages import Lowered
from ._method import BindsAsMethod
from ._outputs import pack_output, unpack_output


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
        "direct",
        "get_dynamic",
        "get_first",
        "get_rest",
        "get_static",
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
        # without computing a mask. Tracers are the exception (their abstract value
        # decides): with them, `types` is None, so no call matches it.
        if types is not None and any(issubclass(t, Tracer) for t in types):
            types = None
        self.types = types
        # Whether calls of this plan go to the direct `jax.jit` (default options only):
        # None until a default wrapper decides.
        self.direct: bool | None = None
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
        return pack_output(fun(*args, **kwargs), self._out, "filter_jit")

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
            out = self._jitted((plan, static), *dynamic)
        except (TypeError, ValueError):
            _diagnose_inputs(tree, leaves, plan, static)
            raise
        return unpack_output(out)

    def lower(self, *args: Any, **kwargs: Any) -> "Lowered":
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking the same arguments.
        """
        _, _, plan, static, dynamic = self._split(args, kwargs)
        return Lowered(self, self._jitted.lower((plan, static), *dynamic), plan, static)


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
