"""filter_make_jaxpr, filter_eval_shape and apply_updates."""

import jax
import jax.numpy as jnp
import pytest

from pytree_transforms import apply_updates, filter_eval_shape, filter_make_jaxpr


def test_make_jaxpr_with_static_inputs_and_outputs():
    jaxpr, shapes, static = filter_make_jaxpr(lambda x, n, s: (x * n, s))(jnp.ones(3), 2, "t")
    assert "mul" in str(jaxpr)
    assert shapes == (jax.ShapeDtypeStruct((3,), jnp.float32), None)
    assert static == (None, "t")


def test_eval_shape_computes_nothing():
    calls = []

    def f(x, name):
        calls.append(type(x))
        return {"y": x @ x.T, "name": name}

    out = filter_eval_shape(f, jax.ShapeDtypeStruct((4, 2), jnp.float32), "n")
    assert out == {"name": "n", "y": jax.ShapeDtypeStruct((4, 4), jnp.float32)}
    assert issubclass(calls[0], jax.core.Tracer)


def test_apply_updates():
    model = {"w": jnp.ones(2), "act": "relu"}
    assert apply_updates(model, {"w": jnp.ones(2), "act": None})["w"].tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="structure of `model`"):
        apply_updates(model, {"w": jnp.ones(2)})
