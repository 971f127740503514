"""Shared objects (one Module reached by several paths) through the filtered transforms."""

import jax
import jax.numpy as jnp
import pytest

from pytree_filter import PathContains, is_inexact_array
from pytree_module import Module
from pytree_transforms import (
    apply_updates,
    filter_grad,
    filter_jit,
    filter_value_and_grad,
)
from pytree_transforms._sharing import find_sharing


class Cell(Module):
    """A holder of one array: what a tied weight is, without pytree_graph."""

    def __init__(self, value):
        self.value = value


class Tied(Module):
    """An encoder and a decoder that use one weight."""

    def __init__(self, cell):
        self.encoder = cell
        self.decoder = cell
        self.bias = jnp.zeros(3)

    def __call__(self, x):
        h = x @ self.encoder.value + self.bias
        return h @ self.decoder.value.T


def make_tied():
    return Tied(Cell(jnp.arange(6.0).reshape(2, 3) / 6))


def loss(model, x):
    return jnp.sum(model(x) ** 2)


def reference_grad(model, x):
    """The gradient with respect to the one weight, by plain JAX."""

    def of_weight(w):
        return jnp.sum(((x @ w + model.bias) @ w.T) ** 2)

    return jax.grad(of_weight)(model.encoder.value)


def test_find_sharing_sees_an_object_reached_twice_and_rebuilds_it_once():
    model = make_tied()
    leaves, treedef = jax.tree.flatten(model)
    sharing = find_sharing(model, treedef)
    assert sharing is not None and len(sharing.unique) == 2
    rebuilt = sharing.unflatten(sharing.dedupe(leaves))
    assert rebuilt.encoder is rebuilt.decoder
    assert jax.tree.structure(rebuilt) == treedef


def test_containers_and_repeated_leaves_are_not_shared_objects():
    x = jnp.ones(2)
    assert find_sharing([x, x]) is None  # the same array twice stays two leaves
    pair = (x, x)
    assert find_sharing({"a": pair, "b": pair}) is None  # tuples are values


def test_filter_grad_sums_the_uses_of_a_shared_object():
    model, x = make_tied(), jnp.array([1.0, -2.0])
    grads = filter_grad(loss)(model, x)
    assert grads.encoder is grads.decoder
    assert jnp.allclose(grads.encoder.value, reference_grad(model, x))


def test_a_repeated_array_still_gets_one_gradient_per_place():
    x = jnp.array(2.0)
    grads = filter_grad(lambda t: 2 * t[0] + 3 * t[1])((x, x))
    assert [float(g) for g in grads] == [2.0, 3.0]  # as jax.grad: leaves are not objects


def test_apply_updates_updates_a_shared_object_once_and_keeps_it_shared():
    model = make_tied()
    updates = jax.tree.map(jnp.ones_like, model)
    new = apply_updates(model, updates)
    assert new.encoder is new.decoder
    assert jnp.array_equal(new.encoder.value, model.encoder.value + 1)


def test_a_filter_that_selects_a_shared_object_at_one_place_only_is_refused():
    model, x = make_tied(), jnp.ones(2)
    only_encoder = filter_grad(loss, arg=~PathContains("decoder") & is_inexact_array)
    with pytest.raises(ValueError, match=r"\.decoder\.value.*differentiated at one of them"):
        only_encoder(model, x)


def test_filter_jit_keeps_a_shared_object_shared_in_and_out():
    model = make_tied()
    seen = []

    @filter_jit
    def identity(m):
        seen.append(m.encoder is m.decoder)
        return m

    out = identity(model)
    assert seen == [True]
    assert out.encoder is out.decoder


def momentum(rate=0.1, beta=0.9):
    """A small optax-like optimizer: its state is a tree shaped like the parameters."""

    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(grads, velocity):
        velocity = jax.tree.map(lambda v, g: beta * v + g, velocity, grads)
        return jax.tree.map(lambda v: -rate * v, velocity), velocity

    return init, update


def test_a_tied_model_trains_the_same_eagerly_and_under_filter_jit_as_its_one_weight():
    init, update = momentum()
    x = jnp.array([1.0, -2.0])

    def step(model, state, x):
        grads = filter_grad(loss)(model, x)
        updates, state = update(grads, state)
        return apply_updates(model, updates), state

    results = []
    for run in (step, filter_jit(step)):
        model = make_tied()
        state = init(model)
        for _ in range(3):
            model, state = run(model, state, x)
        assert model.encoder is model.decoder
        results.append(model)
    # the same training of the one weight (and the bias), written by hand
    params = {"w": make_tied().encoder.value, "b": jnp.zeros(3)}
    velocity = jax.tree.map(jnp.zeros_like, params)

    def of_params(p):
        return jnp.sum(((x @ p["w"] + p["b"]) @ p["w"].T) ** 2)

    for _ in range(3):
        velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, jax.grad(of_params)(params))
        params = jax.tree.map(lambda p, v: p - 0.1 * v, params, velocity)
    for model in results:
        assert jnp.allclose(model.encoder.value, params["w"], rtol=1e-5)
        assert jnp.allclose(model.bias, params["b"], rtol=1e-5)


def test_one_compiled_step_serves_tied_and_untied_models_of_one_structure():
    """Same treedef, different sharing: each call is differentiated as its own objects."""
    tied = make_tied()
    untied = Tied(Cell(tied.encoder.value))
    untied.decoder = Cell(tied.encoder.value + 0)  # same structure, two objects
    x = jnp.array([1.0, -2.0])
    grad = filter_jit(filter_grad(loss))
    assert jax.tree.structure(tied) == jax.tree.structure(untied)
    for _ in range(2):  # either order, twice, through one wrapper
        g_untied = grad(untied, x)
        g_tied = grad(tied, x)
        assert g_untied.encoder is not g_untied.decoder
        assert g_tied.encoder is g_tied.decoder
        assert jnp.allclose(g_tied.encoder.value, reference_grad(tied, x))
        assert not jnp.allclose(g_untied.encoder.value, g_tied.encoder.value)


def test_value_and_grad_with_a_shared_object_inside_filter_jit():
    model, x = make_tied(), jnp.array([0.5, 1.5])
    value, grads = filter_jit(filter_value_and_grad(loss))(model, x)
    assert jnp.allclose(value, loss(model, x))
    assert grads.encoder is grads.decoder
    assert jnp.allclose(grads.encoder.value, reference_grad(model, x))


@pytest.mark.parametrize("blocks", [2, 7], ids=["compared pairwise", "compared by a set"])
def test_filter_jit_finds_a_block_used_twice_among_many_of_one_structure(blocks):
    cells = [Cell(jnp.full(2, float(i + 1))) for i in range(blocks)]
    tied = [*cells, cells[1]]  # the second block again, last
    untied = [*cells, Cell(cells[1].value)]

    def total(chain):
        return sum(jnp.sum(c.value**2) for c in chain)

    grad = filter_jit(filter_grad(total))
    for _ in range(2):
        g_tied, g_untied = grad(tied), grad(untied)
        assert g_tied[-1] is g_tied[1] and g_untied[-1] is not g_untied[1]
        assert g_tied[1].value.tolist() == [8.0, 8.0]  # 2 * 2.0, from each of two uses
        assert g_untied[1].value.tolist() == [4.0, 4.0]
