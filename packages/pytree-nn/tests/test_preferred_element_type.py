"""`preferred_element_type=`: bfloat16 operands accumulated (and returned) in float32, in
every layer that multiplies by a kernel, with the bias added as Flax NNX adds it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_nn as pnn

BF16 = jnp.bfloat16
F32 = jnp.float32
NHWC = ("NHWC", "HWIO", "NHWC")


def fixed(seed, shape, dtype=BF16):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def set_weights(layer):
    layer.kernel.value = fixed(0, layer.kernel.value.shape, layer.kernel.value.dtype)
    if layer.bias is not None:
        layer.bias.value = fixed(1, layer.bias.value.shape, layer.bias.value.dtype)
    return layer


def linear(preferred, **kwargs):
    return pnn.Linear(64, 8, preferred_element_type=preferred, **kwargs, rngs=0)


def conv(preferred, **kwargs):
    return pnn.Conv(16, 8, (3, 3), preferred_element_type=preferred, **kwargs, rngs=0)


def conv_transpose(preferred, **kwargs):
    return pnn.ConvTranspose(
        16, 8, (3, 3), strides=2, preferred_element_type=preferred, **kwargs, rngs=0
    )


def einsum(preferred, **kwargs):
    bias = None if kwargs.pop("use_bias", True) is False else (2, 4)
    return pnn.Einsum(
        "btd,dnh->btnh", (64, 2, 4), bias, preferred_element_type=preferred, **kwargs, rngs=0
    )


def linear_general(preferred, **kwargs):
    return pnn.LinearGeneral(
        (8, 8), (2, 4), axis=(-2, -1), preferred_element_type=preferred, **kwargs, rngs=0
    )


def reference(kind, x, kernel, preferred):
    """The layer's product, written with lax (bias not added)."""
    if kind is linear:
        return jax.lax.dot_general(
            x, kernel, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=preferred
        )
    if kind is conv:
        return jax.lax.conv_general_dilated(
            x, kernel, (1, 1), "SAME", dimension_numbers=NHWC, preferred_element_type=preferred
        )
    if kind is conv_transpose:
        return jax.lax.conv_transpose(
            x, kernel, (2, 2), "SAME", dimension_numbers=NHWC, preferred_element_type=preferred
        )
    if kind is einsum:
        return jnp.einsum("btd,dnh->btnh", x, kernel, preferred_element_type=preferred)
    return jax.lax.dot_general(
        x, kernel, (((1, 2), (0, 1)), ((), ())), preferred_element_type=preferred
    )


INPUT_SHAPES = {
    linear: (3, 64),
    conv: (2, 5, 5, 16),
    conv_transpose: (2, 4, 4, 16),
    einsum: (2, 3, 64),
    linear_general: (3, 8, 8),
}
KINDS = pytest.mark.parametrize("kind", list(INPUT_SHAPES), ids=lambda k: k.__name__)


def bias_for(kind, layer, ndim):
    bias = layer.bias.value
    return bias.reshape((1,) * (ndim - bias.ndim) + bias.shape)


@KINDS
def test_bfloat16_operands_accumulate_in_float32(kind):
    layer = set_weights(kind(F32, param_dtype=BF16))
    x = fixed(2, INPUT_SHAPES[kind])
    y = layer(x)
    assert y.dtype == F32
    product = reference(kind, x, layer.kernel.value, F32)
    assert product.dtype == F32
    expected = product + bias_for(kind, layer, product.ndim).astype(F32)
    np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-6, atol=1e-6)
    # The default rounds the product to bfloat16: float32 accumulation keeps more digits.
    rounded = set_weights(kind(None, param_dtype=BF16))(x)
    assert rounded.dtype == BF16
    assert not np.array_equal(np.asarray(rounded, np.float32), np.asarray(y))


@KINDS
def test_the_jaxpr_asks_for_float32(kind):
    layer = kind(F32, param_dtype=BF16)
    jaxpr = str(jax.make_jaxpr(lambda x: layer(x))(fixed(2, INPUT_SHAPES[kind])))
    assert "preferred_element_type=float32" in jaxpr
    default = str(
        jax.make_jaxpr(lambda x: kind(None, param_dtype=BF16)(x))(fixed(2, INPUT_SHAPES[kind]))
    )
    assert "preferred_element_type=float32" not in default


@KINDS
def test_output_dtype_follows_nnx_bias_promotion(kind):
    """NNX adds the bias to the product with standard promotion: a bfloat16 product plus a
    float32 bias is float32; without a bias the product's dtype stays."""
    x = fixed(2, INPUT_SHAPES[kind], F32)
    if kind not in (conv, conv_transpose):  # lax's convolutions refuse a narrower type
        assert kind(BF16)(x).dtype == F32
        assert kind(BF16, use_bias=False)(x).dtype == BF16
    assert kind(F32, dtype=BF16)(x).dtype == F32
    assert kind(F32, dtype=BF16, use_bias=False)(x).dtype == F32


@KINDS
def test_preferred_element_type_under_strict_promotion(kind):
    layer = set_weights(kind(F32, param_dtype=BF16))
    x = fixed(2, INPUT_SHAPES[kind])
    expected = layer(x)
    with jax.numpy_dtype_promotion("strict"):
        y = layer(x)
    assert y.dtype == F32
    np.testing.assert_array_equal(np.asarray(y), np.asarray(expected))


def test_mlp_passes_preferred_element_type_to_its_layers():
    mlp = pnn.MLP(4, 2, width_size=8, depth=2, param_dtype=BF16, preferred_element_type=F32, rngs=0)
    assert all(layer.preferred_element_type == F32 for layer in mlp.layers)
    x = fixed(3, (5, 4))
    h = x
    for i, layer in enumerate(mlp.layers):
        h = jax.lax.dot_general(
            h, layer.kernel.value, (((1,), (0,)), ((), ())), preferred_element_type=F32
        ) + layer.bias.value.astype(F32)
        h = h if i == len(mlp.layers) - 1 else jax.nn.relu(h)
        # The next layer promotes its float32 input with its bfloat16 kernel.
    np.testing.assert_allclose(np.asarray(mlp(x)), np.asarray(h), rtol=1e-6, atol=1e-6)
    scanned = pnn.MLP(4, 2, width_size=8, depth=3, scan=True, preferred_element_type=F32, rngs=0)
    assert scanned.layers[1].preferred_element_type == F32
    assert "preferred_element_type=float32" in str(jax.make_jaxpr(scanned)(x))


@pytest.mark.parametrize(
    "build",
    [
        lambda p: pnn.Linear(2, 3, preferred_element_type=p, rngs=0),
        lambda p: pnn.Conv(2, 3, 3, preferred_element_type=p, rngs=0),
        lambda p: pnn.ConvTranspose(2, 3, 3, preferred_element_type=p, rngs=0),
        lambda p: pnn.MLP(2, 3, 4, 1, preferred_element_type=p, rngs=0),
    ],
)
def test_a_preferred_element_type_that_is_not_a_dtype_is_refused(build):
    with pytest.raises(
        TypeError, match=r"preferred_element_type must be a dtype such as jnp.float32.*'float99'"
    ):
        build("float99")
