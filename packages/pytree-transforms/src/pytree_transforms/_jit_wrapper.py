"""The general `filter_jit` wrapper: flatten, split traced from static leaves, call `jax.jit`."""

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import flatten_with_mask, is_array_like
from pytree_module import Module

from ._arguments import ArgumentSpecs, TracedLeafNames, leaf_names
from ._errors import check_pytree_objects, describe_leaf, present_as
from ._jit_plan import Plan
from ._jit_stages import Lowered
from ._method import BindsAsMethod
from ._outputs import pack_output, unpack_output
from ._sharing import Sharing, find_sharing, has_repeats, selected_once


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
        # A plain function (a leaf, not a pytree) is the same on every call: the flattened
        # call holds a placeholder for it, so it need not be hashable, and `traced` puts it
        # back. A callable pytree (a Module, a bound method) is flattened with the call.
        self._fun_in_call = _THE_FUNCTION if _is_leaf(fun) else fun
        self._specs = specs
        self._out = out
        self._donate = donate
        self._jitkwargs = jitkwargs
        self._plans: dict[PyTreeDef, list[Plan]] = {}
        self._last: Plan | None = None
        self._previous: Plan | None = None
        functools.update_wrapper(self, fun, updated=())

    def _plan(
        self,
        treedef: PyTreeDef,
        mask: list[Any],
        static_types: tuple[type, ...],
        args: tuple[Any, ...],
        types: list[type] | None = None,
    ) -> Plan:
        """The interned plan of this structure (made, with its `jax.jit`, on first use)."""
        plans = self._plans.setdefault(treedef, [])
        for plan in plans:
            if plan.mask == mask and plan.static_types == static_types:
                return plan
        kept = 0
        if self._donate == "all-except-first":
            # Leaves of `fun` and of the first argument come first in flat order.
            full = treedef.treedef if isinstance(treedef, Sharing) else treedef
            fun_def, args_def, _ = full.children()
            kept = fun_def.num_leaves + (args_def.children()[0].num_leaves if args else 0)
            if isinstance(treedef, Sharing):
                kept = sum(1 for i in treedef.unique if i < kept)
        plan = Plan(treedef, mask, types, static_types, kept)
        plan.fixed = self._donate == "none" and all(t is _TheFunction for t in static_types)
        plan.jitted = self._jit(plan)
        plans.append(plan)
        return plan

    def _jit(self, plan: Plan) -> Any:
        """The `jax.jit` of calls of `plan`'s structure.

        It takes the static argument (see `Plan.static_arg`) and then the traced leaves:
        one tuple, or with donation `(static_arg, aliases)`, the kept leaves and the donated
        ones (see `Plan.donation`).
        """
        out, donating = self._out, self._donate != "none"

        def traced(static_arg: Any, *dynamic: tuple[Any, ...]) -> Any:
            if donating:
                static_arg, aliases = static_arg
                leaves = plan.undo_donation(aliases, *dynamic)
            else:
                (leaves,) = dynamic
            fun, args, kwargs = plan.treedef.unflatten(plan.merge(leaves, plan.statics(static_arg)))
            if fun is _THE_FUNCTION:
                fun = self._fun
            return pack_output(fun(*args, **kwargs), out, "filter_jit")

        # JAX keeps the signature in a cache entry keyed weakly by `traced`: what it holds
        # must not lead back to `traced` (this wrapper, the plan, its `jax.jit`), or the
        # entry would keep the wrapper and its function alive for good.
        names = functools.partial(_leaf_names, self._fun, plan.treedef, tuple(plan.mask))
        if plan.fixed:
            statics = (_THE_FUNCTION,) * len(plan.static_types)

            def traced_fixed(*dynamic: tuple[Any, ...]) -> Any:
                return traced(statics, *dynamic)

            present_as(traced_fixed, self._fun, TracedLeafNames(names, static=False))
            return jax.jit(traced_fixed, **self._jitkwargs)
        present_as(traced, self._fun, TracedLeafNames(names))
        donate_argnums = (2,) if donating else ()
        return jax.jit(traced, static_argnums=0, donate_argnums=donate_argnums, **self._jitkwargs)

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        """Flatten one call and split its leaves: `(tree, leaves, plan, static)`.

        Where an object is reached by several paths of the call (a tied weight, a Module
        passed twice), `leaves` are the unique ones and the plan's structure a `Sharing`:
        the function sees one object at all its places, and it is traced once.
        """
        spec = self._specs.default if self._specs.trivial else self._specs.tree(args, kwargs)
        tree = (self._fun_in_call, args, kwargs)
        leaves, mask, treedef = flatten_with_mask(tree, spec)
        structure: PyTreeDef | Sharing = treedef
        traced = [x for x, m in zip(leaves, mask, strict=True) if m]
        if has_repeats(traced):  # the cheap test; the walk only where it may find something
            sharing = find_sharing(tree, treedef)
            if sharing is not None:
                mask = selected_once(sharing, tree, mask, "traced")
                leaves = sharing.dedupe(leaves)
                structure = sharing
        static = tuple(x for x, traced in zip(leaves, mask, strict=True) if not traced)
        plan = self._plan(structure, mask, tuple(map(type, static)), args)
        if static:
            check_pytree_objects(static, "filter_jit")
        return tree, leaves, plan, static

    def _arguments(self, plan: Plan, leaves: list[Any], static: tuple[Any, ...]) -> tuple:
        """The arguments of `plan.jitted` for one call's leaves."""
        dynamic = plan.get_dynamic(leaves)
        if plan.fixed:
            return (dynamic,)
        static_arg = plan.static_arg(static)
        if self._donate == "none":
            return static_arg, dynamic
        aliases, kept, donated = plan.donation(dynamic)
        return (static_arg, aliases), kept, donated

    def _split_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Plan, tuple]:
        """The plan of one call and the arguments of its `jax.jit`."""
        _, leaves, plan, static = self._split(args, kwargs)
        return plan, self._arguments(plan, leaves, static)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree, leaves, plan, static = self._split(args, kwargs)
        try:
            out = plan.jitted(*self._arguments(plan, leaves, static))
        except (TypeError, ValueError):
            _diagnose_inputs(tree, leaves, plan, static)
            raise
        return unpack_output(out)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking the same arguments.
        """
        plan, arguments = self._split_arguments(args, kwargs)
        static_arg = None if plan.fixed else arguments[0]
        return Lowered(plan.jitted.lower(*arguments), self._split_arguments, plan, static_arg)


class _TheFunction:
    """The placeholder of a plain function in a flattened call (see `JitWrapper`)."""

    def __repr__(self) -> str:
        return "<the function>"


_THE_FUNCTION = _TheFunction()


def _is_leaf(fun: Any) -> bool:
    # A `pytree=False` Module is a leaf too, but it stays in the call to be refused there
    # (with a pointer to pytree_graph).
    leaves = jax.tree.leaves(fun)
    return len(leaves) == 1 and leaves[0] is fun and not isinstance(fun, Module)


def _leaf_names(fun: Any, structure: Any, mask: tuple[Any, ...]) -> list[str]:
    """The names of a plan's traced leaves, as the user's call spells them."""
    tree = structure.unflatten(range(structure.num_leaves))
    names = {index: name for name, index in leaf_names(fun, tree)}
    return [names[i] for i, traced in enumerate(mask) if traced]


def _diagnose_inputs(tree: Any, leaves: list[Any], plan: Plan, static: tuple) -> None:
    """After JAX refused the inputs, say which leaf was at fault and how to fix it."""
    # With shared objects, `leaves` are the unique ones: name them by their first place.
    places = plan.treedef.unique if isinstance(plan.treedef, Sharing) else range(len(leaves))
    for index, (leaf, traced) in enumerate(zip(leaves, plan.mask, strict=True)):
        if traced and not is_array_like(leaf):
            raise TypeError(
                f"filter_jit: {describe_leaf(tree, places[index], ('fun', 'args', 'kwargs'))} is "
                f"marked to be traced, but {type(leaf).__name__} {leaf!r:.60} is not a JAX "
                "type. Only arrays and Python scalars can be traced: mark it static with a "
                "`False` in the `args=`/`kwargs=`/`default=` specs."
            ) from None
    for value in static:
        try:
            hash(value)
        except TypeError:
            index = places[plan.get_static(range(len(leaves)))[static.index(value)]]
            raise TypeError(
                f"filter_jit: {describe_leaf(tree, index, ('fun', 'args', 'kwargs'))} is "
                f"static (not an array), so it must be hashable, but {type(value).__name__} "
                "is not. Make it hashable, turn it into an array, or mark it traced."
            ) from None
