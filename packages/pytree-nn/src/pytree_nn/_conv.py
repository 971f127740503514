"""Convolutions: `Conv` and `ConvTranspose`, channels-last, over 1, 2 or 3 spatial dims."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import initializers
from ._checks import check_features, check_input, check_weight
from ._dtypes import add_bias, check_preferred_element_type, promote_dtype
from ._linear import default_kernel_init, kernel_and_bias
from ._module import Module
from ._rngs import as_rngs

PaddingLike = str | int | Sequence[int | Sequence[int]]

_CONV_PADDINGS = ("SAME", "VALID", "CIRCULAR", "REFLECT", "CAUSAL")
_TRANSPOSE_PADDINGS = ("SAME", "VALID", "CIRCULAR", "CAUSAL")
_SPATIAL_NAMES = {1: "length", 2: "height, width", 3: "depth, height, width"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def kernel_size_tuple(
    layer: str, kernel_size: Any, name: str = "kernel_size", int_is_1d: bool = True
) -> tuple[int, ...]:
    """`kernel_size` as a tuple of positive ints; an int means one spatial dimension."""
    if int_is_1d and _is_int(kernel_size):
        kernel_size = (kernel_size,)
    if (
        isinstance(kernel_size, str)
        or not isinstance(kernel_size, Sequence)
        or not all(_is_int(k) for k in kernel_size)
    ):
        allowed = "an int (one spatial dimension) or a sequence" if int_is_1d else "a sequence"
        raise TypeError(
            f"{layer}: {name} must be {allowed} of ints, one per spatial dimension, e.g. "
            f"(3, 3) for images; got {kernel_size!r}."
        )
    if not kernel_size or any(k < 1 for k in kernel_size):
        raise ValueError(
            f"{layer}: {name} must hold at least one size, all positive; got {kernel_size!r}."
        )
    return tuple(int(k) for k in kernel_size)


def _one_if_none(value: Any) -> Any:
    """Flax NNX's `None` for strides and dilations: 1 in every spatial dimension."""
    return 1 if value is None else value


def spatial_tuple(layer: str, name: str, value: Any, rank: int) -> tuple[int, ...]:
    """`value` as `rank` positive ints: an int is used for every spatial dimension."""
    if _is_int(value):
        value = (value,) * rank
    if (
        isinstance(value, str)
        or not isinstance(value, Sequence)
        or not all(_is_int(v) for v in value)
    ):
        raise TypeError(
            f"{layer}: {name} must be an int or a sequence of {rank} ints (one per spatial "
            f"dimension), got {value!r}."
        )
    if len(value) != rank:
        raise ValueError(
            f"{layer}: {name}={value!r} has {len(value)} entries, but there are {rank} spatial "
            f"dimensions; give one int per spatial dimension, or a single int for all."
        )
    if any(v < 1 for v in value):
        raise ValueError(f"{layer}: {name} must be positive, got {value!r}.")
    return tuple(int(v) for v in value)


def canonical_padding(
    layer: str, padding: Any, rank: int, modes: tuple[str, ...]
) -> str | tuple[tuple[int, int], ...]:
    """A padding mode (upper-cased) or `rank` `(low, high)` pairs of ints >= 0."""
    hint = (
        f"use one of {', '.join(repr(m) for m in modes)}, an int, or a sequence of {rank} "
        "ints or (low, high) pairs, one per spatial dimension"
    )
    if isinstance(padding, str):
        if padding.upper() not in modes:
            raise ValueError(f"{layer}: unknown padding {padding!r}; {hint}.")
        return padding.upper()
    if _is_int(padding):
        padding = (padding,) * rank
    if not isinstance(padding, Sequence):
        raise TypeError(f"{layer}: padding must be a string, an int or a sequence; {hint}.")
    pairs = []
    for entry in padding:
        if _is_int(entry):
            entry = (entry, entry)
        if (
            isinstance(entry, str)
            or not isinstance(entry, Sequence)
            or len(entry) != 2
            or not all(_is_int(p) for p in entry)
        ):
            raise ValueError(f"{layer}: bad padding {padding!r}; {hint}.")
        pairs.append((int(entry[0]), int(entry[1])))
    if len(pairs) != rank:
        raise ValueError(
            f"{layer}: padding={padding!r} has {len(pairs)} entries, but there are {rank} "
            f"spatial dimensions; {hint} (for one dimension, e.g. ((1, 2),))."
        )
    if any(p < 0 for pair in pairs for p in pair):
        raise ValueError(f"{layer}: padding amounts must be >= 0, got {padding!r}.")
    return tuple(pairs)


