"""A graph `jit` called again with the same objects reads their Variables' values only
when some value was written since (every writer draws a stamp): each kind of write is seen
by the next call, and one `jax.jit` per structure serves the plain calls."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_module import Module


class Scale(Module):
    def __init__(self):
        self.w = pg.Param(jnp.array(2.0))
        self.count = pg.BatchStat(jnp.array(0))


@pg.jit
def forward(model, x):
    return model.w.value * x


def _set_value(m):
    m.w.value = jnp.array(3.0)


def _setitem(m):
    m.w[...] = jnp.array(3.0)


def _set_value_method(m):
    m.w.set_value(jnp.array(3.0))


def _update(m):
    pg.update(m, pg.State({"w": pg.Param(jnp.array(3.0))}))


def _another_jit_writes(m):
    @pg.jit
    def write(m):
        m.w.value = jnp.array(3.0)

    write(m)


def _a_grad_step(m):
    def loss(m):
        return (m.w.value - 4.0) ** 2

    grads = pg.grad(loss)(m)  # 2 * (2 - 4)
    m.w.value = m.w.value - 0.25 * grads["w"].value


WRITERS = [_set_value, _setitem, _set_value_method, _update, _another_jit_writes, _a_grad_step]


@pytest.mark.parametrize("write", WRITERS, ids=lambda f: f.__name__.strip("_"))
def test_every_write_between_calls_is_seen(write):
    model, x = Scale(), jnp.array(1.0)
    for _ in range(3):  # cached walk and cached values
        assert float(forward(model, x)) == 2.0
    write(model)
    assert float(forward(model, x)) == 3.0
    assert float(forward(model, x)) == 3.0


def test_a_write_inside_the_call_is_seen_by_the_next():
    @pg.jit
    def count(model, x):
        model.count.value += 1
        return model.w.value * x

    model = Scale()
    for expected in range(1, 4):
        count(model, jnp.array(1.0))
        assert int(model.count.value) == expected


def test_array_backed_variables_written_by_plain_jax_jit_are_seen():
    # Their refs are written in place, drawing no stamp: their values are read every call.
    model = pg.with_vars(Scale(), ref=True)
    assert float(forward(model, jnp.array(1.0))) == 2.0

    @jax.jit
    def write(model):
        model.w[...] = jnp.array(5.0)

    write(model)
    assert float(forward(model, jnp.array(1.0))) == 5.0


def test_a_structure_seen_before_is_not_traced_again():
    traces = []

    @pg.jit
    def f(model, x):
        traces.append(None)
        return model.w.value * x

    a, b = Scale(), Scale()
    b.extra = pg.Param(jnp.ones(2))  # another structure
    for model in (a, b, a, b, a):
        np.testing.assert_allclose(f(model, jnp.array(1.0)), 2.0)
    assert len(traces) == 2
    assert f._cache_size() == 2
