"""`to_pure_dict` and `replace_by_pure_dict`: a State as plain dicts, and written back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_graph import (
    BatchStat,
    Param,
    State,
    Variable,
    eval_shape,
    merge,
    replace_by_pure_dict,
    split,
    state,
    to_pure_dict,
    update,
)
from pytree_module import Module, TraceContextError


class Linear(Module):
    def __init__(self, din, dout):
        self.w = Param(jnp.ones((din, dout)))
        self.b = Param(jnp.zeros(dout))


class MLP(Module):
    def __init__(self):
        self.layers = [Linear(2, 3), Linear(3, 1)]
        self.mean = BatchStat(jnp.zeros(1))


def _values(model):
    return jax.tree.map(np.asarray, to_pure_dict(state(model)))


def test_to_pure_dict_has_the_state_keys_and_no_variables():
    pure = to_pure_dict(state(MLP()))
    assert type(pure) is dict and type(pure["layers"]) is dict
    assert sorted(pure["layers"]) == [0, 1]
    assert sorted(pure["layers"][0]) == ["b", "w"]
    leaves = jax.tree.leaves(pure, is_leaf=lambda x: isinstance(x, Variable))
    assert leaves and not any(isinstance(x, Variable) for x in leaves)
    assert pure["layers"][1]["w"].shape == (3, 1)


def test_to_pure_dict_refuses_what_is_not_a_state():
    with pytest.raises(TypeError, match=r"to_pure_dict expects a State.*got a MLP.*state\(model\)"):
        to_pure_dict(MLP())


def test_replace_by_pure_dict_writes_into_the_models_variables():
    model = MLP()
    variable = model.layers[0].w
    st = state(model)
    pure = jax.tree.map(lambda x: x + 2, to_pure_dict(st))
    assert replace_by_pure_dict(st, pure) is None
    assert model.layers[0].w is variable  # the same Variable, a new value
    np.testing.assert_array_equal(variable.value, np.full((2, 3), 3.0))
    np.testing.assert_array_equal(model.mean.value, np.full(1, 2.0))
    assert st["layers"][0]["w"] is variable


def test_replace_by_pure_dict_then_merge_restores_an_abstract_model():
    graphdef, abstract = split(eval_shape(MLP))
    assert isinstance(abstract["layers"][0]["w"].value, jax.ShapeDtypeStruct)
    saved = to_pure_dict(state(MLP()))
    saved["layers"][1]["b"] = jnp.full(1, 7.0)
    replace_by_pure_dict(abstract, saved)
    restored = merge(graphdef, abstract)
    np.testing.assert_array_equal(restored.layers[1].b.value, [7.0])
    np.testing.assert_array_equal(restored.layers[0].w.value, np.ones((2, 3)))


def test_digit_string_keys_match_list_positions():
    model = MLP()
    pure = to_pure_dict(state(model))
    pure["layers"] = {str(i): v for i, v in pure["layers"].items()}
    pure["layers"]["1"]["b"] = jnp.ones(1)
    replace_by_pure_dict(state(model), pure)
    np.testing.assert_array_equal(model.layers[1].b.value, [1.0])


def test_bare_arrays_in_the_state_are_replaced_in_the_state():
    st = state({"x": jnp.zeros(2), "p": Param(jnp.zeros(2))})
    replace_by_pure_dict(st, {"x": jnp.ones(2), "p": jnp.ones(2)})
    np.testing.assert_array_equal(st["x"], [1.0, 1.0])
    np.testing.assert_array_equal(st["p"].value, [1.0, 1.0])


def test_a_missing_path_is_named_and_nothing_changes():
    model = MLP()
    before = _values(model)
    pure = jax.tree.map(lambda x: x + 1, to_pure_dict(state(model)))
    del pure["layers"][1]["b"]
    with pytest.raises(ValueError, match=r"Missing from `pure_dict`: .*layers.*1.*b"):
        replace_by_pure_dict(state(model), pure)
    jax.tree.map(np.testing.assert_array_equal, _values(model), before)


def test_an_extra_path_is_named_and_nothing_changes():
    model = MLP()
    before = _values(model)
    pure = jax.tree.map(lambda x: x + 1, to_pure_dict(state(model)))
    pure["layers"][0]["scale"] = jnp.ones(3)
    with pytest.raises(ValueError, match=r"Not in the State: .*layers.*0.*scale") as info:
        replace_by_pure_dict(state(model), pure)
    assert "Missing" not in str(info.value)
    jax.tree.map(np.testing.assert_array_equal, _values(model), before)


def test_a_shape_mismatch_is_named_and_nothing_changes():
    model = MLP()
    before = _values(model)
    pure = jax.tree.map(lambda x: x + 1, to_pure_dict(state(model)))
    pure["mean"] = jnp.zeros(4)
    with pytest.raises(ValueError, match=r"mean.*shape \(4,\) where the State has \(1,\)"):
        replace_by_pure_dict(state(model), pure)
    jax.tree.map(np.testing.assert_array_equal, _values(model), before)


def test_a_dtype_mismatch_is_named_and_nothing_changes():
    model = MLP()
    before = _values(model)
    pure = jax.tree.map(lambda x: x + 1, to_pure_dict(state(model)))
    pure["layers"][1]["w"] = jnp.zeros((3, 1), jnp.int32)
    with pytest.raises(ValueError, match=r"w.*dtype int32 where the State has float32"):
        replace_by_pure_dict(state(model), pure)
    jax.tree.map(np.testing.assert_array_equal, _values(model), before)


def test_python_numbers_fit_scalar_arrays():
    st = state({"p": Param(jnp.zeros(()))})
    replace_by_pure_dict(st, {"p": 2.0})
    assert st["p"].value == 2.0


def test_writing_a_captured_state_inside_jit_is_refused_before_anything_changes():
    model = MLP()
    st = state(model)
    before = _values(model)

    @jax.jit
    def restore(pure):
        replace_by_pure_dict(st, pure)
        return 0

    with pytest.raises(TraceContextError):
        restore(to_pure_dict(st))
    jax.tree.map(np.testing.assert_array_equal, _values(model), before)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="replace_by_pure_dict expects a State"):
        replace_by_pure_dict({"w": Param(1.0)}, {"w": 2.0})
    with pytest.raises(TypeError, match=r"expects nested dicts as `pure_dict`.*list"):
        replace_by_pure_dict(State({"w": Param(1.0)}), [2.0])


class Keyed(Module):
    """Typed PRNG keys in a Variable, and a bare one, as RNG streams hold them."""

    def __init__(self, seed):
        self.key = Variable(jax.random.key(seed))
        self.keys = jax.random.split(jax.random.key(seed + 1), 3)
        self.w = Param(jnp.full(2, float(seed)))


def _key_data(st):
    return jax.tree.map(
        lambda v: np.asarray(
            jax.random.key_data(v) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key) else v
        ),
        to_pure_dict(st),
    )


def test_typed_prng_keys_round_trip_as_keys_or_as_their_data():
    saved = Keyed(0)
    pure = to_pure_dict(state(saved))
    assert jax.dtypes.issubdtype(pure["key"].dtype, jax.dtypes.prng_key)
    st = state(Keyed(5))
    replace_by_pure_dict(st, pure)
    assert st["key"].value.dtype == saved.key.value.dtype
    jax.tree.map(np.testing.assert_array_equal, _key_data(st), _key_data(state(saved)))

    data = {
        "key": jax.random.key_data(pure["key"]),
        "keys": jax.random.key_data(pure["keys"]),
        "w": pure["w"],
    }
    model = Keyed(7)
    st = state(model)
    replace_by_pure_dict(st, data)
    assert jax.dtypes.issubdtype(model.key.value.dtype, jax.dtypes.prng_key)
    assert jax.random.key_impl(model.key.value) == jax.random.key_impl(saved.key.value)
    jax.tree.map(np.testing.assert_array_equal, _key_data(st), _key_data(state(saved)))
    model = Keyed(8)
    update(model, {"key": data["key"], "keys": data["keys"]})  # a part, as data
    np.testing.assert_array_equal(jax.random.key_data(model.key.value), data["key"])
    np.testing.assert_array_equal(jax.random.key_data(model.keys), data["keys"])


def test_what_cannot_stand_for_keys_is_named_and_nothing_changes():
    model = Keyed(0)
    before = _key_data(state(model))
    wrong = {**to_pure_dict(state(model)), "w": jnp.ones(2), "key": jnp.zeros((3,), jnp.uint32)}
    with pytest.raises(ValueError, match=r"at \.key: uint32\[3\] where the State has PRNG keys"):
        replace_by_pure_dict(state(model), wrong)
    wrong["key"] = jax.random.key(0, impl="rbg")
    with pytest.raises(ValueError, match=r"at \.key: dtype key<rbg> where the State has key<fry>"):
        replace_by_pure_dict(state(model), wrong)
    jax.tree.map(np.testing.assert_array_equal, _key_data(state(model)), before)
