"""Adaptive pooling: `AdaptiveAvgPool` and `AdaptiveMaxPool` to a target spatial shape.

The bins are Equinox's: an axis of size `n` pooled to `t` bins is cut into `n % t` bins
of `n // t + 1` elements followed by `t - n % t` bins of `n // t`, without overlap. (This
differs from PyTorch's, whose bins may overlap.)
"""

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ._conv import kernel_size_tuple, merge_batch_dims, spatial_tuple
from ._module import Module


def _pool_axis(x: jax.Array, axis: int, bins: int, reduce: Callable[..., Any]) -> jax.Array:
    """Reduce `axis` of `x` to `bins` Equinox-style bins (the larger ones first)."""
    size = x.shape[axis]
    small, large_count = divmod(size, bins)
    split = large_count * (small + 1)
    parts = []
    for start, stop, count in ((0, split, large_count), (split, size, bins - large_count)):
        if count:
            part = jax.lax.slice_in_dim(x, start, stop, axis=axis)
            shape = (*x.shape[:axis], count, (stop - start) // count, *x.shape[axis + 1 :])
            parts.append(reduce(part.reshape(shape), axis=axis + 1))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=axis)


class _AdaptivePool(Module):
    """Pool the spatial axes of channels-last inputs to `target_shape` with `_reduce`."""

    # Set by each pooling class: the reduction, and the number of spatial axes (None: as
    # many as target_shape has entries).
    _reduce: ClassVar[Callable[..., Any]]
    _num_spatial_dims: ClassVar[int | None] = None

    def __init__(self, target_shape: int | Sequence[int]):
        name = type(self).__name__
        rank = type(self)._num_spatial_dims
        if rank is None:
            self.target_shape = kernel_size_tuple(name, target_shape, "target_shape")
        else:
            self.target_shape = spatial_tuple(name, "target_shape", target_shape, rank)

    def __call__(self, x: jax.Array) -> jax.Array:
        """Pool `x`, of shape `(*batch, *spatial, features)`, to
        `(*batch, *target_shape, features)`."""
        name = type(self).__name__
        rank = len(self.target_shape)
        inputs, batch_shape = merge_batch_dims(name, x, rank)
        spatial = inputs.shape[1:-1]
        if any(n < t for n, t in zip(spatial, self.target_shape, strict=True)):
            raise ValueError(
                f"{name}: the input of shape {jnp.shape(x)} has spatial shape {spatial}, "
                f"smaller than target_shape={self.target_shape} along some axis; each bin "
                "needs at least one element, so pick a target_shape no larger than the input."
            )
        y = inputs
        # One spatial axis after another, in order, as Equinox does: the bins along one
        # axis are the same whatever the position along the others, so this equals
        # reducing each box of the grid at once.
        for axis, bins in enumerate(self.target_shape, start=1):
            y = _pool_axis(y, axis, bins, type(self)._reduce)
        return y.reshape(batch_shape + y.shape[1:])


def _mean(x: jax.Array, axis: int) -> jax.Array:
    return jnp.mean(x, axis=axis)


def _max(x: jax.Array, axis: int) -> jax.Array:
    return jnp.max(x, axis=axis)


class AdaptiveAvgPool(_AdaptivePool):
    """Average pooling to a fixed spatial shape, whatever the input's.

    Each spatial axis is cut into `target_shape` bins of (nearly) equal size, as in
    Equinox: when the size does not divide, the first bins hold one element more (7 to 3
    bins: sizes 3, 2, 2). Integer inputs are averaged in floating point.

    Arguments:
        target_shape: the output's spatial shape, one positive int per spatial axis (an
            int: one spatial axis). Each must be at most the input's size on that axis.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveAvgPool
        >>> x = jnp.arange(7.0).reshape(7, 1)  # (length, features)
        >>> AdaptiveAvgPool((3,))(x)[:, 0].tolist()
        [1.0, 3.5, 5.5]
        >>> AdaptiveAvgPool((2, 2))(jnp.ones((8, 5, 6, 3))).shape
        (8, 2, 2, 3)
    """

    _reduce = staticmethod(_mean)


