"""`filter_custom_vjp`: `jax.custom_vjp` with gradients for the first argument only.

The residuals' static parts reach the backward pass in the residuals' treedef, as outputs do
elsewhere (see `_outputs`). The output's static part cannot: JAX checks that the forward
pass's output has the primal function's treedef, and the two build their static parts
separately, as two `StaticOutput`s, which are never equal (each compares by identity). So it
is kept aside instead (`out_static` in `CustomVJP.__call__`).
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import is_array, is_inexact_array_like, path_text

from ._custom_jvp import RuleInputs
from ._errors import check_callable
from ._method import BindsAsMethod
from ._outputs import StaticOutput, split_output


class CustomVJP(BindsAsMethod):
    """A function with a custom VJP rule, as returned by `filter_custom_vjp`.

    Define the rule with `.defvjp(fn_fwd, fn_bwd)`; then call it like the original function.
    """

    def __init__(self, fn: Callable[..., Any]):
        self._fn = fn
        self._fwd: Callable[..., Any] | None = None
        self._bwd: Callable[..., Any] | None = None
        functools.update_wrapper(self, fn, updated=())

    def defvjp(self, fn_fwd: Callable[..., Any], fn_bwd: Callable[..., Any]) -> None:
        """Set the forward and backward passes.

        Arguments:
            fn_fwd: called as `fn_fwd(vjp_arg, *args, **kwargs)`; returns `(out, residuals)`,
                where `out` is what `fn` returns and `residuals` is any pytree to keep for
                the backward pass (its arrays are saved; its other leaves are kept as
                they are).
            fn_bwd: called as `fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs)`, where
                `grad_obj` is the cotangent of `out` (`None` for leaves that are not
                floating-point arrays); returns the cotangent of `vjp_arg`, with `None` for
                leaves that are not floating-point arrays (`None` elsewhere means zero).
        """
        check_callable(fn_fwd, "defvjp", "fn_fwd", spelling="fn.defvjp({}, fn_bwd)")
        check_callable(fn_bwd, "defvjp", "fn_bwd", spelling="fn.defvjp(fn_fwd, {})")
        self._fwd = fn_fwd
        self._bwd = fn_bwd

    def __call__(self, vjp_arg: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self._fwd is None or self._bwd is None:
            name = getattr(self._fn, "__name__", "fn")
            raise TypeError(
                f"{name} has no VJP rule yet. Define the forward and backward passes before "
                f"calling it: `{name}.defvjp({name}_fwd, {name}_bwd)`."
            )
        fn, fwd, bwd = self._fn, self._fwd, self._bwd
        inputs = RuleInputs((vjp_arg, args, kwargs), jax.tree.structure(vjp_arg).num_leaves)
        # The output's static part, kept aside by whichever of `primal` and `forward` ran
        # last (see the module docstring for why JAX cannot carry it). A list is the one
        # thing both rules can write and the caller read; every call makes its own.
        out_static: list[StaticOutput] = []

        def split(out: Any) -> list[Any]:
            dynamic, static = split_output(out, is_array, "filter_custom_vjp")
            out_static[:] = [static]
            return dynamic

        def primal(diff: list[Any], other: list[Any]) -> list[Any]:
            call_vjp_arg, call_args, call_kwargs = _rebuild(inputs, diff, other)
            return split(fn(call_vjp_arg, *call_args, **call_kwargs))

        def forward(diff: list[Any], other: list[Any]) -> tuple[list[Any], tuple]:
            call_vjp_arg, call_args, call_kwargs = _rebuild(inputs, diff, other)
            result = fwd(call_vjp_arg, *call_args, **call_kwargs)
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise TypeError(
                    f"filter_custom_vjp: {_name(fwd)} must return a pair `(out, residuals)`, "
                    f"got {type(result).__name__}."
                )
            out, residuals = result
            # The residuals' static part goes to `backward` in the residuals' treedef.
            split_residuals = split_output(residuals, is_array, "filter_custom_vjp")
            return split(out), (split_residuals, diff, other)

        def backward(saved: tuple, cotangents: list[Any]) -> tuple[list[Any], list[None]]:
            (residuals, residuals_static), diff, other = saved
            call_vjp_arg, call_args, call_kwargs = _rebuild(inputs, diff, other)
            cotangents = [c if is_inexact_array_like(c) else None for c in cotangents]
            grad_obj = out_static[0].rebuild(cotangents, static_as_none=True)
            grads = bwd(
                residuals_static.rebuild(residuals),
                grad_obj,
                call_vjp_arg,
                *call_args,
                **call_kwargs,
            )
            diff_grads = _diff_cotangents(grads, call_vjp_arg, inputs.diff_index, diff, bwd)
            return diff_grads, [None] * len(other)

        custom = jax.custom_vjp(primal)
        custom.defvjp(forward, backward)
        out = custom(*inputs.arrays())
        return out_static[0].rebuild(out)


def _rebuild(inputs: RuleInputs, diff: list[Any], other: list[Any]) -> Any:
    """The full inputs, with arrays for JAX's values."""
    return inputs.rebuild([_as_array(x) for x in diff], [_as_array(x) for x in other])


