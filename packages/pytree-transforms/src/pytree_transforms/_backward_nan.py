"""`backward_nan`: find NaNs that appear only in the backward pass."""

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp

from pytree_filter import is_array, is_inexact_array_like
from pytree_module import Module, tree_pformat

from ._custom_vjp import filter_custom_vjp
from ._error_if import error_if


class _Values(Module):
    """A pytree printed with its arrays' values in full, for `jax.debug.print`."""

    tree: Any

    def __repr__(self) -> str:
        return tree_pformat(self.tree, short_arrays=False)


@filter_custom_vjp
def _watched(x: Any, name: Hashable, terminate: bool) -> Any:
    return x


@_watched.def_fwd
def _watched_fwd(perturbed: Any, x: Any, name: Hashable, terminate: bool) -> tuple[Any, None]:
    return x, None


@_watched.def_bwd
def _watched_bwd(
    residuals: None, grad_x: Any, perturbed: Any, x: Any, name: Hashable, terminate: bool
) -> Any:
    text = "   primals={x}\ncotangents={grad_x}"
    if name is not None:
        text = f"{name}:\n" + text
    # `ordered`: printed in the order the backward pass reaches each watched value.
    jax.debug.print(text, x=_Values(x), grad_x=_Values(grad_x), ordered=True)
    if terminate:
        # A cotangent may come as a Python float (`jax.vjp`'s caller gives one): made an
        # array, it is checked, and `error_if` has an array to tie the check to.
        grad_x = jax.tree.map(
            lambda g: jnp.asarray(g) if is_inexact_array_like(g) and not is_array(g) else g,
            grad_x,
        )
    cotangents = [g for g in jax.tree.leaves(grad_x) if is_inexact_array_like(g)]
    if terminate and cotangents:
        has_nan = jnp.any(jnp.stack([jnp.isnan(g).any() for g in cotangents]))
        what = "" if name is None else f" of {name}"
        grad_x = error_if(grad_x, has_nan, f"backward_nan: the cotangent{what} has a NaN.")
    return grad_x


def backward_nan(x: Any, name: Hashable = None, terminate: bool = True) -> Any:
    """The identity, that prints its primal and cotangent on the backward pass.

    For NaNs that appear only in gradients: place it on intermediate values, and the
    backward pass prints, for each, the primal value and its cotangent (in the order the
    backward pass reaches them), and stops at the first cotangent with a NaN.

    Arguments:
        x: any pytree; its floating-point arrays are watched.
        name: a label printed with the values.
        terminate: whether a NaN in the cotangent fails, through `error_if` (so
            `PYTREE_TRANSFORMS_ON_ERROR` applies: `breakpoint` opens the debugger there).

    Returns:
        `x`, unchanged.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms.debug import backward_nan
        >>> def f(x):
        ...     return jnp.sum(jnp.sqrt(backward_nan(x, name="x", terminate=False)))
        >>> jax.grad(f)(jnp.array([1.0, 4.0]))
        x:
           primals=Array([1., 4.], dtype=float32)
        cotangents=Array([0.5 , 0.25], dtype=float32)
        Array([0.5 , 0.25], dtype=float32)
    """
    return _watched(x, name, terminate)
