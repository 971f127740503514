"""One weight-tied model, trained in both styles, gives the same numbers and keeps its tie."""

import jax
import jax.numpy as jnp
import optax
import pytest

import pytree_graph as pg
from pytree_filter import filter, is_inexact_array
from pytree_graph import Param
from pytree_nn import Linear, Module, Optimizer, Rngs
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad


class TiedDecoder(Module):
    def __init__(self, kernel: Param, features: int):
        self.kernel = kernel  # the encoder's Param: one object at two places
        self.bias = Param(jnp.zeros((features,)))

    def __call__(self, code):
        return code @ self.kernel.value.T + self.bias.value


class TiedAutoencoder(Module):
    def __init__(self, rngs: Rngs):
        self.encoder = Linear(6, 3, rngs=rngs)
        self.decoder = TiedDecoder(self.encoder.kernel, 6)

    def __call__(self, x):
        return self.decoder(jax.nn.tanh(self.encoder(x)))


def mse(model, x):
    return jnp.mean((model(x) - x) ** 2)


@pytest.fixture
def data():
    return jax.random.normal(jax.random.key(1), (8, 6))


def train_graph_style(data, steps, tx):
    model = TiedAutoencoder(Rngs(0))
    optimizer = Optimizer(model, tx, wrt=Param)

    @pg.jit
    def step(model, optimizer, x):
        loss, grads = pg.value_and_grad(mse)(model, x)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer, data)) for _ in range(steps)]
    return model, losses


def train_functional_style(data, steps, tx):
    model = TiedAutoencoder(Rngs(0))
    opt_state = tx.init(filter(model, is_inexact_array))

    @filter_jit
    def step(model, opt_state, x):
        loss, grads = filter_value_and_grad(mse)(model, x)
        updates, opt_state = tx.update(grads, opt_state, model)
        return apply_updates(model, updates), opt_state, loss

    losses = []
    for _ in range(steps):
        model, opt_state, loss = step(model, opt_state, data)
        losses.append(float(loss))
    return model, losses


@pytest.mark.parametrize(
    "tx", [optax.adam(0.05), optax.sgd(0.1, momentum=0.9)], ids=["adam", "momentum"]
)
def test_a_tied_model_trains_identically_in_both_styles(data, tx):
    graph, graph_losses = train_graph_style(data, 10, tx)
    functional, functional_losses = train_functional_style(data, 10, tx)
    assert graph.decoder.kernel is graph.encoder.kernel
    assert functional.decoder.kernel is functional.encoder.kernel
    assert functional_losses == pytest.approx(graph_losses, rel=1e-5)
    assert jnp.allclose(functional.encoder.kernel.value, graph.encoder.kernel.value, atol=1e-6)
    assert jnp.allclose(functional.decoder.bias.value, graph.decoder.bias.value, atol=1e-6)


def test_plain_jax_jit_loses_the_tie_as_documented(data):
    """What the docs warn of: plain JAX transforms flatten the shared Param twice."""
    model = TiedAutoencoder(Rngs(0))
    copied = jax.jit(lambda m: m)(model)
    assert copied.decoder.kernel is not copied.encoder.kernel
    kept = filter_jit(lambda m: m)(model)
    assert kept.decoder.kernel is kept.encoder.kernel