class AdaptiveMaxPool(_AdaptivePool):
    """Max pooling to a fixed spatial shape, whatever the input's.

    The bins are those of `AdaptiveAvgPool` (Equinox's): 7 to 3 bins gives sizes 3, 2, 2.

    Arguments:
        target_shape: the output's spatial shape, one positive int per spatial axis (an
            int: one spatial axis). Each must be at most the input's size on that axis.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveMaxPool
        >>> x = jnp.arange(7.0).reshape(7, 1)  # (length, features)
        >>> AdaptiveMaxPool((3,))(x)[:, 0].tolist()
        [2.0, 4.0, 6.0]
    """

    _reduce = staticmethod(_max)


class AdaptiveAvgPool1d(AdaptiveAvgPool):
    """`AdaptiveAvgPool` over 1 spatial dimension.

    Inputs have shape `(*batch, length, features)`.

    Arguments:
        target_shape: the output's length: an int, or a one-int sequence.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveAvgPool1d
        >>> AdaptiveAvgPool1d(4)(jnp.ones((8, 10, 3))).shape
        (8, 4, 3)
    """

    _num_spatial_dims = 1


class AdaptiveAvgPool2d(AdaptiveAvgPool):
    """`AdaptiveAvgPool` over 2 spatial dimensions.

    Inputs have shape `(*batch, height, width, features)`.

    Arguments:
        target_shape: the output's spatial shape: an int (the same for every spatial
            axis), or a sequence of 2 positive ints.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveAvgPool2d
        >>> AdaptiveAvgPool2d(4)(jnp.ones((8, 10, 9, 3))).shape
        (8, 4, 4, 3)
    """

    _num_spatial_dims = 2


class AdaptiveAvgPool3d(AdaptiveAvgPool):
    """`AdaptiveAvgPool` over 3 spatial dimensions.

    Inputs have shape `(*batch, depth, height, width, features)`.

    Arguments:
        target_shape: the output's spatial shape: an int (the same for every spatial
            axis), or a sequence of 3 positive ints.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveAvgPool3d
        >>> AdaptiveAvgPool3d(4)(jnp.ones((10, 9, 7, 3))).shape
        (4, 4, 4, 3)
    """

    _num_spatial_dims = 3


class AdaptiveMaxPool1d(AdaptiveMaxPool):
    """`AdaptiveMaxPool` over 1 spatial dimension.

    Inputs have shape `(*batch, length, features)`.

    Arguments:
        target_shape: the output's length: an int, or a one-int sequence.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveMaxPool1d
        >>> AdaptiveMaxPool1d(4)(jnp.ones((8, 10, 3))).shape
        (8, 4, 3)
    """

    _num_spatial_dims = 1


class AdaptiveMaxPool2d(AdaptiveMaxPool):
    """`AdaptiveMaxPool` over 2 spatial dimensions.

    Inputs have shape `(*batch, height, width, features)`.

    Arguments:
        target_shape: the output's spatial shape: an int (the same for every spatial
            axis), or a sequence of 2 positive ints.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveMaxPool2d
        >>> AdaptiveMaxPool2d(4)(jnp.ones((8, 10, 9, 3))).shape
        (8, 4, 4, 3)
    """

    _num_spatial_dims = 2


class AdaptiveMaxPool3d(AdaptiveMaxPool):
    """`AdaptiveMaxPool` over 3 spatial dimensions.

    Inputs have shape `(*batch, depth, height, width, features)`.

    Arguments:
        target_shape: the output's spatial shape: an int (the same for every spatial
            axis), or a sequence of 3 positive ints.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import AdaptiveMaxPool3d
        >>> AdaptiveMaxPool3d(4)(jnp.ones((10, 9, 7, 3))).shape
        (4, 4, 4, 3)
    """

    _num_spatial_dims = 3