def _as_array(x: Any) -> Any:
    # JAX may hand the rules concrete values as typed Python scalars; the functions see
    # arrays, as their caller passed them.
    return x if is_array(x) else jnp.asarray(x)


def _name(rule: Callable[..., Any]) -> str:
    return getattr(rule, "__name__", "the rule")


def _diff_cotangents(
    grads: Any,
    vjp_arg: Any,
    diff_index: list[int],
    diff: list[Any],
    bwd: Callable[..., Any],
) -> list[Any]:
    """The cotangents of the differentiated leaves of `vjp_arg` from the backward pass's
    result: checked against `vjp_arg`, with zeros for `None`."""
    vjp_def = jax.tree.structure(vjp_arg)
    try:
        leaves = vjp_def.flatten_up_to(grads)
    except (ValueError, TypeError):
        raise ValueError(
            f"filter_custom_vjp: {_name(bwd)} must return the cotangent of `vjp_arg`, of "
            f"structure {vjp_def}, with None for leaves that are not floating-point arrays; "
            f"got {jax.tree.structure(grads)}."
        ) from None
    cotangents = []
    for i, primal in zip(diff_index, diff, strict=True):
        grad, shape = leaves[i], np.shape(primal)
        if grad is None:
            grad = jnp.zeros_like(primal)
        elif not (is_array(grad) or isinstance(grad, float | int)) or np.shape(grad) != shape:
            path = jax.tree_util.tree_flatten_with_path(vjp_arg)[0][i][0]
            raise ValueError(
                f"filter_custom_vjp: {_name(bwd)} returned {_describe(grad)} as the cotangent "
                f"at {path_text(path)} of `vjp_arg`, where an "
                f"array of shape {shape} (or None, for zero) was expected."
            )
        cotangents.append(grad)
    return cotangents


def _describe(value: Any) -> str:
    if is_array(value):
        return f"an array of shape {value.shape}"
    return f"a {type(value).__name__}"


def filter_custom_vjp(fn: Callable[..., Any]) -> CustomVJP:
    """`jax.custom_vjp` for functions of any pytrees, differentiated in their first argument.

    Only the first argument, `vjp_arg`, gets gradients: those of its floating-point arrays
    come from the backward pass you define. Its other leaves, and all other arguments (which
    may hold anything, arrays included), get no gradient. The output may be any pytree:
    its arrays are outputs of the custom rule, its other leaves are returned as they are.

    Usage:

        @filter_custom_vjp
        def fn(vjp_arg, *args, **kwargs):
            return out

        def fn_fwd(vjp_arg, *args, **kwargs):
            return out, residuals

        def fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs):
            return grad_vjp_arg

        fn.defvjp(fn_fwd, fn_bwd)

    The backward pass gets all the forward pass's inputs as well as the residuals, and
    `grad_obj` has `None` for every leaf of `out` that is not a floating-point array. To
    differentiate several objects, pack them together as a tuple in `vjp_arg`.

    As with `jax.custom_vjp`, the arguments must not hide traced arrays inside non-array
    leaves (a function closing over a tracer, say): convert such a function with
    `filter_closure_convert`, which makes those arrays leaves.

    Arguments:
        fn: the function, called as `fn(vjp_arg, *args, **kwargs)`.

    Returns:
        A `CustomVJP`, called like `fn`; set its rule with `.defvjp(fn_fwd, fn_bwd)`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_custom_vjp
        >>> @filter_custom_vjp
        ... def clip_gradient(x, bound):
        ...     return x  # the identity, whose backward pass clips the gradient
        >>> def clip_fwd(x, bound):
        ...     return x, None
        >>> def clip_bwd(residuals, grad_obj, x, bound):
        ...     return jax.tree.map(lambda g: jnp.clip(g, -bound, bound), grad_obj)
        >>> clip_gradient.defvjp(clip_fwd, clip_bwd)
        >>> def loss(w):
        ...     out = clip_gradient({"w": w, "name": "w"}, 1.0)
        ...     return jnp.sum(10 * out["w"])
        >>> jax.grad(loss)(jnp.array([1.0, -2.0]))
        Array([1., 1.], dtype=float32)
    """
    check_callable(fn, "filter_custom_vjp", "fn")
    return CustomVJP(fn)
