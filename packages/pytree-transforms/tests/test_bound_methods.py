"""A transform of a bound method gets its Module as an input, special methods included.

Python binds `model.__call__` itself (a `types.MethodType`, a leaf for JAX), so without care
`filter_jit(model.__call__)` would compile the model's arrays in as constants and keep
returning the old output after the model changes.
"""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module
from pytree_transforms import (
    filter_checkpoint,
    filter_eval_shape,
    filter_grad,
    filter_jit,
    filter_value_and_grad,
    filter_vjp,
    filter_vmap,
)
from pytree_transforms.debug import assert_max_traces


class Scale(Module):
    """A mutable Module with an array, a method and a `__call__`."""

    def __init__(self):
        self.w = jnp.ones(2)

    def __call__(self, x):
        return jnp.sum(self.w * x)

    def apply(self, x):
        return jnp.sum(self.w * x)


class Graph(Module, pytree=False):
    def __init__(self):
        self.w = jnp.ones(2)

    def __call__(self, x):
        return self.w * x


def _methods(model):
    return {"__call__": model.__call__, "apply": model.apply}


@pytest.mark.parametrize("name", ["__call__", "apply"])
def test_filter_jit_of_a_bound_method_sees_later_writes(name):
    model = Scale()
    f = filter_jit(_methods(model)[name])
    assert f(jnp.ones(2)) == 2.0
    model.w = model.w * 3
    assert f(jnp.ones(2)) == 6.0


def test_filter_jit_of_call_traces_the_model_once():
    model = Scale()
    calls = filter_jit(assert_max_traces(lambda m, x: m.__call__(x), max_traces=1))
    method = filter_jit(model.__call__)
    for scale in (1.0, 2.0, 3.0):
        model.w = jnp.full(2, scale)
        assert method(jnp.ones(2)) == calls(model, jnp.ones(2)) == 2 * scale
    # The same method made again compares equal, and shares the compilations.
    assert filter_jit(model.__call__) == method
    assert hash(filter_jit(model.__call__)) == hash(method)


@pytest.mark.parametrize("name", ["__call__", "apply"])
@pytest.mark.parametrize(
    "transform",
    [
        lambda f: filter_grad(f),
        lambda f: filter_value_and_grad(f),
        lambda f: filter_vmap(f, in_axes=None, axis_size=2),
    ],
    ids=["filter_grad", "filter_value_and_grad", "filter_vmap"],
)
def test_jit_of_a_transformed_bound_method_sees_later_writes(name, transform):
    model = Scale()
    f = filter_jit(transform(_methods(model)[name]))
    before = f(jnp.ones(2))
    model.w = model.w * 3
    after = f(jnp.ones(2))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.allclose(3 * a, b)), before, after))


@pytest.mark.parametrize("name", ["__call__", "apply"])
def test_eager_transforms_of_a_bound_method_read_the_model_now(name):
    model = Scale()
    method = _methods(model)[name]
    grad = filter_grad(method)
    vmapped = filter_vmap(method)
    checkpointed = filter_checkpoint(method)
    model.w = model.w * 3
    assert jnp.allclose(grad(jnp.ones(2)), 3.0)
    assert jnp.allclose(vmapped(jnp.ones((4, 2))), 6.0)
    assert checkpointed(jnp.ones(2)) == 6.0
    out, vjp_fn = filter_vjp(method, jnp.ones(2))
    assert out == 6.0 and jnp.allclose(vjp_fn(jnp.array(1.0))[0], 3.0)
    assert filter_eval_shape(method, jnp.ones(2)).shape == ()


def test_transform_of_a_graph_modules_call_is_refused():
    model = Graph()
    with pytest.raises(TypeError, match=r"pytree=False.*pytree_graph"):
        filter_jit(model.__call__)(jnp.ones(2))
