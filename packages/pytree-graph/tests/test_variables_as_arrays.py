"""Variables where JAX expects arrays (`__jax_array__`), while transforms see pytrees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_graph import BatchStat, Param, Variable, jit
from pytree_module import Module


def test_jax_numpy_functions_take_a_variable():
    w = Param(jnp.arange(6.0).reshape(2, 3))
    x = jnp.ones(2)
    expected = x @ w.value
    assert jnp.array_equal(jnp.dot(x, w), expected)
    assert jnp.array_equal(jnp.einsum("i,ij->j", x, w), expected)
    assert float(jnp.sum(w)) == 15.0
    assert jnp.array_equal(jnp.mean(w, axis=0), w.value.mean(axis=0))
    assert jnp.array_equal(jnp.tanh(w), jnp.tanh(w.value))
    assert jnp.array_equal(jax.nn.relu(w - 2), jax.nn.relu(w.value - 2))
    assert jnp.stack([w, w]).shape == (2, 2, 3)
    assert jnp.reshape(w, (3, 2)).shape == (3, 2)
    assert jnp.array_equal(jnp.where(w > 2, w, 0.0), jnp.where(w.value > 2, w.value, 0.0))
    assert jnp.asarray(w) is w.value


def test_operators_give_arrays():
    w = Param(jnp.arange(6.0).reshape(2, 3))
    x = jnp.ones(2)
    for result, expected in [
        (w + 1, w.value + 1),
        (1 + w, 1 + w.value),
        (x @ w, x @ w.value),
        (w @ jnp.ones(3), w.value @ jnp.ones(3)),
        (w * w, w.value * w.value),
        (-w, -w.value),
        (w.T, w.value.T),
    ]:
        assert type(result) is type(expected) and jnp.array_equal(result, expected)


def test_numbers_and_numpy_values():
    assert float(jnp.sum(Param(2.0))) == 2.0
    assert jnp.asarray(BatchStat(3)).dtype == jnp.asarray(3).dtype
    v = Variable(np.arange(3.0))
    assert jnp.array_equal(jnp.cumsum(v), jnp.cumsum(jnp.arange(3.0)))
    assert np.array_equal(np.asarray(v), np.arange(3.0))


def test_a_get_value_override_applies_to_array_use():
    class Doubled(Param):
        def get_value(self):
            return super().get_value() * 2

    v = Doubled(jnp.ones(3))
    assert float(jnp.sum(v)) == 6.0
    assert jnp.array_equal(jnp.asarray(v), 2 * jnp.ones(3))


def test_jit_still_sees_a_variable_as_a_pytree():
    w = Param(jnp.ones((2, 2)), tag="w")
    out = jax.jit(lambda p: p)(w)
    assert type(out) is Param and out.tag == "w" and out is not w
    assert float(jax.jit(lambda p: jnp.sum(p))(w)) == 4.0
    grads = jax.grad(lambda p: jnp.sum(p * p))(w)
    assert type(grads) is Param and jnp.array_equal(grads.value, 2 * w.value)
    leaves, treedef = jax.tree.flatten(w)
    assert leaves == [w.value] and type(treedef.unflatten(leaves)) is Param


def test_inside_graph_transforms():
    class Dense(Module):
        def __init__(self):
            self.w = Param(jnp.ones((2, 3)))

        def __call__(self, x):
            return jnp.dot(x, self.w)  # the Variable itself, no `.value`

    dense = Dense()
    y = jit(lambda m, x: m(x))(dense, jnp.ones(2))
    assert jnp.array_equal(y, 2 * jnp.ones(3))


def test_lax_functions_need_the_value():
    # `jax.lax` takes arrays only, as for Flax NNX's Variables: pass `.value` (or `v[...]`).
    w = Param(jnp.ones(2))
    with pytest.raises((TypeError, ValueError)):
        jax.lax.add(w, w)
    assert jnp.array_equal(jax.lax.add(w.value, w[...]), 2 * jnp.ones(2))


def test_equality_stays_identity():
    # Variables are objects with identity (as Modules): `==` does not compare values.
    w = Param(jnp.ones(2))
    assert w == w and w != Param(jnp.ones(2))
    assert jnp.array_equal(w.value == 1.0, jnp.array([True, True]))
