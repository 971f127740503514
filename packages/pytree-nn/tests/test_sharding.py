"""Models on a device mesh: layers' sharding arguments, `create_sharded`, and data-parallel,
fully sharded and tensor-parallel training that gives the losses of one device.

The mesh tests need 8 devices: the CPU test environments fake them with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_nn import (
    MLP,
    BatchNorm,
    Conv,
    ConvTranspose,
    Embedding,
    GroupNorm,
    GRUCell,
    LayerNorm,
    Linear,
    LSTMCell,
    Module,
    MultiHeadAttention,
    Optimizer,
    RMSNorm,
    Rngs,
    load_checkpoint,
    make_causal_mask,
    save_checkpoint,
)


def _mesh(shape, names):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def _shard_shapes(array):
    return {shard.data.shape for shard in array.addressable_shards}


# ----------------------------------------------------------------------- sharding arguments


@pytest.mark.parametrize(
    ("make", "name", "sharding"),
    [
        (lambda s: Linear(4, 8, kernel_sharding=s, rngs=0), "kernel", (None, "model")),
        (lambda s: Linear(4, 8, bias_sharding=s, rngs=0), "bias", ("model",)),
        (lambda s: Conv(3, 8, (3, 3), kernel_sharding=s, rngs=0), "kernel", (None,) * 3 + ("m",)),
        (lambda s: ConvTranspose(8, 3, 2, kernel_sharding=s, rngs=0), "kernel", (None, "m", None)),
        (lambda s: Embedding(10, 4, embedding_sharding=s, rngs=0), "embedding", ("vocab", None)),
        (lambda s: LayerNorm(8, scale_sharding=s, rngs=0), "scale", ("model",)),
        (lambda s: LayerNorm(8, bias_sharding=s, rngs=0), "bias", ("model",)),
        (lambda s: RMSNorm(8, scale_sharding=s, rngs=0), "scale", ("model",)),
        (lambda s: GroupNorm(8, num_groups=2, bias_sharding=s, rngs=0), "bias", ("model",)),
        (lambda s: BatchNorm(8, scale_sharding=s, rngs=0), "scale", ("model",)),
        (
            lambda s: MultiHeadAttention(2, 8, qkv_kernel_sharding=s, rngs=0).key,
            "kernel",
            (None, "model", None),
        ),
        (
            lambda s: MultiHeadAttention(2, 8, qkv_bias_sharding=s, rngs=0).value,
            "bias",
            ("model", None),
        ),
        (
            lambda s: MultiHeadAttention(2, 8, out_kernel_sharding=s, rngs=0).out,
            "kernel",
            ("model", None, None),
        ),
        (lambda s: MultiHeadAttention(2, 8, out_bias_sharding=s, rngs=0).out, "bias", ("m",)),
        (lambda s: MLP(4, 2, 8, 2, kernel_sharding=s, rngs=0).layers[1], "kernel", ("d", None)),
        (lambda s: MLP(4, 2, 8, 2, bias_sharding=s, rngs=0).layers[2], "bias", ("model",)),
        (lambda s: LSTMCell(3, 8, kernel_sharding=s, rngs=0).ig, "kernel", (None, "model")),
        (
            lambda s: LSTMCell(3, 8, recurrent_kernel_sharding=s, rngs=0).hf,
            "kernel",
            ("model", None),
        ),
        (lambda s: LSTMCell(3, 8, bias_sharding=s, rngs=0).ho, "bias", ("model",)),
        (lambda s: GRUCell(3, 8, kernel_sharding=s, rngs=0).dense_i, "kernel", (None, "model")),
        (
            lambda s: GRUCell(3, 8, recurrent_kernel_sharding=s, rngs=0).dense_h,
            "kernel",
            (None, "model"),
        ),
        (lambda s: GRUCell(3, 8, bias_sharding=s, rngs=0).dense_i, "bias", ("model",)),
    ],
    ids=[
        "linear-kernel",
        "linear-bias",
        "conv",
        "conv-transpose",
        "embedding",
        "layernorm-scale",
        "layernorm-bias",
        "rmsnorm",
        "groupnorm",
        "batchnorm",
        "attention-qkv-kernel",
        "attention-qkv-bias",
        "attention-out-kernel",
        "attention-out-bias",
        "mlp-kernel",
        "mlp-bias",
        "lstm-kernel",
        "lstm-recurrent-kernel",
        "lstm-bias",
        "gru-kernel",
        "gru-recurrent-kernel",
        "gru-bias",
    ],
)
def test_layers_store_their_parameters_sharding(make, name, sharding):
    layer = make(sharding)
    assert getattr(layer, name).sharding == sharding
    unsharded = make(None)
    assert "sharding" not in getattr(unsharded, name).metadata  # no metadata unless asked
    # Axis names inside a tuple (one dimension over several mesh axes) are accepted too.
    assert make(tuple(("a", "b") if s is not None else None for s in sharding)) is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kernel_sharding": ("model",)}, ValueError, "kernel_sharding has 1 entries but"),
        ({"kernel_sharding": "model"}, TypeError, "kernel_sharding must be a tuple"),
        ({"bias_sharding": (3,)}, TypeError, "bias_sharding must be a tuple"),
    ],
)
def test_bad_shardings_are_refused_before_any_key_is_drawn(kwargs, error, message):
    rngs = Rngs(0)
    with pytest.raises(error, match=message):
        Linear(4, 8, rngs=rngs, **kwargs)
    assert int(rngs.default.count.value) == 0


def test_a_partition_spec_is_a_sharding_whose_left_out_dimensions_are_not_split():
    layer = Conv(3, 8, (3, 3), kernel_sharding=PartitionSpec(None, None, None, "model"), rngs=0)
    assert layer.kernel.sharding == (None, None, None, "model")
    linear = Linear(4, 8, kernel_sharding=PartitionSpec(("data", "model")), rngs=0)
    assert linear.kernel.sharding == (("data", "model"), None)
    assert pg.get_partition_spec(linear)["kernel"].value == PartitionSpec(("data", "model"), None)
    with pytest.raises(ValueError, match="kernel_sharding has 3 entries but the parameter has 2"):
        Linear(4, 8, kernel_sharding=PartitionSpec("a", None, None), rngs=0)
    with pytest.raises(TypeError, match=r"must be a tuple \(or PartitionSpec\)"):
        Linear(4, 8, kernel_sharding=PartitionSpec(PartitionSpec.UNCONSTRAINED, None), rngs=0)


def test_a_bad_bias_sharding_draws_not_even_the_scales_key():
    rngs = Rngs(0)
    with pytest.raises(ValueError, match="LayerNorm: bias_sharding has 2 entries"):
        LayerNorm(8, scale_sharding=("model",), bias_sharding=(None, "model"), rngs=rngs)
    assert int(rngs.default.count.value) == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda rngs: LSTMCell(3, 8, recurrent_kernel_sharding=("model",), rngs=rngs),
            "LSTMCell: recurrent_kernel_sharding has 1 entries",
        ),
        (
            lambda rngs: GRUCell(3, 8, bias_sharding=(None, "model"), rngs=rngs),
            "GRUCell: bias_sharding has 2 entries",
        ),
        (
            lambda rngs: MLP(4, 2, 8, 2, bias_sharding="model", rngs=rngs),
            "MLP: bias_sharding must be a tuple",
        ),
    ],
    ids=["lstm", "gru", "mlp"],
)
def test_a_bad_sharding_of_a_later_layer_draws_not_even_the_first_layers_keys(make, message):
    rngs = Rngs(0)
    with pytest.raises((TypeError, ValueError), match=message):
        make(rngs)
    assert int(rngs.default.count.value) == 0


def test_a_bad_out_sharding_draws_not_even_the_query_keys():
    rngs = Rngs(0)
    with pytest.raises(ValueError, match="MultiHeadAttention: out_kernel_sharding has 2"):
        MultiHeadAttention(2, 8, out_kernel_sharding=("model", None), rngs=rngs)
    assert int(rngs.default.count.value) == 0


# ----------------------------------------------------------------------------- create_sharded


class TwoLayers(Module):
    """Two Linear layers; `kernel` gives both kernels' sharding (FSDP: split a dimension)."""

    def __init__(self, rngs, kernel=None, hidden=None, out=None):
        self.hidden = Linear(16, 32, kernel_sharding=hidden or kernel, rngs=rngs)
        self.out = Linear(32, 4, kernel_sharding=out or kernel, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


@pytest.mark.multi_device
def test_create_sharded_splits_every_parameter_as_its_metadata_says():
    mesh = _mesh((2, 4), ("data", "model"))
    rngs = Rngs(0)
    model = pg.create_sharded(TwoLayers, mesh, rngs, hidden=("data", "model"), out=("model", None))
    kernel = model.hidden.kernel.value
    assert kernel.sharding.spec == PartitionSpec("data", "model")
    assert _shard_shapes(kernel) == {(8, 8)}  # 16x32 over 2x4 devices
    assert _shard_shapes(model.out.kernel.value) == {(8, 4)}
    assert model.hidden.bias.value.sharding.spec == PartitionSpec()  # no metadata: replicated
    # The same values, and the same random keys drawn, as built on one device.
    eager_rngs = Rngs(0)
    eager = TwoLayers(eager_rngs)
    np.testing.assert_array_equal(kernel, eager.hidden.kernel.value)
    assert int(rngs.default.count.value) == int(eager_rngs.default.count.value)


def test_create_sharded_names_what_is_wrong():
    mesh = _mesh((1,), ("batch",))
    with pytest.raises(ValueError, match=r"mesh axes \['data'\].*its axes: \['batch'\]"):
        pg.create_sharded(TwoLayers, mesh, Rngs(0), kernel=("data", None))
    with pytest.raises(TypeError, match="takes the function that builds the model first"):
        pg.create_sharded(mesh, TwoLayers)
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh"):
        pg.create_sharded(TwoLayers, ("data",), Rngs(0))


# ------------------------------------------------------------------ training on the mesh


def _loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@pg.jit
def _step(model, optimizer, x, y):
    loss, grads = pg.value_and_grad(_loss)(model, x, y)
    optimizer.update(model, grads)
    return loss


def _train(model, x, y, steps=4):
    optimizer = Optimizer(model, optax.adam(1e-2))
    return np.array([float(_step(model, optimizer, x, y)) for _ in range(steps)])


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype(np.float32)
    return x, (x[:, :4] * 2 - x[:, 4:8]).astype(np.float32)


@pytest.mark.multi_device
@pytest.mark.parametrize(
    ("mesh_shape", "kernel"),
    [((8,), None), ((8,), ("data", None))],
    ids=["data-parallel", "fully-sharded"],
)
def test_mlp_training_on_8_devices_matches_one_device(regression, mesh_shape, kernel):
    x, y = regression
    single = _train(TwoLayers(Rngs(0)), x, y)
    mesh = _mesh(mesh_shape, ("data",))
    batch = NamedSharding(mesh, PartitionSpec("data"))
    model = pg.create_sharded(TwoLayers, mesh, Rngs(0), kernel=kernel)
    sharded = _train(model, jax.device_put(x, batch), jax.device_put(y, batch))
    np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-6)
    assert sharded[-1] < sharded[0]
    if kernel is not None:  # each device holds an eighth of each kernel, after training too
        assert _shard_shapes(model.hidden.kernel.value) == {(2, 32)}
        assert _shard_shapes(model.out.kernel.value) == {(4, 4)}


