"""A write to an input inside a filtered transform reaches the caller through the output,
or is refused with an error naming it: it is never silently dropped."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, register_data_type
from pytree_transforms import (
    filter_checkpoint,
    filter_custom_jvp,
    filter_custom_vjp,
    filter_eval_shape,
    filter_grad,
    filter_jacrev,
    filter_jit,
    filter_jvp,
    filter_make_jaxpr,
    filter_pmap,
    filter_value_and_grad,
    filter_vjp,
    filter_vmap,
)
from pytree_transforms.debug import assert_max_traces


@jax.tree_util.register_pytree_with_keys_class
class Cell:
    """A mutable box with one child, as a Variable is (without pytree_graph)."""

    def __init__(self, value):
        self.value = value

    def tree_flatten_with_keys(self):
        return ((jax.tree_util.GetAttrKey("value"), self.value),), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(children[0])


register_data_type(Cell)


class Model(Module):
    def __init__(self):
        self.w = jnp.ones(2)
        self.count = Cell(jnp.array(0))

    def bump(self, x):
        self.count.value = self.count.value + 1
        return jnp.sum(self.w * x)


def _bump(model, x):
    model.count.value = model.count.value + 1
    return jnp.sum(model.w * x)


def test_filter_jit_refuses_a_dropped_write_and_names_it():
    model = Model()
    with pytest.raises(ValueError) as info:
        filter_jit(_bump)(model, jnp.ones(2))
    message = str(info.value)
    assert "`model.count.value`" in message
    assert "pytree_graph.jit" in message
    assert "return `model`" in message
    # Nothing of the caller's changed, and a correct call of the same function works.
    assert model.count.value == 0

    @filter_jit
    def returned(model, x):
        return _bump(model, x), model

    out, new = returned(model, jnp.ones(2))
    assert out == 2.0 and new.count.value == 1 and model.count.value == 0


def test_filter_jit_names_each_kind_of_write():
    model = Model()

    def assign(model, x):
        model.w = model.w + x
        return x

    def add_attribute(model, x):
        model.extra = x
        return x

    def append(items, x):
        items.append(x)
        return x

    with pytest.raises(ValueError, match=r"`model\.w`"):
        filter_jit(assign)(model, jnp.ones(2))
    with pytest.raises(ValueError, match=r"`model` \(an attribute assigned or removed"):
        filter_jit(add_attribute)(model, jnp.ones(2))
    with pytest.raises(ValueError, match=r"`items` \(an attribute assigned or removed"):
        filter_jit(append)([jnp.ones(2)], jnp.ones(2))
    assert not hasattr(model, "extra") and jnp.all(model.w == 1)


def test_writes_to_the_bound_module_are_named_after_self():
    model = Model()
    with pytest.raises(ValueError, match=r"`self\.count\.value`.*return `self`"):
        filter_jit(model.bump)(jnp.ones(2))


def test_a_shared_object_written_is_named_once():
    model = Model()
    with pytest.raises(ValueError) as info:
        filter_jit(lambda a, b, x: _bump(a, x))(model, model.count, jnp.ones(2))
    assert "`a.count.value`" in str(info.value) and "`b" not in str(info.value)


def test_objects_made_inside_and_reads_are_not_writes():
    model = Model()

    @filter_jit
    @assert_max_traces(max_traces=1)
    def made_inside(model, x):
        local = Model()
        local.count.value = local.count.value + 1
        local.w = model.w * x
        return jnp.sum(local.w) + model.count.value

    assert made_inside(model, jnp.ones(2)) == 2.0
    assert made_inside(model, jnp.ones(2)) == 2.0


def test_a_write_returned_inside_another_object_comes_back():
    model = Model()

    @filter_jit
    def step(model, x):
        _bump(model, x)
        return {"state": [model.count]}

    assert step(model, jnp.ones(2))["state"][0].value == 1


def test_filter_grad_and_value_and_grad_point_to_the_aux_output():
    model = Model()
    with pytest.raises(ValueError, match=r"filter_grad: .*`model\.count\.value`.*has_aux=True"):
        filter_grad(_bump)(model, jnp.ones(2))
    with pytest.raises(ValueError, match=r"pytree_graph\.value_and_grad"):
        filter_value_and_grad(_bump)(model, jnp.ones(2))

    def with_aux(model, x):
        return _bump(model, x), model

    (value, new), grads = filter_value_and_grad(with_aux, has_aux=True)(model, jnp.ones(2))
    assert value == 2.0 and new.count.value == 1 and model.count.value == 0
    assert jnp.allclose(grads.w, 1.0)


def _custom_jvp(model, x):
    f = filter_custom_jvp(_bump)
    f.defjvp(lambda primals, tangents: (_bump(*primals), 0.0))
    return f(model, x)


def _custom_vjp(model, x):
    f = filter_custom_vjp(_bump)
    f.defvjp(lambda m, x: (_bump(m, x), None), lambda *_: None)
    return f(model, x)


def _custom_vjp_forward(model, x):
    """Differentiated through `x`, its first argument, so that the forward rule runs."""
    f = filter_custom_vjp(lambda x, m: _bump(m, x))
    f.defvjp(lambda x, m: (_bump(m, x), None), lambda residuals, g, x, m: g * x)
    return jax.grad(f)(x, model)


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x: filter_vmap(_bump, in_axes=(None, 0))(m, jnp.stack([x, x])),
        lambda m, x: filter_eval_shape(_bump, m, x),
        lambda m, x: filter_make_jaxpr(_bump)(m, x),
        lambda m, x: filter_vjp(_bump, m, x),
        lambda m, x: filter_jvp(lambda x, m: _bump(m, x), (x, m), (x, None)),
        lambda m, x: filter_checkpoint(_bump)(m, x),
        lambda m, x: filter_jacrev(_bump)(m, x),
        lambda m, x: filter_pmap(_bump, in_axes=(None, 0), axis_size=1)(m, x[None]),
        _custom_jvp,
        _custom_vjp,
        _custom_vjp_forward,
    ],
    ids=[
        "vmap",
        "eval_shape",
        "make_jaxpr",
        "vjp",
        "jvp",
        "checkpoint",
        "jacrev",
        "pmap",
        "custom_jvp",
        "custom_vjp",
        "custom_vjp_forward",
    ],
)
def test_every_transform_refuses_a_dropped_write(call):
    model = Model()
    with pytest.raises(ValueError, match=r"`m(odel)?\.count\.value`.* would be lost"):
        call(model, jnp.ones(2))
    assert model.count.value == 0


def test_filter_vmap_carries_a_returned_write():
    model = Model()

    def bumped(model, x):
        return _bump(model, x), model

    out, new = filter_vmap(bumped, in_axes=(None, 0), out_axes=(0, None))(model, jnp.ones((3, 2)))
    assert out.shape == (3,) and new.count.value == 1 and model.count.value == 0
