"""`transform_metadata` as a decorator, side by side with Flax NNX (bench environment)."""

import jax.numpy as jnp
import pytest

nnx = pytest.importorskip("flax.nnx")

import pytree_graph as pg  # noqa: E402


def run(lib, partition, sharding):
    extra = {} if lib is pg else {"eager_sharding": False}
    read = (lambda v: v.value) if lib is pg else (lambda v: v[...])
    v = lib.Param(jnp.array(1), out_sharding=sharding, **extra)
    inside = []

    @lib.transform_metadata(in_axes=0, out_axes=1, partition=partition)
    def f(v):
        inside.append(tuple(v.out_sharding))
        v.value = read(v) + 1
        return lib.Param(jnp.array(10), out_sharding=("dmid", "dout"), **extra)

    out = f(v)
    return inside, tuple(v.out_sharding), int(read(v)), tuple(out.out_sharding)


@pytest.mark.parametrize("partition,sharding", [("din", ("din", "dout")), (None, (None, "dout"))])
def test_same_metadata_and_values(partition, sharding):
    assert run(pg, partition, sharding) == run(nnx, partition, sharding)


def test_both_refuse_the_wrong_name():
    for lib in (pg, nnx):
        with pytest.raises(ValueError):
            run(lib, "dout", ("din", "dout"))
