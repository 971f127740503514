"""`call`, `map`, `update` with a pure dict, `clone`'s options and the `State` method
`replace_by_pure_dict`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_graph import (
    BatchStat,
    Param,
    State,
    Variable,
    call,
    clone,
    map,
    split,
    state,
    to_pure_dict,
    update,
)
from pytree_module import Module


class Linear(Module):
    def __init__(self, n=2):
        self.w = Param(jnp.ones(n))
        self.count = Variable(jnp.array(0))

    def __call__(self, x):
        self.count.value += 1
        return x * self.w.value

    def encode(self, x):
        return 2 * x


class Model(Module):
    def __init__(self):
        self.encoder = Linear()
        self.decoder = self.encoder
        self.layers = [Linear(3), Linear(3)]
        self.mean = BatchStat(jnp.zeros(1))
        self.offset = jnp.zeros(2)

    def __call__(self, x):
        return self.decoder(self.encoder(x)) + self.offset


def test_call_returns_the_output_and_the_new_state_and_touches_nothing():
    model = Model()
    gs = split(model)
    y, (graphdef, new_state) = call(gs)(jnp.ones(2))
    assert y.tolist() == [1.0, 1.0] and graphdef == gs[0]
    assert int(new_state.decoder.count.value) == 2
    assert int(gs[1].decoder.count.value) == 0 and int(model.encoder.count.value) == 0
    _, (_, again) = call((graphdef, new_state))(jnp.ones(2))
    assert int(again.decoder.count.value) == 4 and int(new_state.decoder.count.value) == 2


def test_call_reaches_methods_by_attribute_and_index():
    gs = split(Model())
    out, (_, new_state) = call(gs).layers[1](jnp.ones(3))
    assert out.tolist() == [1.0] * 3 and int(new_state.layers[1].count.value) == 1
    assert float(call(gs)["layers"][0].encode(2.0)[0]) == 4.0
    assert float(call(gs).encoder.encode(1.5)[0]) == 3.0
    nodes = split({"a": Linear(), "b": Linear()})
    _, (_, after) = call(nodes)["b"](1.0)
    assert int(after["b"].count.value) == 1 and int(after["a"].count.value) == 0


def test_call_under_jit_and_errors():
    gs = split(Model())
    step = jax.jit(lambda gs, x: call(gs)(x))
    _, gs = step(gs, jnp.ones(2))
    _, gs = step(gs, jnp.ones(2))
    assert int(gs[1].decoder.count.value) == 4
    with pytest.raises(AttributeError, match=r"nothing at `\.layers\[5\]`"):
        call(gs).layers[5](1.0)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        call(gs).nope()
    with pytest.raises(TypeError, match="not callable"):
        call(gs).mean()
    with pytest.raises(TypeError, match=r"expects the tuple `\(graphdef, state\)`"):
        call(Model())


def test_graphdef_apply_with_filtered_states():
    graphdef, params, rest = split(Model(), Param, ...)
    out, (_, new_state) = graphdef.apply(params, rest).encoder(jnp.ones(2))
    assert out.tolist() == [1.0, 1.0] and int(new_state.decoder.count.value) == 1
    assert int(rest.decoder.count.value) == 0


def test_map_makes_a_new_graph_and_leaves_the_old_one():
    model = Model()
    same = map(lambda path, v: v, model)
    assert same is not model and same.encoder is same.decoder
    assert same.encoder.w is model.encoder.w
    seen = []

    def zero_params(path, leaf):
        seen.append(path)
        return jnp.zeros_like(leaf.value) if isinstance(leaf, Param) else leaf

    zeros = map(zero_params, model)
    assert ("decoder", "w") in seen and ("encoder", "w") not in seen  # shared: once
    assert type(zeros.encoder.w) is Param and zeros.encoder.w.value.tolist() == [0.0, 0.0]
    assert model.encoder.w.value.tolist() == [1.0, 1.0]
    assert zeros.mean is model.mean and zeros.encoder is zeros.decoder
    with pytest.raises(TypeError, match=r"The graph comes second: `map\(fn, node\)`"):
        map(model, zero_params)


def test_update_with_a_pure_dict_sets_what_it_names():
    model = Model()
    update(model, {"decoder": {"w": jnp.full(2, 3.0)}, "layers": {"1": {"count": 5}}})
    assert model.encoder.w.value.tolist() == [3.0, 3.0]
    update(model, {"encoder": {"w": jnp.full(2, 4.0)}})  # the shared Linear's other path
    assert model.decoder.w.value.tolist() == [4.0, 4.0]
    assert int(model.layers[1].count.value) == 5 and int(model.layers[0].count.value) == 0
    pure = jax.tree.map(lambda x: x + 1, to_pure_dict(state(model)))
    update(model, pure)
    assert model.offset.tolist() == [1.0, 1.0] and float(model.mean.value[0]) == 1.0


def test_update_with_a_bad_pure_dict_changes_nothing():
    model = Model()
    before = jax.tree.map(np.asarray, to_pure_dict(state(model)))
    bad = {"decoder": {"w": jnp.zeros(2)}, "layers": {0: {"w": jnp.zeros(5)}}}
    with pytest.raises(ValueError, match=r"layers\[0\]\.w: shape \(5,\) where the State has"):
        update(model, bad)
    with pytest.raises(ValueError, match=r"Not in the State: \.encoder\.bias"):
        update(model, {"decoder": {"w": jnp.zeros(2)}, "encoder": {"bias": jnp.zeros(2)}})
    with pytest.raises(ValueError, match="dtype int32 where the State has float32"):
        update(model, {"decoder": {"w": jnp.zeros(2, jnp.int32)}})
    after = jax.tree.map(np.asarray, to_pure_dict(state(model)))
    jax.tree.map(np.testing.assert_array_equal, after, before)


def test_update_still_takes_a_tree_of_variables_in_their_places():
    model = Linear()
    update(model, {"count": Variable(jnp.array(3)), "w": Param(jnp.array([4.0, 4.0]))})
    assert model.w.value.tolist() == [4.0, 4.0] and int(model.count.value) == 3
    pair = [Variable(jnp.array(1.0)), Variable(jnp.array(2.0))]
    update(pair, [jnp.array(5.0), jnp.array(6.0)])
    assert float(pair[1].value) == 6.0


def test_clone_options():
    model = Model()
    copy = clone(model)
    assert copy.encoder.w is not model.encoder.w and copy.encoder is copy.decoder
    assert copy.encoder.w.value is model.encoder.w.value
    deep = clone(model, arrays=True)
    assert deep.encoder.w.value is not model.encoder.w.value and deep.offset is not model.offset
    np.testing.assert_array_equal(deep.layers[0].w.value, model.layers[0].w.value)
    shallow = clone(model, variables=False)
    assert shallow is not model and shallow.encoder is not model.encoder
    assert shallow.encoder.w is model.encoder.w
    with pytest.raises(ValueError, match="needs variables=True"):
        clone(model, variables=False, arrays=True)


def test_clone_arrays_can_be_donated_while_the_original_lives():
    model = Linear()
    copy = clone(model, arrays=True)
    _, st = split(copy)
    jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)(st)
    assert model.w.value.tolist() == [1.0, 1.0]


def test_state_method_replace_by_pure_dict_writes_in_place():
    st = State({"w": Param(jnp.zeros(2)), "x": jnp.zeros(1)})
    w = st.w
    assert st.replace_by_pure_dict({"w": jnp.ones(2), "x": jnp.ones(1)}) is None
    assert st.w is w and w.value.tolist() == [1.0, 1.0] and st.x.tolist() == [1.0]
    with pytest.raises(ValueError, match=r"Missing from `pure_dict`: \.x"):
        st.replace_by_pure_dict({"w": jnp.ones(2)})
