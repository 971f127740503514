"""Side by side with Flax NNX 0.12: `*_metadata=`, `out_sharding` (metadata and calls),
`InstanceNorm`, `SimpleCell`, `OptimizedLSTMCell` and `PReLU(negative_slope_init=)`: the
same weights in, the same numbers out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec

nnx = pytest.importorskip("flax.nnx")

import pytree_nn as pnn  # noqa: E402

P = PartitionSpec


def assert_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5)


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def copy_params(theirs, ours, paths):
    """Give our layer NNX's parameter values, path by path ("dense_i.kernel", ...)."""
    for path in paths:
        source, target = theirs, ours
        for part in path.split("."):
            source, target = getattr(source, part), getattr(target, part)
        target.value = jnp.asarray(source[...])


def test_instance_norm_matches_nnx():
    x = normal(0, (2, 5, 6, 3)) * 2 + 1
    for options in [{}, {"feature_axes": (2, 3)}, {"use_bias": False, "epsilon": 0.1}]:
        features = 18 if "feature_axes" in options else 3
        theirs = nnx.InstanceNorm(
            features,
            scale_init=jax.nn.initializers.normal(1.0),
            bias_init=jax.nn.initializers.normal(1.0),
            rngs=nnx.Rngs(0),
            **options,
        )
        ours = pnn.InstanceNorm(features, rngs=0, **options)
        copy_params(theirs, ours, ["scale"] + (["bias"] if ours.use_bias else []))
        assert_close(ours(x), theirs(x))
    # The same parameters from the same seed: ones and zeros, as NNX's.
    assert_close(
        (pnn.InstanceNorm(3, rngs=0).scale.value, pnn.InstanceNorm(3, rngs=0).bias.value),
        (
            nnx.InstanceNorm(3, rngs=nnx.Rngs(0)).scale[...],
            nnx.InstanceNorm(3, rngs=nnx.Rngs(0)).bias[...],
        ),
    )


@pytest.mark.parametrize("residual", [False, True])
def test_simple_cell_matches_nnx(residual):
    theirs = nnx.SimpleCell(
        3, 4, residual=residual, bias_init=jax.nn.initializers.normal(1.0), rngs=nnx.Rngs(0)
    )
    ours = pnn.SimpleCell(3, 4, residual=residual, rngs=1)
    copy_params(theirs, ours, ["dense_i.kernel", "dense_i.bias", "dense_h.kernel"])
    x, h = normal(1, (2, 3)), normal(2, (2, 4))
    assert_close(ours(h, x), theirs(h, x))
    xs = normal(3, (2, 6, 3))
    assert_close(pnn.RNN(ours)(xs), nnx.RNN(theirs)(xs))
    assert_close(ours.initialize_carry((2, 3)), theirs.initialize_carry((2, 3), nnx.Rngs(0)))


def test_optimized_lstm_cell_matches_nnx_and_lstm_cell():
    theirs = nnx.OptimizedLSTMCell(
        3, 4, bias_init=jax.nn.initializers.normal(1.0), rngs=nnx.Rngs(0)
    )
    ours = pnn.OptimizedLSTMCell(3, 4, rngs=1)
    copy_params(theirs, ours, ["dense_i.kernel", "dense_h.kernel", "dense_h.bias"])
    x = normal(1, (2, 3))
    carry = (normal(2, (2, 4)), normal(3, (2, 4)))
    assert_close(ours(carry, x), theirs(carry, x))
    xs = normal(4, (2, 5, 3))
    assert_close(pnn.RNN(ours)(xs), nnx.RNN(theirs)(xs))

    def loss(cell, xs):
        return jnp.sum(cell(carry, xs[:, 0])[1] ** 2)

    assert_close(jax.grad(loss, 1)(ours, xs), jax.grad(loss, 1)(theirs, xs))

    # NNX's LSTMCell with the same weights, unfused, gives the same numbers.
    unfused = nnx.LSTMCell(3, 4, rngs=nnx.Rngs(5))
    kernels = jnp.split(ours.dense_i.kernel.value, 4, -1)
    recurrent = jnp.split(ours.dense_h.kernel.value, 4, -1)
    biases = jnp.split(ours.dense_h.bias.value, 4, -1)
    for gate, kernel, recurrent_kernel, bias in zip(
        ("i", "f", "g", "o"), kernels, recurrent, biases, strict=True
    ):
        getattr(unfused, "if_" if gate == "f" else f"i{gate}").kernel[...] = kernel
        getattr(unfused, f"h{gate}").kernel[...] = recurrent_kernel
        getattr(unfused, f"h{gate}").bias[...] = bias
    assert_close(ours(carry, x), unfused(carry, x))


