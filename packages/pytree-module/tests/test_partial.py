"""Partial: a pytree functools.partial."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, Partial


def test_partial_binds_arguments_and_traces_them():
    p = Partial(lambda a, b, scale=1.0: (a + b) * scale, jnp.ones(2), scale=2.0)
    assert p(jnp.ones(2)).tolist() == [4.0, 4.0]
    grads = jax.grad(lambda p: jnp.sum(p(jnp.zeros(2))))(p)
    assert grads.args[0].tolist() == [2.0, 2.0]


def test_plain_function_is_static_and_arguments_are_always_leaves():
    p = Partial(jnp.add, 1.0)
    assert jax.tree.leaves(p) == [1.0]
    assert float(jax.jit(lambda p: p(2.0))(p)) == 3.0


def test_partial_of_a_module_exposes_its_arrays():
    class Scale(Module):
        def __init__(self):
            self.s = jnp.array(3.0)

        def __call__(self, x):
            return self.s * x

    p = Partial(Scale())
    assert jax.tree.leaves(p) == [p.func.s]
    assert float(jax.jit(lambda p, x: p(x))(p, 2.0)) == 6.0


def test_partial_rejects_non_callable():
    with pytest.raises(TypeError, match="callable"):
        Partial(3)
