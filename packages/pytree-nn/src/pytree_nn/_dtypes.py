"""Choosing the dtype a layer computes in, and giving its operands one rank.

Layers combine their operands explicitly, so that they work whatever the user's promotion
settings: under `jax_numpy_rank_promotion="raise"` an operand of lower rank (a bias, a
per-channel slope) must be given its leading axes before it broadcasts.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def promote_dtype(*arrays: Any, dtype: Any = None) -> list[Any]:
    """Cast arrays to one dtype: `dtype` if given, else their common promoted type.

    Layers compute in `dtype` when it is set (e.g. bfloat16 activations with float32
    parameters), and otherwise in the type of their inputs and parameters combined.
    `None` entries (a missing bias) pass through.

    Arguments:
        *arrays: arrays or None.
        dtype: the dtype to use, or None to promote.

    Returns:
        The arrays, cast.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn._dtypes import promote_dtype
        >>> x, w = promote_dtype(jnp.ones(2, jnp.bfloat16), jnp.ones(2))
        >>> x.dtype, w.dtype
        (dtype('float32'), dtype('float32'))
    """
    if dtype is None:
        try:
            dtype = jnp.result_type(*(a for a in arrays if a is not None))
        except ValueError as error:  # JAX's TypePromotionError (public from JAX 0.11)
            raise type(error)(
                f"{error} A layer whose input and parameters differ in dtype computes in "
                "their promoted dtype, which jax_numpy_dtype_promotion='strict' refuses: "
                "give the layer dtype=... (the dtype to compute in), or cast the input to "
                "its parameters' dtype (param_dtype)."
            ) from None
    return [None if a is None else jnp.asarray(a, dtype) for a in arrays]


def with_rank(a: Any, ndim: int) -> Any:
    """`a` with axes of size 1 in front, up to `ndim` axes: it broadcasts against an array
    of rank `ndim` with no rank promotion (which `jax_numpy_rank_promotion="raise"`
    refuses). `None` (a missing bias) passes through.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn._dtypes import with_rank
        >>> with_rank(jnp.ones(3), 3).shape
        (1, 1, 3)
    """
    if a is None or jnp.ndim(a) >= ndim:
        return a
    return jnp.reshape(a, (1,) * (ndim - jnp.ndim(a)) + jnp.shape(a))


def at_least_float32(dtype: Any) -> np.dtype:
    """`jnp.promote_types(dtype, jnp.float32)` for a floating or complex `dtype`, found
    without promotion, which `jax_numpy_dtype_promotion="strict"` refuses for
    half-precision types: the dtype half-precision inputs are computed in.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn._dtypes import at_least_float32
        >>> at_least_float32(jnp.bfloat16), at_least_float32(jnp.float32)
        (dtype('float32'), dtype('float32'))
    """
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return dtype if dtype.itemsize >= 8 else np.dtype(np.complex64)
    return (
        dtype
        if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize >= 4
        else np.dtype(np.float32)
    )


def check_preferred_element_type(layer: str, value: Any) -> Any:
    """Refuse a `preferred_element_type=` that is not a dtype (None: the default, the
    operands' dtype), naming the argument; the value is kept as given."""
    if value is None:
        return None
    try:
        jnp.dtype(value)
    except TypeError:
        raise TypeError(
            f"{layer}: preferred_element_type must be a dtype such as jnp.float32 (the "
            f"dtype the matmul accumulates in and returns) or None, got {value!r}."
        ) from None
    return value


def add_bias(y: Any, bias: Any) -> Any:
    """`y + bias`, the bias given `y`'s rank first (see `with_rank`); `None` gives `y`.

    A layer with `preferred_element_type=` returns its matmul in that dtype, which may
    differ from the bias's: the sum is then in the wider of the two, as in Flax NNX (whose
    layers add the bias with JAX's standard promotion), found under standard promotion so
    that `jax_numpy_dtype_promotion="strict"` does not refuse it.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn._dtypes import add_bias
        >>> add_bias(jnp.ones((2, 3), jnp.float32), jnp.ones(3, jnp.bfloat16)).dtype
        dtype('float32')
    """
    if bias is None:
        return y
    bias = with_rank(bias, y.ndim)
    if bias.dtype != y.dtype:
        with jax.numpy_dtype_promotion("standard"):
            dtype = jnp.promote_types(y.dtype, bias.dtype)
        y, bias = y.astype(dtype), bias.astype(dtype)
    return y + bias
