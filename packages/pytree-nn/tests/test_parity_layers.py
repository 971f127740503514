"""Identity, PReLU and adaptive pooling: behaviour, errors, and use under transforms."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_nn import (
    AdaptiveAvgPool,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    Identity,
    PReLU,
    Sequential,
)
from pytree_transforms import filter_jit

# ---------------------------------------------------------------------------- Identity


def test_identity_returns_its_input_and_ignores_arguments():
    x = {"a": jnp.ones(3), "b": "text"}
    layer = Identity(4, 5, rngs=0, anything=None)
    assert layer(x, key=jax.random.key(0)) is x
    assert jax.tree.leaves(layer) == []


def test_identity_in_a_sequential_under_jit_and_vmap():
    net = Sequential(Identity(), jnp.tanh)
    x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
    np.testing.assert_array_equal(jax.vmap(net)(x), jnp.tanh(x))
    np.testing.assert_array_equal(filter_jit(lambda m, x: m(x))(net, x), jnp.tanh(x))


# ------------------------------------------------------------------------------- PReLU


def ref_prelu(x, slope):
    return np.where(x >= 0, x, slope * x)


def test_prelu_default_is_one_scalar_slope():
    layer = PReLU()
    assert isinstance(layer.negative_slope, Param)
    assert layer.negative_slope.value.shape == ()
    x = jnp.array([[-2.0, 0.0], [3.0, -0.5]])
    np.testing.assert_allclose(layer(x), ref_prelu(np.asarray(x), 0.25))


def test_prelu_per_channel_slopes_broadcast_over_the_last_axis():
    layer = PReLU(0.1, num_parameters=3)
    layer.negative_slope.value = jnp.array([0.1, 0.2, 0.3])
    x = -jnp.ones((4, 5, 3))
    np.testing.assert_allclose(layer(x), np.broadcast_to([-0.1, -0.2, -0.3], (4, 5, 3)))


def test_prelu_array_init_alpha_as_in_equinox():
    layer = PReLU(jnp.array([0.5, 2.0]))
    np.testing.assert_allclose(layer(jnp.array([-1.0, -1.0])), [-0.5, -2.0])


def test_prelu_slope_gets_gradients():
    x = jnp.array([-2.0, 1.0, -3.0])
    grad = jax.grad(lambda m: m(x).sum())(PReLU())
    np.testing.assert_allclose(grad.negative_slope.value, -5.0)


def test_prelu_dtypes():
    x = jnp.array([-1.0, 2.0], jnp.bfloat16)
    assert PReLU()(x).dtype == jnp.float32
    assert PReLU(dtype=jnp.bfloat16)(x).dtype == jnp.bfloat16
    assert PReLU(param_dtype=jnp.bfloat16).negative_slope.value.dtype == jnp.bfloat16


def test_prelu_under_graph_jit_and_vmap():
    layer = PReLU(0.5, num_parameters=2)
    x = jnp.array([[-2.0, 4.0], [6.0, -8.0]])
    expected = ref_prelu(np.asarray(x), 0.5)
    np.testing.assert_allclose(pg.jit(lambda m, x: m(x))(layer, x), expected)
    np.testing.assert_allclose(jax.vmap(layer)(x), expected)


def test_prelu_errors():
    with pytest.raises(ValueError, match="num_parameters must be a positive int, got 0"):
        PReLU(num_parameters=0)
    with pytest.raises(ValueError, match=r"init_alpha must be a number .* shape \(2,\)"):
        PReLU(jnp.ones(2), num_parameters=2)
    with pytest.raises(ValueError, match=r"last dimension is num_parameters=3.*\(4, 2\)"):
        PReLU(num_parameters=3)(jnp.ones((4, 2)))
    with pytest.raises(ValueError, match=r"slope of shape \(3,\) does not broadcast.*\(2,\)"):
        PReLU(jnp.ones(3))(jnp.ones(2))
    with pytest.raises(ValueError, match=r"slope of shape \(2, 1\).*input of shape \(2,\)"):
        PReLU(jnp.ones((2, 1)))(jnp.ones(2))


# ------------------------------------------------------------------- adaptive pooling


def ref_bins(size, bins):
    """Equinox's bins: `size % bins` bins of `size // bins + 1`, then the rest of `size // bins`."""
    small, large = divmod(size, bins)
    sizes = [small + 1] * large + [small] * (bins - large)
    starts = np.cumsum([0, *sizes])
    return [slice(a, b) for a, b in itertools.pairwise(starts)]


def ref_adaptive(x, target, reduce):
    """Reduce each box of the bins' grid at once, over `(batch, *spatial, features)`."""
    x = np.asarray(x, np.float64)
    rank = len(target)
    grids = [ref_bins(n, t) for n, t in zip(x.shape[1:-1], target, strict=True)]
    out = np.zeros((x.shape[0], *target, x.shape[-1]))
    for index in np.ndindex(*target):
        box = x[(slice(None), *(g[i] for g, i in zip(grids, index, strict=True)))]
        out[(slice(None), *index)] = reduce(box, axis=tuple(range(1, rank + 1)))
    return out


