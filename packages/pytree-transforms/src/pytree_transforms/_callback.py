"""`filter_pure_callback`: `jax.pure_callback` for callbacks taking and returning any pytrees."""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from pytree_filter import is_array, path_text

from ._errors import check_callable
from ._shapes import is_shaped


def filter_pure_callback(
    callback: Callable[..., Any],
    *args: Any,
    result_shape_dtypes: Any,
    vmap_method: str | None = None,
    sharding: Any = None,
    **kwargs: Any,
) -> Any:
    """`jax.pure_callback` for callbacks of any pytrees: call Python code from traced code.

    The array leaves of `args` and `kwargs` (and of `callback` itself, if it is a pytree
    such as a Module or a bound method) cross the callback boundary, and reach the callback
    as NumPy arrays; every other leaf is passed to it as it is. The callback must be pure
    (JAX may call it any number of times, or not at all when its result is unused).

    Arguments:
        callback: the Python function, called as `callback(*args, **kwargs)` on the host.
        *args: its arguments: any pytrees.
        result_shape_dtypes: the structure of what `callback` returns, with a
            `jax.ShapeDtypeStruct` (or an array, standing for its shape and dtype) for each
            array it returns. Other leaves are the values `callback` returns there; they are
            returned as they are.
        vmap_method: how the call behaves under `jax.vmap`, as for `jax.pure_callback`:
            `"sequential"` (one call per batch element), `"expand_dims"` or
            `"broadcast_all"` (one call on batched arrays), or `"legacy_vectorized"`. Leave
            it out to refuse `jax.vmap`.
        sharding: the sharding of the outputs, as for `jax.pure_callback`.
        **kwargs: its keyword arguments: any pytrees. (`vmap_method`, `sharding` and
            `result_shape_dtypes` are taken by this function, not passed on.)

    Returns:
        The result: arrays where `result_shape_dtypes` has shapes, its other leaves as they
        are.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from pytree_transforms import filter_pure_callback
        >>> def host_norm(x, ord):
        ...     return {"norm": np.linalg.norm(x, ord=ord).astype(x.dtype), "ord": ord}
        >>> @jax.jit
        ... def norm(x):
        ...     shape = {"norm": jax.ShapeDtypeStruct((), x.dtype), "ord": 1}
        ...     out = filter_pure_callback(host_norm, x, 1, result_shape_dtypes=shape)
        ...     return out["norm"]
        >>> norm(jnp.array([3.0, -4.0]))
        Array(7., dtype=float32)
    """
    check_callable(
        callback,
        "filter_pure_callback",
        "callback",
        spelling="filter_pure_callback({}, x, result_shape_dtypes=...)",
    )
    if "vectorized" in kwargs:
        raise TypeError(
            "filter_pure_callback takes no `vectorized`: JAX replaced it with `vmap_method`. "
            'Pass `vmap_method="expand_dims"` for a callback that handles a leading batch '
            'axis, or `vmap_method="sequential"` to call it once per batch element.'
        )
    leaves, treedef = jax.tree.flatten((callback, args, kwargs))
    array_index = [i for i, x in enumerate(leaves) if is_array(x)]
    result_leaves, result_def = jax.tree.flatten(result_shape_dtypes)
    shape_index = [i for i, x in enumerate(result_leaves) if is_shaped(x)]
    shapes = [
        jax.ShapeDtypeStruct(np.shape(result_leaves[i]), result_leaves[i].dtype)
        for i in shape_index
    ]

    def host(*arrays: np.ndarray) -> list[np.ndarray]:
        full = list(leaves)
        # JAX hands callbacks host-side `jax.Array`s; NumPy arrays (a zero-copy view) are
        # what host code such as SciPy expects.
        for i, x in zip(array_index, arrays, strict=True):
            full[i] = np.asarray(x)
        fn, call_args, call_kwargs = treedef.unflatten(full)
        out = fn(*call_args, **call_kwargs)
        return _result_arrays(out, result_leaves, result_def, shape_index, shapes)

    out = jax.pure_callback(
        host,
        shapes,
        *[leaves[i] for i in array_index],
        vmap_method=vmap_method,
        sharding=sharding,
    )
    full = list(result_leaves)
    for i, x in zip(shape_index, out, strict=True):
        full[i] = x
    return result_def.unflatten(full)


def _result_arrays(
    out: Any,
    expected: list[Any],
    result_def: Any,
    shape_index: list[int],
    shapes: list[jax.ShapeDtypeStruct],
) -> list[np.ndarray]:
    """The arrays of the callback's result, checked against `result_shape_dtypes`."""
    try:
        leaves = result_def.flatten_up_to(out)
    except (ValueError, TypeError):
        raise ValueError(
            "filter_pure_callback: the callback returned a result of structure "
            f"{jax.tree.structure(out)}, but `result_shape_dtypes` has structure {result_def}."
        ) from None
    shaped = set(shape_index)
    for i, (value, wanted) in enumerate(zip(leaves, expected, strict=True)):
        if i not in shaped and not (value is wanted or _equal(value, wanted)):
            raise ValueError(
                f"filter_pure_callback: at {_where(result_def, i)} of its result the callback "
                f"returned {value!r}, where `result_shape_dtypes` has the non-array value "
                f"{wanted!r}. Non-array results are fixed when tracing: return that same "
                "value, or declare an array there with a jax.ShapeDtypeStruct."
            )
    arrays = []
    for i, shape in zip(shape_index, shapes, strict=True):
        value = np.asarray(leaves[i])
        # Under `jax.vmap` with a vectorised `vmap_method`, results have leading batch axes.
        trailing = value.shape[value.ndim - len(shape.shape) :] if value.ndim else ()
        if trailing != shape.shape or not np.can_cast(value.dtype, shape.dtype, "same_kind"):
            raise ValueError(
                f"filter_pure_callback: at {_where(result_def, i)} of its result the callback "
                f"returned an array {value.dtype}{list(value.shape)}, where "
                f"`result_shape_dtypes` declares {np.dtype(shape.dtype).name}"
                f"{list(shape.shape)}. Return an array of that shape and dtype."
            )
        arrays.append(value.astype(shape.dtype, copy=False))
    return arrays


def _equal(value: Any, wanted: Any) -> bool:
    try:
        return bool(value == wanted)
    except Exception:  # comparisons that do not give one truth value
        return False


def _where(treedef: Any, index: int) -> str:
    paths = jax.tree_util.tree_flatten_with_path(treedef.unflatten(range(treedef.num_leaves)))
    return path_text(paths[0][index][0])
