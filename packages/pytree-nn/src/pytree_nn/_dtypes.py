"""Choosing the dtype a layer computes in."""

from typing import Any

import jax.numpy as jnp


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
        dtype = jnp.result_type(*(a for a in arrays if a is not None))
    return [None if a is None else jnp.asarray(a, dtype) for a in arrays]
