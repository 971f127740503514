"""Static values in graphs are keyed by type and value: equal Python values of different
types (or signs) never share a compilation."""

import math

import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_module import Module


def _traced(fun):
    traces = []

    def recorded(*args):
        traces.append(args[1:])
        return fun(*args)

    return pg.jit(recorded), traces


def test_a_static_in_a_tuple_that_changes_type_retraces():
    f, traces = _traced(lambda x, s: x + jnp.asarray(s[0]))
    x = jnp.zeros((), jnp.int32)
    assert f(x, (1, 2)).dtype == jnp.int32
    assert f(x, (1.0, 2)).dtype == jnp.float32  # traced for the float, not reused
    assert f(x, [1.0, (2, 3)]).dtype == jnp.float32
    assert f(x, [1.0, (2.0, 3)]).dtype == jnp.float32
    assert len(traces) == 4


def test_int_and_bool_statics_take_their_own_branch():
    f, _ = _traced(lambda x, s: x + (10 if type(s) is bool else 20))
    assert float(f(jnp.zeros(()), 1)) == 20.0
    assert float(f(jnp.zeros(()), True)) == 10.0
    assert float(f(jnp.zeros(()), {"k": 1})) == 20.0
    assert float(f(jnp.zeros(()), {"k": True})) == 20.0  # a dict's items are walked


def test_signed_zeros_are_different_statics_and_nan_is_itself():
    f, traces = _traced(lambda x, s: x + jnp.copysign(1.0, s))
    assert float(f(jnp.zeros(()), 0.0)) == 1.0
    assert float(f(jnp.zeros(()), -0.0)) == -1.0
    assert float(f(jnp.zeros(()), (0.0,)[0])) == 1.0
    assert len(traces) == 2
    g, nan_traces = _traced(lambda x, s: x)
    g(jnp.zeros(()), float("nan"))
    g(jnp.zeros(()), float("nan"))  # another NaN object: no retrace
    assert len(nan_traces) == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [(1, 1.0), (1, True), (0.0, -0.0), (complex(0.0, 0.0), complex(0.0, -0.0))],
)
def test_graphdefs_with_statics_of_another_type_differ(first, second):
    class Holder(Module):
        def __init__(self, items):
            self.items = items

    assert pg.graphdef([first]) != pg.graphdef([second])
    assert pg.graphdef([first]) == pg.graphdef([first])
    assert pg.graphdef(Holder([jnp.ones(1), (first,)])) != pg.graphdef(
        Holder([jnp.ones(1), (second,)])
    )


def test_nan_statics_make_equal_graphdefs():
    assert pg.graphdef([math.nan]) == pg.graphdef([float("nan")])


def test_variable_metadata_keeps_its_type():
    assert Param(1.0, tag=True).tag is True
    assert type(Param(1.0, tag=1).tag) is int
    assert type(Param(1.0, tag=1.0).tag) is float
    assert pg.graphdef([Param(1.0, tag=1)]) != pg.graphdef([Param(1.0, tag=True)])


class Scaled(Module):
    def __init__(self):
        self.scales = [1.0, 2.0]
        self.w = Param(jnp.ones(2))

    def __call__(self, x):
        return x * self.scales[0] + self.w.value


class ScaledNode(Module, pytree=False):
    def __init__(self):
        self.scales = [1.0, 2.0]
        self.w = Param(jnp.ones(2))

    def __call__(self, x):
        return x * self.scales[0] + self.w.value


def _callers(m):
    from pytree_transforms import filter_jit

    traced = pg.jit(lambda m, x: m(x))
    filtered = filter_jit(lambda m, x: m(x))
    return {
        "filter_jit": lambda x: filtered(m, x),
        "jit": lambda x: traced(m, x),
        "jit_partial": pg.jit_partial(lambda m, x: m(x), m),
        "cached_partial": pg.cached_partial(traced, m),
        "merge(*split)": lambda x: pg.merge(*pg.split(m))(x),
        "clone": lambda x: pg.clone(m)(x),
    }


@pytest.mark.parametrize(
    "name", ["filter_jit", "jit", "jit_partial", "cached_partial", "merge(*split)", "clone"]
)
def test_a_static_list_cannot_change_behind_a_cache_and_reassigning_it_is_seen(name):
    m = Scaled()
    call = _callers(m)[name]
    x = jnp.ones(2)
    assert float(call(x)[0]) == 2.0
    with pytest.raises(TypeError, match=r"Scaled\.scales is static .*`module\.scales = "):
        m.scales[0] = 5.0
    assert float(call(x)[0]) == 2.0
    m.scales = [5.0, 2.0]
    assert float(call(x)[0]) == 6.0
    m.scales = [*m.scales[:1], 3.0]  # a new list, kept as frozen as the first
    with pytest.raises(TypeError, match=r"Scaled\.scales is static"):
        m.scales.append(1.0)
    assert float(call(x)[0]) == 6.0


@pytest.mark.parametrize("name", ["jit", "jit_partial", "cached_partial", "merge(*split)", "clone"])
def test_a_list_of_a_graph_node_is_walked_so_an_in_place_change_is_seen(name):
    # A `pytree=False` node's lists are part of the graph, compared on every call.
    m = ScaledNode()
    call = _callers(m)[name]
    x = jnp.ones(2)
    assert float(call(x)[0]) == 2.0
    m.scales[0] = 5.0
    assert float(call(x)[0]) == 6.0
