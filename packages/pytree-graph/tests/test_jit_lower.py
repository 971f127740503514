"""Ahead-of-time stages of the graph jit: `jit(f).lower(...)`, `.compile()`, `.trace(...)`,
and the same on a `jit_partial` function."""

import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import Param, Variable
from pytree_module import Module


class Counter(Module):
    def __init__(self):
        self.w = Param(jnp.ones(2))
        self.count = Variable(jnp.array(0))

    def __call__(self, x):
        self.count.value += 1
        return x * self.w.value


def apply(m, x):
    return m(x)


def test_lower_as_text_and_compile_write_back():
    model = Counter()
    lowered = pg.jit(apply).lower(model, jnp.ones(2))
    assert "func" in lowered.as_text()
    assert int(model.count.value) == 0  # lowering runs nothing
    compiled = lowered.compile()
    assert compiled(model, jnp.full(2, 3.0)).tolist() == [3.0, 3.0]
    assert int(model.count.value) == 1
    other = Counter()
    compiled(other, jnp.ones(2))  # another object of the same structure
    assert int(other.count.value) == 1
    assert "HloModule" in compiled.as_text() or compiled.as_text()


def test_compiled_refuses_another_structure():
    model = Counter()
    compiled = pg.jit(apply).lower(model, jnp.ones(2)).compile()
    model.extra = Param(jnp.zeros(2))
    with pytest.raises(ValueError, match="lowered for arguments of another structure"):
        compiled(model, jnp.ones(2))
    with pytest.raises(ValueError, match="another structure"):
        compiled(Counter(), 2.0)  # a static value where an array was


def test_lower_donating():
    model = Counter()

    def scale(m, x):
        m.w.value = m(x)
        return None

    compiled = pg.jit(scale, donate_argnums=0).lower(model, jnp.ones(2)).compile()
    old = model.w.value
    compiled(model, jnp.full(2, 2.0))
    assert old.is_deleted() and model.w.value.tolist() == [2.0, 2.0]
    assert int(model.count.value) == 1


def test_trace_then_lower():
    model = Counter()
    traced = pg.jit(apply).trace(model, jnp.ones(2))
    assert "mul" in str(traced.jaxpr)
    compiled = traced.lower().compile()
    assert compiled(model, jnp.ones(2)).tolist() == [1.0, 1.0]


def test_jit_partial_lower_and_compile():
    model = Counter()
    f = pg.jit_partial(apply, model)
    lowered = f.lower(jnp.ones(2))
    assert "func" in lowered.as_text()
    compiled = lowered.compile()
    assert compiled(jnp.full(2, 2.0)).tolist() == [2.0, 2.0]
    assert int(model.count.value) == 1
    assert "mul" in str(f.trace(jnp.ones(2)).jaxpr)


def test_jit_partial_keeps_unwritten_donated_variables():
    model = Counter()
    f = pg.jit_partial(apply, model, donate_argnums=0)
    f(jnp.ones(2))  # `w` is read, not written: its buffer may go to the output
    assert not model.w.value.is_deleted()
    assert f(jnp.ones(2)).tolist() == [1.0, 1.0]
    assert int(model.count.value) == 2


def test_jit_partial_compiled_refuses_changed_bound_objects():
    model = Counter()
    compiled = pg.jit_partial(apply, model).lower(jnp.ones(2)).compile()
    model.extra = Param(jnp.zeros(2))
    with pytest.raises(ValueError, match="lowered for bound objects of another structure"):
        compiled(jnp.ones(2))


def test_jit_keeps_unwritten_donated_variables():
    model = Counter()
    f = pg.jit(apply, donate_argnums=0)
    f(model, jnp.ones(2))  # `w` is read, not written: its buffer may go to the output
    assert not model.w.value.is_deleted()
    assert f(model, jnp.ones(2)).tolist() == [1.0, 1.0]
    assert int(model.count.value) == 2
    # Lowered ahead of time too.
    compiled = f.lower(model, jnp.ones(2)).compile()
    assert compiled(model, jnp.ones(2)).tolist() == [1.0, 1.0]
    assert not model.w.value.is_deleted() and int(model.count.value) == 3
