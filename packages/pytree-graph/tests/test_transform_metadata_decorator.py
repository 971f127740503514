"""`transform_metadata` as a decorator (Flax NNX's `nnx.transform_metadata`)."""

import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_module import Module


def test_one_axis_removed_inside_values_written_back_output_axis_added():
    v = pg.Param(jnp.array(0), sharding=("din", "dout"))
    seen = []

    @pg.transform_metadata(in_axes=0, out_axes=1, partition="din")
    def f(v):
        v.value += 1
        seen.append(v.sharding)
        return pg.Param(jnp.array(10), sharding=("dmid", "dout"))

    out = f(v)
    assert seen == [("dout",)]
    assert v.sharding == ("din", "dout") and int(v.value) == 1
    assert out.sharding == ("dmid", "din", "dout") and int(out.value) == 10


def test_none_partition_and_nnx_metadata_name():
    v = pg.Param(jnp.array(1), out_sharding=(None, "dout"))

    @pg.transform_metadata(in_axes=0, out_axes=1, partition=None)
    def f(v):
        v.value += 1
        assert v.sharding == ("dout",)
        return pg.Param(jnp.array(10), out_sharding=("dmid", "dout"))

    out = f(v)
    assert v.sharding == (None, "dout") and int(v.value) == 2
    assert out.sharding == ("dmid", None, "dout")


def test_tied_module_stays_tied_inside_and_per_argument_axes():
    class Tied(Module):
        def __init__(self):
            self.embed = pg.Param(jnp.ones((2, 3)), sharding=("layers", "vocab"))
            self.unembed = self.embed

    model = Tied()
    scale = pg.Param(jnp.ones(()), sharding=("layers",))

    @pg.transform_metadata(in_axes=(0, None), out_axes=None, partition="layers")
    def step(model, scale):
        assert model.embed is model.unembed and model.embed.sharding == ("vocab",)
        assert scale.sharding == ("layers",)  # not mapped: left alone
        model.unembed.value = model.unembed.value * 2

    assert step(model, scale) is None
    assert model.embed is model.unembed and float(model.embed.value[0, 0]) == 2.0
    assert model.embed.sharding == ("layers", "vocab")


def test_keyword_arguments_count_as_positional():
    v = pg.Param(jnp.array(0.0), sharding=("layers", "d"))

    @pg.transform_metadata(in_axes=(0,), out_axes=None, partition="layers")
    def f(v):
        assert v.sharding == ("d",)

    f(v=v)


def test_errors():
    v = pg.Param(jnp.array(0), sharding=("din", "dout"))
    with pytest.raises(ValueError, match=r"names the mapped axis 'dout'.*args\[0\]"):
        pg.transform_metadata(lambda v: None, in_axes=0, partition="dout")(v)
    assert v.sharding == ("din", "dout")
    with pytest.raises(ValueError, match="is a Variable the function was given"):
        pg.transform_metadata(lambda v: v, in_axes=0, partition="din")(v)
    with pytest.raises(ValueError, match="in_axes has 2 entries but there are 1 arguments"):
        pg.transform_metadata(lambda v: None, in_axes=(0, 0), partition="din")(v)
    with pytest.raises(TypeError, match="in_axes must be an int, None, or a tuple"):
        pg.transform_metadata(lambda v: None, in_axes="0", partition="din")(v)
    with pytest.raises(TypeError, match="partition must be a str or None"):
        pg.transform_metadata(partition=3)
