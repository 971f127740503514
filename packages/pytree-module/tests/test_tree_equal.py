"""tree_equal: structure and values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module, tree_equal


class Box(Module):
    def __init__(self, x, tag="a"):
        self.x = x
        self.tag = tag


def test_equal_and_unequal_trees():
    assert tree_equal(Box(jnp.ones(2)), Box(jnp.ones(2)), Box(np.ones(2, np.float32)))
    assert not tree_equal(Box(jnp.ones(2)), Box(jnp.zeros(2)))
    assert not tree_equal(Box(jnp.ones(2)), Box(jnp.ones(2), tag="b"))
    assert not tree_equal(Box(jnp.ones(2)), Box(jnp.ones(3)))
    assert not tree_equal(jnp.ones(2), jnp.ones(2, dtype=jnp.int32))
    assert not tree_equal([1], (1,))
    assert tree_equal(1)


def test_tolerances():
    a, b = jnp.array([1.0, 2.0]), jnp.array([1.0, 2.001])
    assert not tree_equal(a, b)
    assert tree_equal(a, b, atol=1e-2)
    assert tree_equal(a, b, rtol=1e-2)
    assert tree_equal([1.0], [1.0005], atol=1e-3)


def test_tolerances_leave_integers_bools_and_float0_exact():
    # The gradient of an integer input is a float0 array: tolerances apply to floating-point
    # values only, and the others compare exactly (they have no distance to measure).
    grad = jax.grad(lambda x, n: x * n, argnums=(0, 1), allow_int=True)(1.0, 3)
    assert grad[1].dtype == jax.dtypes.float0
    assert tree_equal(grad, grad, rtol=1e-5, atol=1e-8)
    assert tree_equal(np.array([True, False]), np.array([True, False]), atol=1e-3)
    assert not tree_equal(np.array([True, False]), np.array([True, True]), atol=1e-3)
    assert not tree_equal(jnp.array([1, 2]), jnp.array([1, 3]), atol=5)
    traced = jax.jit(lambda a, b: tree_equal(a, b, atol=5))(jnp.array([1, 2]), jnp.array([1, 3]))
    assert not bool(traced)


def test_under_jit_returns_a_traced_boolean():
    out = jax.jit(lambda a, b: tree_equal(a, b))(jnp.ones(2), jnp.ones(2))
    assert bool(out)
    out = jax.jit(lambda a, b: tree_equal(a, b))(jnp.ones(2), jnp.zeros(2))
    assert not bool(out)


def test_no_trees_is_an_error_naming_the_argument():
    with pytest.raises(TypeError, match=r"tree_equal\(\) missing the pytrees.*`\*trees`"):
        tree_equal()
    with pytest.raises(TypeError, match="missing the pytrees"):
        tree_equal(rtol=1e-3)
