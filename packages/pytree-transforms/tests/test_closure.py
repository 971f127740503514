"""filter_closure_convert: the seed's example, pytrees in and out, transforms and errors."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module
from pytree_transforms import filter_closure_convert, filter_jit


def test_seed_example():
    @jax.grad
    def f(x, y):
        z = x + y
        g = lambda a: z + a  # closes over z  # noqa: E731
        g2 = filter_closure_convert(g, 1)
        assert [id(b) for b in g2.consts] == [id(z)]
        return z

    assert f(1.0, 1.0) == 1.0


def test_gradients_flow_through_the_converted_function():
    def f(x):
        g2 = filter_closure_convert(lambda a: jnp.sin(x) * a, jnp.array(0.0))
        return g2(jnp.array(3.0))

    assert jax.grad(f)(0.0) == pytest.approx(3.0)


def test_pytrees_in_and_out():
    weights = jnp.arange(3)
    offset = jnp.array(0.5)

    def fn(inputs, mode, *, scale):
        return {"y": inputs["x"] * weights * scale + offset, "mode": mode, "n": 3}

    example = {"x": jnp.zeros(3)}
    converted = filter_closure_convert(fn, example, "train", scale=2.0)
    assert len(converted.consts) == 2
    assert any(c is weights for c in converted.consts)  # integer arrays are hoisted too
    out = converted({"x": jnp.ones(3)}, "train", scale=2.0)
    assert out["y"].tolist() == [0.5, 2.5, 4.5]
    assert out["mode"] == "train" and out["n"] == 3


def test_is_a_pytree_usable_under_transforms():
    scale = jnp.array(2.0)
    converted = filter_closure_convert(lambda x: x * scale, jax.ShapeDtypeStruct((2,), jnp.float32))
    assert isinstance(converted, Module)
    assert jax.tree.leaves(converted) == [scale]
    assert jax.jit(lambda c, x: c(x))(converted, jnp.ones(2)).tolist() == [2.0, 2.0]
    assert filter_jit(lambda c, x: c(x))(converted, jnp.ones(2)).tolist() == [2.0, 2.0]
    batched = jax.vmap(converted)(jnp.ones((3, 2)))
    assert batched.shape == (3, 2)
    grads = jax.grad(lambda c: jnp.sum(c(jnp.array([1.0, 2.0]))))(converted)
    assert grads.consts[0] == pytest.approx(3.0)


def test_calls_must_match_the_example():
    converted = filter_closure_convert(lambda x, n: x * n, jnp.ones(2), 3)
    assert converted(jnp.full(2, 2.0), 3).tolist() == [6.0, 6.0]
    with pytest.raises(ValueError, match=r"float32\[2\].*float32\[3\]"):
        converted(jnp.ones(3), 3)
    with pytest.raises(ValueError, match=r"non-array arguments \[3\].*\[4\]"):
        converted(jnp.ones(2), 4)
    with pytest.raises(ValueError, match="arguments of structure"):
        converted(jnp.ones(2), 3, 5)
    with pytest.raises(TypeError, match="expects a function"):
        filter_closure_convert("f")