def test_prelu_negative_slope_init_matches_nnx():
    x = jnp.array([-3.0, -0.5, 0.0, 2.0])
    assert_close(pnn.PReLU(negative_slope_init=0.1)(x), nnx.PReLU(negative_slope_init=0.1)(x))
    assert_close(pnn.PReLU(0.2)(x), nnx.PReLU(0.2)(x))
    assert pnn.PReLU(negative_slope_init=0.1).negative_slope.shape == ()


# (NNX layer, our layer, {metadata argument: parameter path}), built with rngs given last.
METADATA_LAYERS = [
    (
        lambda **kw: nnx.Linear(3, 4, **kw),
        lambda **kw: pnn.Linear(3, 4, **kw),
        {"kernel_metadata": "kernel", "bias_metadata": "bias"},
    ),
    (
        lambda **kw: nnx.Conv(3, 4, (3,), **kw),
        lambda **kw: pnn.Conv(3, 4, (3,), **kw),
        {"kernel_metadata": "kernel", "bias_metadata": "bias"},
    ),
    (
        lambda **kw: nnx.ConvTranspose(3, 4, (3,), **kw),
        lambda **kw: pnn.ConvTranspose(3, 4, (3,), **kw),
        {"kernel_metadata": "kernel", "bias_metadata": "bias"},
    ),
    (
        lambda **kw: nnx.Embed(5, 4, **kw),
        lambda **kw: pnn.Embedding(5, 4, **kw),
        {"embedding_metadata": "embedding"},
    ),
    (
        lambda **kw: nnx.LayerNorm(4, **kw),
        lambda **kw: pnn.LayerNorm(4, **kw),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    (
        lambda **kw: nnx.RMSNorm(4, **kw),
        lambda **kw: pnn.RMSNorm(4, **kw),
        {"scale_metadata": "scale"},
    ),
    (
        lambda **kw: nnx.GroupNorm(4, num_groups=2, **kw),
        lambda **kw: pnn.GroupNorm(4, num_groups=2, **kw),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    (
        lambda **kw: nnx.BatchNorm(4, **kw),
        lambda **kw: pnn.BatchNorm(4, **kw),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    (
        lambda **kw: nnx.InstanceNorm(4, **kw),
        lambda **kw: pnn.InstanceNorm(4, **kw),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    (
        lambda **kw: nnx.SimpleCell(3, 4, **kw),
        lambda **kw: pnn.SimpleCell(3, 4, **kw),
        {
            "kernel_metadata": "dense_i.kernel",
            "recurrent_kernel_metadata": "dense_h.kernel",
            "bias_metadata": "dense_i.bias",
        },
    ),
    (
        lambda **kw: nnx.OptimizedLSTMCell(3, 4, **kw),
        lambda **kw: pnn.OptimizedLSTMCell(3, 4, **kw),
        {
            "kernel_metadata": "dense_i.kernel",
            "recurrent_kernel_metadata": "dense_h.kernel",
            "bias_metadata": "dense_h.bias",
        },
    ),
    (
        lambda **kw: nnx.LSTMCell(3, 4, **kw),
        lambda **kw: pnn.LSTMCell(3, 4, **kw),
        {
            "kernel_metadata": "ig.kernel",
            "recurrent_kernel_metadata": "ho.kernel",
            "bias_metadata": "hf.bias",
        },
    ),
    (
        lambda **kw: nnx.GRUCell(3, 4, **kw),
        lambda **kw: pnn.GRUCell(3, 4, **kw),
        {
            "kernel_metadata": "dense_i.kernel",
            "recurrent_kernel_metadata": "dense_h.kernel",
            "bias_metadata": "dense_i.bias",
        },
    ),
]


@pytest.mark.parametrize("index", range(len(METADATA_LAYERS)))
def test_metadata_arguments_read_as_in_nnx(index):
    make_theirs, make_ours, arguments = METADATA_LAYERS[index]
    metadata = {}
    for n, argument in enumerate(arguments):
        ndim = 1 if argument in ("bias_metadata", "scale_metadata") else None
        entry = {"tag": f"t{n}"}
        if ndim == 1:
            entry["out_sharding"] = ("model",)
        metadata[argument] = entry
    # NNX lays a Variable with `out_sharding` out when it is made, so it needs a mesh.
    one_device = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
    with jax.set_mesh(one_device):
        theirs = make_theirs(**metadata, rngs=nnx.Rngs(0))
    ours = make_ours(**metadata, rngs=0)
    for path in arguments.values():
        a, b = theirs, ours
        for part in path.split("."):
            a, b = getattr(a, part), getattr(b, part)
        assert a.tag == b.tag
        assert a.get_metadata("out_sharding", None) == b.get_metadata("out_sharding", None)
        if b.get_metadata("out_sharding", None) is not None:
            assert b.out_sharding == a.out_sharding == ("model",)


def test_prelu_negative_slope_metadata_reads_as_in_nnx():
    theirs = nnx.PReLU(negative_slope_metadata={"tag": "slope"})
    ours = pnn.PReLU(negative_slope_metadata={"tag": "slope"})
    assert theirs.negative_slope.tag == ours.negative_slope.tag == "slope"


def test_variable_out_sharding_reads_as_in_nnx():
    with jax.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("m",))):
        theirs = nnx.Param(jnp.ones((2, 2)), out_sharding=(None, "m"))
    import pytree_graph as pg

    ours = pg.Param(jnp.ones((2, 2)), out_sharding=(None, "m"))
    assert ours.out_sharding == theirs.out_sharding == (None, "m")
    assert ours.get_metadata("out_sharding") == theirs.get_metadata("out_sharding")
    ours.set_metadata(out_sharding=("m", None))
    theirs.set_metadata(out_sharding=("m", None))
    assert ours.out_sharding == theirs.out_sharding


@pytest.mark.multi_device
def test_out_sharding_on_calls_matches_nnx():
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:8]), ("data",), axis_types=(AxisType.Explicit,)
    )
    pairs = {
        "linear": (
            nnx.Linear(4, 16, rngs=nnx.Rngs(0)),
            pnn.Linear(4, 16, rngs=0),
            ["kernel", "bias"],
        ),
        "conv": (
            nnx.Conv(4, 16, (3,), rngs=nnx.Rngs(0)),
            pnn.Conv(4, 16, (3,), rngs=0),
            ["kernel", "bias"],
        ),
        "embed": (
            nnx.Embed(24, 16, rngs=nnx.Rngs(0)),
            pnn.Embedding(24, 16, rngs=0),
            ["embedding"],
        ),
    }
    for theirs, ours, paths in pairs.values():
        copy_params(theirs, ours, paths)
    x = normal(0, (8, 6, 4))
    tokens = jnp.arange(48).reshape(8, 6) % 24
    spec = P(None, None, "data")
    with jax.set_mesh(mesh):
        x = jax.sharding.reshard(x, P("data"))
        tokens = jax.sharding.reshard(tokens, P("data"))
        h = pairs["linear"][1](x)
        for name, (theirs, ours, _) in pairs.items():
            inputs = tokens if name == "embed" else x
            a = jax.jit(lambda v, layer=theirs: layer(v, out_sharding=spec))(inputs)
            b = jax.jit(lambda v, layer=ours: layer(v, out_sharding=spec))(inputs)
            assert a.sharding == b.sharding and b.sharding.spec == spec, name
            assert_close(a, b)
        theirs, ours, _ = pairs["embed"]
        a = theirs.attend(h, out_sharding=spec)
        b = ours.attend(h, out_sharding=spec)
        assert a.sharding == b.sharding and b.sharding.spec == spec
        assert_close(a, b, atol=1e-4)
