"""Equinox's stateful layers, `Shared`, "scalar" sizes and learnt MLP activations, side by
side with pytree_nn's: the same snippets on both libraries, with the weights copied across,
give the same shapes, outputs and state updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_nn as pnn
from pytree_transforms import filter_vmap

eqx = pytest.importorskip("equinox")

CLOSE = dict(rtol=1e-5, atol=1e-5)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **CLOSE)


def linear_from(eqx_linear, ours):
    """`ours` with the weights of `eqx_linear` (whose weight is `(out, in)`)."""
    ours.kernel.value = eqx_linear.weight.T
    if eqx_linear.bias is not None:
        ours.bias.value = eqx_linear.bias
    return ours


@pytest.mark.parametrize(
    ("sizes", "x"),
    [
        (("scalar", 3), jnp.array(0.7)),
        ((3, "scalar"), jnp.arange(3.0)),
        (("scalar", "scalar"), jnp.array(-1.5)),
    ],
)
def test_linear_with_scalar_sizes_matches_equinox(sizes, x):
    theirs = eqx.nn.Linear(*sizes, key=jax.random.key(0))
    ours = linear_from(theirs, pnn.Linear(*sizes, rngs=0))
    assert ours.kernel.value.shape == theirs.weight.T.shape
    assert ours.bias.value.shape == theirs.bias.shape
    y = ours(x)
    assert y.shape == theirs(x).shape and y.dtype == theirs(x).dtype
    close(y, theirs(x))
    # A batch of inputs: Equinox's vmap is the leading axis of ours.
    xs = jnp.stack([x, x + 1.0])
    close(ours(xs), jax.vmap(theirs)(xs))


def test_linear_scalar_input_of_another_shape_raises_in_both():
    with pytest.raises(ValueError, match="scalar"):
        eqx.nn.Linear("scalar", 2, key=jax.random.key(0))(jnp.ones(2))
    # Ours takes every element as one input (a batch); a feature axis is refused elsewhere.
    with pytest.raises(ValueError, match="in_features"):
        pnn.Linear(3, 2, rngs=0)(jnp.ones(()))


def mlp_from(theirs, ours):
    for their_layer, our_layer in zip(theirs.layers, ours.layers, strict=True):
        linear_from(their_layer, our_layer)
    for name in ("activation", "final_activation"):
        their_activation = getattr(theirs, name)
        if isinstance(their_activation, eqx.nn.PReLU):
            getattr(ours, name).negative_slope.value = their_activation.negative_slope
    return ours


@pytest.mark.parametrize("in_size", ["scalar", 3])
@pytest.mark.parametrize("out_size", ["scalar", 2])
def test_mlp_with_scalar_sizes_and_prelu_matches_equinox(in_size, out_size):
    key = jax.random.key(1)
    theirs = eqx.nn.MLP(
        in_size,
        out_size,
        4,
        2,
        activation=eqx.nn.PReLU(0.1),
        final_activation=eqx.nn.PReLU(0.3),
        key=key,
    )
    ours = pnn.MLP(
        in_size,
        out_size,
        4,
        2,
        activation=pnn.PReLU(0.1),
        final_activation=pnn.PReLU(0.3),
        rngs=0,
    )
    assert ours.activation.negative_slope.value.shape == theirs.activation.negative_slope.shape
    their_final = theirs.final_activation
    if isinstance(their_final, eqx.nn.PReLU):
        assert ours.final_activation.negative_slope.value.shape == their_final.negative_slope.shape
    close(ours.activation.negative_slope.value, theirs.activation.negative_slope)
    # Distinct slopes per layer and neuron, so that a mix-up of copies would show.
    slopes = jnp.linspace(-0.5, 0.5, theirs.activation.negative_slope.size).reshape(
        theirs.activation.negative_slope.shape
    )
    theirs = eqx.tree_at(lambda m: m.activation.negative_slope, theirs, slopes)
    ours = mlp_from(theirs, ours)
    x = jnp.array(-0.8) if in_size == "scalar" else jnp.array([-1.0, 0.5, -2.0])
    close(ours(x), theirs(x))
    assert ours(x).shape == theirs(x).shape
    # Gradients with respect to the slopes: one per layer and neuron, the same in both.
    their_grads = eqx.filter_grad(lambda m: jnp.sum(m(x)))(theirs)
    import pytree_graph as pg

    our_grads = pg.grad(lambda m: jnp.sum(m(x)))(ours)
    close(our_grads["activation"]["negative_slope"].value, their_grads.activation.negative_slope)


@pytest.mark.parametrize("scan", [False, True])
def test_mlp_with_prelu_under_scan_matches_equinox(scan):
    theirs = eqx.nn.MLP(2, 3, 5, 4, activation=eqx.nn.PReLU(), scan=scan, key=jax.random.key(2))
    slopes = jax.random.uniform(jax.random.key(3), theirs.activation.negative_slope.shape)
    theirs = eqx.tree_at(lambda m: m.activation.negative_slope, theirs, slopes)
    ours = pnn.MLP(2, 3, 5, 4, activation=pnn.PReLU(), scan=scan, rngs=0)
    ours.activation.negative_slope.value = slopes
    if scan:
        first, stacked, last = theirs.layers
        linear_from(first, ours.layers[0])
        ours.layers[1].kernel.value = jnp.swapaxes(stacked.weight, 1, 2)
        ours.layers[1].bias.value = stacked.bias
        linear_from(last, ours.layers[2])
    else:
        mlp_from(theirs, ours)
    x = jax.random.normal(jax.random.key(4), (6, 2))
    close(ours(x), jax.vmap(theirs)(x))


class EqxModel(eqx.Module):
    linear: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    spectral: eqx.nn.SpectralNorm

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.linear = eqx.nn.Linear(3, 4, key=k1)
        self.norm = eqx.nn.BatchNorm(4, axis_name="batch", momentum=0.9, mode="batch")
        self.spectral = eqx.nn.SpectralNorm(eqx.nn.Linear(4, 2, key=k2), "weight", key=k3)

    def __call__(self, x, state):
        x, state = self.norm(self.linear(x), state)
        return self.spectral(jax.nn.relu(x), state)


class OurModel(pnn.Module):
    def __init__(self):
        self.linear = pnn.Linear(3, 4, rngs=0)
        self.norm = pnn.BatchNorm(
            4, axis_name="batch", momentum=0.9, use_fast_variance=False, rngs=0
        )
        self.spectral = pnn.SpectralNorm(pnn.Linear(4, 2, rngs=1), "kernel", rngs=2)

    def __call__(self, x, state):
        x, state = self.norm(self.linear(x), state)
        return self.spectral(jax.nn.relu(x), state)


def copied_pair():
    theirs, their_state = eqx.nn.make_with_state(EqxModel)(jax.random.key(0))
    ours, state = pnn.make_with_state(OurModel)()
    linear_from(theirs.linear, ours.linear)
    linear_from(theirs.spectral.layer, ours.spectral.layer)
    u, v = their_state.get(theirs.spectral.uv_index)
    state = state.set(ours.spectral, {"u": u, "v": v})
    return theirs, their_state, ours, state


def test_a_batch_norm_model_with_state_trains_as_in_equinox():
    theirs, their_state, ours, state = copied_pair()
    their_step = eqx.filter_jit(
        eqx.filter_vmap(theirs, in_axes=(0, None), out_axes=(0, None), axis_name="batch")
    )
    our_step = filter_vmap(ours, in_axes=(0, None), out_axes=(0, None), axis_name="batch")
    for i in range(3):
        x = jax.random.normal(jax.random.key(10 + i), (8, 3))
        their_y, their_state = their_step(x, their_state)
        y, state = our_step(x, state)
        assert y.shape == their_y.shape
        close(y, their_y)
        their_mean, their_var = their_state.get(theirs.norm.batch_state_index)
        close(state.get(ours.norm)["mean"], their_mean)
        close(state.get(ours.norm)["var"], their_var)
        their_u, their_v = their_state.get(theirs.spectral.uv_index)
        close(state.get(ours.spectral)["u"], their_u)
        close(state.get(ours.spectral)["v"], their_v)
    # The layers' own Variables were not touched: the State holds the updates.
    close(ours.norm.mean.value, jnp.zeros(4))


def test_state_keys_and_old_state_errors_match_equinox():
    theirs, their_state = eqx.nn.make_with_state(EqxModel)(jax.random.key(0))
    ours, state = pnn.make_with_state(OurModel)()
    # Keys from the paths, as Equinox's markers.
    assert theirs.norm.batch_state_index.marker.startswith("EqxModel.norm")
    assert ours.norm.state_key == "OurModel.norm"
    assert ours.spectral.state_key == "OurModel.spectral"
    # Both retire the State `set` was called on.
    index = theirs.norm.batch_counter
    their_state.set(index, jnp.array(1))
    with pytest.raises(ValueError):
        their_state.get(index)
    state.set(ours.norm, state.get(ours.norm))
    with pytest.raises(ValueError, match="already used"):
        state.get(ours.norm)
    # Both refuse a new value of another shape.
    _, their_state = eqx.nn.make_with_state(EqxModel)(jax.random.key(0))
    with pytest.raises(ValueError):
        their_state.set(index, jnp.zeros(2))
    _, state = pnn.make_with_state(OurModel)()
    with pytest.raises(ValueError, match="shapes and dtypes"):
        state.set(ours.norm, {"mean": jnp.zeros(3), "var": jnp.ones(4)})


def test_substate_and_update_match_equinox():
    class Counter(pnn.Module):
        def __init__(self):
            self.index = pnn.StateIndex(jnp.array(0))

        def __call__(self, x, state):
            count = state.get(self.index)
            return x + count, state.set(self.index, count + 1)

    class EqxCounter(eqx.Module):
        index: eqx.nn.StateIndex

        def __init__(self):
            self.index = eqx.nn.StateIndex(jnp.array(0))

        def __call__(self, x, state):
            count = state.get(self.index)
            return x + count, state.set(self.index, count + 1)

    for make, make_with_state in [
        (lambda: (Counter(), Counter()), pnn.make_with_state),
        (lambda: (EqxCounter(), EqxCounter()), eqx.nn.make_with_state),
    ]:
        (first, second), state = make_with_state(make)()
        sub = state.substate(second)
        y, sub = second(jnp.array(5), sub)
        y, sub = second(jnp.array(5), sub)
        state = state.update(sub)
        assert int(y) == 6
        assert int(state.get(first.index)) == 0
        assert int(state.get(second.index)) == 2


def test_shared_ties_an_embedding_to_a_linear_as_in_equinox():
    embedding = eqx.nn.Embedding(5, 3, key=jax.random.key(0))
    linear = eqx.nn.Linear(3, 5, key=jax.random.key(1))
    theirs = eqx.nn.Shared(
        (embedding, linear), lambda pair: pair[1].weight, lambda pair: pair[0].weight
    )
    ours_pair = (pnn.Embedding(5, 3, rngs=0), pnn.Linear(3, 5, rngs=1))
    ours_pair[0].embedding.value = embedding.weight
    linear_from(linear, ours_pair[1])
    # Our Linear's kernel is (in, out): the embedding transposed.
    ours = pnn.Shared(
        ours_pair, lambda pair: pair[1].kernel, lambda pair: pair[0].embedding.value.T
    )

    def run(pair, tokens):
        embed, out = pair
        return out(embed(tokens))

    tokens = jnp.array([0, 3, 4])
    their_embed, their_linear = theirs()
    expected = jax.vmap(lambda t: their_linear(their_embed(t)))(tokens)
    close(run(ours(), tokens), expected)
    # One weight, so one gradient: the sum over both uses.
    their_grads = eqx.filter_grad(
        lambda s: jnp.sum(jax.vmap(lambda t: s()[1](s()[0](t)))(tokens) ** 2)
    )(theirs)
    from pytree_transforms import filter_grad

    our_grads = filter_grad(lambda s: jnp.sum(run(s(), tokens) ** 2))(ours)
    close(our_grads.pytree[0].embedding.value, their_grads.pytree[0].weight)
