"""Variables: subscripting, get_value/set_value overrides, get_metadata/set_metadata."""

import pickle
import types

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import GraphDef, Param, State, Variable
from pytree_module import TraceContextError


class Clipped(Param):
    def set_value(self, value):
        super().set_value(jnp.clip(value, -1.0, 1.0))


class Scaled(Param):
    def get_value(self):
        return super().get_value() * 10


def test_subscripting_gives_an_annotation():
    alias = Param[jax.Array]
    assert isinstance(alias, types.GenericAlias)
    assert alias.__origin__ is Param and alias.__args__ == (jax.Array,)
    assert Variable[int].__origin__ is Variable and Clipped[float].__origin__ is Clipped
    assert isinstance(State[str, Param[jax.Array]], types.GenericAlias)
    assert GraphDef[Variable].__origin__ is GraphDef
    made = Param[float](2.0)  # calling the alias builds the class
    assert type(made) is Param and made.value == 2.0
    assert isinstance(made, Param) and isinstance(made, Variable)
    leaves, treedef = jax.tree.flatten(Param(jnp.ones(2), tag="a"))
    assert len(leaves) == 1 and jax.tree.unflatten(treedef, leaves).tag == "a"
    with pytest.raises(TypeError):
        isinstance(made, Param[float])  # as for list[int]


def test_get_value_and_set_value():
    v = Param(jnp.zeros(2))
    assert v.get_value() is v.value
    v.set_value(jnp.ones(2))
    assert v.value.tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="Cannot store a Param inside a Param"):
        v.set_value(Param(1.0))
    assert v.value.tolist() == [1.0, 1.0]

    @jax.jit
    def write():
        v.set_value(jnp.zeros(2))

    with pytest.raises(TraceContextError, match="created outside the current JAX transform"):
        write()
    assert v.value.tolist() == [1.0, 1.0]


def test_default_reads_are_not_rerouted():
    # Classes that do not override `get_value` keep the direct slot reads.
    assert Param.value is Variable.value and Clipped.value is Variable.value
    assert Param.__add__ is Variable.__add__ and Clipped.__getitem__ is Variable.__getitem__
    assert Scaled.value is not Variable.value and Scaled.__add__ is not Variable.__add__


def test_set_value_override_applies_to_every_write():
    v = Clipped(jnp.array([5.0, 0.5]))
    assert v.value.tolist() == [5.0, 0.5]  # the constructor stores the value as given
    v.value = jnp.array([3.0, -3.0])
    assert v.value.tolist() == [1.0, -1.0]
    v.set_value(jnp.array([0.25, 9.0]))
    assert v.value.tolist() == [0.25, 1.0]
    v[0] = -7.0
    assert v.value.tolist() == [-1.0, 1.0]
    v[...] = jnp.array([0.5, 0.5])
    v += 2.0
    assert v.value.tolist() == [1.0, 1.0]


def test_set_value_override_inside_a_graph_transform():
    v = Clipped(jnp.zeros(2))

    @pg.jit
    def step(v, x):
        v.value = v.value + x

    step(v, jnp.array([0.5, 4.0]))
    assert v.value.tolist() == [0.5, 1.0]


def test_get_value_override_applies_to_every_read():
    v = Scaled(jnp.array([1.0, 2.0]))
    assert v.get_value().tolist() == v.value.tolist() == [10.0, 20.0]
    assert v[...].tolist() == [10.0, 20.0] and float(v[1]) == 20.0
    assert (v + 1).tolist() == [11.0, 21.0] and (1 - v).tolist() == [-9.0, -19.0]
    assert (-v).tolist() == [-10.0, -20.0] and (v > 15).tolist() == [False, True]
    assert (jnp.ones(2) @ v).tolist() == 30.0
    assert len(v) == 2 and [float(x) for x in v] == [10.0, 20.0]
    # The stored value is unchanged: pytree leaves, copies and pickles hold it as stored.
    assert jax.tree.leaves(v)[0].tolist() == [1.0, 2.0]
    assert v.copy().value.tolist() == [10.0, 20.0]
    assert jax.tree.leaves(v.replace(tag="a"))[0].tolist() == [1.0, 2.0]
    assert jax.tree.leaves(pickle.loads(pickle.dumps(v)))[0].tolist() == [1.0, 2.0]
    v += 1.0  # reads through get_value, writes the result
    assert jax.tree.leaves(v)[0].tolist() == [11.0, 21.0]


