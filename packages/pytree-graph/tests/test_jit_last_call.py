"""A graph `jit` matches a call to its last one by the arguments' identity (Modules,
Variables, arrays at the same places) before building the lift cache's key: every other
call must still be told apart, and the last call must not keep objects alive."""

import gc
import weakref

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_module import Module


class Scale(Module):
    def __init__(self, factor):
        self.w = pg.Param(jnp.array(factor))


@pg.jit
def forward(model, x):
    return model.w.value * x


@pg.jit
def two_models(a, b, x):
    return a.w.value * x + b.w.value


def test_another_object_of_the_same_structure_is_read():
    a, b = Scale(2.0), Scale(3.0)
    assert float(forward(a, jnp.array(1.0))) == 2.0
    assert float(forward(b, jnp.array(1.0))) == 3.0
    assert float(forward(a, jnp.array(1.0))) == 2.0


def test_arguments_at_swapped_places_are_told_apart():
    a, b = Scale(2.0), Scale(3.0)
    x = jnp.array(2.0)
    assert float(two_models(a, b, x)) == 7.0
    assert float(two_models(b, a, x)) == 8.0
    assert float(two_models(a, a, x)) == 6.0  # one object twice: shared
    assert float(two_models(a, b, x)) == 7.0


def test_a_static_or_a_container_in_place_of_an_array_is_told_apart():
    @pg.jit
    def f(model, x):
        return model.w.value * (x[0] if isinstance(x, list) else x)

    m = Scale(2.0)
    assert float(f(m, jnp.array(2.0))) == 4.0
    assert float(f(m, [jnp.array(3.0)])) == 6.0
    assert float(f(m, 5)) == 10.0
    assert float(f(m, jnp.array(2.0))) == 4.0


def test_writes_and_structure_changes_between_calls_are_seen():
    m = Scale(2.0)
    x = jnp.array(1.0)
    assert float(forward(m, x)) == 2.0
    m.w.value = jnp.array(5.0)
    assert float(forward(m, x)) == 5.0
    m.w = pg.Param(jnp.array(7.0))
    assert float(forward(m, x)) == 7.0


def test_the_last_call_keeps_no_object_alive():
    m = Scale(2.0)
    forward(m, jnp.array(1.0))
    forward(m, jnp.array(1.0))
    model_ref, variable_ref = weakref.ref(m), weakref.ref(m.w)
    del m
    gc.collect()
    assert model_ref() is None
    assert variable_ref() is None


def test_writes_on_a_repeated_call_reach_the_caller():
    @pg.jit
    def step(model, x):
        model.w.value = model.w.value + x

    m = Scale(0.0)
    for _ in range(4):
        step(m, jnp.array(1.0))
    assert float(m.w.value) == 4.0


def test_an_error_tracing_a_repeated_call_names_the_argument():
    # Python control flow on `x`, except where its shape settles it.
    f = pg.jit(lambda model, x: x if x.shape == (1,) or x.sum() > 0 else model.w.value * x)
    m = Scale(2.0)
    f(m, jnp.ones(1))
    f(m, jnp.ones(1))
    # The same objects as the last call, matched by identity; the new shape traces again.
    with pytest.raises(jax.errors.TracerBoolConversionError, match=r"of the argument x\."):
        f(m, jnp.ones(2))
