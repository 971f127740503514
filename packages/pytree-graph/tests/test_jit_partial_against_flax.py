"""jit_partial and cached_partial side by side with Flax NNX's: the same training steps give
the same parameters; where NNX keeps using objects replaced outside, ours sees the change."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402
from pytree_nn import Optimizer  # noqa: E402

W = jnp.array([[0.5, -1.0], [2.0, 0.25]])
B = jnp.array([0.1, -0.2])


class Ours(Module):
    def __init__(self):
        self.w = pg.Param(W)
        self.b = pg.Param(B)

    def __call__(self, x):
        return x @ self.w.value + self.b.value


class Theirs(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(W)
        self.b = nnx.Param(B)

    def __call__(self, x):
        return x @ self.w[...] + self.b[...]


def loss(m, x):
    return jnp.sum(m(x) ** 2)


def our_step(model, optimizer, x):
    value, grads = pg.value_and_grad(loss)(model, x)
    optimizer.update(model, grads)
    return value


def their_step(model, optimizer, x):
    value, grads = nnx.value_and_grad(loss)(model, x)
    optimizer.update(model, grads)
    return value


def trained(make, steps=3):
    x = jnp.array([1.0, -2.0])
    return [float(make()(x)) for _ in range(steps)]


def test_jit_partial_matches_nnx_jit_partial():
    ours, theirs = Ours(), Theirs()
    our_opt = Optimizer(ours, optax.adam(0.1))
    their_opt = nnx.Optimizer(theirs, optax.adam(0.1), wrt=nnx.Param)
    our_fn = pg.jit_partial(our_step, ours, our_opt)
    their_fn = nnx.jit_partial(their_step, theirs, their_opt, graph=False)
    x = jnp.array([1.0, -2.0])
    for _ in range(3):
        assert jnp.allclose(our_fn(x), their_fn(x), rtol=1e-6)
    assert jnp.allclose(ours.w.value, theirs.w[...], rtol=1e-6)
    assert jnp.allclose(ours.b.value, theirs.b[...], rtol=1e-6)


def test_cached_partial_matches_nnx_cached_partial():
    ours, theirs = Ours(), Theirs()
    our_opt = Optimizer(ours, optax.adam(0.1))
    their_opt = nnx.Optimizer(theirs, optax.adam(0.1), wrt=nnx.Param)
    our_fn = pg.cached_partial(pg.jit(our_step), ours, our_opt)
    with nnx.set_graph_mode(True), nnx.set_graph_updates(True):
        their_fn = nnx.cached_partial(nnx.jit(their_step), theirs, their_opt)
    x = jnp.array([1.0, -2.0])
    for _ in range(3):
        assert jnp.allclose(our_fn(x), their_fn(x), rtol=1e-6)
    assert jnp.allclose(ours.w.value, theirs.w[...], rtol=1e-6)


def test_value_set_outside_is_read_by_both():
    ours, theirs = Ours(), Theirs()
    our_fn = pg.jit_partial(lambda m, x: m(x), ours)
    their_fn = nnx.jit_partial(lambda m, x: m(x), theirs, graph=False)
    x = jnp.ones(2)
    our_fn(x), their_fn(x)
    ours.w.value = jnp.zeros((2, 2))
    theirs.w[...] = jnp.zeros((2, 2))
    assert jnp.allclose(our_fn(x), their_fn(x))


def test_variable_replaced_outside_is_seen_where_nnx_keeps_the_old_one():
    ours, theirs = Ours(), Theirs()
    our_fn = pg.jit_partial(lambda m, x: m(x), ours)
    their_fn = nnx.jit_partial(lambda m, x: m(x), theirs, graph=False)
    x = jnp.ones(2)
    our_fn(x), their_fn(x)
    ours.w = pg.Param(jnp.zeros((2, 2)))
    theirs.w = nnx.Param(jnp.zeros((2, 2)))
    assert jnp.allclose(our_fn(x), B)  # the new (zero) weights
    # NNX flattened the bound objects once: it still computes with the old Param.
    assert jnp.allclose(their_fn(x), jnp.ones(2) @ W + B)


def test_eval_shape_gives_nnxs_shapes_and_changes_nothing():
    ours, theirs = Ours(), Theirs()
    x = jnp.ones((5, 2))
    our_shape = pg.jit_partial(our_step, ours, Optimizer(ours, optax.sgd(0.1))).eval_shape(x)
    their_shape = nnx.jit_partial(
        their_step, theirs, nnx.Optimizer(theirs, optax.sgd(0.1), wrt=nnx.Param), graph=False
    ).eval_shape(x)
    assert (our_shape.shape, our_shape.dtype) == (their_shape.shape, their_shape.dtype)
    assert jnp.array_equal(ours.w.value, W) and jnp.array_equal(theirs.w[...], W)


def test_as_a_class_attribute_it_binds_like_nnxs():
    def scaled(model, holder, x):
        return model(x) * holder.scale

    ours, theirs = Ours(), Theirs()

    # A pytree with no leaves: NNX passes the instance to `jax.jit` as an argument.
    @jax.tree_util.register_static
    class OurHolder:
        scale = 3.0
        apply = pg.jit_partial(scaled, ours)

    @jax.tree_util.register_static
    class TheirHolder:
        scale = 3.0
        apply = nnx.jit_partial(scaled, theirs, graph=False)

    x = jnp.array([1.0, -2.0])
    assert jnp.allclose(OurHolder().apply(x), TheirHolder().apply(x))
    assert jnp.allclose(OurHolder().apply(x), ours(x) * 3.0)


def test_in_and_out_shardings_are_taken_as_nnxs():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    ours, theirs = Ours(), Theirs()
    our_opt = Optimizer(ours, optax.adam(0.1))
    their_opt = nnx.Optimizer(theirs, optax.adam(0.1), wrt=nnx.Param)
    options = {"in_shardings": (replicated, replicated, replicated), "out_shardings": replicated}
    our_fn = pg.jit_partial(our_step, ours, our_opt, **options)
    their_fn = nnx.jit_partial(their_step, theirs, their_opt, graph=False, **options)
    assert trained(lambda: our_fn) == trained(lambda: their_fn)
    assert jnp.allclose(ours.w.value, theirs.w[...])
