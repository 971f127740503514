"""`capture`: what a model sows and perturbs, returned, with the model left as it was."""

import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Intermediate, Perturbation
from pytree_nn import Linear, Module, Rngs, capture


class Block(Module):
    def __init__(self, rngs):
        self.linear = Linear(2, 2, rngs=rngs)

    def __call__(self, x):
        h = self.linear(x)
        self.sow(Intermediate, "features", h)
        return self.perturb("grad_of_h", h)


class Model(Module):
    def __init__(self, rngs):
        self.blocks = [Block(rngs), Block(rngs)]
        self.head = Linear(2, 1, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        self.sow(Intermediate, "last", x)
        return self.head(x).sum()


def test_records_by_path_and_model_unchanged():
    model = Model(Rngs(0))
    before = sorted(pg.state(model).flat_state())
    y, intermediates = capture(model, Intermediate)(jnp.ones(2))
    assert sorted(intermediates.flat_state()) == [
        ("blocks", 0, "features"),
        ("blocks", 1, "features"),
        ("last",),
    ]
    assert sorted(pg.state(model).flat_state()) == before  # nothing left behind
    assert np.isclose(y, model(jnp.ones(2)))  # perturbations outside capture are zeros


def test_types_not_captured_are_not_recorded_and_not_perturbed():
    model = Model(Rngs(0))
    result = capture(model)(jnp.ones(2))  # no types: the result alone
    assert np.isclose(result, Model(Rngs(0))(jnp.ones(2)))
    _, perturbations = capture(model, Perturbation)(jnp.ones(2))
    expected = [("blocks", 0, "grad_of_h"), ("blocks", 1, "grad_of_h")]
    assert sorted(perturbations.flat_state()) == expected
    assert all(float(jnp.abs(v.value).sum()) == 0 for v in perturbations.flat_state().values())


def test_gradients_of_intermediate_values_through_init():
    model = Model(Rngs(0))
    x = jnp.ones(2)
    _, perturbations = capture(model, Perturbation)(x)

    def loss(model, perturbations, x):
        return capture(model, Intermediate, init=perturbations)(x)

    grads, sowed = pg.grad(loss, argnums=1, has_aux=True)(model, perturbations, x)
    # d loss / d (second block's output) is the head's kernel, summed over outputs
    expected = model.head.kernel.value.sum(axis=-1)
    np.testing.assert_allclose(grads["blocks"][1]["grad_of_h"].value, expected, rtol=1e-6)
    assert sorted(sowed.flat_state())[0] == ("blocks", 0, "features")


def test_records_made_before_are_kept_apart_and_put_back():
    model = Model(Rngs(0))
    model(jnp.ones(2))  # an ordinary call sows as attributes
    old = model.blocks[0].features
    _, intermediates = capture(model, Intermediate)(jnp.zeros(2))
    assert len(intermediates["blocks"][0]["features"].value) == 1  # only this call's
    assert model.blocks[0].features is old and len(old.value) == 1


def test_inside_and_around_graph_transforms():
    model = Model(Rngs(0))
    x = jnp.ones(2)
    _, eager = capture(model, Intermediate)(x)
    _, around = capture(pg.jit(lambda m, x: m(x)), Intermediate)(model, x)
    _, inside = pg.jit(lambda m, x: capture(m, Intermediate)(x))(model, x)
    for state in (around, inside):
        np.testing.assert_allclose(state["last"].value[0], eager["last"].value[0], rtol=1e-6)
    assert "last" not in vars(model)


def test_tied_model_stays_tied():
    class Tied(Module):
        def __init__(self):
            self.shared = Block(Rngs(0))
            self.again = self.shared

        def __call__(self, x):
            return self.again(self.shared(x)).sum()

    model = Tied()
    _, intermediates = capture(model, Intermediate)(jnp.ones(2))
    # one Module reached twice: its records are one Variable, two calls long
    (records,) = intermediates.flat_state().values()
    assert len(records.value) == 2
    assert model.shared is model.again and "features" not in vars(model.shared)


def test_bound_methods_decorator_form_and_method_outputs():
    model = Model(Rngs(0))
    _, from_method = capture(model.__call__, Intermediate)(jnp.ones(2))
    assert ("last",) in from_method.flat_state()
    forward = capture(Intermediate)(lambda m, x: m(x))
    _, decorated = forward(model, jnp.ones(2))
    assert ("last",) in decorated.flat_state()
    _, outputs = capture(model, Intermediate, method_outputs=Intermediate)(jnp.ones(2))
    paths = set(outputs.flat_state())
    assert ("__call__",) in paths and ("blocks", 0, "__call__") in paths
    assert "__call__" not in vars(model) and type(model).__call__ is Model.__call__


def test_an_error_inside_leaves_the_model_as_it_was():
    class Failing(Module):
        def __call__(self, x):
            self.sow(Intermediate, "seen", x)
            raise RuntimeError("boom")

    model = Failing()
    with pytest.raises(RuntimeError, match="boom"):
        capture(model, Intermediate)(jnp.ones(2))
    assert "seen" not in vars(model)


def test_bad_arguments():
    model = Model(Rngs(0))
    with pytest.raises(TypeError, match="the types to capture are Variable types"):
        capture(model, int)
    with pytest.raises(TypeError, match="init must be a State"):
        capture(model, Intermediate, init={"a": 1})
    with pytest.raises(TypeError, match="takes the model as its first argument"):
        capture(lambda: None, Intermediate)()
    with pytest.raises(TypeError, match="method_outputs must be a Variable type"):
        capture(model, method_outputs=str)


def test_sow_says_whether_it_recorded():
    model = Model(Rngs(0))
    assert model.sow(Intermediate, "x", 1.0) is True

    def inner(model):
        return model.sow(Intermediate, "y", 1.0), model.sow(Perturbation, "z", 1.0)

    (sowed, skipped), _ = capture(inner, Intermediate)(model)
    assert sowed is True and skipped is False
