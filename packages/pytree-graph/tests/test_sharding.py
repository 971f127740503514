"""Partition specs and named shardings from Variables' `sharding` metadata."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_graph import (
    Param,
    State,
    axis_rules,
    create_sharded,
    eval_shape,
    get_named_sharding,
    get_partition_spec,
    state,
)
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


def test_a_partition_spec_as_metadata_is_used_as_it_is():
    state = State({"w": Param(jnp.ones((4, 2)), sharding=PartitionSpec(("data", "model")))})
    assert get_partition_spec(state)["w"].value == PartitionSpec(("data", "model"))
    with axis_rules({"model": None}):  # rules apply to a PartitionSpec's names too
        assert get_partition_spec(state)["w"].value == PartitionSpec("data")


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


# ------------------------------------------------------------------------------ axis rules


class Roles(Module):
    """Dimensions named by role, as layers written for any layout name them."""

    def __init__(self):
        self.kernel = Param(jnp.ones((8, 16)), sharding=("embed", "mlp"))
        self.both = Param(jnp.ones(16), sharding=(("embed", "mlp"),))


def test_axis_rules_map_logical_names_to_mesh_axes():
    model = Roles()
    with axis_rules({"embed": None, "mlp": "model"}):
        specs = get_partition_spec(model)
        assert specs["kernel"].value == PartitionSpec(None, "model")
        assert specs["both"].value == PartitionSpec("model")  # None dropped from the group
        with axis_rules([("embed", "data")]):  # inner rules add to, and override, outer
            assert get_partition_spec(model)["kernel"].value == PartitionSpec("data", "model")
            assert get_partition_spec(model)["both"].value == PartitionSpec(("data", "model"))
        assert get_partition_spec(model)["kernel"].value == PartitionSpec(None, "model")
    # Without rules the names are taken as mesh axes.
    assert get_partition_spec(model)["kernel"].value == PartitionSpec("embed", "mlp")
    assert Roles().kernel.sharding == ("embed", "mlp")  # the metadata itself is unchanged


def test_unmapped_logical_names_are_named_with_the_way_to_map_them():
    mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
    with (
        axis_rules({"mlp": "model"}),
        pytest.raises(ValueError, match=r"mesh axes \['embed'\].*pytree_graph\.axis_rules"),
    ):
        get_named_sharding(Roles(), mesh)


@pytest.mark.parametrize(
    "rules",
    [{"embed": 1}, {3: "data"}, "embed", [("embed",)], {"embed": ("data", 2)}],
    ids=["int-axis", "int-name", "string", "short-pair", "int-in-tuple"],
)
def test_bad_axis_rules_are_refused(rules):
    with pytest.raises(TypeError, match="axis_rules expects"), axis_rules(rules):
        pass
    assert get_partition_spec(Roles())["kernel"].value == PartitionSpec("embed", "mlp")


@pytest.mark.multi_device
def test_create_sharded_follows_the_rules_in_force_and_is_rebuilt_when_they_change():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    with axis_rules({"embed": None, "mlp": "model"}):
        tensor_parallel = create_sharded(Roles, mesh)
    with axis_rules({"embed": "data", "mlp": None}):
        fully_sharded = create_sharded(Roles, mesh)  # the same make and mesh, new rules
    assert {s.data.shape for s in tensor_parallel.kernel.value.addressable_shards} == {(8, 4)}
    assert {s.data.shape for s in fully_sharded.kernel.value.addressable_shards} == {(4, 16)}


@pytest.mark.multi_device
def test_an_abstract_model_gives_the_shardings_create_sharded_uses():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    abstract = eval_shape(Linear)  # nothing allocated
    assert isinstance(abstract.kernel.value, jax.ShapeDtypeStruct)
    planned = get_named_sharding(abstract, mesh)
    built = create_sharded(Linear, mesh)
    for name in ("kernel", "bias"):
        assert getattr(built, name).value.sharding == planned[name].value
    assert planned["kernel"].value.shard_shape(abstract.kernel.value.shape) == (4, 1)
