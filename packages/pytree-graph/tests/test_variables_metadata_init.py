"""Metadata given with a value: `VariableMetadata`, `with_metadata`, `with_partitioning`,
`set_metadata` over a graph, and Variables laid out on a mesh when made (`mesh=`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.nn.initializers import lecun_normal, ones, zeros
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_graph import (
    BatchStat,
    Param,
    Variable,
    VariableMetadata,
    axis_rules,
    jit,
    set_metadata,
    split,
    with_metadata,
    with_partitioning,
)
from pytree_module import Module, TraceContextError


def _layers():
    """pytree_nn, where installed (the layers above this package wrap initializer outputs)."""
    return pytest.importorskip("pytree_nn")


def test_a_variable_unpacks_variable_metadata():
    boxed = VariableMetadata(jnp.ones(2), tag="a")
    p = Param(boxed, other=1)
    assert p.get_metadata() == {"tag": "a", "other": 1}
    assert p.value is boxed.value
    assert Param(boxed, tag="a").tag == "a"  # the same value both ways is fine
    with pytest.raises(ValueError, match=r"tag='b'.*already has tag='a'.*one way only"):
        Param(boxed, tag="b")
    with pytest.raises(TypeError, match="holds the value"):
        VariableMetadata(p)
    assert repr(VariableMetadata(1.0, tag="a")) == "VariableMetadata(1.0, tag='a')"


def test_variable_metadata_is_a_pytree():
    boxed = jax.jit(lambda x: VariableMetadata(x * 2, tag="a"))(jnp.ones(2))
    assert type(boxed) is VariableMetadata and dict(boxed.metadata) == {"tag": "a"}
    assert jnp.array_equal(Param(boxed).value, 2 * jnp.ones(2))


def test_with_metadata_wraps_an_initializer():
    init = with_metadata(ones, tag="frozen", level=2)
    assert init.__name__ == ones.__name__ and init.__wrapped__ is ones
    out = init(jax.random.key(0), (2, 3), jnp.float16)
    assert type(out) is VariableMetadata
    p = Param(out)
    assert p.shape == (2, 3) and p.dtype == jnp.float16
    assert p.get_metadata() == {"tag": "frozen", "level": 2}
    with pytest.raises(TypeError, match=r"hashable.*list"):
        with_metadata(ones, axes=["a"])
    with pytest.raises(ValueError, match="`value` is the value"):
        with_metadata(ones, value=1)
    with pytest.raises(TypeError, match="initializer first"):
        with_metadata((None, "model"))


def test_layers_take_metadata_initializers():
    nn = _layers()
    Linear, Embedding, Rngs = nn.Linear, nn.Embedding, nn.Rngs
    layer = Linear(
        4,
        8,
        kernel_init=with_partitioning(lecun_normal(), (None, "model")),
        bias_init=with_metadata(zeros, tag="bias"),
        rngs=Rngs(0),
    )
    assert layer.kernel.sharding == (None, "model") and layer.kernel.shape == (4, 8)
    assert layer.bias.tag == "bias"
    # The same draws as the plain initializer: the wrapper changes metadata only.
    plain = Linear(4, 8, rngs=Rngs(0))
    assert jnp.array_equal(layer.kernel.value, plain.kernel.value)
    embedding = Embedding(
        10, 4, embedding_init=with_partitioning(ones, ("vocab", None)), rngs=Rngs(0)
    )
    assert embedding.embedding.sharding == ("vocab", None)
    # The layer's own sharding argument and the initializer's must agree.
    with pytest.raises(ValueError, match=r"sharding=.*already has sharding="):
        Linear(
            4,
            8,
            kernel_init=with_partitioning(lecun_normal(), (None, "model")),
            kernel_sharding=("data", None),
            rngs=Rngs(0),
        )


def test_with_partitioning_checks_its_arguments():
    assert with_partitioning(ones, ["a", None])(jax.random.key(0), (2, 2)).metadata == {
        "sharding": ("a", None)
    }
    assert "mesh" not in with_partitioning(ones, (None,))(jax.random.key(0), (2,)).metadata
    with pytest.raises(TypeError, match="tuple with an entry per dimension"):
        with_partitioning(ones, "model")
    with pytest.raises(TypeError, match=r"jax.sharding.Mesh"):
        with_partitioning(ones, ("model",), mesh="model")


class Block(Module):
    def __init__(self):
        self.kernel = Param(jnp.ones((2, 2)))
        self.bias = Param(jnp.zeros(2))
        self.mean = BatchStat(jnp.zeros(2))
        self.shared = self.kernel


def test_set_metadata_on_a_graph():
    block = Block()
    set_metadata(block, frozen=True)
    assert block.kernel.frozen and block.bias.frozen and block.mean.frozen
    set_metadata(block, frozen=False, only=Param)
    assert not block.kernel.frozen and block.mean.frozen
    set_metadata(block, tag="k", only=lambda path, v: path[-1] == "kernel")
    assert block.kernel.tag == "k" and block.shared.tag == "k"
    assert block.bias.get_metadata("tag", None) is None
    set_metadata(block, tag="b", only=(BatchStat, lambda path, v: path == ("bias",)))
    assert block.bias.tag == "b" and block.mean.tag == "b" and block.kernel.tag == "k"


def test_set_metadata_changes_nothing_on_error():
    block = Block()
    with pytest.raises(TypeError, match="hashable"):
        set_metadata(block, frozen=True, axes=["a"])
    assert block.kernel.get_metadata() == {}
    with pytest.raises(TypeError, match="needs the entries"):
        set_metadata(block)

    @jax.jit
    def inside(x):
        captured = Block()
        captured.kernel = Param(jnp.ones(2))  # made here, unlike `block`
        captured.bias = block.bias
        set_metadata(captured, frozen=True)
        return x

    with pytest.raises(TraceContextError):
        inside(1.0)
    assert block.bias.get_metadata() == {}


def test_set_metadata_moves_nothing():
    mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
    block = Block()
    before = block.kernel.value
    set_metadata(block, sharding=(None, "model"), mesh=mesh, only=Param)
    assert block.kernel.value is before and block.kernel.mesh is mesh


# ------------------------------------------------------------------- laid out when made


def test_without_a_mesh_sharding_is_metadata_only():
    x = jnp.ones((4, 2))
    p = Param(x, sharding=("data", None))
    assert p.value is x


def test_a_one_device_mesh():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    p = Param(jnp.ones((4, 2)), sharding=("data", None), mesh=mesh)
    assert p.value.sharding == NamedSharding(mesh, PartitionSpec("data", None))
    assert p.get_metadata() == {"sharding": ("data", None), "mesh": mesh}
    replicated = Param(np.ones(3), mesh=mesh)
    assert isinstance(replicated.value, jax.Array)
    assert replicated.value.sharding.spec == PartitionSpec()
    # Copies keep the metadata and are not laid out again (a spec is no array).
    spec = p.replace(PartitionSpec("data"))
    assert spec.value == PartitionSpec("data") and spec.mesh is mesh
    abstract = Variable(jax.ShapeDtypeStruct((4,), jnp.float32), sharding=("data",), mesh=mesh)
    assert abstract.value.sharding.spec == PartitionSpec("data")


def test_mesh_errors_name_the_problem():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    with pytest.raises(ValueError, match=r"names mesh axes \['model'\].*its axes: \['data'\]"):
        Param(jnp.ones(2), sharding=("model",), mesh=mesh)
    with pytest.raises(TypeError, match=r"takes a jax.sharding.Mesh, got a str"):
        Param(jnp.ones(2), sharding=("data",), mesh="data")
    with pytest.raises(TypeError, match=r"can lay out an array.*got a str"):
        Param("text", mesh=mesh)
    with pytest.raises(ValueError, match=r"cannot lay out a value of shape \(2,\)"):
        Param(jnp.ones(2), sharding=("data", None), mesh=mesh)


@pytest.mark.multi_device
def test_laid_out_on_a_mesh_when_made():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    p = Param(jnp.ones((4, 8)), sharding=("data", "model"), mesh=mesh)
    assert p.value.sharding.spec == PartitionSpec("data", "model")
    assert {s.data.shape for s in p.value.addressable_shards} == {(2, 2)}
    assert float(jnp.sum(p)) == 32.0
    with axis_rules({"embed": "data", "mlp": "model"}):
        q = Param(jnp.ones((4, 8)), sharding=("embed", "mlp"), mesh=mesh)
    assert q.value.sharding.spec == PartitionSpec("data", "model")
    with pytest.raises(ValueError, match=r"cannot lay out a value of shape \(3,\)"):
        Param(jnp.ones(3), sharding=("data",), mesh=mesh)
    nn = _layers()
    layer = nn.Linear(
        4,
        8,
        kernel_init=with_partitioning(lecun_normal(), (None, "model"), mesh=mesh),
        rngs=nn.Rngs(0),
    )
    assert layer.kernel.value.sharding.spec == PartitionSpec(None, "model")
    assert layer.kernel.mesh is mesh


@pytest.mark.multi_device
def test_inside_a_trace_a_sharding_constraint():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    @jax.jit
    def make(x):
        return Param(x, sharding=("data", None), mesh=mesh)

    p = make(jnp.ones((4, 4)))
    assert p.value.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec("data")), 2)

    class Dense(Module):
        def __init__(self, x):
            self.w = Param(x, sharding=(None, "model"), mesh=mesh)

    dense = jit(Dense)(jnp.ones((4, 8)))
    assert dense.w.value.sharding.is_equivalent_to(
        NamedSharding(mesh, PartitionSpec(None, "model")), 2
    )
    _, state = split(dense)
    assert state["w"].mesh is mesh
