"""data/static/field specifiers, register_data_type."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, field, is_data, register_data_type


def test_register_data_type_makes_values_data():
    @jax.tree_util.register_pytree_node_class
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def tree_flatten(self):
            return (self.a, self.b), None

        @classmethod
        def tree_unflatten(cls, _, children):
            return cls(*children)

    assert not is_data(Pair(1, 2))
    assert register_data_type(Pair) is Pair
    assert is_data(Pair(1, 2))

    class Holder(Module):
        def __init__(self):
            self.pair = Pair(1, 2)

    assert jax.tree.leaves(Holder()) == [1, 2]


def test_register_data_type_rejects_non_types():
    with pytest.raises(TypeError, match="expects a class"):
        register_data_type(3)


def test_field_is_a_dataclasses_field_holding_its_options():
    f = field(static=True, converter=int, default=1)
    assert isinstance(f, dataclasses.Field)
    assert f.static is True and f.converter is int and f.default == 1
    assert dict(f.metadata) == {}


def test_field_metadata_is_kept_exactly_as_given():
    class Documented(Module):
        a: int = field(metadata={"doc": "a"})
        b: int = field(static=True, metadata={"doc": "b", "unit": "m"})
        c: int = field(converter=int, metadata={"doc": "c"})
        d: int = field(default=0)

    metadata = [dict(f.metadata) for f in dataclasses.fields(Documented)]
    assert metadata == [{"doc": "a"}, {"doc": "b", "unit": "m"}, {"doc": "c"}, {}]
    built = Documented(jnp.ones(1), 2, 3.7)
    assert built.c == 3 and jax.tree.leaves(built) == [built.a, 3, 0]


def test_field_refuses_option_keys_in_metadata():
    with pytest.raises(ValueError, match=r"\['static'\].*`field\(static=...\)`"):
        field(metadata={"static": True})
    with pytest.raises(ValueError, match=r"\['converter'\]"):
        field(static=True, metadata={"converter": int})


def test_plain_dataclass_field_metadata_options_are_honoured():
    class Plain(Module):
        size: int = dataclasses.field(metadata={"static": True, "converter": int})

    assert Plain(2.0).size == 2 and jax.tree.leaves(Plain(2.0)) == []


def test_field_argument_errors():
    with pytest.raises(TypeError, match="static"):
        field(static="yes")
    with pytest.raises(TypeError, match="converter"):
        field(converter=3)


def test_converter_output_decides_inferred_status():
    class Converted(Module):
        value: object = field(converter=jnp.asarray)

    assert jax.tree.leaves(Converted(1.0))[0].dtype == jnp.float32


def test_empty_containers_are_data():
    assert is_data([]) and is_data(()) and is_data({}) and is_data([[], {}])
    assert not is_data([1, 2]) and not is_data(("a",)) and not is_data({"k": 1})
    # An empty container next to other values does not make them leaves.
    assert not is_data({"layers": [], "act": "relu"})
