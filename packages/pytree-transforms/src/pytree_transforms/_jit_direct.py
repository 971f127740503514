"""`filter_jit` with the default options: calls whose inputs are all arrays dispatch
straight through `jax.jit`; the others through the filtered path."""

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import is_array
from pytree_module import Module

from ._arguments import ArgumentSpecs
from ._errors import check_pytree_objects
from ._jit_wrapper import JitWrapper, _diagnose_inputs, _Plan
from ._outputs import PackedOutput, pack_output, unpack_output


class _UseFilteredPath(Exception):
    """Raised when a direct trace finds an input that may have been a Python scalar."""


def _maybe_python_scalar(leaf: Any) -> bool:
    # `jax.jit` traces Python scalars as weakly typed (or boolean) scalars, where filter_jit
    # holds them static. Arrays that look the same take the filtered path too, which traces
    # them just the same.
    aval = jax.typeof(leaf)
    return aval.weak_type or (aval.ndim == 0 and aval.dtype == bool)


class _DirectJitWrapper(JitWrapper):
    """`filter_jit` with the default options (arrays traced, everything else static, no
    donation), while every call so far had only arrays for inputs.

    With these options, a call whose inputs are all arrays means the same to `filter_jit`
    as to `jax.jit`, so it goes straight to a `jax.jit` of the function: JAX's own C++
    dispatch flattens, checks and caches it, with no Python in between. The first call
    that has a non-array leaf anywhere in its inputs (a string, a function, a Python
    scalar) turns the wrapper into a `_FilteredJitWrapper` for good. It is found without a
    check on every call: JAX refuses a non-array leaf before tracing, and a trace that meets
    what may have been a Python scalar stops before running the function.
    """

    def __init__(
        self,
        fun: Callable[..., Any],
        specs: ArgumentSpecs,
        out: Any,
        donate: str,
        jitkwargs: dict[str, Any],
    ):
        super().__init__(fun, specs, out, donate, jitkwargs)
        self._traces = 0
        # The first flat leaf the direct `jax.jit` sees as an input (a plain function is not).
        self._first_input = 0
        leaves = jax.tree.leaves(self._fun)
        if len(leaves) == 1 and leaves[0] is self._fun:
            # A plain function, static for filter_jit: `jax.jit` may close over it.
            self._first_input = 1
            self._direct = jax.jit(self._trace_direct_closed, **jitkwargs)
            if isinstance(self._fun, Module):
                # A `pytree=False` Module: the filtered path refuses it on the first call.
                self.__class__ = _FilteredJitWrapper
        else:
            # A callable pytree (a Module, a bound method): its leaves are inputs too.
            jitted = jax.jit(self._trace_direct, **jitkwargs)
            self._direct = functools.partial(jitted, self._fun)

    def _default_plan(
        self, args: tuple[Any, ...], leaves: list[Any], treedef: PyTreeDef, types: list[type]
    ) -> _Plan:
        plan = self._plan(treedef, [is_array(x) for x in leaves], args, types)
        check_pytree_objects(plan.get_static(leaves), "filter_jit")
        if plan.direct is None:
            plan.direct = all(plan.mask[self._first_input :])
        return plan

    def _trace_direct_closed(self, *args: Any, **kwargs: Any) -> Any:
        return self._trace_direct_checked(self._fun, args, kwargs, (args, kwargs))

    def _trace_direct(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
        return self._trace_direct_checked(fun, args, kwargs, (fun, args, kwargs))

    def _trace_direct_checked(
        self, fun: Any, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: Any
    ) -> Any:
        self._traces += 1
        if any(map(_maybe_python_scalar, jax.tree.leaves(inputs))):
            raise _UseFilteredPath
        return pack_output(fun(*args, **kwargs), is_array, "filter_jit")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        traces = self._traces
        try:
            out = self._direct(*args, **kwargs)
        except _UseFilteredPath:
            pass
        except (TypeError, ValueError):
            if self._traces != traces:
                raise  # raised while tracing the function: its own error
        else:
            # `unpack_output`, inlined: one Python call fewer on every call.
            if type(out) is PackedOutput:
                return out.static.rebuild(out.dynamic)
            return out
        # One class per mode, so that a call runs one method and tests no mode.
        self.__class__ = _FilteredJitWrapper
        return self(*args, **kwargs)


class _FilteredJitWrapper(_DirectJitWrapper):
    """`filter_jit` with the default options, once a call had a non-array input.

    Every call is flattened in Python and split into traced arrays and static leaves. Calls
    whose inputs are all arrays still go to the direct `jax.jit`, where calls of that
    structure were compiled before the switch, so nothing traces again.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree = (self._fun, args, kwargs)
        plan = self._last
        leaves = None
        if plan is not None:
            # Flattening along the last call's structure checks that this call has the
            # same one (node types, keys, static node data), in one step; the leaf types
            # then tell whether the same leaves are traced. (A bare try costs nothing here;
            # `contextlib.suppress` would add a context manager to every call.)
            try:  # noqa: SIM105
                leaves = plan.treedef.flatten_up_to(tree)
            except (TypeError, ValueError):  # another structure
                pass
        if leaves is None or plan.types != list(map(type, leaves)):
            leaves, treedef = jax.tree.flatten(tree)
            plan = self._last = self._default_plan(args, leaves, treedef, list(map(type, leaves)))
        if plan.direct:
            try:
                return unpack_output(self._direct(*args, **kwargs))
            except _UseFilteredPath:  # a weakly typed array, not a Python scalar
                plan.direct = False
        static = plan.get_static(leaves)
        try:
            out = self._jitted((plan, static), plan.get_dynamic(leaves))
        except (TypeError, ValueError):
            _diagnose_inputs(tree, leaves, plan, static)
            raise
        if type(out) is PackedOutput:
            return out.static.rebuild(out.dynamic)
        return out
