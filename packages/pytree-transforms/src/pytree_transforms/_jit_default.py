"""`filter_jit` with the default options: a plan per input structure, found by leaf types."""

from typing import Any

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import is_array

from ._errors import check_pytree_objects
from ._jit_plan import Plan
from ._jit_wrapper import JitWrapper, _diagnose_inputs
from ._outputs import PackedOutput
from ._static_key import KeyedStatics


class DefaultJitWrapper(JitWrapper):
    """`filter_jit` with the default options (arrays traced, everything else static, no
    donation or shardings).

    With these options the leaf types decide what is traced, so a call is matched to the
    last call's plan by flattening along that plan's treedef (`flatten_up_to` checks node
    types, keys and static node data in one C call) and comparing leaf types; only a call of
    a new structure computes a mask. The traced arrays then go to the plan's `jax.jit` as
    one flat tuple, which JAX flattens and checks much faster than the Modules they came
    from, so the Python flatten here costs little more than the one `jax.jit` would make.

    Flattening in Python is also what lets every call be checked for shared objects: when
    one array stands at two places where one object could be reached twice (the plan knows
    where, from its treedef), the call goes through `JitWrapper`'s general path, which
    passes each shared object once.
    """

    def _default_plan(
        self, args: tuple[Any, ...], leaves: list[Any], treedef: PyTreeDef, types: list[type]
    ) -> Plan:
        mask = [is_array(x) for x in leaves]
        static_types = tuple(t for t, traced in zip(types, mask, strict=True) if not traced)
        plan = self._plan(treedef, mask, static_types, args, types)
        check_pytree_objects(plan.get_static(leaves), "filter_jit")
        return plan

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree = (self._fun_in_call, args, kwargs)
        plan = self._last
        leaves = None
        if plan is not None:
            # A bare try costs nothing here; `contextlib.suppress` would add a context
            # manager to every call.
            try:  # noqa: SIM105
                leaves = plan.treedef.flatten_up_to(tree)
            except (TypeError, ValueError):  # another structure
                pass
        if leaves is None or plan.types != list(map(type, leaves)):
            leaves, treedef = jax.tree.flatten(tree)
            plan = self._default_plan(args, leaves, treedef, list(map(type, leaves)))
            # Trying the last plan first pays only while calls keep one structure: a failed
            # `flatten_up_to` raises an error whose message prints the whole tree. So it is
            # tried again only once two calls in a row had the same plan.
            self._last = plan if plan is self._previous else None
            self._previous = plan
        dynamic = plan.get_dynamic(leaves)
        check = plan.repeat_check
        if check is not None and check(dynamic):
            # An object reached by two paths: `JitWrapper._split` passes it once.
            return super().__call__(*args, **kwargs)
        try:
            if plan.fixed:
                out = plan.jitted(dynamic)
            else:
                static = plan.get_static(leaves)
                # `Plan.static_arg`, inlined.
                out = plan.jitted(KeyedStatics(static) if plan.keyed else static, dynamic)
        except (TypeError, ValueError):
            _diagnose_inputs(tree, leaves, plan, plan.get_static(leaves))
            raise
        # `unpack_output`, inlined: one Python call fewer on every call.
        if type(out) is PackedOutput:
            return out.static.rebuild(out.dynamic)
        return out
