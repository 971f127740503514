"""Layer sizes and layouts side by side with Equinox and Flax NNX (runs in the bench
environment): zero sizes give Equinox's shapes, a `Linear` split on its input axis runs under
`shard_map` as NNX's does, and NNX's vmapped `__init__` builds the same stack of layers."""

import pytest

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_nn import MLP, Conv, Embedding, Linear, Module, Rngs, split_rngs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

KEY = jax.random.key(0)


@pytest.mark.parametrize(("in_size", "out_size"), [(4, 0), (0, 3), (0, 0)])
def test_zero_sizes_give_equinoxs_shapes(in_size, out_size):
    x = jnp.ones((in_size,))
    theirs = eqx.nn.Linear(in_size, out_size, key=KEY)
    assert Linear(in_size, out_size, rngs=0)(x).shape == theirs(x).shape == (out_size,)
    their_mlp = eqx.nn.MLP(in_size, out_size, 8, 2, key=KEY)
    assert MLP(in_size, out_size, 8, 2, rngs=0)(x).shape == their_mlp(x).shape


def test_zero_sizes_of_the_other_layers_give_equinoxs_shapes():
    assert (
        MLP(4, 3, 0, 2, rngs=0)(jnp.ones(4)).shape
        == eqx.nn.MLP(4, 3, 0, 2, key=KEY)(jnp.ones(4)).shape
    )
    assert (
        Embedding(0, 3, rngs=0).embedding.value.shape
        == eqx.nn.Embedding(0, 3, key=KEY).weight.shape
    )
    assert Embedding(3, 0, rngs=0)(1).shape == eqx.nn.Embedding(3, 0, key=KEY)(1).shape
    # Channels-last here, channels-first in Equinox.
    ours = Conv(3, 0, (3,), padding="VALID", rngs=0)(jnp.ones((5, 3)))
    theirs = eqx.nn.Conv1d(3, 0, 3, key=KEY)(jnp.ones((3, 5)))
    assert ours.shape == theirs.shape[::-1] == (3, 0)


@pytest.mark.multi_device
def test_a_linear_split_on_its_input_axis_under_shard_map_as_in_nnx():
    mesh = Mesh(np.array(jax.devices()[:8]), ("model",))
    theirs = nnx.Linear(16, 3, use_bias=False, rngs=nnx.Rngs(0))
    ours = Linear(16, 3, use_bias=False, kernel_sharding=("model", None), rngs=0)
    ours.kernel.value = jnp.asarray(theirs.kernel[...])
    x = jnp.arange(32.0).reshape(2, 16) / 32

    their_graphdef, their_state = nnx.split(theirs)
    their_specs = jax.tree.map(lambda _: P("model", None), their_state)

    def their_forward(state, x):
        return jax.lax.psum(nnx.merge(their_graphdef, state)(x), "model")

    their_out = jax.shard_map(
        their_forward, mesh=mesh, in_specs=(their_specs, P(None, "model")), out_specs=P()
    )(their_state, x)

    def our_forward(layer, x):
        return jax.lax.psum(layer(x), "model")

    specs = (pg.get_partition_spec(ours), P(None, "model"))
    our_out = pg.shard_map(our_forward, mesh=mesh, in_specs=specs, out_specs=P())(ours, x)
    np.testing.assert_allclose(our_out, their_out, rtol=1e-6)
    np.testing.assert_allclose(our_out, theirs(x), rtol=1e-5)


def test_nnxs_vmapped_init_with_split_rngs_builds_the_same_stack():
    class Theirs(nnx.Module):
        @nnx.split_rngs(splits=4)
        @nnx.vmap(in_axes=(nnx.StateAxes({...: 0}), 0))
        def __init__(self, rngs):
            self.linear = nnx.Linear(3, 3, rngs=rngs)

        @nnx.scan(in_axes=(nnx.StateAxes({...: 0}), nnx.Carry), out_axes=nnx.Carry)
        def __call__(self, x):
            return jnp.tanh(self.linear(x))

    class Ours(Module):
        @split_rngs(splits=4)
        @pg.vmap(in_axes=(pg.StateAxes({...: 0}), 0))
        def __init__(self, rngs):
            self.linear = Linear(3, 3, rngs=rngs)

        @pg.scan(in_axes=(pg.StateAxes({...: 0}), pg.Carry), out_axes=pg.Carry)
        def __call__(self, x):
            return jnp.tanh(self.linear(x))

    theirs, ours = Theirs(nnx.Rngs(0)), Ours(Rngs(0))
    assert ours.linear.kernel.value.shape == theirs.linear.kernel.shape == (4, 3, 3)
    np.testing.assert_array_equal(ours.linear.kernel.value, theirs.linear.kernel[...])
    x = jnp.ones((2, 3))
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-6)
