"""`TrainState` (functional) and `ModelAndOptimizer` (in place)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Param, State
from pytree_nn import BatchNorm, Linear, ModelAndOptimizer, Module, Optimizer, Rngs, TrainState
from pytree_transforms import filter_jit

X = jax.random.normal(jax.random.key(0), (16, 3))
Y = X @ jnp.array([[1.0], [-2.0], [0.5]]) + 0.3


class TiedRegressor(Module):
    def __init__(self, rngs):
        self.hidden = Linear(3, 3, rngs=rngs)
        self.again = self.hidden  # the same layer used twice
        self.out = Linear(3, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.tanh(self.again(jax.nn.tanh(self.hidden(x)))))


def reference_adam(params, steps):
    """The same training by hand: jax.grad and optax on a dict of arrays."""
    tx = optax.adam(0.05)
    opt_state = tx.init(params)

    def loss(p):
        h = jnp.tanh(X @ p["hk"] + p["hb"])
        h = jnp.tanh(h @ p["hk"] + p["hb"])
        return jnp.mean((h @ p["ok"] + p["ob"] - Y) ** 2)

    for _ in range(steps):
        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params


def initial_arrays(model):
    return {
        "hk": model.hidden.kernel.value,
        "hb": model.hidden.bias.value,
        "ok": model.out.kernel.value,
        "ob": model.out.bias.value,
    }


def test_train_state_matches_hand_written_optax_on_a_tied_model():
    model = TiedRegressor(Rngs(0))
    expected = reference_adam(initial_arrays(model), steps=5)
    graphdef, params = pg.split(model, Param)
    assert len(params.flat_state()) == 4  # the tied layer once
    state = TrainState.create(graphdef, params=params, tx=optax.adam(0.05))
    assert int(state.step) == 0

    @jax.jit
    def train_step(state):
        def loss_fn(params):
            prediction, _ = state.apply(params)(X)
            return jnp.mean((prediction - Y) ** 2)

        grads = jax.grad(loss_fn)(state.params)
        return state.apply_gradients(grads)

    first = state
    for _ in range(5):
        state = train_step(state)
    assert int(state.step) == 5 and int(first.step) == 0  # a new state each time
    trained = pg.merge(state.graphdef, state.params)
    assert trained.hidden is trained.again  # the tie kept
    np.testing.assert_allclose(trained.hidden.kernel.value, expected["hk"], rtol=1e-5)
    np.testing.assert_allclose(trained.out.bias.value, expected["ob"], rtol=1e-5)


class WithBatchStats(TrainState, frozen=True):
    batch_stats: State


def test_subclass_with_batch_stats_and_field_names_in_apply():
    model = Module()
    model.linear = Linear(3, 2, rngs=0)
    model.norm = BatchNorm(2, rngs=0)
    graphdef, params, batch_stats = pg.split(model, Param, BatchStat)
    state = WithBatchStats.create(
        graphdef, params=params, tx=optax.sgd(0.1), batch_stats=batch_stats
    )

    @filter_jit
    def train_step(state):
        def loss_fn(params):
            (out, (_, new_state)) = state.apply(params, "batch_stats").norm(X @ jnp.ones((3, 2)))
            return jnp.mean(out**2), new_state

        grads, new_state = jax.grad(loss_fn, has_aux=True)(state.params)
        _, new_batch_stats = new_state.split(Param, BatchStat)
        return state.apply_gradients(grads, batch_stats=new_batch_stats)

    new = train_step(state)
    assert isinstance(new, WithBatchStats) and int(new.step) == 1
    moved = new.batch_stats["norm"]["mean"].value
    assert not np.allclose(moved, state.batch_stats["norm"]["mean"].value)
    np.testing.assert_allclose(moved, 0.01 * jnp.mean(X @ jnp.ones((3, 2)), axis=0), rtol=1e-5)


def test_train_state_errors():
    graphdef, params = pg.split(Linear(2, 1, rngs=0), Param)
    with pytest.raises(TypeError, match="tx must be an optax GradientTransformation"):
        TrainState.create(graphdef, params=params, tx="adam")
    with pytest.raises(TypeError, match="graphdef must be a GraphDef"):
        TrainState.create(params, params=params, tx=optax.sgd(0.1))
    state = TrainState.create(graphdef, params=params, tx=optax.sgd(0.1))
    with pytest.raises(
        ValueError, match=r"grads are not structured like params.*No gradient for: \.kernel"
    ):
        state.apply_gradients(State({"bias": params["bias"]}))
    with pytest.raises(TypeError, match=r"'tx' must name a field holding a State.*'params'"):
        state.apply("tx")


def test_model_and_optimizer_matches_optimizer_under_jit():
    model_a, model_b = TiedRegressor(Rngs(0)), TiedRegressor(Rngs(0))
    plain = Optimizer(model_a, optax.adam(0.05))
    combined = ModelAndOptimizer(model_b, optax.adam(0.05))
    assert combined.model is model_b and isinstance(combined, Optimizer)

    def loss_fn(model):
        return jnp.mean((model(X) - Y) ** 2)

    @pg.jit
    def step_plain(model, optimizer):
        optimizer.update(model, pg.grad(loss_fn)(model))

    @pg.jit
    def step_combined(optimizer):
        optimizer.update(pg.grad(loss_fn)(optimizer.model))

    for _ in range(4):
        step_plain(model_a, plain)
        step_combined(combined)
    expected = reference_adam(initial_arrays(TiedRegressor(Rngs(0))), steps=4)
    np.testing.assert_allclose(model_b.hidden.kernel.value, expected["hk"], rtol=1e-5)
    for a, b in zip(
        pg.state(model_a).flat_state().values(),
        pg.state(model_b).flat_state().values(),
        strict=True,
    ):
        np.testing.assert_array_equal(a.value, b.value)
    assert model_b.hidden is model_b.again
    assert int(combined.step.value) == 4


def test_model_and_optimizer_errors():
    model = Linear(2, 1, rngs=0)
    optimizer = ModelAndOptimizer(model, optax.sgd(0.1))
    grads = pg.grad(lambda m: jnp.sum(m(jnp.ones((1, 2)))))(model)
    with pytest.raises(TypeError, match=r"takes the gradients only: `optimizer.update\(grads\)`"):
        optimizer.update(model, grads)
    with pytest.raises(TypeError, match="takes the gradients only"):
        optimizer.update()
    with pytest.raises(ValueError, match=r"No gradient for: \.kernel"):
        optimizer.update(State({"bias": grads["bias"]}))
    assert int(optimizer.step.value) == 0
    with pytest.raises(TypeError, match="positional"):
        ModelAndOptimizer(model, optax.sgd(0.1), Param)  # wrt is keyword-only, as in NNX
