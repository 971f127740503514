"""Pooling: `max_pool`, `min_pool` and `avg_pool` over channels-last inputs."""

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._conv import (
    PaddingLike,
    canonical_padding,
    check_not_empty,
    kernel_size_tuple,
    merge_batch_dims,
    spatial_tuple,
)
from ._dtypes import with_rank


def _identity_of(name: str, dtype: Any, lowest: bool) -> np.ndarray:
    """The value no element can beat: the start of a max (`lowest`) or min reduction."""
    if jnp.issubdtype(dtype, jnp.floating):
        value = -np.inf if lowest else np.inf
    elif jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        value = info.min if lowest else info.max
    elif jnp.issubdtype(dtype, jnp.bool_):
        value = not lowest
    else:
        raise TypeError(f"{name}: cannot order elements of dtype {dtype}; use real numbers.")
    return np.array(value, dtype)


def _pool(
    name: str,
    x: Any,
    init: Callable[[Any], Any],
    reduce_fn: Callable[[Any, Any], Any],
    window_shape: Sequence[int],
    strides: int | Sequence[int] | None,
    padding: PaddingLike,
) -> jax.Array:
    """Reduce each window of the spatial axes of `x` with `reduce_fn`, from `init(dtype)`."""
    window = kernel_size_tuple(name, window_shape, "window_shape", int_is_1d=False)
    rank = len(window)
    strides = spatial_tuple(name, "strides", 1 if strides is None else strides, rank)
    padding = canonical_padding(name, padding, rank, ("SAME", "VALID"))
    inputs, batch_shape = merge_batch_dims(name, x, rank)
    pads = padding if isinstance(padding, str) else ((0, 0), *padding, (0, 0))
    y = lax.reduce_window(
        inputs, init(inputs.dtype), reduce_fn, (1, *window, 1), (1, *strides, 1), pads
    )
    check_not_empty(name, inputs.shape[1:-1], y, "use a smaller window_shape or more padding")
    return y.reshape(batch_shape + y.shape[1:])


def max_pool(
    inputs: jax.Array,
    window_shape: Sequence[int],
    strides: int | Sequence[int] | None = None,
    padding: PaddingLike = "VALID",
) -> jax.Array:
    """The maximum over each window of the spatial axes of a channels-last input.

    Padded positions never win (they count as the lowest value of the dtype).

    Arguments:
        inputs: an array of shape `(*batch, *spatial, features)`, with as many spatial
            axes as `window_shape` has entries and any number of batch axes (or none).
        window_shape: the window's spatial shape, e.g. `(2, 2)` for images.
        strides: the step between windows: an int, one per spatial axis, or None (1).
        padding: `"VALID"` (no padding), `"SAME"` (the output size is the input size
            divided by the stride, rounded up), an int, or one int or `(low, high)` pair
            per spatial axis.

    Returns:
        An array of shape `(*batch, *out_spatial, features)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import max_pool
        >>> x = jnp.arange(16.0).reshape(4, 4, 1)
        >>> max_pool(x, (2, 2), strides=2)[..., 0].tolist()
        [[5.0, 7.0], [13.0, 15.0]]
    """
    return _pool(
        "max_pool",
        inputs,
        lambda dtype: _identity_of("max_pool", dtype, lowest=True),
        lax.max,
        window_shape,
        strides,
        padding,
    )


def min_pool(
    inputs: jax.Array,
    window_shape: Sequence[int],
    strides: int | Sequence[int] | None = None,
    padding: PaddingLike = "VALID",
) -> jax.Array:
    """The minimum over each window of the spatial axes of a channels-last input.

    Padded positions never win (they count as the highest value of the dtype).

    Arguments:
        inputs: an array of shape `(*batch, *spatial, features)`.
        window_shape: the window's spatial shape, e.g. `(2, 2)` for images.
        strides: the step between windows: an int, one per spatial axis, or None (1).
        padding: `"VALID"`, `"SAME"`, an int, or one int or `(low, high)` pair per
            spatial axis.

    Returns:
        An array of shape `(*batch, *out_spatial, features)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import min_pool
        >>> min_pool(jnp.array([[3.0], [1.0], [2.0]]), (2,), padding="SAME")[:, 0].tolist()
        [1.0, 1.0, 2.0]
    """
    return _pool(
        "min_pool",
        inputs,
        lambda dtype: _identity_of("min_pool", dtype, lowest=False),
        lax.min,
        window_shape,
        strides,
        padding,
    )


def avg_pool(
    inputs: jax.Array,
    window_shape: Sequence[int],
    strides: int | Sequence[int] | None = None,
    padding: PaddingLike = "VALID",
    count_include_pad: bool = True,
) -> jax.Array:
    """The mean over each window of the spatial axes of a channels-last input.

    Integer inputs are averaged in floating point.

    Arguments:
        inputs: an array of shape `(*batch, *spatial, features)`.
        window_shape: the window's spatial shape, e.g. `(2, 2)` for images.
        strides: the step between windows: an int, one per spatial axis, or None (1).
        padding: `"VALID"`, `"SAME"`, an int, or one int or `(low, high)` pair per
            spatial axis.
        count_include_pad: whether padded positions count (as zeros) in the mean; if
            False, each window's sum is divided by its number of real elements.

    Returns:
        An array of shape `(*batch, *out_spatial, features)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import avg_pool
        >>> x = jnp.array([[2.0], [4.0], [6.0]])
        >>> avg_pool(x, (2,), padding="SAME")[:, 0].tolist()
        [3.0, 5.0, 3.0]
        >>> avg_pool(x, (2,), padding="SAME", count_include_pad=False)[:, 0].tolist()
        [3.0, 5.0, 6.0]
    """
    if not jnp.issubdtype(jnp.result_type(inputs), jnp.inexact):
        inputs = jnp.asarray(inputs, float)

    def zero(dtype: Any) -> np.ndarray:
        return np.array(0, dtype)

    sums = _pool("avg_pool", inputs, zero, lax.add, window_shape, strides, padding)
    window = kernel_size_tuple("avg_pool", window_shape, "window_shape", int_is_1d=False)
    if count_include_pad:
        return sums / math.prod(window)
    spatial = jnp.shape(inputs)[-len(window) - 1 : -1]
    counts = _pool(
        "avg_pool", jnp.ones((*spatial, 1), sums.dtype), zero, lax.add, window, strides, padding
    )
    return sums / with_rank(counts, sums.ndim)
