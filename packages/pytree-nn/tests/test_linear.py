"""`Linear` and `MLP` with "scalar" sizes, and MLPs with a learnt activation copied per
layer and neuron, as Equinox's."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_nn import MLP, Linear, PReLU
from pytree_transforms import filter_grad, filter_jit


@pytest.mark.parametrize(
    ("sizes", "x_shape", "y_shape", "kernel_shape"),
    [
        (("scalar", 3), (), (3,), (1, 3)),
        (("scalar", 3), (5,), (5, 3), (1, 3)),
        ((2, "scalar"), (2,), (), (2, 1)),
        ((2, "scalar"), (4, 2), (4,), (2, 1)),
        (("scalar", "scalar"), (), (), (1, 1)),
    ],
)
def test_linear_with_scalar_sizes(sizes, x_shape, y_shape, kernel_shape):
    layer = Linear(*sizes, param_dtype=jnp.bfloat16, rngs=0)
    assert layer.kernel.value.shape == kernel_shape
    assert layer.bias.value.shape == kernel_shape[1:]
    x = jnp.linspace(-1.0, 1.0, int(np.prod(x_shape))).reshape(x_shape).astype(jnp.bfloat16)
    y = filter_jit(layer)(x)
    assert y.shape == y_shape and y.dtype == jnp.bfloat16
    # The same as the layer with a feature axis of size 1.
    features = [1 if size == "scalar" else size for size in sizes]
    plain = Linear(*features, param_dtype=jnp.bfloat16, rngs=0)
    expected = plain(x[..., None] if sizes[0] == "scalar" else x)
    np.testing.assert_array_equal(y, expected[..., 0] if sizes[1] == "scalar" else expected)


def size_error(name, bad):
    return f'{name} must be an int >= 0, got {re.escape(repr(bad))}; or the string "scalar"'


def test_bad_sizes_name_the_argument():
    for bad in ("scaler", -1, 2.0, True, None):
        with pytest.raises(
            ValueError,
            match=size_error("in_features", bad),
        ):
            Linear(bad, 2, rngs=0)
        with pytest.raises(
            ValueError,
            match=size_error("out_size", bad),
        ):
            MLP(2, bad, 4, 1, rngs=0)
    with pytest.raises(ValueError, match="width_size"):
        MLP(2, 2, "scalar", 1, rngs=0)
    with pytest.raises(ValueError, match="in_features=3"):
        Linear(3, "scalar", rngs=0)(jnp.ones(()))


@pytest.mark.parametrize("scan", [False, True])
def test_mlp_with_scalar_sizes(scan):
    mlp = MLP("scalar", "scalar", 8, 3, scan=scan, rngs=0)
    assert mlp(jnp.array(0.5)).shape == ()
    assert mlp(jnp.ones(7)).shape == (7,)
    assert MLP("scalar", 2, 8, 0, rngs=0)(jnp.array(1.0)).shape == (2,)
    assert MLP(3, "scalar", 8, 2, rngs=0)(jnp.ones((4, 3))).shape == (4,)


def test_a_learnt_activation_gets_its_own_slopes_per_layer_and_neuron():
    given = PReLU(0.2)
    mlp = MLP(3, 2, 4, 3, activation=given, final_activation=PReLU(0.1), rngs=0)
    slopes = mlp.activation.negative_slope
    assert isinstance(slopes, Param) and slopes.value.shape == (3, 4)
    np.testing.assert_allclose(slopes.value, 0.2)
    assert mlp.final_activation.negative_slope.value.shape == (2,)
    # The activation passed is left alone and shares nothing with the MLP.
    assert given.negative_slope.value.shape == ()
    assert slopes is not given.negative_slope
    assert pg.find_duplicates(mlp) == []
    # Each layer's neurons use their own slope, with a gradient of its own.
    x = jax.random.normal(jax.random.key(0), (5, 3))
    grads = pg.grad(lambda m: jnp.sum(m(x) ** 2))(mlp)
    per_slope = grads["activation"]["negative_slope"].value
    assert per_slope.shape == (3, 4)
    assert len({float(g) for g in per_slope.ravel()}) > 4  # not one shared gradient
    # The functional style differentiates the same copies.
    tree_grads = filter_grad(lambda m: jnp.sum(m(x) ** 2))(mlp)
    np.testing.assert_allclose(tree_grads.activation.negative_slope.value, per_slope, rtol=1e-6)


def test_per_neuron_activation_is_what_each_neuron_through_its_copy_gives():
    mlp = MLP(2, 3, 4, 1, activation=PReLU(), final_activation=PReLU(), rngs=0)
    mlp.activation.negative_slope.value = jnp.array([[0.1, 0.2, 0.3, 0.4]])
    mlp.final_activation.negative_slope.value = jnp.array([0.5, 0.6, 0.7])
    x = jnp.array([[1.0, -2.0], [-3.0, 0.5]])
    h = mlp.layers[0](x)
    h = jnp.where(h >= 0, h, jnp.array([0.1, 0.2, 0.3, 0.4]) * h)
    out = mlp.layers[1](h)
    expected = jnp.where(out >= 0, out, jnp.array([0.5, 0.6, 0.7]) * out)
    np.testing.assert_allclose(mlp(x), expected, rtol=1e-6)


def test_scan_and_unrolled_mlps_agree_with_a_learnt_activation():
    unrolled = MLP(2, 3, 4, 4, activation=PReLU(), rngs=0)
    scanned = MLP(2, 3, 4, 4, activation=PReLU(), scan=True, rngs=0)
    slopes = jax.random.uniform(jax.random.key(0), (4, 4))
    unrolled.activation.negative_slope.value = slopes
    scanned.activation.negative_slope.value = slopes
    x = jax.random.normal(jax.random.key(1), (6, 2))
    np.testing.assert_allclose(scanned(x), unrolled(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        pg.jit(lambda m, x: m(x))(scanned, x), unrolled(x), rtol=1e-5, atol=1e-6
    )


def test_plain_activations_apply_to_the_whole_output():
    mlp = MLP(2, 3, 4, 1, final_activation=jax.nn.softmax, rngs=0)
    np.testing.assert_allclose(jnp.sum(mlp(jnp.ones(2))), 1.0, rtol=1e-6)
    assert mlp.activation is jax.nn.relu
