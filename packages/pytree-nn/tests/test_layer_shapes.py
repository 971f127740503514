"""Layer sizes and weight shapes: zero sizes (as in Equinox), a weight assigned a value of
another shape (named, with both shapes, when the layer is used), and weights split over a
mesh inside `shard_map` (checked against their local shard: tensor parallelism).

The mesh tests need 8 devices: the CPU test environments fake them with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import pytree_graph as pg
from pytree_nn import MLP, Conv, ConvTranspose, Embedding, Linear

# ------------------------------------------------------------------------- zero sizes


def test_zero_output_features_give_an_empty_output():
    layer = Linear(4, 0, rngs=0)
    assert layer.kernel.value.shape == (4, 0) and layer.bias.value.shape == (0,)
    assert layer(jnp.ones(4)).shape == (0,)
    assert layer(jnp.ones((2, 5, 4))).shape == (2, 5, 0)
    assert jax.jit(lambda m, x: m(x))(layer, jnp.ones((3, 4))).shape == (3, 0)
    assert Linear(0, 0, rngs=0)(jnp.ones(0)).shape == (0,)


def test_zero_sizes_in_the_other_layers():
    assert MLP(4, 0, width_size=8, depth=2, rngs=0)(jnp.ones(4)).shape == (0,)
    assert MLP(4, 3, width_size=0, depth=2, rngs=0)(jnp.ones(4)).shape == (3,)
    assert MLP(4, 3, width_size=0, depth=3, scan=True, rngs=0)(jnp.ones(4)).shape == (3,)
    assert Conv(3, 0, (3,), rngs=0)(jnp.ones((1, 5, 3))).shape == (1, 5, 0)
    out = Conv(0, 2, (3,), bias_init=jax.nn.initializers.ones, rngs=0)(jnp.ones((5, 0)))
    np.testing.assert_array_equal(out, np.ones((5, 2)))
    assert ConvTranspose(3, 0, (3,), rngs=0)(jnp.ones((5, 3))).shape == (5, 0)
    assert Embedding(0, 3, rngs=0).embedding.value.shape == (0, 3)
    assert Embedding(3, 0, rngs=0)(jnp.array([1, 2])).shape == (2, 0)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Linear(4, -1, rngs=0), "Linear: out_features must be an int >= 0, got -1"),
        (lambda: Linear(-2, 3, rngs=0), "Linear: in_features must be an int >= 0, got -2"),
        (lambda: MLP(2, 3, -1, 1, rngs=0), "MLP: width_size must be an int >= 0, got -1"),
        (lambda: Conv(3, -1, 3, rngs=0), "Conv: out_features must be an int >= 0, got -1"),
        (lambda: ConvTranspose(-1, 3, 3, rngs=0), "ConvTranspose: in_features must be an int"),
        (lambda: Embedding(2, -3, rngs=0), "Embedding: features must be an int >= 0, got -3"),
    ],
)
def test_negative_sizes_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ------------------------------------------------------------ weights of another shape


def _kernel_error(layer_name, name, got, expected):
    got, expected = (str(tuple(s)).replace("(", r"\(").replace(")", r"\)") for s in (got, expected))
    return rf"{layer_name}\.{name} has shape {got}, but the layer's sizes \(.*\) give {expected}"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("shape", [(5, 3), (4, 7), (4,)])
def test_a_kernel_of_another_shape_is_named_with_both_shapes(shape, compiled):
    layer = Linear(4, 3, rngs=0)
    layer.kernel.value = jnp.ones(shape)
    run = jax.jit(lambda m, x: m(x)) if compiled else (lambda m, x: m(x))
    with pytest.raises(ValueError, match=_kernel_error("Linear", "kernel", shape, (4, 3))):
        run(layer, jnp.ones(4))
    with pytest.raises(ValueError, match=r"in_features=4, out_features=3\) give"):
        run(layer, jnp.ones(4))


def test_the_other_layers_name_a_weight_of_another_shape():
    conv = Conv(3, 4, (3,), rngs=0)
    conv.kernel.value = jnp.ones((3, 3, 5))
    with pytest.raises(ValueError, match=_kernel_error("Conv", "kernel", (3, 3, 5), (3, 3, 4))):
        conv(jnp.ones((5, 3)))
    transposed = ConvTranspose(3, 4, (2,), transpose_kernel=True, rngs=0)
    transposed.kernel.value = jnp.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"ConvTranspose\.kernel .* give \(2, 4, 3\)"):
        transposed(jnp.ones((5, 3)))
    embed = Embedding(5, 4, rngs=0)
    embed.embedding.value = jnp.ones((5, 2))
    with pytest.raises(ValueError, match=_kernel_error("Embedding", "embedding", (5, 2), (5, 4))):
        embed(jnp.array([0, 1]))
    with pytest.raises(ValueError, match=r"Embedding\.embedding has shape \(5, 2\)"):
        embed.attend(jnp.ones(4))
    mlp = MLP(2, 3, width_size=4, depth=1, rngs=0)
    mlp.layers[1].kernel.value = jnp.ones((4, 4))
    with pytest.raises(ValueError, match=_kernel_error("Linear", "kernel", (4, 4), (4, 3))):
        mlp(jnp.ones(2))


def test_a_stacked_layer_called_on_its_own_says_how_to_call_it():
    mlp = MLP(2, 1, width_size=8, depth=4, scan=True, rngs=0)
    with pytest.raises(ValueError, match=r"holds a stack of 3 layers .* through `jax.lax.scan`"):
        mlp.layers[1](jnp.ones(8))
    assert mlp(jnp.ones(2)).shape == (1,)


def test_outside_shard_map_a_kernel_the_size_of_a_shard_is_refused():
    layer = Linear(16, 3, rngs=0)
    layer.kernel.value = layer.kernel.value[:2]
    with pytest.raises(ValueError, match=_kernel_error("Linear", "kernel", (2, 3), (16, 3))):
        layer(jnp.ones(2))


# ------------------------------------------------------------ tensor parallelism


def _mesh():
    return Mesh(np.array(jax.devices()[:8]), ("model",))


X = jnp.arange(32.0).reshape(2, 16) / 32


@pytest.mark.multi_device
def test_a_linear_split_on_its_input_axis_under_jax_shard_map():
    # Row-parallel, as in Flax NNX's tensor parallelism: each device multiplies its slice
    # of the features by its rows of the kernel, and the partial sums are added up.
    layer = Linear(16, 3, use_bias=False, rngs=0)
    graphdef, state = pg.split(layer)
    specs = jax.tree.map(lambda _: P("model", None), state)

    def forward(state, x):
        return jax.lax.psum(pg.merge(graphdef, state)(x), "model")

    mapped = jax.shard_map(forward, mesh=_mesh(), in_specs=(specs, P(None, "model")), out_specs=P())
    np.testing.assert_allclose(jax.jit(mapped)(state, X), layer(X), rtol=1e-5)


@pytest.mark.multi_device
def test_linear_and_conv_split_over_the_mesh_under_pytree_graph_shard_map():
    mesh = _mesh()
    rows = Linear(16, 3, kernel_sharding=("model", None), rngs=0)
    columns = Linear(16, 8, kernel_sharding=(None, "model"), bias_sharding=("model",), rngs=0)
    conv = Conv(16, 3, (3,), kernel_sharding=(None, "model", None), use_bias=False, rngs=0)

    def row_parallel(layer, x):  # the bias is added once, after the sum
        return jax.lax.psum(layer(x) - layer.bias.value, "model") + layer.bias.value

    def column_parallel(layer, x):  # each device computes its slice of the outputs
        return layer(x)

    def conv_parallel(layer, x):
        return jax.lax.psum(layer(x), "model")

    for layer, fun, x_spec, out_spec, x in [
        (rows, row_parallel, P(None, "model"), P(), X),
        (columns, column_parallel, P(), P(None, "model"), X),
        (conv, conv_parallel, P(None, None, "model"), P(), X.reshape(1, 2, 16)),
    ]:
        specs = (pg.get_partition_spec(layer), x_spec)
        out = pg.shard_map(fun, mesh=mesh, in_specs=specs, out_specs=out_spec)(layer, x)
        np.testing.assert_allclose(out, layer(x), rtol=1e-5, atol=1e-6)
    # A wrong input is still named, with the size of each shard.
    with pytest.raises(ValueError, match=r"in_features=16 split over the mesh \(2 in each shard\)"):
        specs = (pg.get_partition_spec(rows), P())
        pg.shard_map(row_parallel, mesh=mesh, in_specs=specs, out_specs=P())(rows, X[:, :4])