def merge_batch_dims(layer: str, x: Any, rank: int) -> tuple[jax.Array, tuple[int, ...]]:
    """`x` reshaped to one batch axis `(batch, *spatial, features)`, and its batch shape."""
    x = jnp.asarray(x)
    if x.ndim < rank + 1:
        names = _SPATIAL_NAMES.get(rank, f"{rank} spatial dims")
        raise ValueError(
            f"{layer} over {rank} spatial dimension(s) expects inputs of shape "
            f"(*batch, {names}, features), got an input of shape {x.shape}."
        )
    batch_shape = x.shape[: x.ndim - rank - 1]
    if 0 in x.shape[x.ndim - rank - 1 : -1]:
        raise ValueError(
            f"{layer}: the input of shape {x.shape} has an empty spatial axis; each of its "
            f"{rank} spatial axes (just before the features) needs at least one element."
        )
    return x.reshape((math.prod(batch_shape), *x.shape[x.ndim - rank - 1 :])), batch_shape


def check_not_empty(layer: str, spatial: tuple[int, ...], y: jax.Array, fix: str) -> None:
    """Refuse an output `(batch, *spatial, features)` with an empty spatial axis."""
    if 0 in y.shape[1:-1]:
        raise ValueError(
            f"{layer}: an input of spatial shape {spatial} gives an empty output (spatial "
            f"shape {y.shape[1:-1]}); {fix}."
        )


def _dimension_numbers(rank: int) -> lax.ConvDimensionNumbers:
    """Channels-last inputs and outputs, and a kernel of shape `(*spatial, in, out)`."""
    ndim = rank + 2
    features = (0, ndim - 1, *range(1, ndim - 1))
    kernel = (ndim - 1, ndim - 2, *range(ndim - 2))
    return lax.ConvDimensionNumbers(features, kernel, features)


def _dilated_kernel_size(layer: Any) -> list[int]:
    """The spatial size of `layer`'s kernel once `kernel_dilation` spreads it out."""
    return [(k - 1) * d + 1 for k, d in zip(layer.kernel_size, layer.kernel_dilation, strict=True)]


def _check_causal(layer: str, padding: Any, kernel_size: tuple[int, ...]) -> None:
    """Refuse `"CAUSAL"` padding for more than one spatial dimension: it pads time only."""
    if padding == "CAUSAL" and len(kernel_size) != 1:
        raise ValueError(
            f"{layer}: padding='CAUSAL' is for 1-D convolutions, but kernel_size={kernel_size} "
            "has several spatial dimensions; give explicit (low, high) pairs instead."
        )


def _promoted_params(layer: Any, inputs: jax.Array) -> list[Any]:
    """`inputs`, `layer`'s kernel (times its `mask`, if any) and bias, in one dtype."""
    kernel = _checked_kernel(layer)
    if layer.mask is not None:
        kernel = kernel * layer.mask.astype(kernel.dtype)
    bias = layer.bias.value if layer.bias is not None else None
    return promote_dtype(inputs, kernel, bias, dtype=layer.dtype)