# The kernels' shardings of each layout: (query/key/value, output projection, MLP up, down).
LAYOUTS = {
    "data-parallel": (None, None, None, None),
    # Fully sharded: every kernel split over the batch's axis, along one of its dimensions.
    "fully-sharded": (("data", None, None), (None, None, "data"), ("data", None), ("data", None)),
    # Megatron-style: the heads and the MLP's hidden units split over "model", and the
    # projections that gather them split on their input side.
    "tensor-parallel": (
        (None, "model", None),
        ("model", None, None),
        (None, "model"),
        ("model", None),
    ),
}


class Block(Module):
    """A pre-norm transformer block: causal self-attention and an MLP, each residual, with
    its kernels laid out as `layout` (a key of LAYOUTS) says."""

    def __init__(self, rngs, layout="data-parallel"):
        qkv, out, up, down = LAYOUTS[layout]
        self.norm1 = LayerNorm(16, rngs=rngs)
        self.attention = MultiHeadAttention(
            4, 16, qkv_kernel_sharding=qkv, out_kernel_sharding=out, rngs=rngs
        )
        self.norm2 = LayerNorm(16, rngs=rngs)
        self.up = Linear(16, 32, kernel_sharding=up, rngs=rngs)
        self.down = Linear(32, 16, kernel_sharding=down, rngs=rngs)

    def __call__(self, x):
        mask = make_causal_mask(jnp.ones(x.shape[:-1]))
        x = x + self.attention(self.norm1(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


@pytest.fixture(scope="module")
def sequences():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 8, 16)).astype(np.float32)
    return x, np.roll(x, 1, axis=-1)


