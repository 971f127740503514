"""`sow` inside `scan` (Flax NNX's pattern for per-layer intermediates): each step's record is
stacked along the axis in_axes gives `Intermediate`, and the model gets it."""

import jax.numpy as jnp
import numpy as np

import pytree_graph as pg
import pytree_nn as pn
from pytree_graph import Carry, Intermediate, Param, StateAxes


class Stack(pn.Module):
    def __init__(self, layers: int):
        self.w = Param(jnp.arange(layers * 2.0).reshape(layers, 2) + 1)

    @pg.scan(in_axes=(StateAxes({(Param, Intermediate): 0, ...: Carry}), Carry))
    def __call__(self, x):
        x = x * self.w.value
        self.sow(Intermediate, "hidden", x)
        return x, None


def test_each_step_sows_one_record_stacked_by_layer():
    model = Stack(3)
    y, _ = model(jnp.ones(2))
    (hidden,) = pg.pop(model, Intermediate)["hidden"].value  # one sow per step
    np.testing.assert_allclose(hidden, [[1.0, 2.0], [3.0, 8.0], [15.0, 48.0]])
    np.testing.assert_allclose(y, hidden[-1])
    assert not hasattr(model, "hidden")  # popped: the next call records afresh
    model(jnp.ones(2))
    assert model.hidden.value[0].shape == (3, 2)


def test_under_jit_too():
    model = Stack(4)

    @pg.jit
    def forward(model, x):
        return model(x)[0]

    forward(model, jnp.ones(2))
    assert model.hidden.value[0].shape == (4, 2)