def _checked_kernel(layer: Any) -> jax.Array:
    """`layer`'s kernel value, checked against the shape its sizes give (a local shard of it
    inside `shard_map`)."""
    if isinstance(layer, ConvTranspose):
        features = (layer.in_features, layer.out_features)
        expected = (*layer.kernel_size, *(features[::-1] if layer.transpose_kernel else features))
        groups = f", transpose_kernel={layer.transpose_kernel}"
    else:
        groups = layer.feature_group_count
        expected = (*layer.kernel_size, layer.in_features // groups, layer.out_features)
        groups = f", feature_group_count={groups}" if groups != 1 else ""
    sizes = (
        f"kernel_size={layer.kernel_size}, in_features={layer.in_features}, "
        f"out_features={layer.out_features}{groups}"
    )
    return check_weight(layer, "kernel", sizes, expected)


def _shard(local: int, layer: Any) -> int | None:
    """The input size a local shard of the kernel takes (inside `shard_map`), or None
    where the kernel is whole."""
    return None if local == layer.in_features else local


def _check_mask(layer: str, mask: Any, kernel_shape: tuple[int, ...]) -> jax.Array | None:
    """The mask as an array of the kernel's shape (or None)."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.shape != kernel_shape:
        raise ValueError(
            f"{layer}: mask must have the kernel's shape {kernel_shape}, got {mask.shape}."
        )
    return mask


class Conv(Module):
    """A convolution over channels-last inputs (`jax.lax.conv_general_dilated`).

    The input has shape `(*batch, *spatial, in_features)`, with as many spatial dimensions
    as `kernel_size` has entries and any number of leading batch dimensions (none works
    too); the output has shape `(*batch, *out_spatial, out_features)`. The kernel has
    shape `(*kernel_size, in_features // feature_group_count, out_features)` (HWIO for
    images).

    Arguments:
        in_features: size of the input's last axis (0 allowed: the output is the bias).
        out_features: size of the output's last axis (0 allowed: an empty output).
        kernel_size: the kernel's spatial shape, e.g. `(3, 3)` for images; a single int
            means a 1-D convolution (`3` is `(3,)`).
        strides: the step between windows: an int, or one int per spatial dimension
            (None is 1, as in Flax NNX).
        padding: `"SAME"` (the output size is the input size divided by the stride,
            rounded up), `"VALID"` (no padding), `"CIRCULAR"` (periodic boundaries),
            `"REFLECT"` (mirrored boundaries), `"CAUSAL"` (1-D only: pad on the left, so
            output `t` sees inputs up to `t`), an int (the same on both sides of every
            dimension), or one int or `(low, high)` pair per spatial dimension.
        input_dilation: spacing inserted between input elements (a transposed convolution
            with that stride): an int, or one per spatial dimension. Combine it with
            explicit padding rather than `"SAME"`.
        kernel_dilation: spacing between kernel elements ("atrous" convolution); None
            is 1 here and for `input_dilation`, as in Flax NNX.
        feature_group_count: split the features into this many groups, each convolved
            with its own slice of the kernel (`in_features` for a depthwise convolution).
        use_bias: whether to add a bias.
        mask: an array of the kernel's shape that multiplies the kernel at each call
            (e.g. to keep a convolution causal); a constant, not a `Param`.
        dtype: the dtype to compute in (None: promote the input's and the parameters').
        param_dtype: the dtype of the parameters.
        precision: the convolution's precision (`jax.lax.Precision`), or None.
        preferred_element_type: the dtype the convolution accumulates in and returns
            (None: the operands' dtype), e.g. `jnp.float32` for bfloat16 inputs; the bias
            is then added in the wider of this dtype and the bias's, as in Flax NNX.
        kernel_init: initializer of the kernel.
        bias_init: initializer of the bias, of shape `(out_features,)`.
        kernel_sharding: how to split the kernel over a device mesh, one entry per
            dimension (a mesh axis name, a tuple of names or None), as for `Linear`.
        bias_sharding: the same for the bias.
        kernel_metadata: more metadata for the kernel's Param (see `Linear`).
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Conv
        >>> conv = Conv(3, 8, (3, 3), rngs=0)
        >>> conv.kernel.value.shape, conv(jnp.ones((2, 16, 16, 3))).shape
        ((3, 3, 3, 8), (2, 16, 16, 8))
        >>> Conv(3, 8, (3, 3), strides=2, padding="VALID", rngs=0)(jnp.ones((9, 9, 3))).shape
        (4, 4, 8)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] | None = 1,
        *,
        padding: PaddingLike = "SAME",
        input_dilation: int | Sequence[int] | None = 1,
        kernel_dilation: int | Sequence[int] | None = 1,
        feature_group_count: int = 1,
        use_bias: bool = True,
        mask: Any = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        preferred_element_type: Any = None,
        kernel_init: initializers.Initializer = default_kernel_init,
        bias_init: initializers.Initializer = initializers.zeros,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        # Zero features are allowed, as in Linear.
        check_features("Conv", smallest=0, in_features=in_features, out_features=out_features)
        check_features("Conv", feature_group_count=feature_group_count)
        kernel_size = kernel_size_tuple("Conv", kernel_size)
        rank = len(kernel_size)
        strides = spatial_tuple("Conv", "strides", _one_if_none(strides), rank)
        input_dilation = spatial_tuple("Conv", "input_dilation", _one_if_none(input_dilation), rank)
        kernel_dilation = spatial_tuple(
            "Conv", "kernel_dilation", _one_if_none(kernel_dilation), rank
        )
        padding = canonical_padding("Conv", padding, rank, _CONV_PADDINGS)
        for name, size in (("in_features", in_features), ("out_features", out_features)):
            if size % feature_group_count:
                raise ValueError(
                    f"Conv: {name}={size} is not divisible by "
                    f"feature_group_count={feature_group_count}; each group needs the same "
                    "number of features."
                )
        _check_causal("Conv", padding, kernel_size)
        check_preferred_element_type("Conv", preferred_element_type)
        if padding == "SAME" and any(d > 1 for d in input_dilation):
            raise ValueError(
                f"Conv: padding='SAME' cannot be combined with input_dilation={input_dilation}; "
                "give explicit (low, high) pairs, or use ConvTranspose."
            )
        kernel_shape = (*kernel_size, in_features // feature_group_count, out_features)
        mask = _check_mask("Conv", mask, kernel_shape)
        rngs = as_rngs(rngs, "Conv")
        self.kernel, self.bias = kernel_and_bias(
            "Conv",
            kernel_init,
            bias_init,
            kernel_shape,
            out_features,
            use_bias,
            param_dtype,
            rngs,
            kernel_sharding,
            bias_sharding,
            kernel_metadata,
            bias_metadata,
        )
        self.in_features = in_features
        self.out_features = out_features
        self.kernel_size = kernel_size
        self.strides = strides
        self.padding = padding
        self.input_dilation = input_dilation
        self.kernel_dilation = kernel_dilation
        self.feature_group_count = feature_group_count
        self.use_bias = use_bias
        self.mask = mask
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.preferred_element_type = preferred_element_type

    def __call__(self, x: jax.Array, out_sharding: Any = None) -> jax.Array:
        """Convolve `x`, of shape `(*batch, *spatial, in_features)`.

        Arguments:
            x: the input.
            out_sharding: None, or the sharding of the output (a `PartitionSpec` or a
                `NamedSharding`, one entry per output dimension), under a mesh with
                explicit axes (`jax.sharding.AxisType.Explicit`), as in Flax NNX: given to
                `jax.lax.conv_general_dilated` for inputs with one batch dimension, else
                applied to the output with `jax.sharding.reshard`.

        Returns:
            The output, of shape `(*batch, *out_spatial, out_features)`.
        """
        inputs, batch_shape = merge_batch_dims("Conv", x, len(self.kernel_size))
        spatial = inputs.shape[1:-1]
        inputs, kernel, bias = _promoted_params(self, inputs)
        local = kernel.shape[-2] * self.feature_group_count
        check_input("Conv", x, -1, self.in_features, "in_features", _shard(local, self))
        padding = self.padding
        if padding in ("CIRCULAR", "REFLECT", "CAUSAL"):
            sizes = _dilated_kernel_size(self)
            if padding == "CAUSAL":
                pads = [(sizes[0] - 1, 0)]
            else:
                pads = [((k - 1) // 2, k // 2) for k in sizes]
            mode = {"CIRCULAR": "wrap", "REFLECT": "reflect", "CAUSAL": "constant"}[padding]
            inputs = jnp.pad(inputs, [(0, 0), *pads, (0, 0)], mode=mode)
            padding = "VALID"
        if padding == "VALID":
            # Explicit zeros: lax takes no padding string together with input dilation.
            padding = ((0, 0),) * len(self.kernel_size)
        y = lax.conv_general_dilated(
            inputs,
            kernel,
            self.strides,
            padding,
            lhs_dilation=self.input_dilation,
            rhs_dilation=self.kernel_dilation,
            dimension_numbers=_dimension_numbers(len(self.kernel_size)),
            feature_group_count=self.feature_group_count,
            precision=self.precision,
            preferred_element_type=self.preferred_element_type,
            # The merged batch axis is the input's own only where it has one batch axis.
            **(
                {"out_sharding": out_sharding}
                if out_sharding is not None and len(batch_shape) == 1
                else {}
            ),
        )
        check_not_empty(
            "Conv", spatial, y, "use a smaller kernel_size or kernel_dilation, or more padding"
        )
        y = add_bias(y, bias)
        y = y.reshape(batch_shape + y.shape[1:])
        if out_sharding is not None and len(batch_shape) != 1:
            y = jax.sharding.reshard(y, out_sharding)
        return y


def _fold_periodic(y: jax.Array, periods: Sequence[int], shifts: Sequence[int]) -> jax.Array:
    """Sum `y` onto `periods` along each spatial axis: entry `u` lands at `(u - shift) % period`."""
    for axis, (period, shift) in enumerate(zip(periods, shifts, strict=True), start=1):
        size = y.shape[axis]
        repeats = -(-size // period)
        pads = [(0, 0)] * y.ndim
        pads[axis] = (0, repeats * period - size)
        y = jnp.pad(y, pads)
        y = y.reshape((*y.shape[:axis], repeats, period, *y.shape[axis + 1 :])).sum(axis)
        y = jnp.roll(y, -shift, axis=axis)
    return y


class ConvTranspose(Module):
    """A transposed convolution over channels-last inputs (`jax.lax.conv_transpose`).

    It spreads each input element over a window of the output, `strides` apart, so the
    spatial size grows by the stride: the shape counterpart of a strided `Conv`, for
    upsampling. With `transpose_kernel=True` the kernel is read as the kernel of the
    `Conv` it undoes, of shape `(*kernel_size, out_features, in_features)`, and the layer
    is that convolution's transpose (its gradient with respect to its input) for matching
    padding; otherwise the kernel has shape `(*kernel_size, in_features, out_features)`.

    Output spatial size per dimension, for an input of size `n`, stride `s` and dilated
    kernel size `k = (kernel_size - 1) * kernel_dilation + 1`:

    - `"SAME"`, `"CIRCULAR"` and `"CAUSAL"`: `n * s`;
    - `"VALID"`: `n * s + max(k - s, 0)`;
    - `(low, high)` pairs: `(n - 1) * s + 1 + low + high - k + 1` (the pairs pad the input
      after `s - 1` zeros are put between its elements, unlike PyTorch's `padding`).

    Arguments:
        in_features: size of the input's last axis (0 allowed).
        out_features: size of the output's last axis (0 allowed).
        kernel_size: the kernel's spatial shape; a single int means one dimension.
        strides: the upsampling factor: an int, or one int per spatial dimension (None
            is 1, as in Flax NNX).
        padding: `"SAME"`, `"VALID"`, `"CIRCULAR"` (periodic: with
            `transpose_kernel=True`, exactly the transpose of `Conv(padding="CIRCULAR")`;
            without it, the `"SAME"` output away from the wrap-around),
            `"CAUSAL"` (1-D only: output `t` sees inputs up to `t // strides`), an int, or
            one int or `(low, high)` pair per spatial dimension.
        kernel_dilation: spacing between kernel elements (None is 1).
        use_bias: whether to add a bias.
        mask: an array of the kernel's shape that multiplies the kernel at each call.
        dtype: the dtype to compute in (None: promote the input's and the parameters').
        param_dtype: the dtype of the parameters.
        precision: the convolution's precision (`jax.lax.Precision`), or None.
        preferred_element_type: the dtype the convolution accumulates in and returns
            (None: the operands' dtype), e.g. `jnp.float32` for bfloat16 inputs; the bias
            is then added in the wider of this dtype and the bias's, as in Flax NNX.
        kernel_init: initializer of the kernel.
        bias_init: initializer of the bias, of shape `(out_features,)`.
        transpose_kernel: read the kernel as a `Conv` kernel, flipped and with its feature
            axes swapped (see above).
        kernel_sharding: how to split the kernel over a device mesh, one entry per
            dimension (a mesh axis name, a tuple of names or None), as for `Linear`.
        bias_sharding: the same for the bias.
        kernel_metadata: more metadata for the kernel's Param (see `Linear`).
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import ConvTranspose
        >>> up = ConvTranspose(8, 3, (4, 4), strides=2, rngs=0)
        >>> up.kernel.value.shape, up(jnp.ones((2, 16, 16, 8))).shape
        ((4, 4, 8, 3), (2, 32, 32, 3))
        >>> ConvTranspose(8, 3, 3, strides=2, padding="VALID", rngs=0)(jnp.ones((5, 8))).shape
        (11, 3)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] | None = 1,
        *,
        padding: PaddingLike = "SAME",
        kernel_dilation: int | Sequence[int] | None = 1,
        use_bias: bool = True,
        mask: Any = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        preferred_element_type: Any = None,
        kernel_init: initializers.Initializer = default_kernel_init,
        bias_init: initializers.Initializer = initializers.zeros,
        transpose_kernel: bool = False,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        layer = "ConvTranspose"
        check_features(layer, smallest=0, in_features=in_features, out_features=out_features)
        kernel_size = kernel_size_tuple(layer, kernel_size)
        rank = len(kernel_size)
        strides = spatial_tuple(layer, "strides", _one_if_none(strides), rank)
        kernel_dilation = spatial_tuple(
            layer, "kernel_dilation", _one_if_none(kernel_dilation), rank
        )
        padding = canonical_padding(layer, padding, rank, _TRANSPOSE_PADDINGS)
        _check_causal(layer, padding, kernel_size)
        check_preferred_element_type(layer, preferred_element_type)
        features = (out_features, in_features) if transpose_kernel else (in_features, out_features)
        kernel_shape = (*kernel_size, *features)
        mask = _check_mask(layer, mask, kernel_shape)
        rngs = as_rngs(rngs, layer)
        self.kernel, self.bias = kernel_and_bias(
            layer,
            kernel_init,
            bias_init,
            kernel_shape,
            out_features,
            use_bias,
            param_dtype,
            rngs,
            kernel_sharding,
            bias_sharding,
            kernel_metadata,
            bias_metadata,
        )
        self.in_features = in_features
        self.out_features = out_features
        self.kernel_size = kernel_size
        self.strides = strides
        self.padding = padding
        self.kernel_dilation = kernel_dilation
        self.use_bias = use_bias
        self.mask = mask
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.preferred_element_type = preferred_element_type
        self.transpose_kernel = transpose_kernel

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the layer to `x`, of shape `(*batch, *spatial, in_features)`."""
        inputs, batch_shape = merge_batch_dims("ConvTranspose", x, len(self.kernel_size))
        inputs, kernel, bias = _promoted_params(self, inputs)
        local = kernel.shape[-1 if self.transpose_kernel else -2]
        check_input("ConvTranspose", x, -1, self.in_features, "in_features", _shard(local, self))
        sizes = _dilated_kernel_size(self)
        padding = self.padding
        if padding == "CIRCULAR":
            padding = "VALID"
        elif padding == "CAUSAL":
            padding = ((sizes[0] - 1, self.strides[0] - 1),)
        y = lax.conv_transpose(
            inputs,
            kernel,
            self.strides,
            padding,
            rhs_dilation=self.kernel_dilation,
            dimension_numbers=_dimension_numbers(len(self.kernel_size)),
            transpose_kernel=self.transpose_kernel,
            precision=self.precision,
            preferred_element_type=self.preferred_element_type,
        )
        if self.padding == "CIRCULAR":
            # The full (VALID) output folded back onto one period of n * s. The shift makes
            # the output the exact transpose of a circular Conv with `transpose_kernel`, and
            # line up with the "SAME" output away from the wrap-around without it.
            periods = [n * s for n, s in zip(inputs.shape[1:-1], self.strides, strict=True)]
            if self.transpose_kernel:
                shifts = [(k - 1) // 2 for k in sizes]
            else:
                shifts = [max(k - s, 0) // 2 for k, s in zip(sizes, self.strides, strict=True)]
            y = _fold_periodic(y, periods, shifts)
        check_not_empty(
            "ConvTranspose", inputs.shape[1:-1], y, "use more padding or a smaller kernel_size"
        )
        y = add_bias(y, bias)
        return y.reshape(batch_shape + y.shape[1:])
