"""`grad` of a `Dict` or `List` argument: those containers are objects of the graph (as
NNX's `nnx.Dict` and `nnx.List`, which are Modules), so in graph mode their gradient is a
`State` at the Variables' paths, a shared Variable once; in tree mode, container-shaped."""

import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, DiffState, Param, State
from pytree_module import Dict, List, Module


def _tied():
    p1, p2 = Param(jnp.array(10.0)), Param(jnp.array(20.0))
    return Dict(a=List([p1, p2]), b=p1, c=7, d=5.0)


def _total(m):
    return m["a"][0][...] + m["a"][1][...] + m["b"][...]


def test_the_gradient_of_a_dict_is_a_state_with_a_shared_variable_once():
    m = _tied()
    grads = pg.grad(_total)(m)
    assert type(grads) is State
    assert float(grads["a"][0][...]) == 2.0  # the tied Param: both uses, one entry
    assert float(grads["a"][1][...]) == 1.0
    assert isinstance(grads["a"][0], Param) and len(pg.to_flat_state(grads)) == 2
    pg.update(m, grads)
    assert m["a"][0] is m.b and float(m.b[...]) == 2.0 and float(m["a"][1][...]) == 1.0
    assert m.c == 7 and m.d == 5.0  # static values untouched


def test_value_and_grad_and_a_list_argument():
    weights = List([Param(jnp.array(2.0)), Param(jnp.array(3.0))])
    value, grads = pg.value_and_grad(lambda ws: ws[0][...] * ws[1][...])(weights)
    assert float(value) == 6.0 and type(grads) is State
    assert float(grads[0][...]) == 3.0 and float(grads[1][...]) == 2.0


def test_diff_state_picks_variables_inside_containers():
    m = Dict(a=List([Param(jnp.array(10.0)), BatchStat(jnp.array(20.0))]), b=Param(2.0))
    grads = pg.grad(
        lambda m: m["a"][0][...] * m["a"][1][...] * m["b"][...],
        argnums=DiffState(0, BatchStat),
    )(m)
    assert list(pg.to_flat_state(grads).paths) == [("a", 1)]
    assert float(grads["a"][1][...]) == 20.0


@pytest.mark.parametrize("option", [{"graph": False}, {"graph_updates": False}])
def test_tree_mode_gradients_are_container_shaped(option):
    m = Dict(a=List([Param(jnp.array(1.0)), Param(jnp.array(2.0))]))
    grads = pg.grad(lambda m: m["a"][0][...] + 2 * m["a"][1][...], **option)(m)
    assert type(grads) is Dict and type(grads["a"]) is List
    assert [float(v[...]) for v in grads["a"]] == [1.0, 2.0]


def test_a_module_holding_the_tied_container_gives_the_same_state():
    class Holder(Module):
        def __init__(self):
            self.params = _tied()

    holder = Holder()
    grads = pg.grad(lambda h: _total(h.params))(holder)
    assert float(grads["params"]["a"][0][...]) == 2.0
    assert ("params", "b") not in pg.to_flat_state(grads).paths  # the tie, once


def test_a_plain_dict_of_variables_keeps_its_own_structure():
    # Not an object of the graph (as a plain dict in NNX): the gradient is a dict.
    grads = pg.grad(lambda d: d["w"][...] * 3)({"w": Param(jnp.array(1.0))})
    assert type(grads) is dict and float(grads["w"][...]) == 3.0
