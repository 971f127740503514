"""Errors JAX raises inside `pytree_graph.jit` name the user's function and the argument
paths of the values involved, not the transform's internals."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_module import Module


class Layer(Module):
    def __init__(self):
        self.kernel = Param(jnp.ones(3))


class Model(Module):
    def __init__(self):
        self.layers = [Layer(), Layer()]


def positive(model, x):
    if model.layers[1].kernel.value.sum() > 0:  # Python control flow on a traced value
        return x
    return -x


def test_a_concretization_error_names_the_function_and_the_argument_path():
    with pytest.raises(jax.errors.TracerBoolConversionError) as caught:
        pg.jit(positive)(Model(), jnp.ones(3))
    message = str(caught.value)
    assert "while tracing the function positive at " in message
    assert "test_error_names.py" in message
    assert "depends on the value of the argument model.layers[1].kernel." in message
    assert "pure" not in message and "values[" not in message


def test_the_names_follow_the_call_on_a_repeat_and_with_donation():
    f = pg.jit(positive)
    model = Model()
    with pytest.raises(jax.errors.TracerBoolConversionError, match=r"argument model\.layers\[1\]"):
        f(model, jnp.ones(3))

    def by_input(model, x):
        return x if x.sum() > 0 else -x

    with pytest.raises(jax.errors.TracerBoolConversionError, match=r"of the argument x\."):
        pg.jit(by_input)(model, jnp.ones(3))
    with pytest.raises(jax.errors.TracerBoolConversionError, match=r"of the argument x\."):
        pg.jit(by_input, donate_argnums=1)(model, jnp.ones(3))


def test_a_method_names_self():
    class Gate(Module):
        def __init__(self):
            self.w = Param(jnp.ones(2))

        @pg.jit
        def __call__(self, x):
            return x if self.w.value[0] > 0 else -x

    with pytest.raises(jax.errors.TracerBoolConversionError, match=r"of the argument self\.w\."):
        Gate()(jnp.ones(2))
