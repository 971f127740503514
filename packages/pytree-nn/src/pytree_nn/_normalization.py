"""Normalization layers: `LayerNorm`, `RMSNorm`, `GroupNorm`, `InstanceNorm` and `BatchNorm`."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pytree_graph import BatchStat, Param

from . import initializers
from ._checks import check_features, check_metadata, check_number
from ._dtypes import at_least_float32, promote_dtype
from ._flat_draws import flat_when_eager
from ._linear import sharded_param
from ._module import Module
from ._rngs import as_rngs
from ._stateful import State

Axes = int | Sequence[int]


def _check_axes(layer: str, name: str, axes: Any) -> int | tuple[int, ...]:
    """Refuse an axis spec that is not an int or a non-empty sequence of ints."""

    def is_int(a: Any) -> bool:
        return isinstance(a, int) and not isinstance(a, bool)

    if is_int(axes):
        return axes
    sequence = isinstance(axes, Sequence) and not isinstance(axes, str)
    if sequence and axes and all(is_int(a) for a in axes):
        return tuple(axes)
    raise TypeError(f"{layer}: {name} must be an int or a tuple of ints, got {axes!r}.")


def _input_axes(layer: str, name: str, axes: int | tuple[int, ...], shape: tuple) -> tuple:
    """`axes` as sorted, distinct, non-negative axes of an input of this shape."""
    ndim = len(shape)
    spec = (axes,) if isinstance(axes, int) else axes
    if not all(-ndim <= a < ndim for a in spec):
        raise ValueError(
            f"{layer}: {name}={axes!r} is out of range for an input of shape {shape} (rank {ndim})."
        )
    return tuple(sorted({a % ndim for a in spec}))


def _check_feature_size(
    layer: str, name: str, axes: Any, features: tuple, shape: tuple, num_features: int
) -> None:
    """Refuse an input whose feature axes do not hold `num_features` values."""
    size = math.prod(shape[a] for a in features)
    if size != num_features:
        raise ValueError(
            f"{layer} was built with num_features={num_features}, but the input of shape "
            f"{shape} has {size} features along {name}={axes!r}. Pass inputs with "
            f"{num_features} features there, or build the layer with num_features={size}."
        )


def _feature_axes(
    layer: str, name: str, axes: Any, shape: tuple, num_features: int
) -> tuple[int, ...]:
    """The input's feature axes `axes`, after checking they hold `num_features` values."""
    features = _input_axes(layer, name, axes, shape)
    _check_feature_size(layer, name, axes, features, shape, num_features)
    return features


def _squared_magnitude(x: jax.Array) -> jax.Array:
    """`|x|**2` elementwise (real for complex `x`)."""
    if jnp.iscomplexobj(x):
        return lax.square(x.real) + lax.square(x.imag)
    return lax.square(x)


def _moments(
    x: jax.Array,
    axes: tuple[int, ...],
    *,
    center: bool,
    fast_variance: bool,
    axis_name: Any,
    mask: jax.Array | None = None,
) -> tuple[jax.Array | None, jax.Array]:
    """Mean and variance over `axes` (kept, as size 1), and over the named axis if set.

    Computed in at least float32, so half-precision inputs keep accurate statistics.
    Without `center` the mean is None and the "variance" is the mean square. With a
    boolean `mask` of `x`'s shape, only the entries it keeps count (as Flax NNX's `mask=`).
    """
    x = x.astype(at_least_float32(x.dtype))

    def average(*values: jax.Array) -> list[jax.Array]:
        means = [jnp.mean(v, axes, keepdims=True, where=mask) for v in values]
        return means if axis_name is None else lax.pmean(means, axis_name)

    if not center:
        (mean_square,) = average(_squared_magnitude(x))
        return None, mean_square
    if fast_variance:
        mean, mean_square = average(x, _squared_magnitude(x))
        # E[x^2] - E[x]^2 can round to slightly below zero.
        return mean, jnp.maximum(0.0, mean_square - _squared_magnitude(mean))
    (mean,) = average(x)
    (variance,) = average(_squared_magnitude(x - mean))
    return mean, variance


