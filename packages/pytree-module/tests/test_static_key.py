"""Static values key treedef entries by type and bits: equal-looking values never share one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module, static


class Holder(Module):
    def __init__(self, value):
        self.value = static(value)


def identical(a, b):
    """Same type and same text: `repr` tells `0.0` from `-0.0` and `1` from `1.0` or `True`,
    at any depth. `b` is compared as a Module stores it: static lists, dicts and sets are
    frozen on assignment."""
    frozen = {list: "StaticList", dict: "StaticDict", set: "frozenset"}.get(type(b))
    same_type = type(a) is type(b) if frozen is None else type(a).__name__ == frozen
    return same_type and repr(a) == repr(b if type(b) is not set else frozenset(b))


# Pairs that `==` (and `hash`) call equal, so a cache keyed by `==` would mix them up.
LOOKALIKES = [
    pytest.param(0.0, -0.0, id="zero-and-negative-zero"),
    pytest.param(1, 1.0, id="int-and-float"),
    pytest.param(1, True, id="int-and-bool"),
    pytest.param((1, 2), (1.0, 2), id="tuple-of-int-and-of-float"),
    pytest.param([1, 2], [True, 2], id="list-of-int-and-of-bool"),
    pytest.param({"a": 1}, {"a": 1.0}, id="dict-values"),
    pytest.param({1: "a"}, {1.0: "a"}, id="dict-keys"),
    pytest.param({0}, {False}, id="set"),
    pytest.param(frozenset({0.0}), frozenset({-0.0}), id="frozenset"),
    pytest.param(complex(1.0, 0.0), complex(1.0, -0.0), id="complex"),
    pytest.param(((0.0,),), ((-0.0,),), id="nested-tuples"),
    pytest.param({np.float32(0.0): "a"}, {np.float32(-0.0): "a"}, id="numpy-float32-key"),
    pytest.param({np.float64(0.0): "a"}, {np.float64(-0.0): "a"}, id="numpy-float64-key"),
    pytest.param({np.float64(1.0): "a"}, {1.0: "a"}, id="numpy-and-python-float-key"),
]


@pytest.mark.parametrize(("first", "second"), LOOKALIKES)
def test_lookalike_static_values_get_different_treedefs(first, second):
    assert first == second  # the premise: Python calls them equal
    a, b = Holder(first), Holder(second)
    assert jax.tree.structure(a) != jax.tree.structure(b)
    assert a._pm_flat[1] is not b._pm_flat[1]


@pytest.mark.parametrize(("first", "second"), LOOKALIKES)
def test_unflattening_gives_back_the_value_that_was_stored(first, second):
    a, b = Holder(first), Holder(second)  # both alive: the first one's entry exists
    assert identical(jax.tree.map(lambda x: x, a).value, first)
    assert identical(jax.tree.map(lambda x: x, b).value, second)


@pytest.mark.parametrize(("first", "second"), LOOKALIKES)
def test_jit_round_trip_gives_back_exactly_the_value_passed(first, second):
    identity = jax.jit(lambda m: m)
    a, b = Holder(first), Holder(second)
    assert identical(identity(a).value, first)
    assert identical(identity(b).value, second)


@pytest.mark.parametrize(("first", "second"), LOOKALIKES)
def test_jit_branching_on_a_static_value_retraces_for_a_lookalike(first, second):
    traced = []

    @jax.jit
    def branch(m, x):
        traced.append(m.value)
        return x + 1 if identical(m.value, first) else x - 1

    a, b = Holder(first), Holder(second)
    assert branch(a, 0) == 1
    assert branch(b, 0) == -1
    assert len(traced) == 2 and identical(traced[1], second)


def test_sign_of_a_static_zero_reaches_the_traced_function():
    @jax.jit
    def signed(m, x):
        return jnp.copysign(x, m.value)

    assert signed(Holder(0.0), 2.0) == 2.0
    assert signed(Holder(-0.0), 2.0) == -2.0


# Equal values of equal types, made as distinct objects.
TWINS = [
    pytest.param(lambda: float("0.5"), id="float"),
    pytest.param(lambda: float("-0.0"), id="negative-zero"),
    pytest.param(lambda: float("nan"), id="nan"),
    pytest.param(lambda: complex(float("nan"), 1.0), id="complex-nan"),
    pytest.param(lambda: [1, 2.5], id="list"),
    pytest.param(lambda: {"a": 1.0, "b": (2, "x")}, id="dict"),
    pytest.param(lambda: (1, (2.0, None)), id="tuple"),
    pytest.param(lambda: {1, 2}, id="set"),
    pytest.param(lambda: frozenset({0.5}), id="frozenset"),
    pytest.param(lambda: {np.float32("nan"): "a"}, id="numpy-nan-key"),
    pytest.param(lambda: "relu", id="str"),
    pytest.param(lambda: jax.nn.relu, id="function"),
]


@pytest.mark.parametrize("make", TWINS)
def test_equal_values_of_equal_types_share_one_entry_and_one_compilation(make):
    a, b = Holder(make()), Holder(make())
    assert a._pm_flat[1] is b._pm_flat[1]
    assert jax.tree.structure(a) == jax.tree.structure(b)
    traced = []

    @jax.jit
    def count(m, x):
        traced.append(m.value)
        return x

    count(a, 0)
    count(b, 0)
    assert len(traced) == 1
    jax.tree.map(lambda *xs: xs[0], a, b)  # equal structures combine


def test_dicts_in_another_order_keep_their_order():
    a, b = Holder({"a": 1, "b": 2}), Holder({"b": 2, "a": 1})
    assert list(jax.tree.map(lambda x: x, a).value) == ["a", "b"]
    assert list(jax.tree.map(lambda x: x, b).value) == ["b", "a"]


def test_reassigning_a_lookalike_value_changes_the_treedef():
    m = Holder(0.0)
    before = jax.tree.structure(m)
    m.value = -0.0
    assert jax.tree.structure(m) != before
    assert identical(jax.jit(lambda m: m)(m).value, -0.0)
