"""`Dict`'s string keys as attributes (as Flax NNX's `nnx.Dict`), and its errors."""

import copy
import pickle

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Dict, Module
from pytree_module.extend import mutations


class Model(Module):
    def __init__(self):
        self.layers = Dict(encoder=jnp.ones(2))


def test_read_set_and_delete_keys_as_attributes():
    layers = Dict(a=1.0)
    before = mutations.count
    layers.b = 2.0
    assert mutations.count > before  # set through __setitem__, so graph caches see it
    assert layers.a == 1.0 and layers["b"] == 2.0
    del layers.a
    assert dict(layers) == {"b": 2.0}
    assert hasattr(layers, "b") and not hasattr(layers, "a")


def test_attribute_access_inside_a_module():
    model = Model()
    assert model.layers.encoder.shape == (2,)
    leaves = jax.tree.leaves(model)
    assert len(leaves) == 1


def test_missing_key_names_it_and_the_keys():
    layers = Dict(a=1.0, b=2.0)
    with pytest.raises(AttributeError, match=r"Dict has no key 'c' \(keys: 'a', 'b'\)"):
        _ = layers.c
    with pytest.raises(AttributeError, match=r"no key 'c' \(keys: none\)"):
        _ = Dict().c
    with pytest.raises(AttributeError, match="no key 'c' to delete"):
        del layers.c
    assert dict(layers) == {"a": 1.0, "b": 2.0}


def test_method_names_are_refused_as_attributes():
    layers = Dict()
    with pytest.raises(AttributeError, match=r"Dict key 'keys' is also the name of a Dict method"):
        layers.keys = 1
    assert len(layers) == 0
    layers["keys"] = 1  # still a valid key
    assert layers["keys"] == 1 and callable(layers.keys)


def test_copy_pickle_and_protocol_lookups_are_not_keys():
    layers = Dict(a=jnp.ones(1))
    assert copy.deepcopy(layers)["a"].shape == (1,)
    assert pickle.loads(pickle.dumps(Dict(a=1)))["a"] == 1
    with pytest.raises(AttributeError):
        layers.__array_priority__  # noqa: B018
