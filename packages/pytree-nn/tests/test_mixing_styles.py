"""Mixing the graph style and the functional style never silently does nothing.

- A filtered transform of a layer's bound method (`__call__` included) gets the layer as an
  input: later writes to its Variables are seen.
- A Variable write to an input inside a filtered transform (an `Optimizer.update`, a
  BatchNorm statistic, a Dropout stream advancing) comes back through the output, or is
  refused with an error naming it and the fix.
- `Optimizer.update` says the model comes first, and reads `filter_grad`'s gradient tree.
"""

import jax
import jax.numpy as jnp
import optax
import pytest

import pytree_graph as pg
from pytree_graph import Param, Variable
from pytree_nn import BatchNorm, Dropout, Linear, Module, Optimizer, Rngs
from pytree_transforms import filter_grad, filter_jit, filter_value_and_grad, filter_vmap


class Count(Variable):
    pass


class Net(Module):
    def __init__(self, rngs):
        self.linear = Linear(3, 2, rngs=rngs)
        self.norm = BatchNorm(2, rngs=rngs)
        self.drop = Dropout(0.5, rngs=rngs)
        self.calls = Count(jnp.array(0))

    def __call__(self, x):
        return self.drop(self.norm(self.linear(x)))

    def loss(self, x):
        return jnp.sum(self.linear(x) ** 2)


class Scorer(Module):
    def __init__(self, rngs):
        self.linear = Linear(3, 2, rngs=rngs)

    def __call__(self, x):
        return jnp.sum(jnp.tanh(self.linear(x)))

    def loss(self, x):
        return jnp.sum(self.linear(x) ** 2)


def test_filter_jit_of_a_layers_call_sees_new_weights():
    layer = Linear(2, 2, rngs=Rngs(0))
    f = filter_jit(layer.__call__)
    f(jnp.ones(2))
    layer.kernel.value = layer.kernel.value * 0
    assert jnp.allclose(f(jnp.ones(2)), layer.bias.value)


@pytest.mark.parametrize(
    "transform",
    [filter_grad, filter_value_and_grad, lambda f: filter_vmap(f, in_axes=None, axis_size=2)],
    ids=["filter_grad", "filter_value_and_grad", "filter_vmap"],
)
@pytest.mark.parametrize("method", ["__call__", "loss"])
def test_jit_of_a_transformed_layer_method_sees_new_weights(transform, method):
    model = Scorer(Rngs(0))
    f = filter_jit(transform(getattr(model, method)))
    x = jnp.ones((4, 3))
    before = f(x)
    model.linear.kernel.value = model.linear.kernel.value * 2
    expected = transform(getattr(model, method))(x)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.allclose(a, b)), f(x), expected))
    assert not jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.allclose(a, b)), before, expected))


def _train_step(model, optimizer, x):
    grads = pg.grad(lambda m: m.loss(x))(model)
    optimizer.update(model, grads)


def test_optimizer_update_inside_filter_jit_is_refused_unless_returned():
    model = Net(Rngs(0))
    optimizer = Optimizer(model, optax.sgd(0.1), wrt=Param)
    kernel = model.linear.kernel.value
    with pytest.raises(ValueError) as info:
        filter_jit(_train_step)(model, optimizer, jnp.ones((4, 3)))
    message = str(info.value)
    assert "`model.linear.kernel.value`" in message and "`optimizer" in message
    assert "pytree_graph.jit" in message and "return `model` and `optimizer`" in message
    assert optimizer.step.value == 0 and jnp.array_equal(model.linear.kernel.value, kernel)

    @filter_jit
    def returned(model, optimizer, x):
        _train_step(model, optimizer, x)
        return model, optimizer

    new_model, new_optimizer = returned(model, optimizer, jnp.ones((4, 3)))
    assert new_optimizer.step.value == 1 and new_optimizer.model is new_model
    assert not jnp.allclose(new_model.linear.kernel.value, kernel)
    # The graph style carries the same write out in place.
    pg.jit(_train_step)(model, optimizer, jnp.ones((4, 3)))
    assert optimizer.step.value == 1
    assert jnp.allclose(model.linear.kernel.value, new_model.linear.kernel.value)


def test_batchnorm_and_dropout_state_updates_are_refused_unless_returned():
    model = Net(Rngs(0))
    x = jnp.ones((4, 3))

    def loss(model, x):
        return jnp.sum(model(x))

    with pytest.raises(ValueError, match=r"`model\.drop\.rngs.*`model\.norm\.mean\.value`"):
        filter_jit(loss)(model, x)
    with pytest.raises(ValueError, match=r"filter_grad: .*`model\.norm\.mean\.value`"):
        filter_grad(loss)(model, x)

    def count(model, x):
        model.calls.value = model.calls.value + 1
        return x

    with pytest.raises(ValueError, match=r"filter_vmap: .*`model\.calls\.value`"):
        filter_vmap(count, in_axes=(None, 0))(model, x)


def test_the_functional_recipe_returns_the_written_model():
    model = Net(Rngs(0))
    x = jnp.arange(12.0).reshape(4, 3)

    @filter_jit
    def step(model, x):
        def loss(model):
            return jnp.sum(model(x)), model

        (value, model), grads = filter_value_and_grad(loss, has_aux=True)(model)
        return value, model, grads

    _, new, grads = step(model, x)
    assert not jnp.allclose(new.norm.mean.value, model.norm.mean.value)
    assert int(new.drop.rngs.default.count.value) == int(model.drop.rngs.default.count.value) + 1
    assert grads.linear.kernel.value.shape == (3, 2)


def test_optimizer_update_says_the_model_comes_first():
    model = Linear(2, 2, rngs=Rngs(0))
    optimizer = Optimizer(model, optax.sgd(0.1), wrt=Param)
    grads = pg.grad(lambda m: jnp.sum(m(jnp.ones(2))))(model)
    with pytest.raises(TypeError, match=r"model first.*`optimizer\.update\(model, grads\)`.*State"):
        optimizer.update(grads)
    with pytest.raises(TypeError, match=r"model first.*passed second"):
        optimizer.update(grads, model)
    with pytest.raises(TypeError, match=r"got int 5.*`optimizer\.update\(model, grads\)`"):
        optimizer.update(model, 5)
    assert optimizer.step.value == 0


def test_optimizer_update_reads_filter_grads_gradient_tree():
    model = Net(Rngs(0)).eval()
    twin = pg.clone(model)
    x = jnp.ones((4, 3))
    optimizer = Optimizer(model, optax.adam(0.1), wrt=Param)
    twin_optimizer = Optimizer(twin, optax.adam(0.1), wrt=Param)
    for _ in range(3):
        optimizer.update(model, filter_grad(lambda m: m.loss(x))(model))
        twin_optimizer.update(twin, pg.grad(lambda m: m.loss(x))(twin))
    assert optimizer.step.value == 3
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(twin), strict=True):
        assert jnp.allclose(a, b)
