"""`out_sharding`, Flax NNX 0.12's name for a Variable's mesh axes, as another name for
the `sharding` entry: read, written, deleted and given at construction under either."""

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec

from pytree_graph import (
    Param,
    VariableMetadata,
    get_partition_spec,
    set_metadata,
    with_metadata,
)
from pytree_module import Module


def test_out_sharding_reads_and_writes_the_sharding_entry():
    p = Param(jnp.ones((2, 3)), out_sharding=(None, "model"))
    assert p.get_metadata() == {"sharding": (None, "model")}
    assert p.out_sharding == p.sharding == p.get_metadata("out_sharding") == (None, "model")
    p.set_metadata(out_sharding=("data", None))
    assert p.get_metadata() == {"sharding": ("data", None)}
    p.set_metadata("out_sharding", (None, None))
    assert p.sharding == (None, None)
    p.out_sharding = ("a", "b")
    assert p.get_metadata() == {"sharding": ("a", "b")}
    p.set_metadata({"out_sharding": ("c", None), "tag": 1})
    assert p.get_metadata() == {"sharding": ("c", None), "tag": 1}
    assert p.replace(out_sharding=("d", None)).get_metadata() == {"sharding": ("d", None), "tag": 1}
    del p.out_sharding
    assert p.get_metadata() == {"tag": 1}
    assert p.get_metadata("out_sharding", None) is None


def test_without_sharding_out_sharding_is_missing_not_the_arrays_own_sharding():
    p = Param(jnp.ones(2))
    assert not hasattr(p, "out_sharding")
    with pytest.raises(AttributeError, match=r"no `sharding` metadata .*out_sharding"):
        p.out_sharding  # noqa: B018
    with pytest.raises(KeyError, match="no metadata 'sharding'"):
        p.get_metadata("out_sharding")


def test_boxed_values_and_graph_set_metadata_take_out_sharding():
    boxed = VariableMetadata(jnp.zeros(2), out_sharding=("model",))
    assert dict(boxed.metadata) == {"sharding": ("model",)}
    assert Param(boxed).sharding == ("model",)
    init = with_metadata(lambda key, shape, dtype: jnp.zeros(shape, dtype), out_sharding=("m",))
    assert Param(init(None, (2,), jnp.float32)).sharding == ("m",)

    class Model(Module):
        def __init__(self):
            self.w = Param(jnp.ones((2, 2)))

    model = Model()
    set_metadata(model, out_sharding=("data", None))
    assert model.w.get_metadata() == {"sharding": ("data", None)}
    assert get_partition_spec(model)["w"].value == PartitionSpec("data", None)


def test_both_names_with_different_values_are_refused():
    with pytest.raises(ValueError, match="sharding=\\('a',\\) and out_sharding=\\('b',\\)"):
        Param(jnp.ones(2), sharding=("a",), out_sharding=("b",))
    assert Param(jnp.ones(2), sharding=("a",), out_sharding=("a",)).sharding == ("a",)
    p = Param(jnp.ones(2), sharding=("a",))
    with pytest.raises(ValueError, match="two names"):
        p.set_metadata(sharding=("b",), out_sharding=("c",))
    assert p.get_metadata() == {"sharding": ("a",)}  # unchanged
    with pytest.raises(ValueError, match="two names"):
        VariableMetadata(jnp.ones(2), sharding=("a",), out_sharding=("c",))


def test_sharding_names_is_one_more_name_for_the_entry():
    # NNX's earlier name, which NNX 0.12 still reads (with a deprecation warning).
    p = Param(jnp.ones((2, 3)), sharding_names=("din", "dout"))
    assert p.get_metadata() == {"sharding": ("din", "dout")}
    assert p.sharding_names == p.out_sharding == ("din", "dout")
    init = with_metadata(
        lambda key, shape, dtype: jnp.zeros(shape, dtype), sharding_names=("din", "dout")
    )
    assert Param(init(None, (2, 2), jnp.float32)).sharding == ("din", "dout")
    with pytest.raises(ValueError, match=r"out_sharding=\('a',\) and sharding_names=\('b',\)"):
        Param(jnp.ones(2), out_sharding=("a",), sharding_names=("b",))
    with pytest.raises(AttributeError, match="`sharding_names` is Flax NNX's name"):
        Param(jnp.ones(2)).sharding_names  # noqa: B018
