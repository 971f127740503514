"""Leaf predicates: which leaves are arrays, and which are floating-point arrays."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

ARRAY_TYPES: tuple[type, ...] = (jax.Array, np.ndarray, np.generic)
"""The types `is_array` accepts: JAX arrays (tracers included), NumPy arrays and NumPy scalars."""

SHAPED_TYPES: tuple[type, ...] = (*ARRAY_TYPES, jax.ShapeDtypeStruct)
"""`ARRAY_TYPES` and `jax.ShapeDtypeStruct`, the stand-in `jax.eval_shape` returns for an array.

This is what counts as array data where a value stands for an array without being one: a
Module holding a `ShapeDtypeStruct` keeps it as data (a leaf), as it would the array, so a
model built by `eval_shape` has the structure of the real one.
"""

_SCALAR_TYPES = (bool, int, float, complex)
_INEXACT_SCALAR_TYPES = (float, complex)
_inexact_dtypes: dict[Any, bool] = {}
# Whether a leaf is an array depends only on its type, except for tracers (their abstract
# value decides), and `isinstance(x, jax.Array)` goes through a costly metaclass check: so
# the answer is cached per type, tracers never.
_array_by_type: dict[type, bool] = {}


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
    known = _array_by_type.get(type(element))
    if known is None:
        known = isinstance(element, ARRAY_TYPES)
        if not isinstance(element, Tracer):
            _array_by_type[type(element)] = known
    return known


def leaf_mask(predicate: Callable[[Any], Any], leaves: list[Any]) -> list[Any]:
    """`predicate` applied to every leaf; for `is_array`, a dict look-up per leaf, no call."""
    if predicate is is_array:
        try:
            return list(map(_array_by_type.__getitem__, map(type, leaves)))
        except KeyError:  # a type not seen yet, or a tracer
            pass
    return list(map(predicate, leaves))


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
    return isinstance(element, ARRAY_TYPES + _SCALAR_TYPES) or hasattr(
        type(element), "__jax_array__"
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
    return is_array(element) and _is_inexact_dtype(element.dtype)


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
    if is_array(element):
        return _is_inexact_dtype(element.dtype)
    if hasattr(type(element), "__jax_array__"):
        element = element.__jax_array__()
    return isinstance(element, _INEXACT_SCALAR_TYPES) or is_inexact_array(element)
