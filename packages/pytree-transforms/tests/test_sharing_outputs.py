"""Every filtered transform keeps the sharing of what it returns (outputs, aux, gradients,
tangents), whatever the filter: one object at several places comes back one object."""

import functools

import jax
import jax.numpy as jnp
import pytest

from pytree_filter import OfType
from pytree_module import Module
from pytree_transforms import (
    filter_checkpoint,
    filter_custom_jvp,
    filter_custom_vjp,
    filter_eval_shape,
    filter_grad,
    filter_jit,
    filter_make_jaxpr,
    filter_shard,
    filter_value_and_grad,
    filter_vjp,
    filter_vmap,
)


class Cell(Module):
    """A holder of one array: a tied weight, without pytree_graph."""

    def __init__(self, value):
        self.value = value


class Block(Module):
    def __init__(self, cell):
        self.cell = cell


class Tied(Module):
    """A layer used twice (`first`, `again`) and a weight held at two places."""

    def __init__(self, key=None, weight=None):
        key = jax.random.key(0) if key is None else key
        self.first = Block(Cell(jax.random.normal(key, (2, 2))))
        self.again = self.first
        self.enc = Cell(jnp.arange(4.0).reshape(2, 2) / 4 if weight is None else weight)
        self.dec = self.enc
        self.bias = jnp.ones(2)

    def __call__(self, x):
        h = jnp.tanh(x @ self.first.cell.value) @ self.again.cell.value
        return jnp.sum((h @ self.enc.value + self.bias) @ self.dec.value.T)


def assert_tied(model):
    assert model.again is model.first
    assert model.dec is model.enc


X = jnp.array([1.0, -2.0])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "filter_jit"])
def test_value_and_grad_returns_the_model_as_aux_with_its_ties(jit):
    def step(model, x):
        return filter_value_and_grad(lambda m, x: (m(x), m), has_aux=True)(model, x)

    step = filter_jit(step) if jit else step
    (value, aux), grads = step(Tied(), X)
    assert value == pytest.approx(Tied()(X))
    assert_tied(aux)
    assert_tied(grads)
    (grads_again, aux_again) = filter_grad(lambda m, x: (m(x), m), has_aux=True)(Tied(), X)
    assert_tied(aux_again)
    assert_tied(grads_again)


def test_a_filter_that_stops_at_the_shared_object_gives_one_summed_gradient():
    model = Tied()
    by_type = filter_grad(lambda m, x: m(x), arg=OfType(Cell))(model, X)
    default = filter_grad(lambda m, x: m(x))(model, X)
    assert_tied(by_type)
    assert by_type.bias is None  # not a Cell: not differentiated
    for path in (lambda g: g.enc, lambda g: g.first.cell):
        assert jnp.allclose(path(by_type).value, path(default).value)
    # The sum of both uses, as plain JAX gives it for the one weight.
    of_weight = jax.grad(
        lambda w: jnp.sum(
            (jnp.tanh(X @ model.first.cell.value) @ model.first.cell.value @ w + 1.0) @ w.T
        )
    )(model.enc.value)
    assert jnp.allclose(by_type.enc.value, of_weight)


def test_filter_vmap_keeps_sharing_in_and_out():
    seen = []

    def apply(model, x):
        seen.append(model.again is model.first and model.dec is model.enc)
        return model(x), model

    values, out = filter_vmap(apply, in_axes=(None, 0))(Tied(), jnp.ones((3, 2)))
    assert seen == [True]
    assert values.shape == (3,)
    assert_tied(out)
    ensemble = filter_vmap(Tied)(jax.random.split(jax.random.key(1), 3))
    assert_tied(ensemble)
    assert ensemble.enc.value.shape == (3, 2, 2)


def test_filter_vmap_refuses_two_axes_for_one_shared_object():
    cell = Cell(jnp.ones((3, 3)))
    with pytest.raises(ValueError, match=r"`a\.value` and `b\.value`.*same axis"):
        filter_vmap(lambda a, b: a.value + b.value, in_axes=(0, 1))(cell, cell)
    # The same axis at both places is one mapped object.
    out = filter_vmap(lambda a, b: (a, b), in_axes=(0, 0))(cell, cell)
    assert out[0] is out[1]


