"""`vjp` and `jvp` as decorators (as Flax NNX's): with no function, a decorator; with a
function and no primals, the function of the primals. Graph mode keeps a tied model's
tie; tree mode refuses it."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import Param, Variable
from pytree_module import Module


class Linear(Module):
    def __init__(self, w=None):
        self.w = Param(jnp.full((2, 2), 2.0)) if w is None else w
        self.calls = Variable(jnp.array(0))

    def __call__(self, x):
        self.calls.value += 1
        return (x @ self.w.value).sum()


class Tied(Module):
    def __init__(self):
        shared = Param(jnp.full((2, 2), 2.0))
        self.a = Linear(shared)
        self.b = Linear(shared)

    def __call__(self, x):
        return self.a(x) + self.b(x)


def loss(model, x):
    return model(x)


@pytest.mark.parametrize("graph", [True, False])
def test_vjp_of_a_function_is_the_function_of_the_primals(graph):
    model, x = Linear(), jnp.ones((1, 2))
    out, vjp_fn = pg.vjp(loss, graph=graph)(model, x)
    expected_out, expected_fn = pg.vjp(loss, Linear(), x, graph=graph)
    assert float(out) == float(expected_out) == 8.0
    grads, x_grad = vjp_fn(jnp.array(1.0))
    assert jnp.allclose(x_grad, expected_fn(jnp.array(1.0))[1])
    w_grad = grads["w"].value if graph else grads.w.value
    assert w_grad.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert int(model.calls.value) == 1  # the write inside is written back


def test_vjp_decorator_with_has_aux_and_a_tied_model():
    @pg.vjp(has_aux=True)
    def tied_loss(model, x):
        return model(x), model.a.calls.value

    model = Tied()
    out, vjp_fn, aux = tied_loss(model, jnp.ones((1, 2)))
    assert float(out) == 16.0 and int(aux) == 1
    (grads, _) = vjp_fn(jnp.array(1.0))
    # One Param, reached twice: one gradient, the sum of both uses.
    assert grads["a"]["w"].value.tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert model.a.w is model.b.w
    with pytest.raises(ValueError, match="Duplicate"):
        pg.vjp(graph=False)(loss)(model, jnp.ones((1, 2)))


@pytest.mark.parametrize("graph", [True, False])
def test_jvp_of_a_function_is_the_function_of_primals_and_tangents(graph):
    model, x = Linear(), jnp.ones((1, 2))
    tangent = jax.tree.map(jnp.ones_like, pg.state(model, Param) if graph else model)
    if not graph:
        tangent.calls.value = jnp.zeros((), jax.dtypes.float0)
    out, tangent_out = pg.jvp(loss, graph=graph)((model, x), (tangent, jnp.zeros_like(x)))
    assert float(out) == 8.0 and float(tangent_out) == 4.0
    decorated = pg.jvp(has_aux=True, graph=graph)(lambda m, x: (loss(m, x), "aux"))
    assert decorated((model, x), (tangent, jnp.zeros_like(x)))[2] == "aux"


def test_jvp_decorator_on_a_tied_model():
    model = Tied()
    dw = jax.tree.map(jnp.ones_like, pg.state(model, Param))
    out, tangent_out = pg.jvp()(loss)((model, jnp.ones((1, 2))), (dw, None))
    assert float(out) == 16.0 and float(tangent_out) == 8.0
    assert int(model.b.calls.value) == 1


def test_decorator_forms_refuse_bad_calls_clearly():
    with pytest.raises(TypeError, match="vjp expects a function"):
        pg.vjp(3)
    with pytest.raises(TypeError, match="jvp expects a function"):
        pg.jvp(3)
    with pytest.raises(TypeError, match=r"vjp\(loss\) takes the primals"):
        pg.vjp(loss)()
    with pytest.raises(TypeError, match="jvp: tangents missing"):
        pg.jvp(loss, (Linear(), jnp.ones((1, 2))))
    with pytest.raises(TypeError, match="jvp: tangents missing"):
        pg.jvp(loss)((Linear(), jnp.ones((1, 2))))
    with pytest.raises(TypeError, match="no function"):
        pg.jvp(None, (1.0,), (1.0,))
