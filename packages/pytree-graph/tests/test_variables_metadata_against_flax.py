"""Variables as arrays, metadata initializers, `set_metadata` and abstract models side by
side with Flax NNX (runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

import pytree_graph as pg  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _user_metadata(variable):
    # NNX adds its own entries (`hijax`, `ref`, `eager_sharding`).
    own = {"hijax", "ref", "eager_sharding"}
    return {k: v for k, v in variable.get_metadata().items() if k not in own}


def test_jax_numpy_functions_as_in_nnx():
    value = jnp.arange(6.0).reshape(2, 3)
    x = jnp.ones(2)
    for make in (pg.Param, nnx.Param):
        w = make(value)
        for result, expected in [
            (jnp.dot(x, w), x @ value),
            (jnp.sum(w), jnp.sum(value)),
            (w + 1, value + 1),
            (x @ w, x @ value),
            (jnp.tanh(w), jnp.tanh(value)),
            (jnp.mean(w, axis=0), jnp.mean(value, axis=0)),
            (jnp.asarray(w), value),
        ]:
            assert jnp.array_equal(result, expected)
        # A Variable stays a pytree for transforms.
        assert type(jax.jit(lambda p: p)(w)) is make
        # And neither library's Variable is a `jax.lax` argument.
        with pytest.raises((TypeError, ValueError)):
            jax.lax.add(w, w)


def test_with_metadata_as_in_nnx():
    ours = pg.with_metadata(jax.nn.initializers.ones, tag="a", level=1)
    theirs = nnx.with_metadata(jax.nn.initializers.ones, tag="a", level=1)
    key = jax.random.key(0)
    p, q = pg.Param(ours(key, (2,))), nnx.Param(theirs(key, (2,)))
    assert p.get_metadata() == _user_metadata(q)
    assert jnp.array_equal(p.value, q.get_value())
    assert ours.__name__ == theirs.__name__


def test_with_partitioning_in_layers_as_in_nnx():
    mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
    init = jax.nn.initializers.lecun_normal()
    ours = pg.with_partitioning(init, (None, "model"), mesh=mesh)
    theirs = nnx.with_partitioning(init, (None, "model"), mesh=mesh)
    key = jax.random.key(0)
    p, q = pg.Param(ours(key, (4, 8))), nnx.Param(theirs(key, (4, 8)))
    assert jnp.array_equal(p.value, q.get_value())
    assert p.value.sharding.spec == q.get_value().sharding.spec == PartitionSpec(None, "model")
    # NNX calls the metadata `out_sharding`; ours is `sharding`, as everywhere here.
    assert p.sharding == q.get_metadata("out_sharding") and p.mesh is q.get_metadata("mesh")


def test_without_a_mesh_nnx_refuses_and_ours_keeps_metadata():
    init = pg.with_partitioning(jax.nn.initializers.ones, ("data", None))
    assert pg.Param(init(jax.random.key(0), (2, 2))).sharding == ("data", None)
    with pytest.raises(ValueError, match="mesh"):
        nnx.Param(
            nnx.with_partitioning(jax.nn.initializers.ones, ("data", None))(
                jax.random.key(0), (2, 2)
            )
        )


def test_set_metadata_as_in_nnx():
    from pytree_module import Module

    class OurBlock(Module):
        def __init__(self):
            self.param = pg.Param(0.0)
            self.variable = pg.Variable(0.0)

    class TheirBlock(nnx.Module):
        def __init__(self):
            self.param = nnx.Param(0.0)
            self.variable = nnx.Variable(0.0)

    ours, theirs = OurBlock(), TheirBlock()
    pg.set_metadata(ours, differentiable=False, only=pg.Param)
    nnx.set_metadata(theirs, differentiable=False, only=nnx.Param)
    pg.set_metadata(ours, tag="x")
    nnx.set_metadata(theirs, tag="x")
    for name in ("param", "variable"):
        assert getattr(ours, name).get_metadata() == _user_metadata(getattr(theirs, name))


def test_get_abstract_model_as_in_nnx():
    nn = pytest.importorskip("pytree_nn")
    mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
    init = jax.nn.initializers.lecun_normal()
    _, ours = pg.get_abstract_model(
        lambda: nn.Linear(
            4, 8, kernel_init=pg.with_partitioning(init, (None, "model")), rngs=nn.Rngs(0)
        ),
        mesh,
    )
    _, theirs = nnx.get_abstract_model(
        lambda: nnx.Linear(
            4, 8, kernel_init=nnx.with_partitioning(init, (None, "model")), rngs=nnx.Rngs(0)
        ),
        mesh,
    )
    for name in ("kernel", "bias"):
        a, b = ours[name].value, theirs[name].get_value()
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        assert a.sharding.spec == b.sharding.spec and a.sharding.mesh == b.sharding.mesh