def test_filter_vjp_keeps_sharing_of_output_aux_and_cotangents():
    model = Tied()
    out, vjp_fn, aux = filter_vjp(lambda m: ((m, m), m), model, has_aux=True)
    assert out[0] is out[1]
    assert_tied(out[0])
    assert_tied(aux)
    # A shared object has one cotangent: a gradient of the output keeps it one object...
    cotangent = filter_grad(lambda o: o[0].enc.value.sum() * 2 + o[1].dec.value.sum())(out)
    assert cotangent[0].dec is cotangent[0].enc
    (grads,) = vjp_fn(cotangent)
    assert_tied(grads)
    assert jnp.allclose(grads.enc.value, 3.0)
    # ...and one made place by place counts once too.
    (grads,) = vjp_fn(jax.tree.map(jnp.ones_like, out))
    assert jnp.allclose(grads.enc.value, 1.0)
    assert jnp.allclose(grads.first.cell.value, 1.0)


def test_eval_shape_make_jaxpr_and_checkpoint_keep_sharing():
    model = Tied()
    assert_tied(filter_eval_shape(lambda m: m, model))
    _, shapes, static = filter_make_jaxpr(lambda m: m)(model)
    assert_tied(shapes)
    assert_tied(static)
    assert_tied(filter_checkpoint(lambda m: m)(model))
    grads = jax.grad(lambda w: filter_checkpoint(lambda m: m(X))(Tied(weight=w)))(model.enc.value)
    expected = filter_grad(lambda m: m(X))(model).enc.value
    assert jnp.allclose(grads, expected)


def test_filter_shard_keeps_sharing_outside_and_inside_jit():
    model = Tied()
    sharing = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    assert_tied(filter_shard(model, sharing))
    assert_tied(filter_jit(lambda m: filter_shard(m, sharing))(model))


def test_custom_rules_keep_sharing_and_count_a_shared_object_once():
    @filter_custom_jvp
    def identity(m):
        return m

    @identity.defjvp
    def identity_jvp(primals, tangents):
        assert primals[0].dec is primals[0].enc
        return identity(primals[0]), tangents[0]

    @filter_custom_vjp
    def same(m):
        return m

    same.defvjp(
        lambda m: (m, None), lambda residuals, grad_obj, m: jax.tree.map(lambda g: g, grad_obj)
    )

    def use(f, w):
        m = f(Tied(weight=w))
        assert_tied(m)
        return jnp.sum(m.enc.value) * 2 + jnp.sum(m.dec.value)

    w = jnp.ones((2, 2))
    for f in (identity, same):
        assert jnp.allclose(jax.grad(functools.partial(use, f))(w), 3.0)
    _, tangent = jax.jvp(lambda w: use(identity, w), (w,), (jnp.ones((2, 2)),))
    assert tangent == pytest.approx(12.0)


def test_has_aux_must_be_a_bool():
    for transform in (filter_grad, filter_value_and_grad):
        with pytest.raises(TypeError, match=r"has_aux=\.\.\.\) takes True or False, got 'yes'"):
            transform(lambda x: x, has_aux="yes")
        with pytest.raises(TypeError, match="has_aux"):
            transform(has_aux="yes")  # as a decorator


def test_a_vmap_size_mismatch_names_the_arguments():
    with pytest.raises(ValueError, match=r"size 3: `x` .*size 4: `y` ") as info:
        filter_vmap(lambda x, y: x + y)(jnp.ones(3), jnp.ones(4))
    assert "mapped_leaves" not in str(info.value)
    with pytest.raises(ValueError, match=r"`args\[0\]\['w'\]`"):
        filter_vmap(lambda a, *args: a)(jnp.ones(3), {"w": jnp.ones(4)})
    with pytest.raises(ValueError, match=r"`axis_size=4`.*`a`|`a`.*`axis_size=4`"):
        filter_vmap(lambda a: a, axis_size=4)(jnp.ones(3))
