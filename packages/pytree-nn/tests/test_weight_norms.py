"""WeightNorm and SpectralNorm: norms, gradients, state updates and transforms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Param
from pytree_nn import Conv, Linear, Module, SpectralNorm, WeightNorm


def random(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def spectral_norm(weight):
    """The largest singular value of the weight read as `(-1, out)`."""
    return float(np.linalg.norm(np.asarray(weight).reshape(-1, weight.shape[-1]), ord=2))


def ref_power_iteration(matrix, u, v, steps):
    """NumPy power iterations on `matrix` (rows, out), from `u` (out,) and `v` (rows,)."""
    matrix, u, v = (np.asarray(a, np.float64) for a in (matrix, u, v))
    for _ in range(steps):
        u = v @ matrix
        u = u / max(1e-12, np.linalg.norm(u))
        v = matrix @ u
        v = v / max(1e-12, np.linalg.norm(v))
    return u, v


class Counting(Module):
    """A dense layer that counts its calls in a BatchStat and holds a plain array weight."""

    def __init__(self):
        self.weight = random((3, 2), 0)
        self.calls = BatchStat(jnp.zeros((), jnp.int32))

    def __call__(self, x, *, scale=1.0):
        self.calls.value = self.calls.value + 1
        return scale * (x @ self.weight)


class FrozenDense(Module, frozen=True):
    kernel: jax.Array

    def __call__(self, x):
        return x @ self.kernel


# ------------------------------------------------------------------------- WeightNorm


def test_weight_norm_starts_as_the_layer_and_normalises_per_output_unit():
    layer = WeightNorm(Linear(3, 4, rngs=0))
    x = random((5, 3), 1)
    close(layer(x), layer.layer(x), 1e-6)
    assert layer.g.value.shape == (1, 4)
    close(layer.g.value, jnp.linalg.norm(layer.layer.kernel.value, axis=0, keepdims=True))
    layer.g.value = jnp.arange(1.0, 5.0)[None]
    close(jnp.linalg.norm(layer.normalized_weight(), axis=0), jnp.arange(1.0, 5.0))
    kernel = layer.layer.kernel.value
    expected = x @ (kernel / jnp.linalg.norm(kernel, axis=0) * jnp.arange(1.0, 5.0))
    close(layer(x), expected + layer.layer.bias.value)


def test_weight_norm_conv_other_axes_and_one_norm():
    conv = WeightNorm(Conv(3, 5, (3, 3), rngs=0))
    assert conv.g.value.shape == (1, 1, 1, 5)
    conv.g.value = jnp.full((1, 1, 1, 5), 2.0)
    norms = jnp.linalg.norm(conv.normalized_weight().reshape(-1, 5), axis=0)
    close(norms, jnp.full(5, 2.0))
    assert conv(random((2, 6, 6, 3), 2)).shape == (2, 6, 6, 5)

    per_input = WeightNorm(Linear(3, 4, rngs=0), axis=0)
    assert per_input.g.value.shape == (3, 1)
    per_input.g.value = jnp.ones((3, 1))
    close(jnp.linalg.norm(per_input.normalized_weight(), axis=1), jnp.ones(3))

    whole = WeightNorm(Linear(3, 4, rngs=0), axis=None)
    assert whole.g.value.shape == (1, 1)
    whole.g.value = jnp.full((1, 1), 3.0)
    close(jnp.linalg.norm(whole.normalized_weight()), 3.0)


def test_weight_norm_leaves_the_layer_unchanged():
    layer = WeightNorm(Linear(3, 4, rngs=0))
    kernel = layer.layer.kernel
    before = kernel.value
    layer.g.value = 2 * layer.g.value
    x = random((2, 3), 3)
    close(layer(x), 2 * (x @ before) + layer.layer.bias.value)
    assert layer.layer.kernel is kernel and kernel.value is before
    close(layer.layer(x), x @ before + layer.layer.bias.value)


def test_weight_norm_gradients_reach_v_and_g():
    layer = WeightNorm(Linear(3, 4, rngs=0))
    layer.g.value = random((1, 4), 4)
    x = random((6, 3), 5)

    def reference(v, g, bias):
        return jnp.sum(jnp.tanh(x @ (g * v / jnp.linalg.norm(v, axis=0)) + bias))

    grads = pg.grad(lambda m: jnp.sum(jnp.tanh(m(x))))(layer)
    assert sorted(grads.to_dict()) == ["g", "layer"]
    v, g, bias = layer.layer.kernel.value, layer.g.value, layer.layer.bias.value
    dv, dg, dbias = jax.grad(reference, argnums=(0, 1, 2))(v, g, bias)
    close(grads["layer"]["kernel"].value, dv)
    close(grads["g"].value, dg)
    close(grads["layer"]["bias"].value, dbias)
    assert float(jnp.abs(dv).sum()) > 0 and float(jnp.abs(dg).sum()) > 0


def test_weight_norm_under_transforms():
    layer = WeightNorm(Conv(2, 3, (3,), rngs=0))
    layer.g.value = random((1, 1, 3), 6)
    x = random((4, 7, 2), 7)
    expected = layer(x)
    close(pg.jit(lambda m, x: m(x))(layer, x), expected)
    close(jax.jit(lambda m, x: m(x))(layer, x), expected)  # a pytree argument
    close(jax.jit(lambda x: layer(x))(x), expected)  # captured: nothing is written to it
    graphdef, state = pg.split(layer)
    close(jax.jit(lambda s, x: pg.merge(graphdef, s)(x))(state, x), expected)


def test_weight_norm_passes_arguments_and_keeps_the_layers_other_state():
    layer = WeightNorm(Counting(), weight_name="weight")
    x = random((2, 3), 8)
    close(layer(x, scale=3.0), 3.0 * (x @ layer.layer.weight))
    pg.jit(lambda m, x: m(x))(layer, x)
    assert int(layer.layer.calls.value) == 2  # updates inside the layer reach it
    assert sorted(pg.state(layer, Param).to_dict()) == ["g"]  # the weight is a plain array


def test_weight_norm_of_a_frozen_layer():
    dense = FrozenDense(random((3, 2), 9))
    layer = WeightNorm(dense, axis=-1)
    layer.g.value = jnp.ones((1, 2))
    x = random((4, 3), 10)
    kernel = dense.kernel
    close(layer(x), x @ (kernel / jnp.linalg.norm(kernel, axis=0)))
    assert layer.layer.kernel is kernel


def test_weight_norm_errors():
    linear = Linear(3, 4, rngs=0)
    with pytest.raises(AttributeError, match=r"Linear has no attribute 'weight'.*'kernel'"):
        WeightNorm(linear, weight_name="weight")
    with pytest.raises(TypeError, match=r"Linear.in_features must be a Param \(or array\)"):
        WeightNorm(linear, weight_name="in_features")
    with pytest.raises(TypeError, match="weight_name must be"):
        WeightNorm(linear, weight_name=0)
    with pytest.raises(ValueError, match=r"axis=2 is out of range .* shape \(3, 4\)"):
        WeightNorm(linear, axis=2)
    with pytest.raises(ValueError, match=r"axis=-3 is out of range"):
        WeightNorm(linear, axis=-3)
    with pytest.raises(TypeError, match="axis must be an int or None"):
        WeightNorm(linear, axis=True)
    with pytest.raises(TypeError, match="wraps a layer"):
        WeightNorm(jnp.ones((3, 4)))

    class IntWeight(Module):
        def __init__(self):
            self.kernel = Param(jnp.ones((2, 2), jnp.int32))

    with pytest.raises(TypeError, match="floating point"):
        WeightNorm(IntWeight())
    assert linear.kernel.value.shape == (3, 4)


# ----------------------------------------------------------------------- SpectralNorm


def test_spectral_norm_state_and_initial_estimate():
    layer = SpectralNorm(Linear(6, 4, rngs=0), rngs=1)
    assert isinstance(layer.u, BatchStat) and isinstance(layer.v, BatchStat)
    assert layer.u.value.shape == (4,) and layer.v.value.shape == (6,)
    close(jnp.linalg.norm(layer.u.value), 1.0)
    close(jnp.linalg.norm(layer.v.value), 1.0)
    again = SpectralNorm(Linear(6, 4, rngs=0), rngs=1)
    close(again.u.value, layer.u.value, 0.0)
    conv = SpectralNorm(Conv(3, 5, (3, 2), rngs=0), rngs=1)
    assert conv.u.value.shape == (5,) and conv.v.value.shape == (3 * 2 * 3,)


@pytest.mark.parametrize("make", [lambda: Linear(6, 4, rngs=0), lambda: Conv(3, 5, (3, 3), rngs=0)])
def test_spectral_norm_gives_unit_spectral_norm(make):
    layer = SpectralNorm(make(), num_power_iterations=10, rngs=1)
    x = random((2, 5, 5, layer.layer.kernel.value.shape[-2]), 11)
    for _ in range(5):
        layer(x)
    assert abs(spectral_norm(layer.normalized_weight()) - 1.0) < 1e-4
    kernel = layer.layer.kernel.value
    sigma = spectral_norm(kernel)
    close(layer.normalized_weight(), kernel / sigma, 1e-4)
    close(layer(x), layer.layer(x) / sigma - layer.layer.bias.value * (1 / sigma - 1), 1e-4)


def test_spectral_norm_training_steps_match_a_reference():
    layer = SpectralNorm(Linear(5, 3, rngs=0), num_power_iterations=2, rngs=1)
    kernel, bias = layer.layer.kernel.value, layer.layer.bias.value
    u, v = layer.u.value, layer.v.value
    for step in range(3):
        x = random((4, 5), 20 + step)
        u, v = ref_power_iteration(kernel, u, v, 2)
        sigma = v @ np.asarray(kernel, np.float64) @ u
        close(layer(x), x @ (kernel / sigma) + bias, 1e-5)
        close(layer.u.value, u, 1e-5)
        close(layer.v.value, v, 1e-5)


def test_spectral_norm_train_and_eval_modes():
    layer = SpectralNorm(Linear(5, 3, rngs=0), rngs=1)
    layer.u.value, layer.v.value = random((3,), 30), random((5,), 31)
    x = random((2, 5), 32)
    u, v = layer.u.value, layer.v.value
    layer.eval()
    assert layer.use_running_average is True
    kernel, bias = layer.layer.kernel.value, layer.layer.bias.value
    close(layer(x), x @ (kernel / (v @ kernel @ u)) + bias)
    assert layer.u.value is u and layer.v.value is v  # frozen in evaluation mode
    layer(x, use_running_average=False)  # a call-time override
    assert not np.allclose(layer.u.value, u)
    layer.train()
    u = layer.u.value
    layer(x)
    assert not np.allclose(layer.u.value, u)
    u = layer.u.value
    layer(x, use_running_average=True)
    assert layer.u.value is u
    with pytest.raises(TypeError, match="use_running_average must be True, False or None"):
        layer(x, use_running_average=1)


def test_spectral_norm_updates_are_written_back_from_graph_jit():
    eager = SpectralNorm(Conv(2, 3, (3,), rngs=0), rngs=1)
    eager.u.value, eager.v.value = random((3,), 40), random((6,), 41)
    compiled = pg.clone(eager)
    step = pg.jit(lambda m, x: m(x))
    for i in range(3):
        x = random((2, 7, 2), 42 + i)
        close(step(compiled, x), eager(x))
        close(compiled.u.value, eager.u.value)
        close(compiled.v.value, eager.v.value)
    compiled.eval()
    before = compiled.u.value
    step(compiled, x)
    close(compiled.u.value, before, 0.0)


def test_spectral_norm_under_jax_jit_of_split_and_merge():
    eager = SpectralNorm(Linear(4, 3, rngs=0), rngs=1)
    eager.u.value, eager.v.value = random((3,), 50), random((4,), 51)
    model = pg.clone(eager)
    graphdef, state = pg.split(model)

    @jax.jit
    def step(state, x):
        model = pg.merge(graphdef, state)
        return model(x), pg.state(model)

    for i in range(3):
        x = random((2, 4), 52 + i)
        y, state = step(state, x)
        close(y, eager(x))
    pg.update(model, state)
    close(model.u.value, eager.u.value)
    close(model.v.value, eager.v.value)


def test_spectral_norm_gradients_only_through_sigma_and_the_weight():
    layer = SpectralNorm(Linear(4, 3, rngs=0), num_power_iterations=3, rngs=1)
    layer.u.value, layer.v.value = random((3,), 60), random((4,), 61)
    x = random((5, 4), 62)
    u, v = ref_power_iteration(layer.layer.kernel.value, layer.u.value, layer.v.value, 3)
    u, v = jnp.asarray(u, jnp.float32), jnp.asarray(v, jnp.float32)

    def reference(kernel, bias):
        return jnp.sum(jnp.tanh(x @ (kernel / (v @ kernel @ u)) + bias))

    dkernel, dbias = jax.grad(reference, argnums=(0, 1))(
        layer.layer.kernel.value, layer.layer.bias.value
    )
    grads = pg.grad(lambda m: jnp.sum(jnp.tanh(m(x))))(layer)
    assert sorted(grads.to_dict()) == ["layer"]  # Params only: u and v are BatchStats
    close(grads["layer"]["kernel"].value, dkernel, 1e-4)
    close(grads["layer"]["bias"].value, dbias, 1e-4)
    close(layer.u.value, u)  # the training-mode call updated the state

    # Differentiating the whole pytree: the power iteration is under stop_gradient.
    layer.eval()
    whole = jax.grad(lambda m: jnp.sum(jnp.tanh(m(x))))(layer)
    assert float(jnp.abs(whole.u.value).sum()) == 0.0
    assert float(jnp.abs(whole.v.value).sum()) == 0.0


def test_spectral_norm_of_a_zero_weight_stays_finite():
    layer = SpectralNorm(Linear(3, 2, kernel_init=jax.nn.initializers.zeros, rngs=0), rngs=1)
    y = layer(jnp.ones((1, 3)))
    assert bool(jnp.all(jnp.isfinite(y)))
    close(y, jnp.zeros((1, 2)))


def test_spectral_norm_errors():
    linear = Linear(3, 4, rngs=0)
    with pytest.raises(AttributeError, match=r"Linear has no attribute 'weight'"):
        SpectralNorm(linear, weight_name="weight", rngs=0)
    with pytest.raises(TypeError, match="must be a Param"):
        SpectralNorm(linear, weight_name="precision", rngs=0)
    with pytest.raises(ValueError, match=r"bias has shape \(4,\).*at least two dimensions"):
        SpectralNorm(linear, weight_name="bias", rngs=0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_power_iterations must be an int >= 1"):
            SpectralNorm(linear, num_power_iterations=bad, rngs=0)
    with pytest.raises(ValueError, match="eps must be a number >= 0"):
        SpectralNorm(linear, eps=-1.0, rngs=0)
    with pytest.raises(TypeError, match="use_running_average must be True or False"):
        SpectralNorm(linear, use_running_average=None, rngs=0)
    with pytest.raises(TypeError, match="needs `rngs=`"):
        SpectralNorm(linear)