def _checked_mask(layer: str, mask: Any, shape: tuple) -> jax.Array | None:
    """`mask` (None, or booleans broadcastable to the input's `shape`) at that shape."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(
            f"{layer}: mask must be an array of booleans (True where an entry counts in the "
            f"statistics), got dtype {mask.dtype}. Compare first, e.g. `mask=lengths > 0`."
        )
    try:
        return jnp.broadcast_to(mask, shape)
    except ValueError:
        raise ValueError(
            f"{layer}: mask of shape {mask.shape} does not broadcast to the input's shape "
            f"{shape}; give one boolean per input entry (or a shape that broadcasts to it)."
        ) from None


def _normalize(
    x: jax.Array,
    mean: jax.Array | None,
    variance: jax.Array,
    scale: jax.Array | None,
    bias: jax.Array | None,
    feature_axes: tuple[int, ...],
    epsilon: float,
) -> jax.Array:
    """`(x - mean) / sqrt(variance + epsilon) * scale + bias`, parameters on `feature_axes`.

    The result has the dtype of `x` (float32 for integer inputs).
    """
    out_dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.float32
    # In the statistics' dtype (at least float32; complex for complex inputs), cast to
    # explicitly: the numbers promotion gives, and no promotion for the setting
    # `jax_numpy_dtype_promotion="strict"` to refuse.
    compute = at_least_float32(out_dtype)
    feature_shape = [x.shape[a] if a in feature_axes else 1 for a in range(x.ndim)]
    multiplier = lax.rsqrt(variance + epsilon).astype(compute)
    if scale is not None:
        multiplier = multiplier * scale.reshape(feature_shape).astype(compute)
    x = x.astype(compute)
    y = (x if mean is None else x - mean) * multiplier
    if bias is not None:
        y = y + bias.reshape(feature_shape).astype(compute)
    return y.astype(out_dtype)


def _scale_and_bias(
    layer: str,
    size: int,
    dtype: Any,
    rngs: Any,
    scale: tuple[initializers.Initializer, Any, Any] | None,
    bias: tuple[initializers.Initializer, Any, Any] | None = None,
) -> tuple[Param | None, Param | None]:
    """The `(size,)` `scale` and `bias` Params (None where not used), each from its
    `(initializer, sharding, metadata)` with a key from `rngs.params`; the shardings and
    metadata are checked before any key is drawn."""
    parts = {"scale": scale, "bias": bias}
    checked = {
        name: check_metadata(layer, f"{name}_metadata", part[2], f"{name}_sharding", part[1], 1)
        for name, part in parts.items()
        if part is not None
    }
    made = {
        name: sharded_param(part[0](flat_when_eager(rngs.params()), (size,), dtype), *checked[name])
        for name, part in parts.items()
        if part is not None
    }
    return made.get("scale"), made.get("bias")


def _promoted(x: jax.Array, scale: Param | None, bias: Param | None, dtype: Any) -> list[Any]:
    """`x` and the values of `scale` and `bias` (None where absent), in one dtype."""
    values = [None if param is None else param.value for param in (scale, bias)]
    return promote_dtype(x, *values, dtype=dtype)


class _CenteredNorm(Module):
    """What `LayerNorm` and `InstanceNorm` share: `scale` and `bias` Params, their settings,
    and normalizing to zero mean and unit variance over the axes a subclass picks."""

    def _build(
        self,
        layer: str,
        num_features: int,
        epsilon: float,
        dtype: Any,
        param_dtype: Any,
        scale: tuple | None,
        bias: tuple | None,
        feature_axes: Axes,
        axis_name: Any,
        use_fast_variance: bool,
        rngs: Any,
    ) -> None:
        """Check the constructor's arguments and make the Params; `scale` and `bias` are
        `(init, sharding, metadata)`, or None for a layer without them."""
        check_features(layer, num_features=num_features)
        self.epsilon = check_number(layer, "epsilon", epsilon, 0.0, math.inf)
        self.feature_axes = _check_axes(layer, "feature_axes", feature_axes)
        rngs = as_rngs(rngs, layer)
        self.scale, self.bias = _scale_and_bias(layer, num_features, param_dtype, rngs, scale, bias)
        self.num_features = num_features
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.use_bias = bias is not None
        self.use_scale = scale is not None
        self.axis_name = axis_name
        self.use_fast_variance = use_fast_variance

    def _normalize_over(
        self,
        x: jax.Array,
        reduction: tuple[int, ...],
        features: tuple[int, ...],
        mask: jax.Array | None,
    ) -> jax.Array:
        x, scale, bias = _promoted(x, self.scale, self.bias, self.dtype)
        mean, variance = _moments(
            x,
            reduction,
            center=True,
            fast_variance=self.use_fast_variance,
            axis_name=self.axis_name,
            mask=mask,
        )
        return _normalize(x, mean, variance, scale, bias, features, self.epsilon)


class LayerNorm(_CenteredNorm):
    """Layer normalization: normalize each example over its features.

    `y = (x - mean) / sqrt(var + epsilon) * scale + bias`, with the mean and variance taken
    over `reduction_axes` of each example separately (by default the last axis), and
    `scale`/`bias` Params of shape `(num_features,)` laid along `feature_axes`. Statistics
    are computed in at least float32; the result has the dtype of the input and
    parameters promoted together, or `dtype`.

    Arguments:
        num_features: the number of features (the product of the sizes of the input's
            `feature_axes`).
        epsilon: added to the variance before the square root.
        dtype: the dtype to compute in and return (None: promote the input's and the
            parameters').
        param_dtype: the dtype of `scale` and `bias`.
        use_bias: whether to add the learned `bias`.
        use_scale: whether to multiply by the learned `scale`.
        bias_init: initializer of `bias`.
        bias_sharding: the same for `bias`.
        bias_metadata: more metadata for `bias`'s Param (see `scale_metadata`).
        scale_init: initializer of `scale`.
        scale_sharding: how to split `scale` over a device mesh, e.g. `("model",)` (see
            `Linear`'s `kernel_sharding`).
        scale_metadata: more metadata for `scale`'s Param, a mapping of names to
            hashable values (see `Linear`'s `kernel_metadata`).
        reduction_axes: the axis or axes to take the statistics over.
        feature_axes: the axis or axes `scale` and `bias` lie along.
        axis_name: also average the statistics over this named axis (of `vmap`, `pmap`
            or `shard_map`), e.g. when the features are split across it.
        use_fast_variance: compute the variance as `E[x^2] - E[x]^2` (one pass) instead
            of `E[(x - E[x])^2]`.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import LayerNorm
        >>> norm = LayerNorm(4, rngs=0)
        >>> y = norm(jnp.array([1.0, 2.0, 3.0, 4.0]))
        >>> [round(v, 3) for v in y.tolist()]
        [-1.342, -0.447, 0.447, 1.342]
        >>> norm.scale.value.shape, norm.bias.value.shape
        ((4,), (4,))
    """

    def __init__(
        self,
        num_features: int,
        *,
        epsilon: float = 1e-6,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: initializers.Initializer = initializers.zeros,
        bias_sharding: Any = None,
        bias_metadata: Mapping[str, Any] | None = None,
        scale_init: initializers.Initializer = initializers.ones,
        scale_sharding: Any = None,
        scale_metadata: Mapping[str, Any] | None = None,
        reduction_axes: Axes = -1,
        feature_axes: Axes = -1,
        axis_name: Any = None,
        use_fast_variance: bool = True,
        rngs: Any = None,
    ):
        self.reduction_axes = _check_axes("LayerNorm", "reduction_axes", reduction_axes)
        self._build(
            "LayerNorm",
            num_features,
            epsilon,
            dtype,
            param_dtype,
            (scale_init, scale_sharding, scale_metadata) if use_scale else None,
            (bias_init, bias_sharding, bias_metadata) if use_bias else None,
            feature_axes,
            axis_name,
            use_fast_variance,
            rngs,
        )

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalize `x`; the result has the shape of `x`.

        `mask`: None, or booleans broadcastable to `x`'s shape: only the entries it keeps
        count in the mean and variance (every entry is still normalized), as Flax NNX's.
        """
        shape = jnp.shape(x)
        reduction = _input_axes("LayerNorm", "reduction_axes", self.reduction_axes, shape)
        features = _feature_axes(
            "LayerNorm", "feature_axes", self.feature_axes, shape, self.num_features
        )
        mask = _checked_mask("LayerNorm", mask, shape)
        return self._normalize_over(x, reduction, features, mask)


class RMSNorm(Module):
    """Root-mean-square normalization: scale each example to unit RMS, without centering.

    `y = x / sqrt(mean(x^2) + epsilon) * scale`, with the mean square taken over
    `reduction_axes` of each example (by default the last axis) and a `scale` Param of
    shape `(num_features,)` laid along `feature_axes`. Statistics are computed in at least
    float32; the result has the dtype of the input and `scale` promoted, or `dtype`.

    Arguments:
        num_features: the number of features (the product of the sizes of the input's
            `feature_axes`).
        epsilon: added to the mean square before the square root.
        dtype: the dtype to compute in and return (None: promote).
        param_dtype: the dtype of `scale`.
        use_scale: whether to multiply by the learned `scale`.
        scale_init: initializer of `scale`.
        scale_sharding: how to split `scale` over a device mesh, e.g. `("model",)` (see
            `Linear`'s `kernel_sharding`).
        scale_metadata: more metadata for `scale`'s Param, a mapping of names to
            hashable values (see `Linear`'s `kernel_metadata`).
        reduction_axes: the axis or axes to take the mean square over.
        feature_axes: the axis or axes `scale` lies along.
        axis_name: also average over this named axis (of `vmap`, `pmap`, `shard_map`).
        use_fast_variance: taken for Flax NNX's signature; without centering there is
            one way to compute the mean square, so it changes nothing.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import RMSNorm
        >>> norm = RMSNorm(2, rngs=0)
        >>> [round(v, 3) for v in norm(jnp.array([3.0, 4.0])).tolist()]
        [0.849, 1.131]
    """

    def __init__(
        self,
        num_features: int,
        *,
        epsilon: float = 1e-6,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        use_scale: bool = True,
        scale_init: initializers.Initializer = initializers.ones,
        scale_sharding: Any = None,
        scale_metadata: Mapping[str, Any] | None = None,
        reduction_axes: Axes = -1,
        feature_axes: Axes = -1,
        axis_name: Any = None,
        use_fast_variance: bool = True,
        rngs: Any = None,
    ):
        check_features("RMSNorm", num_features=num_features)
        self.epsilon = check_number("RMSNorm", "epsilon", epsilon, 0.0, math.inf)
        self.reduction_axes = _check_axes("RMSNorm", "reduction_axes", reduction_axes)
        self.feature_axes = _check_axes("RMSNorm", "feature_axes", feature_axes)
        rngs = as_rngs(rngs, "RMSNorm")
        self.scale, _ = _scale_and_bias(
            "RMSNorm",
            num_features,
            param_dtype,
            rngs,
            (scale_init, scale_sharding, scale_metadata) if use_scale else None,
        )
        self.num_features = num_features
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.use_scale = use_scale
        self.axis_name = axis_name
        self.use_fast_variance = use_fast_variance

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalize `x`; the result has the shape of `x`.

        `mask`: None, or booleans broadcastable to `x`'s shape: only the entries it keeps
        count in the mean square (every entry is still scaled), as Flax NNX's.
        """
        shape = jnp.shape(x)
        reduction = _input_axes("RMSNorm", "reduction_axes", self.reduction_axes, shape)
        features = _feature_axes(
            "RMSNorm", "feature_axes", self.feature_axes, shape, self.num_features
        )
        mask = _checked_mask("RMSNorm", mask, shape)
        x, scale, _ = _promoted(x, self.scale, None, self.dtype)
        _, mean_square = _moments(
            x, reduction, center=False, fast_variance=True, axis_name=self.axis_name, mask=mask
        )
        return _normalize(x, None, mean_square, scale, None, features, self.epsilon)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class GroupNorm(Module):
    """Group normalization: normalize each example over groups of channels.

    The `num_features` channels (the last axis) are split into `num_groups` consecutive
    groups of `group_size`; the mean and variance are taken per example and per group,
    over the group's channels and every axis between the batch axis and the channels
    (for an image batch `(N, H, W, C)`: over `H`, `W` and the group). The leading axis is
    the batch; a 1-D input `(C,)` is one example. `num_groups=1` is a layer norm over all
    non-batch axes; `group_size=1` is instance normalization. Learned `scale` and `bias`
    of shape `(num_features,)` follow.

    Arguments:
        num_features: the number of channels (size of the input's last axis).
        num_groups: the number of groups (default 32, as in the paper that introduced
            the layer); it must divide `num_features`. Pass `num_groups=None` to give
            `group_size` instead.
        group_size: the number of channels in a group (instead of `num_groups`).
        epsilon: added to the variance before the square root.
        dtype: the dtype to compute in and return (None: promote).
        param_dtype: the dtype of `scale` and `bias`.
        use_bias: whether to add the learned `bias`.
        use_scale: whether to multiply by the learned `scale`.
        bias_init: initializer of `bias`.
        bias_sharding: the same for `bias`.
        bias_metadata: more metadata for `bias`'s Param (see `scale_metadata`).
        scale_init: initializer of `scale`.
        scale_sharding: how to split `scale` over a device mesh, e.g. `("model",)` (see
            `Linear`'s `kernel_sharding`).
        scale_metadata: more metadata for `scale`'s Param, a mapping of names to
            hashable values (see `Linear`'s `kernel_metadata`).
        reduction_axes: the axes to take the statistics over, instead of the default
            (every axis but the first); it must include the last axis. Use it for inputs
            with several batch axes, e.g. `(-3, -2, -1)` for `(..., H, W, C)`.
        axis_name: also average the statistics over this named axis.
        use_fast_variance: compute the variance as `E[x^2] - E[x]^2` (one pass).
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import GroupNorm
        >>> norm = GroupNorm(4, num_groups=2, rngs=0)
        >>> norm(jnp.array([[0.0, 2.0, 10.0, 30.0]])).round(3).tolist()
        [[-1.0, 1.0, -1.0, 1.0]]
        >>> GroupNorm(6, num_groups=None, group_size=3, rngs=0).num_groups
        2
    """

    def __init__(
        self,
        num_features: int,
        num_groups: int | None = 32,
        *,
        group_size: int | None = None,
        epsilon: float = 1e-6,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: initializers.Initializer = initializers.zeros,
        bias_sharding: Any = None,
        bias_metadata: Mapping[str, Any] | None = None,
        scale_init: initializers.Initializer = initializers.ones,
        scale_sharding: Any = None,
        scale_metadata: Mapping[str, Any] | None = None,
        reduction_axes: Axes | None = None,
        axis_name: Any = None,
        use_fast_variance: bool = True,
        rngs: Any = None,
    ):
        check_features("GroupNorm", num_features=num_features)
        if (num_groups is None) == (group_size is None):
            got = (
                "neither"
                if num_groups is None
                else f"num_groups={num_groups!r} and group_size={group_size!r}"
            )
            raise ValueError(
                f"GroupNorm: give exactly one of num_groups and group_size, got {got}. "
                "num_groups defaults to 32: to give group_size, pass num_groups=None too."
            )
        given, value = (
            ("num_groups", num_groups) if group_size is None else ("group_size", group_size)
        )
        check_features("GroupNorm", **{given: value})
        if num_features % value:
            raise ValueError(
                f"GroupNorm: {given}={value} does not divide num_features={num_features}; "
                f"use one of {_divisors(num_features)}."
            )
        self.epsilon = check_number("GroupNorm", "epsilon", epsilon, 0.0, math.inf)
        self.reduction_axes = (
            None
            if reduction_axes is None
            else _check_axes("GroupNorm", "reduction_axes", reduction_axes)
        )
        rngs = as_rngs(rngs, "GroupNorm")
        self.scale, self.bias = _scale_and_bias(
            "GroupNorm",
            num_features,
            param_dtype,
            rngs,
            (scale_init, scale_sharding, scale_metadata) if use_scale else None,
            (bias_init, bias_sharding, bias_metadata) if use_bias else None,
        )
        self.num_features = num_features
        self.num_groups = num_features // value if given == "group_size" else value
        self.group_size = num_features // self.num_groups
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.use_bias = use_bias
        self.use_scale = use_scale
        self.axis_name = axis_name
        self.use_fast_variance = use_fast_variance

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalize `x`, of shape `(batch, ..., num_features)` or `(num_features,)`.

        `mask`: None, or booleans broadcastable to `x`'s shape: only the entries it keeps
        count in each group's statistics, as Flax NNX's.
        """
        shape = jnp.shape(x)
        if not shape:
            raise ValueError(
                f"GroupNorm expects inputs of shape (batch, ..., {self.num_features}) or "
                f"({self.num_features},), got a scalar."
            )
        last = len(shape) - 1
        _check_feature_size("GroupNorm", "axis", -1, (last,), shape, self.num_features)
        if self.reduction_axes is None:
            reduction = (*range(1, last), last)
        else:
            reduction = _input_axes("GroupNorm", "reduction_axes", self.reduction_axes, shape)
            if last not in reduction:
                raise ValueError(
                    f"GroupNorm: reduction_axes={self.reduction_axes!r} must include the "
                    "channel axis (the last axis, -1)."
                )
        mask = _checked_mask("GroupNorm", mask, shape)
        x, scale, bias = _promoted(x, self.scale, self.bias, self.dtype)
        # Split the channels into (num_groups, group_size): axes `last` and `last + 1`.
        grouped_shape = (*shape[:-1], self.num_groups, self.group_size)
        grouped = x.reshape(grouped_shape)
        mean, variance = _moments(
            grouped,
            (*reduction[:-1], last + 1),
            center=True,
            fast_variance=self.use_fast_variance,
            axis_name=self.axis_name,
            mask=None if mask is None else mask.reshape(grouped_shape),
        )
        y = _normalize(grouped, mean, variance, scale, bias, (last, last + 1), self.epsilon)
        return y.reshape(shape)


class InstanceNorm(_CenteredNorm):
    """Instance normalization: normalize each example and each channel on its own.

    `y = (x - mean) / sqrt(var + epsilon) * scale + bias`, with the mean and variance
    taken per example (the leading axis is the batch) and per feature, over every axis
    that is neither the batch axis nor one of `feature_axes` (for an image batch
    `(N, H, W, C)`: over `H` and `W`). `scale` and `bias` are Params of shape
    `(num_features,)` laid along `feature_axes`, as in `LayerNorm`. It is `LayerNorm` with
    `reduction_axes` every non-batch, non-feature axis, and `GroupNorm` with
    `group_size=1`. Statistics are computed in at least float32; the result has the dtype
    of the input and parameters promoted together, or `dtype`.

    Arguments:
        num_features: the number of features (the product of the sizes of the input's
            `feature_axes`).
        epsilon: added to the variance before the square root.
        dtype: the dtype to compute in and return (None: promote).
        param_dtype: the dtype of `scale` and `bias`.
        use_bias: whether to add the learned `bias`.
        use_scale: whether to multiply by the learned `scale`.
        bias_init: initializer of `bias`.
        bias_sharding: how to split `bias` over a device mesh (see `Linear`'s
            `kernel_sharding`).
        bias_metadata: more metadata for `bias`'s Param (see `Linear`'s
            `kernel_metadata`).
        scale_init: initializer of `scale`.
        scale_sharding: the same as `bias_sharding`, for `scale`.
        scale_metadata: the same as `bias_metadata`, for `scale`.
        feature_axes: the axis or axes `scale` and `bias` lie along (not the batch axis,
            0); the statistics are taken over all others but the batch axis.
        axis_name: also average the statistics over this named axis (of `vmap`, `pmap`
            or `shard_map`).
        use_fast_variance: compute the variance as `E[x^2] - E[x]^2` (one pass).
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import InstanceNorm
        >>> norm = InstanceNorm(2, rngs=0)
        >>> x = jnp.array([[[0.0, 1.0], [2.0, 5.0]]])  # (batch=1, length=2, channels=2)
        >>> norm(x).round(3).tolist()
        [[[-1.0, -1.0], [1.0, 1.0]]]
    """

    def __init__(
        self,
        num_features: int,
        *,
        epsilon: float = 1e-6,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: initializers.Initializer = initializers.zeros,
        bias_sharding: Any = None,
        bias_metadata: Mapping[str, Any] | None = None,
        scale_init: initializers.Initializer = initializers.ones,
        scale_sharding: Any = None,
        scale_metadata: Mapping[str, Any] | None = None,
        feature_axes: Axes = -1,
        axis_name: Any = None,
        use_fast_variance: bool = True,
        rngs: Any = None,
    ):
        self._build(
            "InstanceNorm",
            num_features,
            epsilon,
            dtype,
            param_dtype,
            (scale_init, scale_sharding, scale_metadata) if use_scale else None,
            (bias_init, bias_sharding, bias_metadata) if use_bias else None,
            feature_axes,
            axis_name,
            use_fast_variance,
            rngs,
        )

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalize `x`, of shape `(batch, ...)` with the features on `feature_axes`;
        the result has the shape of `x`.

        `mask`: None, or booleans broadcastable to `x`'s shape: only the entries it keeps
        count in the statistics, as Flax NNX's.
        """
        shape = jnp.shape(x)
        features = _feature_axes(
            "InstanceNorm", "feature_axes", self.feature_axes, shape, self.num_features
        )
        if 0 in features:
            raise ValueError(
                f"InstanceNorm: feature_axes={self.feature_axes!r} includes the leading "
                f"axis of the input of shape {shape}, which is the batch axis. Give inputs "
                "a leading batch axis (x[None] for one example), or other feature_axes."
            )
        reduction = tuple(a for a in range(1, len(shape)) if a not in features)
        mask = _checked_mask("InstanceNorm", mask, shape)
        return self._normalize_over(x, reduction, features, mask)


class BatchNorm(Module):
    """Batch normalization: normalize each feature over the batch, keeping running averages.

    In training mode (`use_running_average=False`, how Modules start; `model.train()`)
    the mean and variance of each feature are taken over every axis but `axis` (and over
    the named axis `axis_name`, if set), used to normalize, and folded into the running
    averages, the BatchStats `mean` and `var`, in place:
    `mean = momentum * mean + (1 - momentum) * batch_mean` (likewise `var`). In evaluation
    mode (`use_running_average=True`; `model.eval()`) the running averages are used and
    nothing changes. Then `y = (x - mean) / sqrt(var + epsilon) * scale + bias`.

    The running averages are updated eagerly and inside `pytree_graph.jit` (which writes
    them back to the caller's model). To share batch statistics across a vectorised or
    parallel axis, give it a name (`pytree_graph.vmap(..., axis_name="batch")` with the
    Params and BatchStats not mapped) and pass the same `axis_name` here.

    Equinox's way works too: called as `y, state = norm(x, state)` with a `State` (from
    `make_with_state`), the layer reads the running averages from the State and returns
    the updated State, leaving its Variables as they are. Under
    `filter_vmap(model, in_axes=(0, None), out_axes=(0, None), axis_name="batch")` with
    `axis_name="batch"` here, each example is then normalized with the statistics of the
    whole batch, as Equinox's `BatchNorm` is.

    Arguments:
        num_features: the number of features (the size of the input's `axis`).
        use_running_average: start in evaluation mode.
        axis: the feature axis (or axes); statistics are taken over all the others.
        momentum: the decay of the running averages, in [0, 1].
        epsilon: added to the variance before the square root.
        dtype: the dtype to compute in and return (None: promote).
        param_dtype: the dtype of `scale` and `bias` (the running averages are float32).
        use_bias: whether to add the learned `bias`.
        use_scale: whether to multiply by the learned `scale`.
        bias_init: initializer of `bias`.
        bias_sharding: the same for `bias`.
        bias_metadata: more metadata for `bias`'s Param (see `scale_metadata`).
        scale_init: initializer of `scale`.
        scale_sharding: how to split `scale` over a device mesh, e.g. `("model",)` (see
            `Linear`'s `kernel_sharding`).
        scale_metadata: more metadata for `scale`'s Param, a mapping of names to
            hashable values (see `Linear`'s `kernel_metadata`).
        axis_name: also average the batch statistics over this named axis.
        use_fast_variance: compute the variance as `E[x^2] - E[x]^2` (one pass).
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import BatchNorm
        >>> norm = BatchNorm(2, momentum=0.5, rngs=0)
        >>> x = jnp.array([[0.0, 4.0], [2.0, 6.0]])
        >>> y = norm(x)  # training mode: batch mean [1, 5] and variance [1, 1]
        >>> bool(jnp.allclose(y, jnp.array([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-4))
        True
        >>> norm.mean.value.tolist(), norm.var.value.tolist()  # 0.5 * old + 0.5 * batch
        ([0.5, 2.5], [1.0, 1.0])
        >>> y = norm.eval()(x)  # evaluation mode: the running averages, unchanged
        >>> bool(jnp.allclose(y, x - jnp.array([0.5, 2.5]), atol=1e-4))
        True
    """

    # The Variables an Equinox-style State holds for it (see `make_with_state`).
    _state_variables = ("mean", "var")

    def __init__(
        self,
        num_features: int,
        *,
        use_running_average: bool = False,
        axis: Axes = -1,
        momentum: float = 0.99,
        epsilon: float = 1e-5,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: initializers.Initializer = initializers.zeros,
        bias_sharding: Any = None,
        bias_metadata: Mapping[str, Any] | None = None,
        scale_init: initializers.Initializer = initializers.ones,
        scale_sharding: Any = None,
        scale_metadata: Mapping[str, Any] | None = None,
        axis_name: Any = None,
        use_fast_variance: bool = True,
        rngs: Any = None,
    ):
        check_features("BatchNorm", num_features=num_features)
        if not isinstance(use_running_average, bool):
            raise TypeError(
                "BatchNorm: use_running_average must be True or False, got "
                f"{use_running_average!r}."
            )
        self.momentum = check_number("BatchNorm", "momentum", momentum, 0.0, 1.0)
        self.epsilon = check_number("BatchNorm", "epsilon", epsilon, 0.0, math.inf)
        self.axis = _check_axes("BatchNorm", "axis", axis)
        rngs = as_rngs(rngs, "BatchNorm")
        self.mean = BatchStat(jnp.zeros((num_features,), jnp.float32))
        self.var = BatchStat(jnp.ones((num_features,), jnp.float32))
        self.scale, self.bias = _scale_and_bias(
            "BatchNorm",
            num_features,
            param_dtype,
            rngs,
            (scale_init, scale_sharding, scale_metadata) if use_scale else None,
            (bias_init, bias_sharding, bias_metadata) if use_bias else None,
        )
        self.num_features = num_features
        self.use_running_average = use_running_average
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.use_bias = use_bias
        self.use_scale = use_scale
        self.axis_name = axis_name
        self.use_fast_variance = use_fast_variance
        # The key of its entry in an Equinox-style State (see make_with_state).
        self.state_key = None

    def set_view(self, use_running_average: bool | None = None) -> None:
        """What `pytree_graph.view` (and `view_info`) set on a BatchNorm layer.

        Arguments:
            use_running_average: if True, the stored batch statistics will be
                used instead of computing the batch statistics on the input.
        """
        if use_running_average is not None:
            self.use_running_average = use_running_average

    def __call__(
        self,
        x: jax.Array,
        state: State | bool | None = None,
        *,
        use_running_average: bool | None = None,
        mask: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, State]:
        """Normalize `x`; the result has the shape of `x`.

        Arguments:
            x: the input, with `num_features` features along `axis`.
            state: None (the running averages are the layer's Variables, updated in
                place), or a `State` holding them, Equinox's way: the call then returns
                `(y, new_state)` and leaves the Variables as they are. A bool here is
                `use_running_average`, given by position as in Flax NNX.
            use_running_average: override the layer's mode for this call (True: use
                and keep the running averages; False: use batch statistics and update
                the running averages).
            mask: None, or booleans broadcastable to `x`'s shape: only the entries it
                keeps count in the batch statistics, as Flax NNX's.

        Returns:
            The normalized input; with a `state`, the pair `(y, new_state)`.
        """
        if isinstance(state, bool):
            if use_running_average is not None:
                raise TypeError(
                    "BatchNorm: use_running_average was given twice, by position "
                    f"({state}) and by keyword ({use_running_average})."
                )
            state, use_running_average = None, state
        if state is not None and not isinstance(state, State):
            raise TypeError(
                "BatchNorm: the second argument is use_running_average (True or False) or "
                "the State of Equinox-style state passing (`y, state = norm(x, state)`), "
                f"got {type(state).__name__} {state!r:.60}."
            )
        if use_running_average is None:
            use_running_average = self.use_running_average
        elif not isinstance(use_running_average, bool):
            raise TypeError(
                "BatchNorm: use_running_average must be True, False or None, got "
                f"{use_running_average!r}."
            )
        shape = jnp.shape(x)
        features = _feature_axes("BatchNorm", "axis", self.axis, shape, self.num_features)
        reduction = tuple(a for a in range(len(shape)) if a not in features)
        if not use_running_average and not reduction and self.axis_name is None:
            raise ValueError(
                f"BatchNorm in training mode needs a batch to take statistics over, but the "
                f"input of shape {shape} has no axis besides the feature axis. Add a batch "
                "axis, name the vmap/pmap axis that holds the batch with axis_name=, or "
                "use the running averages (model.eval() or use_running_average=True)."
            )
        if state is None:
            running_mean, running_var = self.mean.value, self.var.value
        else:
            running = state.get(self)
            running_mean, running_var = running["mean"], running["var"]
        mask = _checked_mask("BatchNorm", mask, shape)
        x, scale, bias = _promoted(x, self.scale, self.bias, self.dtype)
        if use_running_average:
            feature_shape = [shape[a] if a in features else 1 for a in range(len(shape))]
            mean = running_mean.reshape(feature_shape)
            variance = running_var.reshape(feature_shape)
        else:
            mean, variance = _moments(
                x,
                reduction,
                center=True,
                fast_variance=self.use_fast_variance,
                axis_name=self.axis_name,
                mask=mask,
            )
            running_mean = self._running_average(running_mean, mean)
            running_var = self._running_average(running_var, variance)
            if state is None:
                self.mean.value, self.var.value = running_mean, running_var
            else:
                state = state.set(self, {"mean": running_mean, "var": running_var})
        y = _normalize(x, mean, variance, scale, bias, features, self.epsilon)
        return y if state is None else (y, state)

    def _running_average(self, running: jax.Array, batch: jax.Array) -> jax.Array:
        """The running average after one more batch (no gradient; dtype kept)."""
        updated = self.momentum * running + (1.0 - self.momentum) * batch.reshape(-1)
        return lax.stop_gradient(updated).astype(running.dtype)
