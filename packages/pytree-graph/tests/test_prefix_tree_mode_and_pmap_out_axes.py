"""`prefix(..., graph=False)` (a plain pytree prefix of axes, as Flax NNX's tree mode) and
`pmap`'s `out_axes` given as a `StateAxes` (per filter, for returned objects)."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Param, StateAxes
from pytree_module import Module


class Stats(Module):
    def __init__(self, w=None):
        self.w = Param(jnp.full((2,), 2.0)) if w is None else w
        self.s = BatchStat(jnp.arange(3.0))
        self.n = 3


class Tied(Module):
    def __init__(self):
        shared = Param(jnp.full((2,), 2.0))
        self.a = Stats(shared)
        self.b = Stats(shared)


def test_tree_prefix_is_the_nodes_pytree_with_axes_for_leaves():
    d = {"a": Param(jnp.array(2.0)), "b": BatchStat(jnp.arange(5.0))}
    axes = pg.prefix(d, lambda path, leaf: 0 if "b" in path else None, graph=False)
    assert axes == {"a": None, "b": 0}
    expected = [0.0, 2.0, 4.0, 6.0, 8.0]
    assert jax.vmap(lambda d: d["a"].value * d["b"].value, in_axes=(axes,))(d).tolist() == (
        expected
    )
    f = pg.vmap(lambda d: d["a"].value * d["b"].value, in_axes=(axes,), graph=False)
    assert f(d).tolist() == expected


def test_tree_prefix_of_a_module_and_a_tuple():
    m = Stats()
    axes = pg.prefix(m, {BatchStat: 0, ...: None}, graph=False)
    assert type(axes) is Stats and axes.s == 0 and axes.w is None and axes.n == 3
    both = pg.prefix((m, jnp.ones(3)), {...: 0}, graph=False)
    assert type(both) is tuple and both[1] == 0 and both[0].w == 0
    out = pg.vmap(lambda m, x: m.s.value + x + m.w.value.sum(), in_axes=(axes, 0), graph=False)(
        m, jnp.ones(3)
    )
    assert out.tolist() == [5.0, 6.0, 7.0]


def test_graph_mode_reads_the_switch_and_keeps_prefix_axes():
    m = Stats()
    with pg.set_graph_mode(False):
        assert type(pg.prefix(m, {...: 0})) is Stats
    graph_axes = pg.prefix(m, {BatchStat: 0, ...: None})
    assert isinstance(graph_axes, StateAxes)


def test_tree_prefix_refuses_a_tied_model_and_bad_axes_graph_mode_keeps_the_tie():
    model = Tied()
    with pytest.raises(ValueError, match=r"Param at \.b\.w is also at \.a\.w.*graph=True"):
        pg.prefix(model, {...: None}, graph=False)
    axes = pg.prefix(model, {BatchStat: 0, ...: None}, graph=True)
    out = pg.vmap(lambda m: m.a.s.value * m.b.w.value.sum(), in_axes=(axes,))(model)
    assert out.tolist() == [0.0, 4.0, 8.0]
    with pytest.raises(TypeError, match=r"axis of the BatchStat at \.s is 'x'"):
        pg.prefix(Stats(), {BatchStat: "x", ...: None}, graph=False)
    with pytest.raises(ValueError, match=r"no filter matches the BatchStat at \.s"):
        pg.prefix(Stats(), {Param: None}, graph=False)


def test_pmap_out_axes_as_state_axes_for_returned_objects():
    n = jax.local_device_count()

    @pg.pmap(out_axes=StateAxes({Param: None, ...: 0}))
    def make(x):
        m = Stats()
        m.s.value = m.s.value + x
        return m

    m = make(jnp.arange(float(n)))
    assert m.w.value.shape == (2,) and m.s.value.shape == (n, 3)
    assert m.s.value[:, 0].tolist() == list(map(float, range(n)))
    out, x = pg.pmap(lambda x: (Stats(), x), out_axes=(StateAxes({Param: 1, ...: None}), 0))(
        jnp.arange(float(n))
    )
    assert out.w.value.shape == (2, n) and out.s.value.shape == (3,) and x.shape == (n,)


def test_pmap_out_axes_state_axes_with_a_tied_model():
    n = jax.local_device_count()
    model = Tied()

    @pg.pmap(in_axes=(StateAxes({...: None}), 0), out_axes=StateAxes({...: 0}))
    def step(model, x):
        model.a.w.value = model.b.w.value + 1.0  # the tie holds inside: one Variable
        # A new Variable out takes its axis from out_axes; those that came in keep theirs.
        return BatchStat(model.a.s.value + x * model.b.w.value.sum())

    stats = step(model, jnp.arange(float(n)))
    assert stats.value.shape == (n, 3) and stats.value[1].tolist() == [6.0, 7.0, 8.0]
    assert model.a.w is model.b.w and model.b.w.value.tolist() == [3.0, 3.0]


def test_pmap_bad_out_axes_are_refused():
    with pytest.raises(TypeError, match="pmap: out_axes must be an int, None or a StateAxes"):
        pg.pmap(lambda x: x, out_axes="a")
    with pytest.raises(TypeError, match=r"pmap: out_axes\[1\] must be"):
        pg.pmap(lambda x: x, out_axes=(0, 1.5))
    n = jax.local_device_count()
    f = pg.pmap(lambda x: x, out_axes=(0, 0))
    with pytest.raises(ValueError, match="out_axes has 2 entries, one per output"):
        f(jnp.arange(float(n)))
