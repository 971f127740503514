"""`breakpoint_if`: a debugger breakpoint inside jitted code, taken only when asked for."""

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def breakpoint_if(pred: Any, **kwargs: Any) -> Any:
    """`jax.debug.breakpoint`, entered only where `pred` is true.

    A Python `if` cannot test a traced value, so the breakpoint is placed in a `lax.cond`
    branch; it works inside `jax.jit`/`filter_jit`.

    Arguments:
        pred: a boolean scalar or array; the breakpoint is entered if any element is true.
        **kwargs: passed on to `jax.debug.breakpoint` (`backend=`, `filter_frames=`,
            `num_frames=`, `token=`).

    Returns:
        What `jax.debug.breakpoint` returns (the `token` passed, or None) when the
        breakpoint is taken; the `token` passed otherwise.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jit
        >>> from pytree_transforms.debug import breakpoint_if
        >>> @filter_jit
        ... def checked_sqrt(x):
        ...     breakpoint_if(jnp.any(x < 0))
        ...     return jnp.sqrt(x)
        >>> checked_sqrt(jnp.array([1.0, 4.0]))
        Array([1., 2.], dtype=float32)
    """
    token = kwargs.get("token")
    # `jax.debug.breakpoint` is called inside a lambda: as a branch itself it would be
    # handed the operands `lax.cond` passes (none here), and its keyword arguments lost.
    return lax.cond(jnp.any(pred), lambda: jax.debug.breakpoint(**kwargs), lambda: token)
