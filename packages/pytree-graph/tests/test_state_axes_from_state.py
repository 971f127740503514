"""`StateAxes` made from a `State` of axes (as Flax NNX's): one axis per path."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Carry, Param, State, StateAxes
from pytree_module import Module


class Stats(Module):
    def __init__(self, w=None):
        self.w = Param(jnp.full((2,), 2.0)) if w is None else w
        self.s = BatchStat(jnp.arange(3.0))


class Tied(Module):
    def __init__(self):
        shared = Param(jnp.full((2,), 2.0))
        self.a = Stats(shared)
        self.b = Stats(shared)


def _axes(state):
    return jax.tree.map(lambda v: 0 if v.shape == (3,) else None, state)


def test_state_of_axes_gives_each_path_its_axis():
    m = Stats()
    axes = StateAxes(_axes(pg.state(m)))
    assert repr(axes) == "StateAxes({PathIn(.s): 0, PathIn(.w): None})"
    out = pg.vmap(lambda m: m.s.value * m.w.value.sum(), in_axes=(axes,))(m)
    assert out.tolist() == [0.0, 4.0, 8.0]
    # Same paths with the same axes: equal, whatever the order they were listed in.
    assert axes == StateAxes(State({"w": Param(None), "s": BatchStat(0)}))
    assert StateAxes(State({"s": 0, "w": Carry})).has_carry


def test_state_axes_from_state_on_a_tied_model():
    model = Tied()
    with pytest.raises(ValueError, match=r"matches the Param at \.b\.w.*made from a State"):
        pg.vmap(lambda m: m.a.s.value, in_axes=(StateAxes(_axes(pg.state(model))),))(model)
    # The paths of a shared Variable can be listed in the State, each with its axis.
    listed = State(
        {"a": {"w": Param(None), "s": BatchStat(0)}, "b": {"w": Param(None), "s": BatchStat(0)}}
    )
    out = pg.vmap(lambda m: m.a.s.value * m.b.w.value.sum(), in_axes=(StateAxes(listed),))(model)
    assert out.tolist() == [0.0, 4.0, 8.0] and model.a.w is model.b.w


def test_a_state_whose_leaves_are_not_axes_is_refused():
    with pytest.raises(TypeError, match=r"the State gives Array.* at \.s"):
        StateAxes(pg.state(Stats()))
    with pytest.raises(TypeError, match=r"gives True at \.s"):
        StateAxes(State({"s": True}))


def test_map_prefix_gives_the_axis_of_a_path_as_nnx():
    state = pg.state(Stats())
    state["w"] = 0
    state["s"] = None
    axes = StateAxes(state)
    assert axes.map_prefix(("w",), None) == 0 and axes.map_prefix(["s"], None) is None
    by_filter = StateAxes({Param: 1, ...: None})
    assert by_filter.map_prefix(("w",), Param(1.0)) == 1
    assert by_filter.map_prefix(("s",), BatchStat(1.0)) is None
    with pytest.raises(ValueError, match=r"StateAxes.map_prefix: no filter .* matches .* at \.x"):
        axes.map_prefix(("x",), None)


def test_state_sharding_from_a_state_of_specs():
    # As Flax NNX: a State whose leaves are PartitionSpecs gives each path its spec, for
    # shard_map's in_specs and jit's in_shardings alike.
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(jax.devices()[:2], ("a",))

    class Dense(Module):
        def __init__(self):
            self.kernel = Param(jnp.ones((4, 8)))
            self.bias = Param(jnp.zeros(8))

    specs = State({"kernel": P(None, "a"), "bias": P()})
    sharding = pg.StateSharding(specs)
    assert [(repr(f), spec) for f, spec in sharding.items()] == [
        ("PathIn(.bias)", P()),
        ("PathIn(.kernel)", P(None, "a")),
    ]
    seen = []

    @pg.shard_map(mesh=mesh, in_specs=(sharding,), out_specs=P())
    def shapes(m):
        seen.append((m.kernel.value.shape, m.bias.value.shape))
        return jnp.zeros(())

    shapes(Dense())
    assert seen == [((4, 4), (8,))]
    named = pg.StateSharding(jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    model = Dense()
    pg.jit(lambda m: m.kernel.value.sum() + m.bias.value.sum(), in_shardings=(named,))(model)
    with pytest.raises(TypeError, match=r"StateSharding: the State gives 3 at \.bias"):
        pg.StateSharding(State({"kernel": P(), "bias": 3}))
