"""Side by side with Flax NNX: the four calls of `update_context`, the State functions
(`to_flat_state`, `split_state`, `filter_state`), a lone Variable's `split` / `merge` /
`update`, and `update` of a static value from a pure dict (runs in the bench
environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def _classes(lib):
    base = nnx.Module if lib is nnx else Module

    class Bar(base):
        def __init__(self):
            self.x = 1
            self.w = lib.Param(jnp.ones(2))

    class Foo(base):
        def __init__(self):
            self.a = Bar()
            self.b = self.a

    return Bar, Foo


def _round_trip(lib, m, work):
    @jax.jit
    def inside(graphdef, state):
        with lib.merge_context("t", inner=True) as ctx:
            inner = ctx.merge(graphdef, state)
        work(inner)
        with lib.split_context("t") as ctx:
            return ctx.split(inner)

    with lib.update_context("t"):
        with lib.split_context("t") as ctx:
            graphdef, state = ctx.split(m)
        graphdef, state = inside(graphdef, state)
        with lib.merge_context("t", inner=False) as ctx:
            return ctx.merge(graphdef, state)


@pytest.mark.parametrize("lib", [nnx, pg], ids=["nnx", "ours"])
def test_four_calls_update_the_original(lib):
    bar_cls, foo_cls = _classes(lib)
    m = foo_cls()
    bar = m.a

    def work(inner):
        inner.a.y = 2  # a static attribute added
        inner.a.w.value = inner.a.w.value * 3
        inner.c = inner.a  # a new shared reference
        inner.d = bar_cls()  # a new submodule

    out = _round_trip(lib, m, work)
    assert out is m and m.a is bar and m.b is bar and m.c is bar
    assert m.a.y == 2 and m.a.w.value.tolist() == [3.0, 3.0]
    assert isinstance(m.d, bar_cls) and m.d is not bar


@pytest.mark.parametrize("lib", [nnx, pg], ids=["nnx", "ours"])
def test_second_split_in_one_context_is_a_reference(lib):
    _, foo_cls = _classes(lib)
    m = foo_cls()
    with lib.split_context() as ctx:
        _, first = ctx.split(m)
        _, second = ctx.split(m)
    assert (len(lib.to_flat_state(first)), len(lib.to_flat_state(second))) == (1, 0)


def test_misuse_raises_value_error_in_both():
    for lib in (nnx, pg):
        with pytest.raises(ValueError, match="No update context found for tag 'x'"):
            lib.current_update_context("x")
        with (
            lib.update_context("t"),
            pytest.raises(ValueError, match="inner"),
            lib.merge_context("t"),
        ):
            pass


def test_state_functions_agree():
    def model(lib):
        return {"w": lib.Param(jnp.ones(2)), "s": {"m": lib.BatchStat(jnp.zeros(1))}}

    theirs, ours = nnx.state(model(nnx)), pg.state(model(pg))
    # The same pairs; NNX sorts a dict's keys, the project keeps their order.
    assert sorted(nnx.to_flat_state(theirs).paths) == sorted(pg.to_flat_state(ours).paths)
    t_params, t_rest = nnx.split_state(theirs, nnx.Param, ...)
    o_params, o_rest = pg.split_state(ours, pg.Param, ...)
    assert list(nnx.to_flat_state(t_rest).paths) == list(pg.to_flat_state(o_rest).paths)
    assert list(t_params) == list(o_params)
    assert list(nnx.filter_state(theirs, nnx.Param)) == list(pg.filter_state(ours, pg.Param))
    with pytest.raises(ValueError):
        nnx.split_state(theirs, nnx.Param)
    with pytest.raises(ValueError):
        pg.split_state(ours, pg.Param)


@pytest.mark.parametrize("lib", [nnx, pg], ids=["nnx", "ours"])
def test_lone_variable(lib):
    v = lib.Param(jnp.array(1.0))
    graphdef, st = lib.split(v)
    assert st is v and lib.merge(graphdef, st) is v
    graphdef, stats, params, rest = lib.split(v, lib.BatchStat, lib.Param, ...)
    assert params is v and len(stats) == 0 and len(rest) == 0
    params = lib.Param(jnp.array(5.0))
    lib.update(v, stats, params, rest)
    assert v.value == 5.0


@pytest.mark.parametrize("lib", [nnx, pg], ids=["nnx", "ours"])
def test_update_sets_static_values(lib):
    node = {"a": {"b": 1, "c": lib.Param(jnp.array(2)), "d": 3}}
    lib.update(node, {"a": {"b": 4, "c": jnp.array(10)}})
    assert node["a"]["b"] == 4 and node["a"]["c"].value == 10 and node["a"]["d"] == 3
