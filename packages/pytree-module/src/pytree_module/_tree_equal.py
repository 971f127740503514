"""`tree_equal`: structure and value equality of pytrees."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._status import is_array


def tree_equal(
    *trees: Any, typematch: bool = False, rtol: float = 0.0, atol: float = 0.0
) -> bool | jax.Array:
    """Whether all `trees` have the same structure and equal leaves.

    Arrays are equal when their shapes and dtypes match and their values agree within
    `atol + rtol * |other|` (exactly, by default; integer, bool and float0 arrays always
    exactly). Other leaves compare with `==`. Under a
    JAX trace the result is a traced boolean array.

    With `typematch=True`, corresponding leaves must also have the same type: `1`, `1.0`
    and `True` differ, and so do a NumPy array and a JAX array. Every JAX array counts as
    one type, whether concrete or a tracer under `jax.jit`, `jax.grad` or `jax.vmap`, so
    tracing a function does not change its answer.

    Arguments:
        *trees: the pytrees to compare: at least one (a single tree is trivially equal
            to itself).
        typematch: whether corresponding leaves must also have the same type.
        rtol: relative tolerance for array values.
        atol: absolute tolerance for array values.

    Returns:
        `True`/`False`, or a scalar boolean array when tracers are involved.

    Raises:
        TypeError: no trees were given, or `typematch` is not a bool.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import tree_equal
        >>> tree_equal({"a": jnp.ones(2)}, {"a": jnp.ones(2)})
        True
        >>> tree_equal([1.0], [1.0 + 1e-9], atol=1e-6)
        True
        >>> tree_equal(jnp.ones(2), jnp.ones(3))
        False
        >>> tree_equal([1, 2.0], [1.0, 2.0]), tree_equal([1, 2.0], [1.0, 2.0], typematch=True)
        (True, False)
    """
    if not trees:
        raise TypeError(
            "tree_equal() missing the pytrees to compare: pass at least one positional "
            "argument `*trees`, e.g. `tree_equal(a, b)`."
        )
    if typematch is not False and typematch is not True:
        raise TypeError(
            f"tree_equal(typematch=...) must be True or False, got {typematch!r}: pass "
            "`typematch=True` to require leaves of the same type."
        )
    if len(trees) == 1:
        return True
    first_leaves, first_def = jax.tree.flatten(trees[0])
    result: bool | jax.Array = True
    for other in trees[1:]:
        leaves, treedef = jax.tree.flatten(other)
        if treedef != first_def:
            return False
        if typematch and not _same_leaf_types(first_leaves, leaves):
            return False
        for a, b in zip(first_leaves, leaves, strict=True):
            equal = _leaf_equal(a, b, rtol, atol)
            if equal is False:
                return False
            if equal is not True:
                result = equal if result is True else jnp.logical_and(result, equal)
    return result


def _same_leaf_types(first: list[Any], other: list[Any]) -> bool:
    """Whether the leaves of two trees of one structure have the same types, pairwise."""
    return all(_leaf_type(a) is _leaf_type(b) for a, b in zip(first, other, strict=True))


def _leaf_type(x: Any) -> type:
    """The type `typematch` compares: `jax.Array` for every JAX array, tracers included."""
    # A tracer's class says which transform is running, not what the leaf is: comparing it
    # would make an argument traced by `jax.jit` differ from the concrete array it stands for.
    return jax.Array if isinstance(x, jax.Array) else type(x)


def _leaf_equal(a: Any, b: Any, rtol: float, atol: float) -> bool | jax.Array:
    if is_array(a) or is_array(b):
        if not (is_array(a) and is_array(b)):
            if rtol == 0 and atol == 0:
                return False
            a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
            return _close(jnp, a, b, rtol, atol)
        return bool(_close(np, np.asarray(a), np.asarray(b), rtol, atol))
    numbers = int | float | complex
    if (rtol or atol) and isinstance(a, numbers) and isinstance(b, numbers):
        return bool(abs(a - b) <= atol + rtol * abs(b))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _close(xnp: Any, a: Any, b: Any, rtol: float, atol: float) -> Any:
    # Tolerances are for floating-point values: integers, bools and float0 (the gradients
    # of integer inputs) compare exactly, and have no subtraction to measure a distance with.
    if (rtol == 0 and atol == 0) or not jnp.issubdtype(a.dtype, jnp.inexact):
        return xnp.all(a == b)
    return xnp.all(xnp.abs(a - b) <= atol + rtol * xnp.abs(b))
