"""`DiffState` in `grad` and `value_and_grad`'s argnums: a filter per argument."""

import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_filter import PathContains
from pytree_graph import BatchStat, DiffState, Param, Variable
from pytree_module import Module


class Head(Module):
    def __init__(self):
        self.w = Param(jnp.array(2.0))


class Net(Module):
    def __init__(self):
        self.body = Param(jnp.array(3.0))
        self.head = Head()
        self.stat = BatchStat(jnp.array(1.0))
        self.steps = Variable(jnp.array(0))

    def __call__(self, x):
        self.steps.value += 1
        return self.body.value * self.head.w.value * self.stat.value * x


def test_diff_state_selects_part_of_a_model():
    net = Net()
    grads = pg.grad(lambda m, x: m(x), argnums=DiffState(0, PathContains("head")))(net, 1.0)
    assert list(grads.flat_state()) == [("head", "w")]
    assert float(grads["head"]["w"].value) == 3.0
    assert int(net.steps.value) == 1


def test_diff_states_and_ints_mixed():
    a, b = Net(), Net()

    def loss(a, b, x):
        return a(x) + 2 * b(x) + x

    grads_a, grads_b, g_x = pg.grad(loss, argnums=(DiffState(0, BatchStat), 1, 2))(
        a, b, jnp.array(1.0)
    )
    assert list(grads_a) == ["stat"] and float(grads_a["stat"].value) == 6.0
    assert set(grads_b.flat_state()) == {("body",), ("head", "w")}  # Params: the default
    np.testing.assert_allclose(grads_b["body"].value, 4.0)
    assert float(g_x) == 1.0 + 6.0 + 12.0


def test_diff_state_same_as_wrt():
    net = Net()
    by_wrt = pg.value_and_grad(lambda m: m(1.0), wrt=...)
    by_diff_state = pg.value_and_grad(lambda m: m(1.0), argnums=DiffState(0, ...))
    with pytest.raises(
        TypeError, match=r"the Variable at \.steps of argument 0 matches wrt=\.\.\."
    ):
        by_wrt(net)
    with pytest.raises(TypeError, match=r"matches DiffState\(0, \.\.\.\) but holds int32"):
        by_diff_state(net)
    floats = DiffState(0, lambda leaf: jnp.issubdtype(leaf.value.dtype, jnp.floating))
    value, grads = pg.value_and_grad(lambda m: m(1.0), argnums=floats)(net)
    assert float(value) == 6.0 and set(grads) == {"body", "head", "stat"}


def test_negative_argnum_in_a_diff_state():
    grads = pg.grad(lambda x, m: m(x), argnums=DiffState(-1, Param))(1.0, Net())
    assert set(grads) == {"body", "head"}


def test_diff_state_errors():
    with pytest.raises(ValueError, match="wrt=BatchStat is given too"):
        pg.grad(lambda m: m(1.0), argnums=DiffState(0, Param), wrt=BatchStat)
    with pytest.raises(ValueError, match="names argument 0 twice"):
        pg.grad(lambda m: m(1.0), argnums=(0, DiffState(0, Param)))
    with pytest.raises(ValueError, match="names argument 0 twice"):
        pg.grad(lambda a, b: a(1.0), argnums=(DiffState(-2, Param), 0))(Net(), Net())
    with pytest.raises(ValueError, match=r"names argument 3, out of range for a call with 1"):
        pg.grad(lambda m: m(1.0), argnums=DiffState(3, Param))(Net())
    with pytest.raises(TypeError, match="DiffState: argnum must be the int position"):
        DiffState("0", Param)
    with pytest.raises(TypeError, match="argnums must be an int, a DiffState, or a non-empty"):
        pg.grad(lambda m: m(1.0), argnums=())
    assert DiffState(0, Param) == DiffState(0, Param)
    assert repr(DiffState(1, Param)) == "DiffState(1, Param)"


def test_shared_variable_reached_with_two_filters_is_refused():
    net = Net()
    with pytest.raises(ValueError, match="gives it two specs"):
        pg.grad(
            lambda a, b: a(1.0) + b(1.0),
            argnums=(DiffState(0, BatchStat), DiffState(1, Param)),
        )(net, net)
