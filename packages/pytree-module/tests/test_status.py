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


def test_field_is_a_dataclasses_field_with_metadata():
    f = field(static=True, converter=int, default=1)
    assert isinstance(f, dataclasses.Field)
    assert f.metadata["static"] is True and f.metadata["converter"] is int


def test_field_argument_errors():
    with pytest.raises(TypeError, match="static"):
        field(static="yes")
    with pytest.raises(TypeError, match="converter"):
        field(converter=3)


def test_converter_output_decides_inferred_status():
    class Converted(Module):
        value: object = field(converter=jnp.asarray)

    assert jax.tree.leaves(Converted(1.0))[0].dtype == jnp.float32