def test_own_operators_of_a_subclass_are_kept():
    class Odd(Param):
        def get_value(self):
            return super().get_value() + 1

        def __add__(self, other):
            return "own"

    v = Odd(1.0)
    assert v + 1 == "own" and v * 2 == 4.0

    class OddChild(Odd):
        def get_value(self):
            return super().get_value() * 3

    assert OddChild(1.0) + 1 == "own" and OddChild(1.0).value == 6.0


def test_get_metadata():
    v = Param(1.0, tag="a", sharding=("data",))
    metadata = v.get_metadata()
    assert metadata == {"tag": "a", "sharding": ("data",)}
    metadata["tag"] = "changed"  # a copy
    assert v.tag == "a"
    assert v.get_metadata("tag") == "a" and v.get_metadata("missing", None) is None
    with pytest.raises(KeyError, match=r"has no metadata 'missing'.*'sharding', 'tag'"):
        v.get_metadata("missing")
    with pytest.raises(TypeError, match="needs a `name`"):
        v.get_metadata(default=None)


def test_set_metadata_forms():
    v = Param(1.0, tag="a")
    treedef = jax.tree.structure(v)
    v.set_metadata(sharding=("data",), tag="b")
    assert v.get_metadata() == {"tag": "b", "sharding": ("data",)}
    assert jax.tree.structure(v) != treedef  # metadata lives in the treedef
    v.set_metadata("tag", "c")
    assert v.tag == "c" and v.sharding == ("data",)
    v.set_metadata({"only": 1})
    assert v.get_metadata() == {"only": 1}
    v.set_metadata({})
    assert v.metadata == {} and v.value == 1.0


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((), {"bad": [1, 2]}, TypeError, "metadata 'bad' must be hashable.*list"),
        (({"bad": {}},), {}, TypeError, "metadata 'bad' must be hashable.*dict"),
        ((), {"_private": 1}, ValueError, "Invalid metadata name '_private'"),
        (("value", 1), {}, ValueError, "Invalid metadata name 'value'"),
        (({1: "x"},), {}, ValueError, "Invalid metadata name 1"),
        (("tag",), {"x": 1}, TypeError, "either positional arguments or keywords"),
        ((), {}, TypeError, "got 0 positional arguments"),
        (("a", 1, 2), {}, TypeError, "got 3 positional arguments"),
        (("tag",), {}, TypeError, "takes a mapping.*got a str"),
    ],
)
def test_set_metadata_errors_leave_it_unchanged(args, kwargs, error, match):
    v = Param(1.0, tag="a")
    with pytest.raises(error, match=match):
        v.set_metadata(*args, **kwargs)
    assert v.get_metadata() == {"tag": "a"}


def test_set_metadata_inside_a_transform_it_was_not_passed_into():
    v = Param(jnp.zeros(2), tag="a")

    @jax.jit
    def write():
        v.set_metadata(tag="b")

    with pytest.raises(TraceContextError, match="Cannot set the metadata"):
        write()
    assert v.tag == "a"

    @pg.jit
    def passed_in(v):
        v.set_metadata(tag="b")

    passed_in(v)
    assert v.tag == "b"


def test_replace_makes_a_new_variable_with_metadata():
    v = Param(1.0, tag="a")
    new = v.replace(tag="b")
    assert type(new) is Param and new.tag == "b" and new.value == 1.0 and v.tag == "a"
