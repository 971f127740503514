"""Leaf predicates: which leaves are arrays, and which are floating-point arrays."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)
_SCALAR_TYPES = (bool, int, float, complex)
_INEXACT_SCALAR_TYPES = (float, complex)
_inexact_dtypes: dict[Any, bool] = {}


def _is_inexact_dtype(dtype: Any) -> bool:
    # Cached per dtype: `jnp.issubdtype` is slow, and it is the only check that also
    # knows extended float types such as bfloat16 (whose NumPy kind is "V").
    known = _inexact_dtypes.get(dtype)
    if known is None:
        known = _inexact_dtypes[dtype] = bool(jnp.issubdtype(dtype, jnp.inexact))
    return known


def is_array(element: Any) -> bool:
    """Whether `element` is a JAX array or a NumPy array or scalar.

    JAX tracers count as JAX arrays, so this holds inside transforms too.

    Arguments:
        element: any leaf.

    Returns:
        `True` for `jax.Array`, `np.ndarray` and NumPy scalars (`np.float32(1)`), else `False`.

    Examples:
        >>> import jax.numpy as jnp, numpy as np
        >>> from pytree_filter import is_array
        >>> is_array(jnp.zeros(2)), is_array(np.ones(2)), is_array(1.0)
        (True, True, False)
    """
    return isinstance(element, _ARRAY_TYPES)


def is_array_like(element: Any) -> bool:
    """Whether `element` can be turned into a JAX array: arrays, Python scalars, and objects
    with a `__jax_array__` method.

    Arguments:
        element: any leaf.

    Returns:
        `True` for arrays, `bool`, `int`, `float`, `complex` and `__jax_array__` objects.

    Examples:
        >>> from pytree_filter import is_array_like
        >>> is_array_like(1), is_array_like(2.5), is_array_like("text")
        (True, True, False)
    """
    return (
        isinstance(element, _ARRAY_TYPES + _SCALAR_TYPES)
        or hasattr(type(element), "__jax_array__")
    )


def is_inexact_array(element: Any) -> bool:
    """Whether `element` is an array (as in `is_array`) of floating or complex dtype.

    These are the leaves that are usually trained: `filter_grad` differentiates them.

    Arguments:
        element: any leaf.

    Returns:
        `True` for floating-point (including bfloat16) and complex arrays.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_filter import is_inexact_array
        >>> is_inexact_array(jnp.zeros(2)), is_inexact_array(jnp.zeros(2, jnp.int32))
        (True, False)
    """
    return isinstance(element, _ARRAY_TYPES) and _is_inexact_dtype(element.dtype)


def is_inexact_array_like(element: Any) -> bool:
    """Whether `element` is an inexact array, a Python `float` or `complex`, or a
    `__jax_array__` object that converts to an inexact array.

    Arguments:
        element: any leaf.

    Returns:
        `True` for values that would become floating-point or complex JAX arrays.

    Examples:
        >>> from pytree_filter import is_inexact_array_like
        >>> is_inexact_array_like(1.0), is_inexact_array_like(1), is_inexact_array_like(True)
        (True, False, False)
    """
    if hasattr(type(element), "__jax_array__"):
        element = element.__jax_array__()
    return isinstance(element, _INEXACT_SCALAR_TYPES) or is_inexact_array(element)