@pytest.mark.multi_device
@pytest.mark.parametrize(
    ("layout", "mesh_shape", "query_shard"),
    [
        ("data-parallel", (8, 1), (16, 4, 4)),  # whole on every device
        ("fully-sharded", (8, 1), (2, 4, 4)),  # an eighth of the input features
        ("tensor-parallel", (2, 4), (16, 1, 4)),  # a head each
    ],
)
def test_transformer_block_training_on_8_devices_matches_one_device(
    sequences, layout, mesh_shape, query_shard
):
    x, y = sequences
    single = _train(Block(Rngs(0)), x, y)
    mesh = _mesh(mesh_shape, ("data", "model"))
    model = pg.create_sharded(Block, mesh, Rngs(0), layout)
    assert _shard_shapes(model.attention.query.kernel.value) == {query_shard}
    batch = NamedSharding(mesh, PartitionSpec("data"))
    sharded = _train(model, jax.device_put(x, batch), jax.device_put(y, batch))
    np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-6)
    assert sharded[-1] < sharded[0]
    assert _shard_shapes(model.attention.query.kernel.value) == {query_shard}  # after training


@pytest.mark.multi_device
def test_a_sharded_checkpoint_loads_onto_another_mesh_shape(tmp_path):
    path = tmp_path / "sharded.safetensors"
    wide = pg.create_sharded(
        TwoLayers, _mesh((2, 4), ("data", "model")), Rngs(0), kernel=("data", "model")
    )
    save_checkpoint(path, wide)
    tall = pg.create_sharded(
        TwoLayers, _mesh((4, 2), ("data", "model")), Rngs(1), kernel=("data", "model")
    )
    load_checkpoint(path, tall)
    kernel = tall.hidden.kernel.value
    np.testing.assert_array_equal(kernel, wide.hidden.kernel.value)
    assert _shard_shapes(kernel) == {(4, 16)}  # laid out on the new mesh: 16x32 over 4x2
    assert kernel.sharding.mesh.devices.shape == (4, 2)


# ------------------------------------------------------------------------- real accelerators


class Wide(Module):
    """One 2 GiB kernel (float32), split over every device."""

    def __init__(self, rngs):
        self.kernel = Linear(16384, 32768, use_bias=False, kernel_sharding=(None, "model"),
                             rngs=rngs).kernel  # fmt: skip


@pytest.mark.accelerator
def test_create_sharded_never_holds_the_whole_model_on_one_device():
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("model",))
    model = pg.create_sharded(Wide, mesh, Rngs(0))
    full = model.kernel.value.nbytes
    assert _shard_shapes(model.kernel.value) == {(16384, 32768 // len(devices))}
    for device in devices:  # the peak is since the process began: no step held it all
        assert device.memory_stats()["peak_bytes_in_use"] < full
