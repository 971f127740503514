"""Partition specs and named shardings from Variables' `sharding` metadata."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_graph import Param, State, get_named_sharding, get_partition_spec, state
from pytree_module import Module


class Linear(Module):
    def __init__(self):
        self.kernel = Param(jnp.ones((8, 4)), sharding=("data", "model"))
        self.bias = Param(jnp.zeros(4))
        self.scale = jnp.ones(4)


def test_partition_specs_follow_the_metadata():
    specs = get_partition_spec(Linear())
    assert isinstance(specs, State)
    assert specs["kernel"].value == PartitionSpec("data", "model")
    assert type(specs["kernel"]) is Param and specs["kernel"].sharding == ("data", "model")
    assert specs["bias"].value == PartitionSpec()
    assert specs["scale"] == PartitionSpec()


@pytest.mark.multi_device
def test_named_shardings_place_the_state_on_a_mesh():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    model = Linear()
    st = state(model)
    shardings = get_named_sharding(st, mesh)
    assert isinstance(shardings["kernel"].value, NamedSharding)
    placed = jax.device_put(st, shardings)
    kernel = placed["kernel"].value
    assert kernel.sharding.spec == PartitionSpec("data", "model")
    assert {shard.data.shape for shard in kernel.addressable_shards} == {(4, 1)}
    constrained = jax.jit(
        lambda s: jax.lax.with_sharding_constraint(s, get_named_sharding(s, mesh))
    )(st)
    assert constrained["kernel"].value.sharding.spec == PartitionSpec("data", "model")


def test_unknown_mesh_axes_are_named():
    mesh = Mesh(np.array(jax.devices()[:1]), ("batch",))
    with pytest.raises(ValueError, match=r"mesh axes \['data', 'model'\].*its axes: \['batch'\]"):
        get_named_sharding(Linear(), mesh)
