"""Abstract models: `eval_shape` with shardings, `abstract_with_sharding`,
`get_abstract_model`, and restoring a sharded checkpoint into one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_graph import (
    BatchStat,
    GraphDef,
    Param,
    State,
    abstract_with_sharding,
    axis_rules,
    eval_shape,
    get_abstract_model,
    merge,
    state,
    with_partitioning,
)
from pytree_module import Module


class Dense(Module):
    def __init__(self, key, n=4, mesh=None):
        init = with_partitioning(jax.nn.initializers.lecun_normal(), ("embed", "mlp"), mesh=mesh)
        self.kernel = Param(init(key, (n, 8)))
        self.bias = Param(jnp.zeros(8))
        self.count = BatchStat(jnp.zeros((), jnp.int32))


def _mesh(shape=(1,), names=("mlp",)):
    count = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:count]).reshape(shape), names)


def test_eval_shape_gives_the_sharding_of_variables_made_with_a_mesh():
    mesh = _mesh((1, 1), ("embed", "mlp"))
    abstract = eval_shape(Dense, jax.random.key(0), mesh=mesh)
    kernel = abstract.kernel.value
    assert isinstance(kernel, jax.ShapeDtypeStruct) and kernel.shape == (4, 8)
    assert kernel.sharding == NamedSharding(mesh, PartitionSpec("embed", "mlp"))
    assert abstract.bias.value.sharding is None  # no mesh: nothing known
    assert abstract.kernel.mesh is mesh


def test_abstract_with_sharding_fills_in_a_graph_in_place():
    mesh = _mesh((1, 1), ("data", "model"))
    abstract = eval_shape(Dense, jax.random.key(0))
    assert abstract.kernel.value.sharding is None
    with axis_rules({"embed": "data", "mlp": "model"}):
        same = abstract_with_sharding(abstract, mesh)
    assert same is abstract
    assert abstract.kernel.value.sharding.spec == PartitionSpec("data", "model")
    assert abstract.bias.value.sharding == NamedSharding(mesh, PartitionSpec())
    assert abstract.count.value.dtype == jnp.int32
    # A value that already has a sharding keeps it.
    other = _mesh((1, 1), ("model", "data"))
    abstract_with_sharding(abstract, other)
    assert abstract.bias.value.sharding.mesh is mesh


def test_abstract_with_sharding_of_a_state_is_a_new_state():
    mesh = _mesh((1, 1), ("embed", "mlp"))
    abstract_state = state(eval_shape(Dense, jax.random.key(0)))
    filled = abstract_with_sharding(abstract_state, mesh)
    assert isinstance(filled, State) and filled is not abstract_state
    assert filled["kernel"].value.sharding.spec == PartitionSpec("embed", "mlp")
    assert abstract_state["kernel"].value.sharding is None
    assert type(filled["count"]) is BatchStat


def test_without_a_mesh_each_variable_uses_its_own():
    mesh = _mesh((1, 1), ("embed", "mlp"))
    tree = {
        "with": Param(jax.ShapeDtypeStruct((2, 2), jnp.float32), sharding=("embed", None)),
        "without": Param(jax.ShapeDtypeStruct((2,), jnp.float32)),
    }
    tree["with"].set_metadata(mesh=mesh)
    filled = abstract_with_sharding(tree)
    assert filled["with"].value.sharding.spec == PartitionSpec("embed", None)
    assert filled["without"].value.sharding is None


def test_unknown_axes_are_refused_and_nothing_changes():
    abstract = eval_shape(Dense, jax.random.key(0))
    with pytest.raises(ValueError, match=r"names mesh axes \['embed', 'mlp'\]"):
        abstract_with_sharding(abstract, _mesh((1,), ("batch",)))
    assert abstract.bias.value.sharding is None
    with pytest.raises(ValueError, match=r"mesh axes \['embed', 'mlp'\]"):
        abstract_with_sharding(state(abstract), _mesh((1,), ("batch",)))
    with pytest.raises(TypeError, match=r"jax.sharding.Mesh"):
        abstract_with_sharding(abstract, "mesh")


def test_get_abstract_model():
    mesh = _mesh((1, 1), ("embed", "mlp"))
    graphdef, abstract = get_abstract_model(Dense, mesh, jax.random.key(0), n=3)
    assert isinstance(graphdef, GraphDef) and isinstance(abstract, State)
    assert abstract["kernel"].value.shape == (3, 8)
    assert abstract["kernel"].value.sharding.spec == PartitionSpec("embed", "mlp")
    assert abstract["bias"].value.sharding.spec == PartitionSpec()
    with pytest.raises(TypeError, match="function that builds the model first"):
        get_abstract_model(mesh, Dense)


def _restore_into(abstract_state, model):
    ocp = pytest.importorskip("orbax.checkpoint")
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(f"{folder}/step", state(model))
        checkpointer.wait_until_finished()
        return checkpointer.restore(f"{folder}/step", abstract_state)


def test_restoring_a_checkpoint_into_an_abstract_state():
    mesh = _mesh((1, 1), ("embed", "mlp"))
    model = Dense(jax.random.key(1))
    graphdef, abstract = get_abstract_model(Dense, mesh, jax.random.key(0))
    restored = _restore_into(abstract, model)
    assert isinstance(restored, State)
    assert jnp.array_equal(restored["kernel"].value, model.kernel.value)
    assert restored["kernel"].value.sharding.is_equivalent_to(
        NamedSharding(mesh, PartitionSpec("embed", "mlp")), 2
    )
    again = merge(graphdef, restored)
    assert jnp.array_equal(again.kernel.value, model.kernel.value)


@pytest.mark.multi_device
def test_restoring_sharded_on_eight_devices():
    mesh = _mesh((2, 4), ("data", "model"))
    model = Dense(jax.random.key(1))
    with axis_rules({"embed": "data", "mlp": "model"}):
        _, abstract = get_abstract_model(Dense, mesh, jax.random.key(0))
    restored = _restore_into(abstract, model)
    kernel = restored["kernel"].value
    assert kernel.sharding.spec == PartitionSpec("data", "model")
    assert {s.data.shape for s in kernel.addressable_shards} == {(2, 2)}
    assert np.array_equal(np.asarray(kernel), np.asarray(model.kernel.value))
    assert restored["bias"].value.sharding.spec == PartitionSpec()
    # A model built on the mesh directly has the same layout, and its abstract form too.
    with axis_rules({"embed": "data", "mlp": "model"}):
        built = Dense(jax.random.key(0), mesh=mesh)
        abstract_built = eval_shape(Dense, jax.random.key(0), mesh=mesh)
    assert built.kernel.value.sharding.spec == PartitionSpec("data", "model")
    assert abstract_built.kernel.value.sharding == built.kernel.value.sharding
