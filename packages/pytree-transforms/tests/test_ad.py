"""Filtered differentiation, including the Equinox paper's appendix example."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.random as jrandom
import pytest

from pytree_module import Module
from pytree_transforms import (
    apply_updates,
    filter_grad,
    filter_hessian,
    filter_jacfwd,
    filter_jacrev,
    filter_jit,
    filter_jvp,
    filter_value_and_grad,
    filter_vjp,
)


class Linear(Module):
    weight: jax.Array
    bias: jax.Array

    def __init__(self, din, dout, key):
        self.weight = jrandom.normal(key, (dout, din)) / din**0.5
        self.bias = jnp.zeros(dout)

    def __call__(self, x):
        return self.weight @ x + self.bias


class MyModule(Module):
    # Specify the module's attributes:
    layers: list  # a list of submodules
    activation: Callable  # an arbitrary Python object
    bias: jax.Array  # a parameter

    def __init__(self, key):
        key1, key2 = jrandom.split(key)
        self.layers = [Linear(2, 8, key1), Linear(8, 2, key2)]
        self.activation = jax.nn.relu
        self.bias = jnp.ones(2)

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x) + self.bias


@filter_jit
@filter_grad
def loss(model, x, y):
    pred_y = jax.vmap(model)(x)
    return jnp.mean((y - pred_y) ** 2)


def test_paper_appendix_example_and_training():
    x_key, y_key, model_key = jrandom.split(jrandom.PRNGKey(0), 3)
    x, y = jrandom.normal(x_key, (100, 2)), jrandom.normal(y_key, (100, 2))
    model = MyModule(model_key)
    grads = loss(model, x, y)
    assert isinstance(grads, MyModule)
    assert grads.layers[0].weight.shape == (8, 2)
    assert grads.activation is None  # non-differentiable leaves get None

    @filter_jit
    def step(model, x, y):
        value, grads = filter_value_and_grad(lambda m: jnp.mean((y - jax.vmap(m)(x)) ** 2))(model)
        updates = jax.tree.map(lambda g: -0.1 * g, grads)
        return value, apply_updates(model, updates)

    y = jax.vmap(lambda v: jnp.array([v[0] - v[1], 2 * v[0]]))(x)
    first, model = step(model, x, y)
    for _ in range(200):
        value, model = step(model, x, y)
    assert float(value) < 0.2 * float(first)
    assert model.activation is jax.nn.relu


def test_value_and_grad_with_non_array_aux():
    def f(params, scale):
        value = scale * jnp.sum(params["w"] ** 2)
        return value, {"label": "sq", "value": value}

    (value, aux), grads = filter_value_and_grad(f, has_aux=True)({"w": jnp.ones(2)}, 2.0)
    assert float(value) == 4.0 and aux["label"] == "sq" and float(aux["value"]) == 4.0
    assert grads["w"].tolist() == [4.0, 4.0]
    grads, aux = filter_grad(f, has_aux=True)({"w": jnp.ones(2)}, 2.0)
    assert aux["label"] == "sq"


def test_each_call_gets_its_own_aux_even_when_the_backward_pass_calls_the_function_again():
    @jax.custom_vjp
    def probe(x):
        return x

    def probe_fwd(x):
        return x, None

    def probe_bwd(_, cotangent):
        # The backward pass (eager Python here) calls the same function with another aux.
        _, inner_aux = grad_fn(jnp.array(1.0), "inner", nested=False)
        assert inner_aux == {"name": "inner"}
        return (cotangent,)

    probe.defvjp(probe_fwd, probe_bwd)

    def loss(x, name, nested):
        y = probe(x) if nested else x
        return y**2, {"name": name}

    grad_fn = filter_grad(loss, has_aux=True)
    grads, aux = grad_fn(jnp.array(3.0), "outer", nested=True)
    assert aux == {"name": "outer"} and float(grads) == 6.0


def test_arg_filter_selects_what_is_differentiated():
    params = {"a": jnp.array(1.0), "b": jnp.array(2.0)}
    grads = filter_grad(lambda p: p["a"] * p["b"], arg={"a": True, "b": False})(params)
    assert float(grads["a"]) == 2.0 and grads["b"] is None


def test_integer_and_python_leaves_get_none():
    grads = filter_grad(lambda p: p["w"] * p["n"])({"w": jnp.array(3.0), "n": jnp.array(2)})
    assert grads["n"] is None and float(grads["w"]) == 2.0


def test_grad_errors():
    with pytest.raises(TypeError, match="first argument only"):
        filter_grad(lambda x: x, argnums=1)
    with pytest.raises(TypeError, match="expects a function"):
        filter_grad(3)


def test_jvp():
    def f(x, n, label):
        return {"y": x**n, "label": label}

    out, tangent = filter_jvp(f, (jnp.array(3.0), 2, "sq"), (jnp.array(1.0), None, None))
    assert float(out["y"]) == 9.0 and out["label"] == "sq"
    assert float(tangent["y"]) == 6.0 and tangent["label"] is None
    with pytest.raises(ValueError, match="structure of `primals`"):
        filter_jvp(f, (jnp.array(3.0), 2, "sq"), (jnp.array(1.0),))


def test_jvp_none_tangent_is_a_zero_tangent_for_a_float_input():
    for y in (jnp.array(3.0), 3.0):
        out, tangent = filter_jvp(lambda x, y: x * y, (jnp.array(2.0), y), (1.0, None))
        assert float(out) == 6.0 and float(tangent) == 3.0
    # None may stand for a whole argument, arrays and all.
    params = {"w": jnp.array(2.0), "b": jnp.array(1.0)}
    out, tangent = filter_jvp(lambda p, x: p["w"] * x + p["b"], (params, 3.0), (None, 1.0))
    assert float(out) == 7.0 and float(tangent) == 2.0


def test_jvp_outputs_that_do_not_depend_on_perturbed_inputs_have_none_tangents():
    def f(x, y):
        return x * 2, y * 3, jnp.ones(2), 1.5, jax.lax.stop_gradient(x), x.astype(int)

    primals, tangents = (jnp.array(2.0), jnp.array(3.0)), (jnp.array(1.0), None)
    for jvp in (filter_jvp, jax.jit(lambda p, t: filter_jvp(f, p, t))):
        out, tangent = jvp(f, primals, tangents) if jvp is filter_jvp else jvp(primals, tangents)
        assert float(out[1]) == 9.0 and out[3] == 1.5
        assert float(tangent[0]) == 2.0
        assert tangent[1:] == (None, None, None, None, None)


def test_jvp_without_perturbed_inputs_calls_the_function_once_and_returns_none_tangents():
    calls = []

    def f(x, label):
        calls.append(x)
        return {"y": x * 2, "label": label}

    out, tangent = filter_jvp(f, (jnp.array(2.0), "l"), (None, None))
    assert float(out["y"]) == 4.0 and out["label"] == "l"
    assert tangent == {"y": None, "label": None}
    assert len(calls) == 1 and not isinstance(calls[0], jax.core.Tracer)


def test_jvp_keyword_arguments_are_not_differentiated():
    out, tangent = filter_jvp(lambda x, *, k: x * k, (jnp.array(2.0),), (1.0,), k=jnp.array(3.0))
    assert float(out) == 6.0 and float(tangent) == 3.0


def test_jvp_errors_name_the_tangent():
    # A tangent where the primal cannot have one is a TypeError, as from `jax.jvp`.
    with pytest.raises(TypeError, match=r"tangents\[1\]\['n'\] is a tangent, but the primal"):
        filter_jvp(lambda x, d: x, (1.0, {"n": jnp.array(2)}), (1.0, {"n": jnp.array(1.0)}))
    with pytest.raises(TypeError, match=r"tangents\[1\] is a tangent, but the primal there is a"):
        filter_jvp(lambda x, o: x, (1.0, object()), (1.0, object()))
    with pytest.raises(ValueError, match=r"tangents\[0\] has shape \(3,\), but its primal"):
        filter_jvp(lambda x: x, (jnp.ones(2),), (jnp.ones(3),))
    with pytest.raises(TypeError, match="as tuples"):
        filter_jvp(lambda x: x, jnp.ones(2), jnp.ones(2))


def test_vjp_with_aux():
    out, vjp_fn, aux = filter_vjp(lambda x: ((x * 3, "tag"), "aux"), jnp.ones(2), has_aux=True)
    assert out[1] == "tag" and aux == "aux"
    (grad,) = vjp_fn((jnp.ones(2), None))
    assert grad.tolist() == [3.0, 3.0]


def test_jacobians_and_hessian():
    params = {"w": jnp.array([1.0, 2.0]), "name": "w"}
    for jac in (filter_jacfwd, filter_jacrev):
        j = jac(lambda p: p["w"] ** 2)(params)
        assert j["w"].tolist() == [[2.0, 0.0], [0.0, 4.0]] and j["name"] is None
    h = filter_hessian(lambda p: jnp.sum(p["w"] ** 3))(params)
    assert h["w"]["w"].tolist() == [[6.0, 0.0], [0.0, 12.0]]
