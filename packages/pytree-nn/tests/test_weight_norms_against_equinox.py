"""WeightNorm and SpectralNorm side by side with Equinox's, with the same weights.

Equinox's layers keep `(out, in)` weights and OIHW kernels and take one channels-first
example; ours keep `(in, out)` and `(*kernel_size, in, out)` kernels and take channels-last
batches. The helpers below convert weights, inputs and the power-iteration vectors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
import pytree_nn as pnn

eqx = pytest.importorskip("equinox")


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def eqx_weight(kernel):
    """Our `(*kernel_size, in, out)` kernel as Equinox's `(out, in, *kernel_size)`."""
    rank = kernel.ndim - 2
    return jnp.transpose(kernel, (rank + 1, rank, *range(rank)))


def eqx_twin(ours):
    """An Equinox Linear or Conv holding the weights of our Linear or Conv."""
    kernel = ours.kernel.value
    if isinstance(ours, pnn.Linear):
        theirs = eqx.nn.Linear(kernel.shape[0], kernel.shape[1], key=jax.random.key(0))
    else:
        theirs = eqx.nn.Conv(
            kernel.ndim - 2,
            kernel.shape[-2],
            kernel.shape[-1],
            kernel.shape[:-2],
            key=jax.random.key(0),
        )
    weight = eqx_weight(kernel)
    bias = ours.bias.value.reshape((-1,) + (1,) * (kernel.ndim - 2))
    return eqx.tree_at(lambda layer: (layer.weight, layer.bias), theirs, (weight, bias))


def channels_first(fn):
    """An unbatched channels-first function as a batched channels-last one."""
    return jax.vmap(lambda x: jnp.moveaxis(fn(jnp.moveaxis(x, -1, 0)), 0, -1))


LAYERS = {
    "linear": (lambda: pnn.Linear(5, 3, rngs=0), (4, 5)),
    "conv1d": (lambda: pnn.Conv(2, 3, (3,), padding="VALID", rngs=0), (2, 7, 2)),
    "conv2d": (lambda: pnn.Conv(3, 4, (3, 2), padding="VALID", rngs=0), (2, 6, 5, 3)),
}


def run_theirs(layer, x, is_linear):
    return jax.vmap(layer)(x) if is_linear else channels_first(layer)(x)


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("axes", [(-1, 0), (None, None)], ids=["per_output", "whole"])
def test_weight_norm_equinox(name, axes):
    make, shape = LAYERS[name]
    our_axis, their_axis = axes
    ours = pnn.WeightNorm(make(), axis=our_axis)
    theirs = eqx.nn.WeightNorm(eqx_twin(ours.layer), axis=their_axis)
    is_linear = name == "linear"
    # Their g keeps the output axis first, ours last.
    g = normal(1, theirs.g.shape)
    ours.g.value = jnp.moveaxis(g, 0, -1)
    theirs = eqx.tree_at(lambda layer: layer.g, theirs, g)
    x = normal(2, shape)
    close(ours(x), run_theirs(theirs, x, is_linear), 1e-5)

    def loss(y):
        return jnp.sum(jnp.sin(y))

    our_grads = pg.grad(lambda m: loss(m(x)))(ours)
    their_grads = eqx.filter_grad(lambda m: loss(run_theirs(m, x, is_linear)))(theirs)
    close(our_grads["g"].value, jnp.moveaxis(their_grads.g, 0, -1), 1e-4)
    close(eqx_weight(our_grads["layer"]["kernel"].value), their_grads.layer.weight, 1e-4)


def test_weight_norm_initial_g_equinox():
    ours = pnn.WeightNorm(pnn.Conv(3, 4, (3, 3), rngs=0))
    theirs = eqx.nn.WeightNorm(eqx_twin(ours.layer))
    close(jnp.moveaxis(theirs.g, 0, -1), ours.g.value, 1e-6)


def their_v(v, kernel_shape):
    """Our `v` (rows of the kernel read as `(-1, out)`) in Equinox's order `(in, *spatial)`."""
    rank = len(kernel_shape) - 2
    v = v.reshape(kernel_shape[:-1])
    return jnp.moveaxis(v, -1, 0).reshape(-1) if rank else v


def our_v(v, kernel_shape):
    """Equinox's `v` (in order `(in, *spatial)`) in our order `(*spatial, in)`."""
    rank = len(kernel_shape) - 2
    v = v.reshape((kernel_shape[-2], *kernel_shape[:-2]))
    return jnp.moveaxis(v, 0, -1).reshape(-1) if rank else v


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_spectral_norm_equinox(name):
    make, shape = LAYERS[name]
    iterations = 2
    is_linear = name == "linear"
    ours = pnn.SpectralNorm(make(), num_power_iterations=iterations, rngs=1)
    kernel_shape = ours.layer.kernel.value.shape
    theirs, state = eqx.nn.make_with_state(eqx.nn.SpectralNorm)(
        eqx_twin(ours.layer), "weight", num_power_iterations=iterations, key=jax.random.key(2)
    )
    # Start both from Equinox's vectors, perturbed so that the steps still move them.
    u, v = state.get(theirs.uv_index)
    u, v = u + 0.3 * normal(3, u.shape), v + 0.3 * normal(4, v.shape)
    state = state.set(theirs.uv_index, (u, v))
    ours.u.value, ours.v.value = u, our_v(v, kernel_shape)

    def their_call(model, state, x, inference):
        def one(x, state):
            return model(x, state, inference=inference)

        if not is_linear:
            x = jnp.moveaxis(x, -1, 1)
        # The state is the same for every example: take it from the first.
        ys, states = jax.vmap(one, in_axes=(0, None), out_axes=(0, None))(x, state)
        return (ys if is_linear else jnp.moveaxis(ys, 1, -1)), states

    step = pg.jit(lambda m, x: m(x))
    for i in range(3):
        x = normal(10 + i, shape)
        their_y, state = their_call(theirs, state, x, False)
        close(step(ours, x), their_y, 1e-5)
        u, v = state.get(theirs.uv_index)
        close(ours.u.value, u, 1e-5)
        close(their_v(ours.v.value, kernel_shape), v, 1e-5)

    ours.eval()
    x = normal(20, shape)
    their_y, state = their_call(theirs, state, x, True)
    close(ours(x), their_y, 1e-5)
    close(ours.u.value, state.get(theirs.uv_index)[0], 1e-5)

    def our_loss(m):
        return jnp.sum(jnp.sin(m(x)))

    def their_loss(m):
        return jnp.sum(jnp.sin(their_call(m, state, x, True)[0]))

    our_grads = pg.grad(our_loss)(ours)
    their_grads = eqx.filter_grad(their_loss)(theirs)
    close(eqx_weight(our_grads["layer"]["kernel"].value), their_grads.layer.weight, 1e-4)


def test_spectral_norm_estimates_agree_with_equinox():
    """From their own random vectors, both estimates are close to the true sigma."""
    ours = pnn.SpectralNorm(pnn.Linear(6, 4, rngs=0), rngs=1)
    theirs, state = eqx.nn.make_with_state(eqx.nn.SpectralNorm)(
        eqx_twin(ours.layer), "weight", key=jax.random.key(2)
    )
    u, v = state.get(theirs.uv_index)
    weight = theirs.layer.weight
    kernel = ours.layer.kernel.value
    sigma = np.linalg.norm(np.asarray(kernel), ord=2)
    close(float(u @ weight @ v), sigma, 1e-3)
    close(float(ours.v.value @ kernel @ ours.u.value), sigma, 1e-3)
