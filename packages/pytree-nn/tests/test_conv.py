"""Conv, ConvTranspose and pooling, against references written with NumPy loops."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_nn import Conv, ConvTranspose, Rngs, avg_pool, max_pool, min_pool

# ------------------------------------------------------------------- references (NumPy)


def _dilated_size(k, d):
    return (k - 1) * d + 1


def _same_pads(size, window, stride):
    """TensorFlow's SAME: output ceil(size / stride), the extra padding on the high side."""
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return (total // 2, total - total // 2)


def ref_conv(x, w, strides, pads, lhs_dil=None, rhs_dil=None, groups=1):
    """Correlate `x` (B, *S, C) with `w` (*K, C // groups, O): an explicit sum over offsets."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    rank = w.ndim - 2
    lhs_dil = lhs_dil or (1,) * rank
    rhs_dil = rhs_dil or (1,) * rank
    spatial = x.shape[1:-1]
    dilated = np.zeros(
        (
            x.shape[0],
            *(_dilated_size(n, d) for n, d in zip(spatial, lhs_dil, strict=True)),
            x.shape[-1],
        )
    )
    dilated[(slice(None), *(slice(None, None, d) for d in lhs_dil))] = x
    padded = np.pad(dilated, [(0, 0), *pads, (0, 0)])
    kernel = w.shape[:rank]
    out = [
        (padded.shape[1 + i] - _dilated_size(kernel[i], rhs_dil[i])) // strides[i] + 1
        for i in range(rank)
    ]
    in_group, out_group = x.shape[-1] // groups, w.shape[-1] // groups
    y = np.zeros((x.shape[0], *out, w.shape[-1]))
    for offsets in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(o * d, o * d + (m - 1) * s + 1, s)
            for o, d, m, s in zip(offsets, rhs_dil, out, strides, strict=True)
        )
        patch = padded[(slice(None), *window)]
        for g in range(groups):
            y[..., g * out_group : (g + 1) * out_group] += (
                patch[..., g * in_group : (g + 1) * in_group]
                @ w[offsets][:, g * out_group : (g + 1) * out_group]
            )
    return y


def ref_conv_adjoint(y, w, strides, pads, rhs_dil, in_spatial, circular=False):
    """The transpose of `ref_conv(x, w, strides, pads, rhs_dil=...)` applied to `y`, scattering
    each output back onto the (padded) input; `circular` folds the padding around instead."""
    y, w = np.asarray(y, np.float64), np.asarray(w, np.float64)
    rank = w.ndim - 2
    kernel = w.shape[:rank]
    padded_shape = [n + lo + hi for n, (lo, hi) in zip(in_spatial, pads, strict=True)]
    x = np.zeros((y.shape[0], *padded_shape, w.shape[-2]))
    out = y.shape[1:-1]
    for offsets in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(o * d, o * d + (m - 1) * s + 1, s)
            for o, d, m, s in zip(offsets, rhs_dil, out, strides, strict=True)
        )
        x[(slice(None), *window)] += y @ w[offsets].T
    for axis, (n, (lo, _)) in enumerate(zip(in_spatial, pads, strict=True), start=1):
        if circular:
            folded = np.zeros((*x.shape[:axis], n, *x.shape[axis + 1 :]))
            index = (np.arange(x.shape[axis]) - lo) % n
            np.add.at(np.moveaxis(folded, axis, 0), index, np.moveaxis(x, axis, 0))
            x = folded
        else:
            x = np.take(x, np.arange(lo, lo + n), axis=axis)
    return x


def ref_pool(x, window, strides, pads, fill, reduce):
    """Reduce each window of `x` (B, *S, C) with `reduce`, padding with `fill`."""
    x = np.asarray(x, np.float64)
    padded = np.pad(x, [(0, 0), *pads, (0, 0)], constant_values=fill)
    out = [(padded.shape[1 + i] - window[i]) // strides[i] + 1 for i in range(len(window))]
    y = None
    for offsets in itertools.product(*(range(k) for k in window)):
        part = padded[
            (
                slice(None),
                *(
                    slice(o, o + (m - 1) * s + 1, s)
                    for o, m, s in zip(offsets, out, strides, strict=True)
                ),
            )
        ]
        y = part if y is None else reduce(y, part)
    return y


def random(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def flat(x, rank):
    """`x` with its batch dims merged into one (a leading 1 for unbatched input)."""
    return np.asarray(x).reshape((-1, *np.shape(x)[np.ndim(x) - rank - 1 :]))


def numpy_normal(key, shape, dtype=jnp.float32):
    """Normal values made by NumPy: XLA compiles jax.random for 4-D shapes slowly on CPU."""
    seed = int(jax.random.randint(key, (), 0, 2**30))
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


BIAS = numpy_normal
# Random kernels without slow compiles, and full float32 precision (no TF32 on GPUs).
EXACT = dict(kernel_init=numpy_normal, precision=jax.lax.Precision.HIGHEST)

# ------------------------------------------------------------------------------ Conv

CONV_CASES = [
    # kernel_size, strides, kernel_dilation, input_dilation, groups, batch shape
    ((3,), (1,), (1,), (1,), 1, (2,)),
    ((2,), (2,), (2,), (1,), 2, ()),
    ((4,), (3,), (1,), (1,), 1, (2, 3)),
    ((3, 2), (1, 2), (1, 1), (1, 1), 1, (2,)),
    ((2, 3), (2, 1), (2, 1), (1, 1), 2, ()),
    ((3, 3), (1, 1), (1, 1), (1, 1), 4, (1, 2)),
    ((2, 2, 2), (1, 2, 1), (1, 1, 2), (1, 1, 1), 1, (2,)),
    ((3, 1, 2), (2, 1, 1), (1, 1, 1), (1, 1, 1), 2, ()),
]
PADDINGS = ["SAME", "VALID", "CIRCULAR", "REFLECT", "CAUSAL", 1, "pairs"]


def _ref_padding(padding, x, kernel_size, strides, kernel_dilation):
    """The padded input and the explicit pads that a padding mode stands for."""
    rank = len(kernel_size)
    sizes = [_dilated_size(k, d) for k, d in zip(kernel_size, kernel_dilation, strict=True)]
    x = np.asarray(x, np.float64)
    if padding in ("CIRCULAR", "REFLECT"):
        pads = [(k - 1) // 2 for k in sizes], [k // 2 for k in sizes]
        mode = "wrap" if padding == "CIRCULAR" else "reflect"
        x = np.pad(x, [(0, 0), *zip(*pads, strict=True), (0, 0)], mode=mode)
        return x, [(0, 0)] * rank
    if padding == "CAUSAL":
        return np.pad(x, [(0, 0), (sizes[0] - 1, 0), (0, 0)]), [(0, 0)]
    if padding == "SAME":
        return x, [
            _same_pads(n, k, s) for n, k, s in zip(x.shape[1:-1], sizes, strides, strict=True)
        ]
    if padding == "VALID":
        return x, [(0, 0)] * rank
    if isinstance(padding, int):
        return x, [(padding, padding)] * rank
    return x, list(padding)


@pytest.mark.parametrize(
    ("case", "padding"),
    [(c, p) for c in CONV_CASES for p in PADDINGS if p != "CAUSAL" or len(c[0]) == 1],
    ids=str,
)
def test_conv_matches_reference(case, padding):
    kernel_size, strides, kernel_dilation, input_dilation, groups, batch = case
    rank = len(kernel_size)
    if padding == "pairs":
        padding = tuple((i, 2 - i) for i in range(rank))
    conv = Conv(
        4,
        8,
        kernel_size,
        strides,
        padding=padding,
        kernel_dilation=kernel_dilation,
        input_dilation=input_dilation,
        feature_group_count=groups,
        bias_init=BIAS,
        **EXACT,
        rngs=0,
    )
    assert conv.kernel.value.shape == (*kernel_size, 4 // groups, 8)
    x = random((*batch, *(6,) * rank, 4), seed=1)
    y = conv(x)
    padded, pads = _ref_padding(padding, flat(x, rank), kernel_size, strides, kernel_dilation)
    expected = ref_conv(
        padded, conv.kernel.value, strides, pads, input_dilation, kernel_dilation, groups
    )
    expected = expected + np.asarray(conv.bias.value)
    assert y.shape == (*batch, *expected.shape[1:])
    np.testing.assert_allclose(flat(y, rank), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding", ["VALID", "CIRCULAR", ((2, 1), (0, 1))])
def test_conv_input_dilation_with_padding(padding):
    conv = Conv(3, 2, (2, 3), (1, 2), padding=padding, input_dilation=(2, 3), **EXACT, rngs=0)
    x = random((2, 4, 5, 3))
    padded, pads = _ref_padding(padding, x, (2, 3), (1, 2), (1, 1))
    expected = ref_conv(padded, conv.kernel.value, (1, 2), pads, (2, 3))
    np.testing.assert_allclose(conv(x), expected, rtol=1e-5, atol=1e-5)


def test_conv_output_shapes():
    x = jnp.ones((2, 9, 10, 3))
    assert Conv(3, 5, (3, 3), **EXACT, rngs=0)(x).shape == (2, 9, 10, 5)
    assert Conv(3, 5, (3, 3), 2, **EXACT, rngs=0)(x).shape == (2, 5, 5, 5)
    assert Conv(3, 5, (3, 3), 2, padding="VALID", **EXACT, rngs=0)(x).shape == (2, 4, 4, 5)
    assert Conv(3, 5, (3, 3), padding="CIRCULAR", **EXACT, rngs=0)(x).shape == (2, 9, 10, 5)
    assert Conv(3, 5, (3, 4), padding=((1, 0), 2), **EXACT, rngs=0)(x).shape == (2, 8, 11, 5)
    assert Conv(3, 5, 3, padding="CAUSAL", **EXACT, rngs=0)(jnp.ones((7, 3))).shape == (7, 5)
    # An int kernel_size is a 1-D convolution: earlier axes are batch axes.
    one_d = Conv(3, 5, 3, **EXACT, rngs=0)
    assert one_d.kernel_size == (3,) and one_d(x).shape == (2, 9, 10, 5)


def test_conv_unbatched_and_batch_dims_agree():
    conv = Conv(3, 4, (3, 2), strides=(2, 1), bias_init=BIAS, **EXACT, rngs=0)
    x = random((2, 3, 5, 6, 3))
    y = conv(x)
    assert y.shape == (2, 3, 3, 6, 4)
    np.testing.assert_allclose(conv(x[1, 2]), y[1, 2], rtol=1e-6, atol=1e-6)
    assert conv(jnp.ones((0, 5, 6, 3))).shape == (0, 3, 6, 4)


def test_conv_causal_sees_only_the_past():
    conv = Conv(2, 3, 3, padding="CAUSAL", kernel_dilation=2, **EXACT, rngs=0)
    x = random((8, 2))
    changed = x.at[5].add(1.0)
    diff = np.abs(np.asarray(conv(changed) - conv(x))).sum(-1)
    assert np.all(diff[:5] == 0) and np.all(diff[[5, 7]] > 0)


def test_conv_depthwise_and_mask():
    depthwise = Conv(4, 8, (3,), feature_group_count=4, use_bias=False, **EXACT, rngs=0)
    assert depthwise.kernel.value.shape == (3, 1, 8) and depthwise.bias is None
    x = random((2, 5, 4))
    expected = ref_conv(x, depthwise.kernel.value, (1,), [(1, 1)], groups=4)
    np.testing.assert_allclose(depthwise(x), expected, rtol=1e-5, atol=1e-5)
    # A mask multiplies the kernel; it is a constant, not a parameter.
    mask = np.tril(np.ones((3, 4, 2)))
    masked = Conv(4, 2, (3,), padding="VALID", mask=mask, use_bias=False, **EXACT, rngs=0)
    expected = ref_conv(x, np.asarray(masked.kernel.value) * mask, (1,), [(0, 0)])
    np.testing.assert_allclose(masked(x), expected, rtol=1e-5, atol=1e-5)
    grads = pg.grad(lambda m: m(x).sum())(masked)
    assert list(grads) == ["kernel"]
    assert not isinstance(masked.mask, Param)


def test_conv_dtypes():
    x16 = jnp.ones((1, 5, 5, 3), jnp.bfloat16)
    assert Conv(3, 4, (3, 3), **EXACT, rngs=0)(x16).dtype == jnp.float32
    assert Conv(3, 4, (3, 3), dtype=jnp.bfloat16, **EXACT, rngs=0)(jnp.ones((5, 5, 3))).dtype == (
        jnp.bfloat16
    )
    half = Conv(3, 4, (3, 3), param_dtype=jnp.bfloat16, **EXACT, rngs=0)
    assert half.kernel.value.dtype == half.bias.value.dtype == jnp.bfloat16
    assert half(x16).dtype == jnp.bfloat16
    assert Conv(3, 4, (3, 3), **EXACT, rngs=0)(jnp.ones((5, 5, 3), jnp.int32)).dtype == jnp.float32
    # bfloat16 compute is close to the float32 result.
    conv = Conv(3, 4, (3, 3), **EXACT, rngs=0)
    x = random((5, 5, 3))
    low = Conv(3, 4, (3, 3), dtype=jnp.bfloat16, **EXACT, rngs=0)
    np.testing.assert_allclose(low(x).astype(jnp.float32), conv(x), rtol=0.05, atol=0.05)


def test_conv_is_a_pytree_and_trains():
    highest = jax.lax.Precision.HIGHEST
    conv = Conv(2, 3, (3,), precision=highest, rngs=Rngs(0))  # the default kernel_init
    x = random((4, 6, 2))
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(conv, x), conv(x), rtol=1e-6, atol=1e-6)
    grads = pg.grad(lambda m: (m(x) ** 2).sum())(conv)
    assert grads["kernel"].value.shape == (3, 2, 3) and grads["bias"].value.shape == (3,)

    def loss(w):
        padded = jnp.pad(x, [(0, 0), (1, 1), (0, 0)])
        y = sum(jnp.matmul(padded[:, i : i + 6], w[i], precision=highest) for i in range(3))
        return ((y + conv.bias.value) ** 2).sum()

    expected = jax.grad(loss)(conv.kernel.value)
    np.testing.assert_allclose(grads["kernel"].value, expected, rtol=1e-4, atol=1e-5)


def test_conv_errors():
    with pytest.raises(ValueError, match=r"last dimension is in_features=3"):
        Conv(3, 4, (3, 3), **EXACT, rngs=0)(jnp.ones((5, 5, 4)))
    with pytest.raises(ValueError, match=r"expects inputs of shape \(\*batch, height, width"):
        Conv(3, 4, (3, 3), **EXACT, rngs=0)(jnp.ones((5, 3)))
    with pytest.raises(ValueError, match=r"empty output.*smaller kernel_size"):
        Conv(3, 4, (5,), padding="VALID", **EXACT, rngs=0)(jnp.ones((3, 3)))
    with pytest.raises(ValueError, match=r"input of shape \(2, 0, 3\) has an empty spatial axis"):
        Conv(3, 4, 3, padding="CIRCULAR", **EXACT, rngs=0)(jnp.ones((2, 0, 3)))
    for bad in (3.0, "3", None, (3, 2.0), (True,)):
        with pytest.raises(TypeError, match=r"kernel_size must be an int .* or a sequence"):
            Conv(3, 4, bad, **EXACT, rngs=0)
    for bad in ((), (3, 0)):
        with pytest.raises(ValueError, match="kernel_size must hold at least one size"):
            Conv(3, 4, bad, **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"strides=\(1, 2, 1\) has 3 entries, but there are 2"):
        Conv(3, 4, (3, 3), (1, 2, 1), **EXACT, rngs=0)
    with pytest.raises(TypeError, match="strides must be an int or a sequence of 2 ints"):
        Conv(3, 4, (3, 3), 1.5, **EXACT, rngs=0)
    with pytest.raises(ValueError, match="kernel_dilation must be positive"):
        Conv(3, 4, (3, 3), kernel_dilation=0, **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"input_dilation=.* has 1 entries"):
        Conv(3, 4, (3, 3), input_dilation=(2,), **EXACT, rngs=0)
    with pytest.raises(ValueError, match="in_features=6 is not divisible by feature_group_count=4"):
        Conv(6, 8, 3, feature_group_count=4, **EXACT, rngs=0)
    with pytest.raises(ValueError, match="out_features=6 is not divisible by feature_group_count"):
        Conv(4, 6, 3, feature_group_count=4, **EXACT, rngs=0)
    with pytest.raises(ValueError, match="feature_group_count must be a positive int"):
        Conv(4, 6, 3, feature_group_count=0, **EXACT, rngs=0)
    with pytest.raises(ValueError, match="in_features must be an int >= 0, got -1"):
        Conv(-1, 6, 3, **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"unknown padding 'FULL'; use one of 'SAME', 'VALID'"):
        Conv(3, 4, 3, padding="FULL", **EXACT, rngs=0)
    with pytest.raises(TypeError, match="padding must be a string, an int or a sequence"):
        Conv(3, 4, 3, padding=1.5, **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"bad padding \(\(1, 2, 3\),\)"):
        Conv(3, 4, 3, padding=((1, 2, 3),), **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"has 2 entries, but there are 1 .*\(\(1, 2\),\)"):
        Conv(3, 4, 3, padding=(1, 2), **EXACT, rngs=0)
    with pytest.raises(ValueError, match="padding amounts must be >= 0"):
        Conv(3, 4, (3, 3), padding=((1, -1), 0), **EXACT, rngs=0)
    with pytest.raises(ValueError, match="'CAUSAL' is for 1-D convolutions"):
        Conv(3, 4, (3, 3), padding="CAUSAL", **EXACT, rngs=0)
    with pytest.raises(ValueError, match="'SAME' cannot be combined with input_dilation"):
        Conv(3, 4, (3, 3), input_dilation=2, **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"mask must have the kernel's shape \(3, 3, 4\)"):
        Conv(3, 4, 3, mask=jnp.ones((3, 4)), **EXACT, rngs=0)
    with pytest.raises(TypeError, match="Conv needs `rngs=`"):
        Conv(3, 4, 3)
    # Padding names are case-insensitive.
    assert Conv(3, 4, 3, padding="valid", **EXACT, rngs=0).padding == "VALID"


# --------------------------------------------------------------------- ConvTranspose

TRANSPOSE_CASES = [
    # kernel_size, strides, kernel_dilation, batch shape
    ((3,), (1,), (1,), (2,)),
    ((3,), (2,), (1,), ()),
    ((2,), (3,), (1,), (2, 2)),
    ((4,), (2,), (2,), (1,)),
    ((3, 2), (2, 1), (1, 1), (2,)),
    ((2, 3), (1, 3), (2, 1), ()),
    ((2, 2, 3), (2, 1, 2), (1, 2, 1), (1,)),
]


def _transpose_pads(padding, n, stride, size):
    """Input size and explicit pads of the Conv that a ConvTranspose padding transposes."""
    if padding == "SAME":
        return n * stride, _same_pads(n * stride, size, stride)
    if padding == "VALID":
        return n * stride + max(size - stride, 0), (0, 0)
    return n * stride, ((size - 1) // 2, size // 2)  # CIRCULAR


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=str)
@pytest.mark.parametrize("padding", ["SAME", "VALID", "CIRCULAR"])
def test_conv_transpose_is_the_adjoint_of_conv(case, padding):
    kernel_size, strides, kernel_dilation, batch = case
    rank = len(kernel_size)
    layer = ConvTranspose(
        3,
        2,
        kernel_size,
        strides,
        padding=padding,
        kernel_dilation=kernel_dilation,
        transpose_kernel=True,
        bias_init=BIAS,
        **EXACT,
        rngs=0,
    )
    assert layer.kernel.value.shape == (*kernel_size, 2, 3)
    x = random((*batch, *(4,) * rank, 3), seed=2)
    y = layer(x)
    sizes = [_dilated_size(k, d) for k, d in zip(kernel_size, kernel_dilation, strict=True)]
    spatial, pads = zip(
        *(_transpose_pads(padding, 4, s, k) for s, k in zip(strides, sizes, strict=True)),
        strict=True,
    )
    expected = ref_conv_adjoint(
        flat(x, rank),
        layer.kernel.value,
        strides,
        pads,
        kernel_dilation,
        spatial,
        circular=padding == "CIRCULAR",
    )
    expected = expected + np.asarray(layer.bias.value)
    assert y.shape == (*batch, *expected.shape[1:])
    np.testing.assert_allclose(flat(y, rank), expected, rtol=1e-5, atol=1e-5)
    if padding == "CIRCULAR":
        # Without transpose_kernel the periodic output is folded to line up with "SAME"
        # instead (test_circular_conv_transpose_is_same_away_from_the_wrap_around).
        return
    # Without transpose_kernel, the kernel is read flipped, with its feature axes swapped.
    plain = ConvTranspose(
        3,
        2,
        kernel_size,
        strides,
        padding=padding,
        kernel_dilation=kernel_dilation,
        **EXACT,
        rngs=0,
    )
    assert plain.kernel.value.shape == (*kernel_size, 3, 2)
    flipped = jnp.flip(layer.kernel.value, tuple(range(rank))).swapaxes(-1, -2)
    plain.kernel.value = flipped
    plain.bias.value = layer.bias.value
    np.testing.assert_allclose(plain(x), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose_kernel", [False, True])
@pytest.mark.parametrize("padding", [((2, 0),), ((1, 3),), 2, "CAUSAL"])
def test_conv_transpose_explicit_padding_pads_the_dilated_input(padding, transpose_kernel):
    layer = ConvTranspose(
        2, 3, 3, 2, padding=padding, kernel_dilation=2, transpose_kernel=transpose_kernel, rngs=0
    )
    x = random((2, 5, 2), seed=3)
    kernel = np.asarray(layer.kernel.value)
    if transpose_kernel:
        kernel = np.flip(kernel, 0).swapaxes(-1, -2)
    pads = {"CAUSAL": [(4, 1)], 2: [(2, 2)]}.get(padding, padding)
    expected = ref_conv(x, kernel, (1,), pads, lhs_dil=(2,), rhs_dil=(2,))
    expected = expected + np.asarray(layer.bias.value)
    np.testing.assert_allclose(layer(x), expected, rtol=1e-5, atol=1e-5)
    if padding == "CAUSAL":
        assert layer(x).shape == (2, 10, 3)


def test_conv_transpose_shapes_and_causality():
    x = jnp.ones((2, 7, 3))
    for padding, size in [("SAME", 14), ("CIRCULAR", 14), ("VALID", 15), ("CAUSAL", 14)]:
        assert ConvTranspose(3, 4, 3, 2, padding=padding, **EXACT, rngs=0)(x).shape == (
            2,
            size,
            4,
        )
    assert ConvTranspose(3, 4, 2, 3, padding="VALID", **EXACT, rngs=0)(x).shape == (2, 21, 4)
    assert ConvTranspose(3, 4, 3, 2, padding=1, **EXACT, rngs=0)(x).shape == (2, 13, 4)
    assert ConvTranspose(3, 4, (3, 3), (2, 1), **EXACT, rngs=0)(jnp.ones((5, 6, 3))).shape == (
        10,
        6,
        4,
    )
    causal = ConvTranspose(2, 2, 3, 2, padding="CAUSAL", **EXACT, rngs=0)
    z = random((6, 2))
    diff = np.abs(np.asarray(causal(z.at[3].add(1.0)) - causal(z))).sum(-1)
    assert np.all(diff[:6] == 0) and diff[6] > 0  # input 3 first reaches output 3 * 2


def test_conv_transpose_unbatched_dtypes_and_mask():
    layer = ConvTranspose(3, 2, (2, 2), 2, bias_init=BIAS, **EXACT, rngs=0)
    x = random((2, 3, 4, 4, 3))
    np.testing.assert_allclose(layer(x[1, 2]), layer(x)[1, 2], rtol=1e-6, atol=1e-6)
    assert layer(x.astype(jnp.bfloat16)).dtype == jnp.float32
    low = ConvTranspose(3, 2, (2, 2), 2, dtype=jnp.bfloat16, **EXACT, rngs=0)
    assert low(x).dtype == jnp.bfloat16
    assert ConvTranspose(3, 2, 2, param_dtype=jnp.bfloat16, **EXACT, rngs=0).kernel.value.dtype == (
        jnp.bfloat16
    )
    mask = np.zeros((2, 2, 3, 2))
    masked = ConvTranspose(3, 2, (2, 2), 2, mask=mask, use_bias=False, **EXACT, rngs=0)
    assert masked.bias is None and not np.any(masked(x))


def test_conv_transpose_errors():
    with pytest.raises(ValueError, match="last dimension is in_features=3"):
        ConvTranspose(3, 4, 3, **EXACT, rngs=0)(jnp.ones((5, 2)))
    with pytest.raises(ValueError, match=r"expects inputs of shape \(\*batch, depth, height"):
        ConvTranspose(3, 4, (3, 3, 3), **EXACT, rngs=0)(jnp.ones((5, 5, 3)))
    with pytest.raises(ValueError, match="unknown padding 'REFLECT'"):
        ConvTranspose(3, 4, 3, padding="REFLECT", **EXACT, rngs=0)
    with pytest.raises(ValueError, match="'CAUSAL' is for 1-D convolutions"):
        ConvTranspose(3, 4, (3, 3), padding="CAUSAL", **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"strides=\(2, 2\) has 2 entries, but there are 1"):
        ConvTranspose(3, 4, 3, (2, 2), **EXACT, rngs=0)
    with pytest.raises(TypeError, match="kernel_size must be an int"):
        ConvTranspose(3, 4, [3.0], **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"mask must have the kernel's shape \(3, 4, 3\)"):
        ConvTranspose(3, 4, 3, transpose_kernel=True, mask=np.ones((3, 3, 4)), **EXACT, rngs=0)
    with pytest.raises(ValueError, match=r"empty output.*more padding"):
        ConvTranspose(3, 4, 5, padding=0, **EXACT, rngs=0)(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"ConvTranspose: the input .* has an empty spatial axis"):
        ConvTranspose(3, 4, 2, 2, **EXACT, rngs=0)(jnp.ones((2, 0, 3)))


# --------------------------------------------------------------------------- pooling

POOL_CASES = [
    # window, strides, padding, batch shape
    ((2,), None, "VALID", (2,)),
    ((3,), 2, "SAME", ()),
    ((2,), (3,), ((1, 1),), (2, 2)),
    ((2, 2), None, "VALID", (2,)),
    ((3, 2), (2, 1), "SAME", ()),
    ((2, 3), 2, 1, (1, 2)),
    ((2, 2, 2), (1, 2, 1), "SAME", (2,)),
    ((2, 2, 3), None, ((0, 1), (1, 0), (2, 1)), ()),
]


def _pool_pads(padding, spatial, window, strides):
    rank = len(window)
    strides = (1,) * rank if strides is None else strides
    strides = (strides,) * rank if isinstance(strides, int) else strides
    if padding == "SAME":
        pads = [_same_pads(n, k, s) for n, k, s in zip(spatial, window, strides, strict=True)]
    elif padding == "VALID":
        pads = [(0, 0)] * rank
    elif isinstance(padding, int):
        pads = [(padding, padding)] * rank
    else:
        pads = list(padding)
    return strides, pads


@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_pooling_matches_reference(case):
    window, strides, padding, batch = case
    rank = len(window)
    x = random((*batch, *(5,) * rank, 3), seed=4)
    steps, pads = _pool_pads(padding, (5,) * rank, window, strides)
    reference = {
        "max": ref_pool(flat(x, rank), window, steps, pads, -np.inf, np.maximum),
        "min": ref_pool(flat(x, rank), window, steps, pads, np.inf, np.minimum),
    }
    sums = ref_pool(flat(x, rank), window, steps, pads, 0.0, np.add)
    counts = ref_pool(np.ones((1, *(5,) * rank, 1)), window, steps, pads, 0.0, np.add)
    reference["avg"] = sums / math.prod(window)
    reference["avg_real"] = sums / counts
    results = {
        "max": max_pool(x, window, strides, padding),
        "min": min_pool(x, window, strides, padding),
        "avg": avg_pool(x, window, strides, padding),
        "avg_real": avg_pool(x, window, strides, padding, count_include_pad=False),
    }
    for name, y in results.items():
        assert y.shape == (*batch, *reference[name].shape[1:]), name
        assert y.dtype == jnp.float32
        np.testing.assert_allclose(flat(y, rank), reference[name], rtol=1e-5, atol=1e-6)


def test_pooling_unbatched_dtypes_and_gradients():
    x = random((2, 6, 6, 3))
    np.testing.assert_allclose(max_pool(x[1], (2, 2), 2), max_pool(x, (2, 2), 2)[1])
    ints = jnp.arange(-8, 8, dtype=jnp.int32).reshape(4, 4, 1)
    top = max_pool(ints, (3, 3), padding="SAME")
    assert top.dtype == jnp.int32 and int(top.min()) == -3  # padding never wins
    assert int(min_pool(ints, (3, 3), padding="SAME").max()) == 2
    mean = avg_pool(ints, (2, 2), 2)
    assert mean.dtype == jnp.float32
    np.testing.assert_allclose(mean[..., 0], [[-5.5, -3.5], [2.5, 4.5]])
    assert max_pool(x.astype(jnp.bfloat16), (2, 2), padding="SAME").dtype == jnp.bfloat16
    assert avg_pool(x.astype(jnp.bfloat16), (2, 2)).dtype == jnp.bfloat16
    assert max_pool(jnp.array([[True], [False]]), (2,))[0, 0]
    # Gradients flow to each window's winner and spread evenly over its mean.
    g = jax.grad(lambda v: max_pool(v, (2,), 2).sum())(jnp.array([[1.0], [3.0], [2.0], [0.0]]))
    assert g[:, 0].tolist() == [0.0, 1.0, 1.0, 0.0]
    g = jax.grad(lambda v: avg_pool(v, (2,), 2).sum())(jnp.ones((4, 1)))
    assert g[:, 0].tolist() == [0.5] * 4
    assert jax.jit(max_pool, static_argnums=(1,))(x, (2, 2)).shape == (2, 5, 5, 3)


def test_pooling_errors():
    x = jnp.ones((2, 5, 5, 3))
    with pytest.raises(TypeError, match=r"window_shape must be a sequence of ints.*\(3, 3\)"):
        max_pool(x, 2)
    with pytest.raises(ValueError, match="window_shape must hold at least one size"):
        avg_pool(x, ())
    with pytest.raises(ValueError, match=r"strides=\(1, 2, 3\) has 3 entries"):
        min_pool(x, (2, 2), (1, 2, 3))
    with pytest.raises(ValueError, match=r"unknown padding 'CIRCULAR'; use one of 'SAME', 'VALID'"):
        max_pool(x, (2, 2), padding="CIRCULAR")
    with pytest.raises(ValueError, match=r"avg_pool over 3 spatial dimension\(s\) expects"):
        avg_pool(x[0], (2, 2, 2))
    with pytest.raises(ValueError, match=r"empty output.*smaller window_shape"):
        max_pool(x, (6, 2))
    with pytest.raises(ValueError, match=r"avg_pool: the input .* has an empty spatial axis"):
        avg_pool(jnp.ones((2, 0, 3)), (1,))
    with pytest.raises(TypeError, match="cannot order elements of dtype complex64"):
        max_pool(jnp.ones((4, 1), jnp.complex64), (2,))


@pytest.mark.parametrize("strides", [1, 2, 3])
@pytest.mark.parametrize("kernel_size", [2, 3, 4, 5])
def test_circular_conv_transpose_is_same_away_from_the_wrap_around(kernel_size, strides):
    # Without transpose_kernel the periodic output lines up with the "SAME" one: an impulse
    # in the middle of the signal gives the same response in both.
    impulse = jnp.zeros((2, 12, 2)).at[:, 6].set(1.0)
    for dilation in (1, 2):
        options = dict(strides=strides, kernel_dilation=dilation, **EXACT, rngs=0)
        circular = ConvTranspose(2, 3, kernel_size, padding="CIRCULAR", **options)
        same = ConvTranspose(2, 3, kernel_size, padding="SAME", **options)
        same.kernel.value = circular.kernel.value
        np.testing.assert_allclose(circular(impulse), same(impulse), rtol=1e-6, atol=1e-6)
