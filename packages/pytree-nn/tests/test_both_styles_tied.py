"""One model with Dropout, BatchNorm, a shared layer and a shared Param, trained 50 steps in
both styles, as the docs give them: the graph style (`Optimizer` + `pytree_graph.jit`) and
the functional style (optax + `filter_jit`, the loss returning the model as aux). Same
losses and weights at every step, same random masks, and both keep their ties."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_filter import filter, is_inexact_array
from pytree_graph import BatchStat, Param
from pytree_nn import BatchNorm, Dropout, Linear, Module, Optimizer, Rngs
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad

STEPS = 50
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


class Model(Module):
    def __init__(self, rngs: Rngs):
        self.encoder = Linear(6, 8, rngs=rngs)
        self.norm = BatchNorm(8, momentum=0.9, rngs=rngs)
        self.drop = Dropout(0.3, rngs=rngs)
        self.hidden = Linear(8, 8, rngs=rngs)
        self.again = self.hidden  # a shared layer: applied twice
        self.decoder_kernel = self.encoder.kernel  # a shared Param: the tied decoder

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.drop(jax.nn.relu(self.norm(self.encoder(x))))
        h = jnp.tanh(self.again(jnp.tanh(self.hidden(h))))
        return h @ self.decoder_kernel.value.T


def mse(model: Model, x: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - x) ** 2)


def batches():
    return [jax.random.normal(jax.random.key(i), (16, 6)) for i in range(STEPS)]


def snapshot(model: Model) -> dict:
    """Every Variable value by path (Params, BatchStats and the Dropout's RNG counter)."""
    return {
        path: np.asarray(jax.random.key_data(v.value) if _is_key(v.value) else v.value)
        for path, v in pg.state(model).flat_state().items()
    }


def _is_key(x) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def train_graph(tx):
    model = Model(Rngs(0))
    optimizer = Optimizer(model, tx, wrt=Param)

    @pg.jit
    def step(model, optimizer, x):
        loss, grads = pg.value_and_grad(mse)(model, x)
        optimizer.update(model, grads)
        return loss

    history = []
    for x in batches():
        loss = step(model, optimizer, x)
        history.append((float(loss), snapshot(model)))
    return model, history


def loss_and_model(model: Model, x: jax.Array):
    return mse(model, x), model


def train_functional(tx):
    model = Model(Rngs(0))
    opt_state = tx.init(filter(model, is_inexact_array))

    @filter_jit
    def step(model, opt_state, x):
        (loss, model), grads = filter_value_and_grad(loss_and_model, has_aux=True)(model, x)
        updates, opt_state = tx.update(grads, opt_state, filter(model, is_inexact_array))
        return apply_updates(model, updates), opt_state, loss

    history = []
    for x in batches():
        model, opt_state, loss = step(model, opt_state, x)
        history.append((float(loss), snapshot(model)))
    return model, history


def assert_tied(model: Model) -> None:
    assert model.again is model.hidden
    assert model.decoder_kernel is model.encoder.kernel


@pytest.mark.parametrize(
    "tx", [optax.adam(1e-2), optax.sgd(0.05, momentum=0.9)], ids=["adam", "momentum"]
)
def test_both_styles_train_identically_and_keep_their_ties(tx):
    graph, graph_history = train_graph(tx)
    functional, functional_history = train_functional(tx)
    for step, ((graph_loss, graph_state), (loss, state)) in enumerate(
        zip(graph_history, functional_history, strict=True)
    ):
        assert loss == pytest.approx(graph_loss, rel=1e-5), f"step {step}"
        assert state.keys() == graph_state.keys()
        for path in state:
            np.testing.assert_allclose(
                state[path], graph_state[path], **TOLERANCE, err_msg=f"step {step}, {path}"
            )
    assert_tied(graph)
    assert_tied(functional)
    # The training moved the running statistics and drew a new mask at every step.
    assert not np.allclose(functional.norm.mean.value, 0.0)
    assert isinstance(functional.norm.mean, BatchStat)
    assert int(functional.drop.rngs.default.count.value) == STEPS


def test_filter_grad_by_variable_type_sums_a_shared_param_into_one_gradient():
    # The filter the docs recommend for BatchNorm models stops flattening at each Param;
    # the Param held at two places is still one object, with one gradient: the sum of its
    # uses, as the default filter and pytree_graph.grad give.
    from pytree_filter import OfType
    from pytree_transforms import filter_grad

    model = Model(Rngs(0))
    model.eval()  # no Dropout mask, no statistics update: the three gradients compare
    x = batches()[0]
    by_type = filter_grad(mse, arg=OfType(Param))(model, x)
    default = filter_grad(mse)(model, x)
    graph = pg.grad(mse)(model, x)
    assert by_type.decoder_kernel is by_type.encoder.kernel
    assert by_type.again is by_type.hidden
    assert isinstance(by_type.encoder.kernel, Param)
    assert jax.tree.leaves(by_type.norm.mean) == []  # a BatchStat: not differentiated
    # pytree_graph.grad's State lists a shared Variable once, at its first path in
    # attribute order (`.decoder_kernel` before `.encoder.kernel`, `.again` before `.hidden`).
    for kernel, expected in (
        (by_type.encoder.kernel, default.encoder.kernel),
        (by_type.encoder.kernel, graph.decoder_kernel),
        (by_type.hidden.kernel, default.hidden.kernel),
        (by_type.hidden.kernel, graph.again.kernel),
    ):
        np.testing.assert_allclose(kernel.value, expected.value, **TOLERANCE)
