"""Identity, PReLU and adaptive pooling, side by side with Equinox's layers.

Equinox's layers take one example, channels first; ours take any batch axes, channels
last. Each check runs Equinox's layer on each example with its channels moved first.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_nn as pnn

eqx = pytest.importorskip("equinox")


def channels_first(fn):
    """A function of a channels-first example as one of a channels-last example."""
    return lambda x: jnp.moveaxis(fn(jnp.moveaxis(x, -1, 0)), 0, -1)


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def test_identity_equinox():
    x = normal(0, (3, 4))
    theirs = eqx.nn.Identity(1, 2, name="ignored")
    ours = pnn.Identity(1, 2, name="ignored")
    key = jax.random.key(1)
    assert ours(x, key=key) is x
    np.testing.assert_array_equal(ours(x, key=key), theirs(x, key=key))


@pytest.mark.parametrize(
    "init_alpha", [0.25, -0.5, 0.0, np.array([0.1, 0.2, 0.3], np.float32)], ids=str
)
def test_prelu_equinox(init_alpha):
    x = normal(2, (5, 3)).at[0].set(0.0)
    ours, theirs = pnn.PReLU(init_alpha), eqx.nn.PReLU(init_alpha)
    assert ours.negative_slope.value.shape == theirs.negative_slope.shape
    np.testing.assert_array_equal(ours(x), theirs(x))
    # The slopes' gradients agree too.
    ours_grad = jax.grad(lambda m: m(x).sum())(ours).negative_slope.value
    theirs_grad = eqx.filter_grad(lambda m: m(x).sum())(theirs).negative_slope
    np.testing.assert_allclose(ours_grad, theirs_grad, rtol=1e-6)


def test_prelu_per_channel_equinox():
    x = normal(3, (4, 6, 3))
    ours = pnn.PReLU(0.2, num_parameters=3)
    theirs = eqx.nn.PReLU(jnp.full((3,), 0.2))
    np.testing.assert_array_equal(ours(x), theirs(x))


# Non-dividing sizes (7 -> 3, 10 -> 4), dividing ones, and target 1 and target = size.
POOL_CASES = [
    (1, (7,), (3,)),
    (1, (10,), (4,)),
    (1, (12,), (4,)),
    (1, (5,), (5,)),
    (1, (9,), (1,)),
    (2, (7, 10), (3, 4)),
    (2, (8, 6), (4, 6)),
    (2, (11, 5), (2, 3)),
    (3, (5, 7, 6), (2, 3, 4)),
    (3, (4, 4, 9), (4, 1, 2)),
]


@pytest.mark.parametrize(("rank", "spatial", "target"), POOL_CASES, ids=str)
@pytest.mark.parametrize("kind", ["Avg", "Max"])
def test_adaptive_pool_equinox(kind, rank, spatial, target):
    x = normal(4, (2, *spatial, 3))
    theirs = getattr(eqx.nn, f"Adaptive{kind}Pool{rank}d")(target)
    expected = jax.vmap(channels_first(theirs))(x)
    for ours in (
        getattr(pnn, f"Adaptive{kind}Pool{rank}d")(target),
        getattr(pnn, f"Adaptive{kind}Pool")(target),
    ):
        np.testing.assert_allclose(ours(x), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["Avg", "Max"])
def test_adaptive_pool_int_target_equinox(kind):
    x = normal(5, (9, 7, 2))
    theirs = getattr(eqx.nn, f"Adaptive{kind}Pool2d")(3)
    ours = getattr(pnn, f"Adaptive{kind}Pool2d")(3)
    np.testing.assert_allclose(ours(x), channels_first(theirs)(x), rtol=1e-6, atol=1e-7)


def test_adaptive_avg_pool_integer_input_equinox():
    x = jnp.arange(14).reshape(7, 2)
    theirs = channels_first(eqx.nn.AdaptiveAvgPool1d(3))(x)
    ours = pnn.AdaptiveAvgPool1d(3)(x)
    assert ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs)
