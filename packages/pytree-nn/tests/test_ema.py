import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Param
from pytree_nn import EMA, BatchNorm, Dropout, Linear, Module, Optimizer, Rngs


class Tied(Module):
    """A layer used twice, a BatchNorm (BatchStats), a Dropout (random-key state)."""

    def __init__(self, rngs):
        self.first = Linear(3, 3, rngs=rngs)
        self.second = self.first
        self.norm = BatchNorm(3, rngs=rngs)
        self.dropout = Dropout(0.1, rngs=rngs)
        self.head = Linear(3, 1, rngs=rngs)

    def __call__(self, x):
        x = self.second(jax.nn.relu(self.first(x)))
        return self.head(self.dropout(self.norm(x)))


def values(state):
    return {path: np.asarray(v.value) for path, v in state.flat_state().items()}


def test_update_matches_hand_written_average():
    model = Linear(2, 3, rngs=0)
    ema = EMA(model, decay=0.8)
    assert ema.params["kernel"] is not model.kernel
    assert isinstance(ema.params["kernel"], Param)
    expected = values(pg.state(model))
    for step in range(4):
        for variable in pg.state(model).flat_state().values():
            variable.value = variable.value + (step + 1) * 0.5
        ema.update(model)
        current = values(pg.state(model))
        expected = {p: 0.8 * expected[p] + 0.2 * current[p] for p in expected}
        for path, value in values(ema.params).items():
            np.testing.assert_allclose(value, expected[path], rtol=1e-6)
    assert int(ema.count.value) == 4


def test_debias_matches_optax():
    model = Linear(2, 3, rngs=0)
    ema = EMA(model, decay=0.9, debias=True)
    tx = optax.ema(0.9, debias=True)
    params = {"kernel": model.kernel.value, "bias": model.bias.value}
    opt_state = tx.init(params)
    # Before any update the average is the model's value.
    np.testing.assert_array_equal(ema.params["kernel"].value, model.kernel.value)
    for step in range(5):
        model.kernel.value = model.kernel.value * 1.3 + step
        model.bias.value = model.bias.value - step
        ema.update(model)
        params = {"kernel": model.kernel.value, "bias": model.bias.value}
        averaged, opt_state = tx.update(params, opt_state)
        np.testing.assert_allclose(ema.params["kernel"].value, averaged["kernel"], rtol=1e-5)
        np.testing.assert_allclose(ema.params["bias"].value, averaged["bias"], rtol=1e-5)
        if step == 0:  # after one update, the debiased average is the value itself
            np.testing.assert_allclose(ema.params["kernel"].value, model.kernel.value, rtol=1e-6)


def test_only_floating_point_variables_and_only_filter():
    model = Tied(Rngs(0))
    everything = EMA(model, 0.9)
    paths = set(everything.params.flat_state())
    assert ("norm", "mean") in paths and ("first", "kernel") in paths
    assert not any("dropout" in path for path in paths)  # random keys and counts left out
    assert ("second", "kernel") not in paths  # the tied layer is averaged once
    params_only = EMA(model, 0.9, only=Param)
    assert all(isinstance(v, Param) for v in params_only.params.flat_state().values())
    assert ("norm", "mean") not in set(params_only.params.flat_state())


def test_tied_model_under_graph_jit():
    model = Tied(Rngs(0))
    optimizer = Optimizer(model, optax.sgd(0.1))
    ema = EMA(model, decay=0.5, only=Param)
    ema_model = ema.apply_to(model)
    # Sharing kept: the tied layer is one object in the averaged model, holding the averages.
    assert ema_model.first is ema_model.second
    assert ema_model.first.kernel is ema.params["first"]["kernel"]
    # What the EMA does not average is the model's own (BatchStats, random streams).
    assert ema_model.norm.mean is model.norm.mean
    x = jax.random.normal(jax.random.key(1), (8, 3))
    y = jnp.ones((8, 1))

    @pg.jit
    def train_step(model, optimizer, ema):
        grads = pg.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        ema.update(model)

    expected = values(pg.state(model, Param))
    for _ in range(3):
        train_step(model, optimizer, ema)
        current = values(pg.state(model, Param))
        expected = {p: 0.5 * expected[p] + 0.5 * current[p] for p in expected}
    for path, value in values(pg.state(ema_model, Param)).items():
        np.testing.assert_allclose(value, expected[path], rtol=1e-5)
    assert int(ema.count.value) == 3
    # The averaged model runs, and the tie survives a split / merge round trip.
    ema_model.eval()
    assert ema_model(x).shape == (8, 1)
    graphdef, state = pg.split(ema_model)
    again = pg.merge(graphdef, state)
    assert again.first is again.second


def test_update_from_a_state_and_eval_under_jit():
    model = Linear(2, 2, rngs=0)
    ema = EMA(model, decay=0.0)
    model.kernel.value = model.kernel.value + 1
    ema.update(pg.state(model))  # a State of the Variables works too
    np.testing.assert_array_equal(ema.params["kernel"].value, model.kernel.value)


def test_errors():
    model = Linear(2, 2, rngs=0)
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\], got 1.5"):
        EMA(model, 1.5)
    with pytest.raises(ValueError, match="below 1 with debias=True"):
        EMA(model, 1.0, debias=True)
    with pytest.raises(TypeError, match="decay must be a float"):
        EMA(model, "0.9")
    with pytest.raises(ValueError, match="nothing to average"):
        EMA(model, 0.9, only=BatchStat)
    ema = EMA(model, 0.9)
    before = values(ema.params)
    with pytest.raises(ValueError, match=r"EMA.update: .*only=\.\.\. selects.*Missing: \.bias"):
        # Another structure: another model whose paths differ.
        other = Module()
        other.kernel = Param(jnp.zeros((2, 2)))
        ema.update(other)
    with pytest.raises(ValueError, match=r"\.kernel has shape \(3, 2\).*\(2, 2\)"):
        ema.update(Linear(3, 2, rngs=0))
    with pytest.raises(ValueError, match=r"EMA.apply_to: .*Missing"):
        ema.apply_to(Linear(2, 2, use_bias=False, rngs=0))
    for path, value in values(ema.params).items():  # nothing was written
        np.testing.assert_array_equal(value, before[path])
    assert int(ema.count.value) == 0


def test_a_model_that_gained_a_variable_is_named():
    model = Linear(2, 2, rngs=0)
    ema = EMA(model, 0.9)
    model.extra = Param(jnp.zeros(3))
    with pytest.raises(ValueError, match=r"New: \.extra\. Pass the model the EMA was built"):
        ema.update(model)


def test_checkpoint_round_trip(tmp_path):
    from pytree_nn import load_checkpoint, save_checkpoint

    model = Tied(Rngs(0))
    ema = EMA(model, 0.9, debias=True)
    model.first.kernel.value = model.first.kernel.value + 1
    ema.update(model)
    save_checkpoint(tmp_path / "ema.safetensors", ema)
    restored = load_checkpoint(tmp_path / "ema.safetensors", EMA(Tied(Rngs(1)), 0.9, debias=True))
    for path, value in values(ema.params).items():
        np.testing.assert_array_equal(values(restored.params)[path], value)
    assert int(restored.count.value) == 1
