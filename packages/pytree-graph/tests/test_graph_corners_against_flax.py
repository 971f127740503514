"""Side by side with Flax NNX: `vmap` decorating `__init__` (NNX's way of building a stack
of layers: the same keys give the same stacked Variables), and `pop` of plain arrays."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_filter import PathContains  # noqa: E402
from pytree_module import Module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

KEYS = jax.random.split(jax.random.key(0), 4)


def _their_block(in_axes):
    class TheirBlock(nnx.Module):
        @nnx.vmap(in_axes=in_axes)
        def __init__(self, key):
            self.w = nnx.Param(jax.random.normal(key, (3, 3)))
            self.mean = nnx.BatchStat(jnp.zeros(3))

    return TheirBlock


def _our_block(in_axes):
    class OurBlock(Module):
        @pg.vmap(in_axes=in_axes)
        def __init__(self, key):
            self.w = pg.Param(jax.random.normal(key, (3, 3)))
            self.mean = pg.BatchStat(jnp.zeros(3))

    return OurBlock


@pytest.mark.parametrize(
    "axes",
    [
        lambda ns: (ns.StateAxes({...: 0}), 0),
        lambda ns: (ns.StateAxes({ns.Param: 0, ns.BatchStat: None}), 0),
        lambda ns: (0, 0),
        lambda ns: (ns.StateAxes({...: 1}), 0),
    ],
    ids=["all-0", "params-0-stats-None", "int", "all-1"],
)
def test_vmapped_init_stacks_as_in_nnx(axes):
    theirs = _their_block(axes(nnx))(KEYS)
    ours = _our_block(axes(pg))(KEYS)
    assert isinstance(ours.w, pg.Param) and isinstance(ours.mean, pg.BatchStat)
    assert ours.w.value.shape == theirs.w.shape
    assert ours.mean.value.shape == theirs.mean.shape
    np.testing.assert_array_equal(ours.w.value, theirs.w[...])
    np.testing.assert_array_equal(ours.mean.value, theirs.mean[...])


def test_vmapped_init_then_scan_over_the_layers_as_in_nnx():
    class TheirStack(nnx.Module):
        @nnx.vmap(in_axes=(nnx.StateAxes({...: 0}), 0))
        def __init__(self, key):
            self.w = nnx.Param(jax.random.normal(key, (3, 3)) * 0.5)

        @nnx.scan(in_axes=(nnx.StateAxes({...: 0}), nnx.Carry), out_axes=nnx.Carry)
        def __call__(self, x):
            return jnp.tanh(x @ self.w[...])

    class OurStack(Module):
        @pg.vmap(in_axes=(pg.StateAxes({...: 0}), 0))
        def __init__(self, key):
            self.w = pg.Param(jax.random.normal(key, (3, 3)) * 0.5)

        @pg.scan(in_axes=(pg.StateAxes({...: 0}), pg.Carry), out_axes=pg.Carry)
        def __call__(self, x):
            return jnp.tanh(x @ self.w.value)

    x = jnp.arange(6.0).reshape(2, 3) / 6
    np.testing.assert_allclose(OurStack(KEYS)(x), TheirStack(KEYS)(x), rtol=1e-6)


def test_vmap_of_a_function_that_builds_the_model_as_in_nnx():
    class TheirBlock(nnx.Module):
        def __init__(self, key):
            self.w = nnx.Param(jax.random.normal(key, (2,)))

    class OurBlock(Module):
        def __init__(self, key):
            self.w = pg.Param(jax.random.normal(key, (2,)))

    theirs = nnx.vmap(lambda key: TheirBlock(key), in_axes=0)(KEYS)
    ours = pg.vmap(lambda key: OurBlock(key), in_axes=0)(KEYS)
    np.testing.assert_array_equal(ours.w.value, theirs.w[...])


def test_pop_of_plain_arrays_as_in_nnx():
    class Theirs(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(2))
            self.a = jnp.zeros(3)
            self.d = nnx.data({"x": jnp.ones(1), "y": nnx.Param(jnp.ones(1))})

    class Ours(Module):
        def __init__(self):
            self.w = pg.Param(jnp.ones(2))
            self.a = jnp.zeros(3)
            self.d = {"x": jnp.ones(1), "y": pg.Param(jnp.ones(1))}

    theirs, ours = Theirs(), Ours()
    theirs.b, ours.b = theirs.a, ours.a  # one array at two paths
    for select in ("a", "x"):
        their_popped = nnx.pop(theirs, nnx.PathContains(select))
        our_popped = pg.pop(ours, PathContains(select))
        assert our_popped.to_pure_dict().keys() == their_popped.to_pure_dict().keys()
        assert jax.tree.map(jnp.shape, our_popped.to_pure_dict()) == jax.tree.map(
            jnp.shape, their_popped.to_pure_dict()
        )
    assert hasattr(ours, "a") == hasattr(theirs, "a") is False
    assert hasattr(ours, "b") == hasattr(theirs, "b") is True
    assert list(ours.d) == list(theirs.d) == ["y"]
