"""`dataclass`, `Data[...]`, `Static[...]` side by side with Flax NNX (bench environment)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

nnx = pytest.importorskip("flax.nnx")

import pytree_module as pm  # noqa: E402


def _leaves(obj):
    return [int(x) for x in jax.tree.leaves(obj)]


def test_dataclass_with_markers_same_leaves():
    def make(lib, base, Data, dataclass):
        @dataclass
        class Foo(base):
            node: jax.Array = lib.data()
            meta: int
            meta2: int = 3
            node2: int = lib.data(default=6)
            marked: Data[int] = 7

        return Foo(node=jnp.array(1), meta=1)

    ours = make(pm, pm.Module, pm.Data, pm.dataclass)
    theirs = make(nnx, nnx.Pytree, nnx.Data, nnx.dataclass)
    # the same leaves (NNX orders them by attribute name, fields here keep declaration order)
    assert sorted(_leaves(ours)) == sorted(_leaves(theirs)) == [1, 6, 7]
    ours, theirs = (jax.tree.map(lambda x: x + 1, m) for m in (ours, theirs))
    assert (ours.meta, ours.node2) == (theirs.meta, theirs.node2) == (1, 7)


def test_annotations_under_plain_dataclasses_same_leaves():
    def make(lib, base):
        @dataclasses.dataclass
        class Foo(base):
            a: lib.Data[int]
            b: lib.Static[int]
            c: jax.Array

        return Foo(a=1, b=2, c=jnp.array(3))

    ours, theirs = make(pm, pm.Module), make(nnx, nnx.Pytree)
    assert sorted(_leaves(ours)) == sorted(_leaves(theirs))
    for lib, foo in ((pm, ours), (nnx, theirs)):
        foo.a = lib.static(3)
        foo.b = lib.data(4)
    assert sorted(_leaves(ours)) == sorted(_leaves(theirs)) == [3, 4]


def test_static_marked_array_refused_by_both():
    for lib, base in ((pm, pm.Module), (nnx, nnx.Pytree)):

        @lib.dataclass
        class Bar(base):
            a: jax.Array = lib.static()

        with pytest.raises(ValueError):
            Bar(a=jnp.array(3))
