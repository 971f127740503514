"""Options given per argument that contradict each other on one shared Variable are
refused, naming its paths and the two specs; agreeing ones keep working."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pytree_graph as pg
from pytree_graph import BatchStat, Param, StateAxes
from pytree_module import Module


class Layer(Module):
    def __init__(self):
        self.w = Param(jnp.ones((2, 3)))
        self.stat = BatchStat(jnp.zeros(2))


class Pair(Module):
    def __init__(self, layer):
        self.left = layer
        self.right = [layer]


def test_vmap_refuses_two_axes_for_one_shared_variable():
    layer = Layer()
    f = pg.vmap(lambda a, b: a.w.value.sum() + b.w.value.sum(), in_axes=(0, 1))
    with pytest.raises(ValueError, match=r"reached as argument 0 at \.stat and as argument 1 at "):
        f(layer, layer)
    with pytest.raises(
        ValueError,
        match=r"in_axes gives it two specs:\n  argument 0 at \.stat: 0\n"
        r"  argument 1 at \.stat: 1\n",
    ):
        f(layer, layer)
    same = pg.vmap(lambda a, b: a.w.value.sum() + b.w.value.sum(), in_axes=(0, 0))
    assert same(layer, layer).tolist() == [6.0, 6.0]
    # Through a shared submodule, at a path below it:
    pair = Pair(layer)
    g = pg.vmap(lambda p, q: p.left.w.value.sum(), in_axes=(StateAxes({...: 0}), None))
    with pytest.raises(
        ValueError, match=r"argument 0 at \.left\.stat and as argument 1 at \.left\.stat"
    ):
        g(pair, pair)
    assert g.__wrapped__ is not None
    assert pg.vmap(lambda p, q: p.left.w.value.sum(), in_axes=(0, 0))(pair, pair).shape == (2,)


def test_vmap_refuses_axes_by_path_that_differ_on_a_shared_variable():
    from pytree_filter import PathContains

    pair = Pair(Layer())
    f = pg.vmap(
        lambda p: p.left.w.value.sum(), in_axes=StateAxes({PathContains("right"): 1, ...: 0})
    )
    with pytest.raises(
        ValueError, match=r"argument 0 at \.left\.stat and as argument 0 at \.right\[0\]\.stat"
    ):
        f(pair)


def test_grad_refuses_a_variable_differentiated_through_one_argument_only():
    w = Param(jnp.array(2.0))
    for argnums in (0, 1):
        f = pg.grad(lambda a, b: a.value * b.value, argnums=argnums)
        with pytest.raises(ValueError, match=r"reached as argument 0 and as argument 1 is one"):
            f(w, w)
    layer = Layer()
    g = pg.grad(lambda a, b: (a.w.value * b.w.value).sum(), argnums=1)
    with pytest.raises(ValueError, match=r"argnums=1 \(with wrt=Param\) gives it two specs:\n"):
        g(layer, layer)
    # Differentiating both: the gradient comes once, with the first argument.
    grads = pg.grad(lambda a, b: a.value * b.value, argnums=(0, 1))(w, w)
    assert float(grads[0].value) == 4.0 and grads[1] is None
    # A BatchStat reached through both is differentiated through neither: no conflict.
    grads = pg.grad(lambda a, b: a.w.value.sum() + b["s"].value.sum())(layer, {"s": layer.stat})
    assert list(grads) == ["w"]


def _mesh():
    return Mesh(np.array(jax.devices()[:2]), ("x",))


@pytest.mark.multi_device
def test_jit_refuses_two_in_shardings_for_one_shared_variable():
    mesh = _mesh()
    v = pg.Variable(jnp.ones(4))
    f = pg.jit(
        lambda a, b: a.value + b.value,
        in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))),
    )
    with pytest.raises(
        ValueError,
        match=r"argument 0 and as argument 1 is one object, but "
        r"in_shardings gives it two specs:\n  argument 0: NamedSharding",
    ):
        f(v, v)
    same = pg.jit(lambda a, b: a.value + b.value, in_shardings=NamedSharding(mesh, P("x")))
    assert same(v, v).tolist() == [2.0] * 4


@pytest.mark.multi_device
def test_shard_map_refuses_two_in_specs_for_one_shared_variable():
    mesh = _mesh()
    v = pg.Variable(jnp.ones(4))
    f = pg.shard_map(
        lambda a, b: a.value + b.value, mesh=mesh, in_specs=(P(), P("x")), out_specs=P("x")
    )
    with pytest.raises(
        ValueError,
        match=r"in_specs gives it two specs:\n  argument 0: P\(\)\n  argument 1: P\('x',\)",
    ):
        f(v, v)
    same = pg.shard_map(
        lambda a, b: a.value + b.value, mesh=mesh, in_specs=P("x"), out_specs=P("x")
    )
    assert same(v, v).tolist() == [2.0] * 4


def test_alias_error_lists_each_path_with_its_spec():
    # Flax NNX's words first, then each path with its spec on a line, as NNX lists them.
    w = Param(jnp.ones((2, 2)))
    f = pg.vmap(lambda a, b: None, in_axes=(0, 1))
    with pytest.raises(
        ValueError,
        match=r"^vmap: Inconsistent aliasing detected: the Param reached as argument 0 and "
        r"as argument 1 is one object, but in_axes gives it two specs:\n"
        r"  argument 0: 0\n  argument 1: 1\nIt has one value",
    ):
        f(w, w)