def test_bins_of_a_non_dividing_size():
    x = jnp.arange(7.0).reshape(7, 1)
    np.testing.assert_allclose(AdaptiveAvgPool1d(3)(x)[:, 0], [1.0, 3.5, 5.5])
    np.testing.assert_allclose(AdaptiveMaxPool1d(3)(x)[:, 0], [2.0, 4.0, 6.0])


CASES = [
    ((7,), (3,)),
    ((12,), (4,)),
    ((5,), (5,)),
    ((9,), (1,)),
    ((7, 10), (3, 4)),
    ((8, 6), (4, 6)),
    ((5, 7, 6), (2, 3, 4)),
]


@pytest.mark.parametrize(("spatial", "target"), CASES, ids=str)
@pytest.mark.parametrize(("cls", "reduce"), [(AdaptiveAvgPool, np.mean), (AdaptiveMaxPool, np.max)])
def test_adaptive_pool_against_reference(spatial, target, cls, reduce):
    x = jax.random.normal(jax.random.key(0), (2, *spatial, 3))
    np.testing.assert_allclose(
        cls(target)(x), ref_adaptive(x, target, reduce), rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize(
    ("cls", "rank"),
    [
        (AdaptiveAvgPool1d, 1),
        (AdaptiveAvgPool2d, 2),
        (AdaptiveAvgPool3d, 3),
        (AdaptiveMaxPool1d, 1),
        (AdaptiveMaxPool2d, 2),
        (AdaptiveMaxPool3d, 3),
    ],
)
def test_fixed_rank_classes_take_an_int_for_every_axis(cls, rank):
    assert cls(2).target_shape == (2,) * rank
    assert cls((2,) * rank).target_shape == (2,) * rank


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_any_number_of_batch_axes(batch):
    x = jax.random.normal(jax.random.key(1), (*batch, 7, 5, 2))
    y = AdaptiveAvgPool2d((3, 2))(x)
    assert y.shape == (*batch, 3, 2, 2)
    flat = x.reshape(-1, 7, 5, 2)
    np.testing.assert_allclose(
        y.reshape(-1, 3, 2, 2), ref_adaptive(flat, (3, 2), np.mean), rtol=1e-6
    )


def test_integer_inputs():
    x = jnp.arange(5).reshape(5, 1)
    assert AdaptiveMaxPool1d(2)(x).dtype == x.dtype
    np.testing.assert_allclose(AdaptiveAvgPool1d(2)(x)[:, 0], [1.0, 3.5])


def test_adaptive_pool_has_no_leaves_and_works_under_transforms():
    pool = AdaptiveMaxPool2d(2)
    assert jax.tree.leaves(pool) == []
    x = jax.random.normal(jax.random.key(2), (4, 6, 5, 3))
    expected = ref_adaptive(x, (2, 2), np.max)
    np.testing.assert_allclose(filter_jit(lambda m, x: m(x))(pool, x), expected, rtol=1e-6)
    np.testing.assert_allclose(pg.jit(lambda m, x: m(x))(pool, x), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(pool)(x), expected, rtol=1e-6)


def test_adaptive_pool_constructor_errors():
    with pytest.raises(ValueError, match=r"target_shape=\(2, 2, 2\) has 3 entries.* 2 spatial"):
        AdaptiveAvgPool2d((2, 2, 2))
    with pytest.raises(ValueError, match=r"target_shape must be positive, got \(0, 2\)"):
        AdaptiveMaxPool2d((0, 2))
    with pytest.raises(ValueError, match=r"target_shape must hold .* all positive; got \(3, -1\)"):
        AdaptiveAvgPool((3, -1))
    with pytest.raises(ValueError, match=r"target_shape must hold at least one size"):
        AdaptiveMaxPool(())
    with pytest.raises(TypeError, match=r"target_shape must be an int or a sequence of 3 ints"):
        AdaptiveAvgPool3d("2")


def test_adaptive_pool_input_errors():
    with pytest.raises(ValueError, match=r"expects inputs of shape \(\*batch, height, width, "):
        AdaptiveAvgPool2d(2)(jnp.ones((4, 4)))
    with pytest.raises(ValueError, match=r"shape \(2, 5, 3\) has spatial shape \(2, 5\), smaller"):
        AdaptiveMaxPool((3, 3))(jnp.ones((2, 5, 3)))
    with pytest.raises(ValueError, match="empty spatial axis"):
        AdaptiveMaxPool1d(1)(jnp.ones((0, 3)))


@pytest.mark.parametrize("num_parameters", [None, 2])
def test_prelu_refuses_an_init_alpha_that_is_not_a_number(num_parameters):
    with pytest.raises(TypeError, match=r"PReLU\(init_alpha=\.\.\.\) must be a number .* str 'a'"):
        PReLU(init_alpha="a", num_parameters=num_parameters)
