"""Equinox-style state passing: `StateIndex`, `State`, `make_with_state`, and BatchNorm and
SpectralNorm called as `y, state = layer(x, state)`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_nn import (
    BatchNorm,
    Linear,
    Module,
    SpectralNorm,
    State,
    StateIndex,
    make_with_state,
)
from pytree_transforms import filter_jit, filter_vmap

CLOSE = dict(rtol=1e-5, atol=1e-5)


class Counter(Module):
    def __init__(self):
        self.index = StateIndex(jnp.array(0))

    def __call__(self, x, state):
        count = state.get(self.index)
        return x + count, state.set(self.index, count + 1)


class Model(Module):
    def __init__(self):
        self.linear = Linear(3, 4, rngs=0)
        self.norm = BatchNorm(4, axis_name="batch", momentum=0.8, rngs=0)
        self.spectral = SpectralNorm(Linear(4, 2, rngs=1), rngs=2)

    def __call__(self, x, state):
        x, state = self.norm(self.linear(x), state)
        return self.spectral(jax.nn.relu(x), state)


def test_a_state_index_counts_through_calls_and_jit():
    counter, state = make_with_state(Counter)()
    assert counter.index.marker == "Counter.index"
    step = filter_jit(counter)
    for _ in range(3):
        y, state = step(jnp.array(10), state)
    assert int(y) == 12 and int(state.get(counter.index)) == 3
    # A number given as the initial value becomes an array.
    assert isinstance(StateIndex(0).init, jax.Array)


def test_two_models_built_alike_have_interchangeable_states():
    first, state = make_with_state(Model)()
    second, _ = make_with_state(Model)()
    assert jax.tree.structure(state) == jax.tree.structure(make_with_state(Model)()[1])
    _y, state = filter_vmap(second, in_axes=(0, None), out_axes=(0, None), axis_name="batch")(
        jnp.ones((4, 3)), state
    )
    assert set(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)) == {
        "['Model.norm']['mean']",
        "['Model.norm']['var']",
        "['Model.spectral']['u']",
        "['Model.spectral']['v']",
    }
    del first


def test_batch_norm_with_state_under_filter_vmap_is_batch_norm_over_the_batch():
    # filter_vmap with axis_name, as Equinox runs its BatchNorm: the statistics of the
    # whole batch, the same as the layer called on the batch in place.
    model, state = make_with_state(Model)()
    reference = pg.clone(model)
    x = jax.random.normal(jax.random.key(0), (8, 3))
    batched = filter_jit(
        filter_vmap(model, in_axes=(0, None), out_axes=(0, None), axis_name="batch")
    )
    y, new_state = batched(x, state)
    norm = reference.norm
    norm.axis_name = None
    expected = reference.spectral(jax.nn.relu(norm(reference.linear(x))))
    np.testing.assert_allclose(y, expected, **CLOSE)
    for name in ("mean", "var"):
        np.testing.assert_allclose(
            new_state.get(model.norm)[name], getattr(norm, name).value, **CLOSE
        )
    for name in ("u", "v"):
        np.testing.assert_allclose(
            new_state.get(model.spectral)[name], getattr(reference.spectral, name).value, **CLOSE
        )
    # The model's own Variables are untouched: the State carries the updates.
    np.testing.assert_array_equal(model.norm.mean.value, jnp.zeros(4))
    np.testing.assert_array_equal(model.spectral.u.value, state.get(model.spectral)["u"])


def test_evaluation_mode_reads_the_state_and_keeps_it():
    model, state = make_with_state(Model)()
    x = jax.random.normal(jax.random.key(1), (8, 3))
    run = filter_vmap(model, in_axes=(0, None), out_axes=(0, None), axis_name="batch")
    _, state = run(x, state)
    model.eval()
    before = jax.tree.map(np.asarray, state)
    y, after = run(x, state)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, after), before)
    # The same as the layers in place, their Variables holding the State's values.
    reference = pg.clone(model)
    for layer, names in ((reference.norm, ("mean", "var")), (reference.spectral, ("u", "v"))):
        for name in names:
            getattr(layer, name).value = before.get(layer)[name]
    expected = reference.spectral(jax.nn.relu(reference.norm(reference.linear(x))))
    np.testing.assert_allclose(y, expected, **CLOSE)


def test_graph_style_transforms_carry_the_state():
    model, state = make_with_state(Model)()

    @pg.jit
    def step(model, state, x):
        return pg.vmap(
            lambda x, state: model(x, state),
            in_axes=(0, None),
            out_axes=(0, None),
            axis_name="batch",
        )(x, state)

    y, state = step(model, state, jnp.ones((4, 3)))
    assert y.shape == (4, 2)
    assert isinstance(state, State)
    np.testing.assert_array_equal(model.norm.mean.value, jnp.zeros(4))


def test_a_shared_layer_has_one_entry():
    class Twice(Module):
        def __init__(self):
            self.norm = BatchNorm(2, rngs=0)
            self.again = self.norm

    model, state = make_with_state(Twice)()
    assert len(jax.tree.leaves(state)) == 2  # mean and var, once
    assert model.norm.state_key == "Twice.again" or model.norm.state_key == "Twice.norm"


def test_state_of_a_bare_layer_and_in_place_calls_still_work():
    norm = BatchNorm(2, momentum=0.5, rngs=0)
    x = jnp.array([[0.0, 4.0], [2.0, 6.0]])
    state = State(norm)
    assert norm.state_key == "BatchNorm"
    y, state = norm(x, state)
    np.testing.assert_allclose(state.get(norm)["mean"], [0.5, 2.5])
    np.testing.assert_array_equal(norm.mean.value, [0.0, 0.0])
    np.testing.assert_allclose(norm(x), y, **CLOSE)  # in place: the Variables
    np.testing.assert_allclose(norm.mean.value, [0.5, 2.5])


def test_set_and_update_retire_the_old_state():
    counter, state = make_with_state(Counter)()
    new = state.set(counter.index, jnp.array(5))
    for call in (
        lambda: state.get(counter.index),
        lambda: state.set(counter.index, 1),
        lambda: state.substate(counter),
        lambda: state.update(new.substate(counter)),
    ):
        with pytest.raises(ValueError, match="already used"):
            call()
    assert "retired" in repr(state)
    sub = new.substate(counter)
    assert int(sub.get(counter.index)) == 5
    assert int(new.update(sub.set(counter.index, 7)).get(counter.index)) == 7


def test_bad_uses_raise_and_change_nothing():
    counter, state = make_with_state(Counter)()
    with pytest.raises(ValueError, match="shapes and dtypes"):
        state.set(counter.index, jnp.zeros(3))
    with pytest.raises(ValueError, match="shapes and dtypes"):
        state.set(counter.index, jnp.array(0.5))
    assert int(state.get(counter.index)) == 0  # still usable, unchanged
    with pytest.raises(ValueError, match="no entry in the State"):
        state.get(StateIndex(jnp.array(1)))
    with pytest.raises(ValueError, match="no entry in the State"):
        state.get(BatchNorm(2, rngs=0))
    with pytest.raises(TypeError, match="StateIndex or a stateful layer"):
        state.get("count")
    _other, other_state = make_with_state(Model)()
    with pytest.raises(ValueError, match="not in this State"):
        state.update(other_state)
    with pytest.raises(TypeError, match="takes a State"):
        state.update({})
    assert int(state.get(counter.index)) == 0
    with pytest.raises(ValueError, match="initial value of the state, not a function"):
        StateIndex(lambda: jnp.zeros(2))


def test_batch_norm_takes_a_state_or_the_mode_by_position():
    norm = BatchNorm(2, rngs=0)
    x = jnp.ones((3, 2))
    # A bool by position is use_running_average, as in Flax NNX.
    np.testing.assert_allclose(norm(x, True), norm(x, use_running_average=True))
    with pytest.raises(TypeError, match="given twice"):
        norm(x, True, use_running_average=False)
    with pytest.raises(TypeError, match=r"use_running_average \(True or False\) or the State"):
        norm(x, {"mean": jnp.zeros(2)})
    np.testing.assert_array_equal(norm.mean.value, jnp.zeros(2))


def test_sequential_passes_the_state_through_its_stateful_layers():
    from pytree_nn import Identity, Sequential

    class StatefulCounter(Counter):
        def is_stateful(self):  # Equinox's StatefulLayer protocol
            return True

    class Net(Module):
        def __init__(self):
            self.seq = Sequential(
                Linear(3, 4, rngs=0),
                jax.nn.relu,
                Sequential(BatchNorm(4, rngs=0), Identity()),
                SpectralNorm(Linear(4, 2, rngs=1), rngs=2),
                StatefulCounter(),
            )

    net, state = make_with_state(Net)()
    assert net.seq.is_stateful()
    assert not Sequential(Linear(2, 2, rngs=0)).is_stateful()
    x = jax.random.normal(jax.random.key(0), (5, 3))
    y, new_state = net.seq(x, state)
    # The same as the layers in place (the counter held 0).
    reference = pg.clone(net).seq.layers
    expected = reference[3](reference[2](jax.nn.relu(reference[0](x))))
    np.testing.assert_allclose(y, expected, **CLOSE)
    norm = net.seq.layers[2].layers[0]
    np.testing.assert_allclose(
        new_state.get(norm)["mean"], reference[2].layers[0].mean.value, **CLOSE
    )
    assert int(new_state.get(net.seq.layers[4].index)) == 1
    with pytest.raises(TypeError, match="State of Equinox-style state passing"):
        net.seq(x, {"mean": 0})
