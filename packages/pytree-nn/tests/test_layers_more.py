"""Layer options and layers added for Flax NNX users: `*_metadata=`, `out_sharding` (as
metadata and on calls), `InstanceNorm`, `SimpleCell`, `OptimizedLSTMCell`, and PReLU's
`negative_slope_init=`. Numbers are checked against hand-written jax.numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_nn import (
    MLP,
    RNN,
    BatchNorm,
    Conv,
    ConvTranspose,
    Embedding,
    GroupNorm,
    GRUCell,
    InstanceNorm,
    LayerNorm,
    Linear,
    LSTMCell,
    Module,
    OptimizedLSTMCell,
    Optimizer,
    PReLU,
    RMSNorm,
    Rngs,
    SimpleCell,
)

P = PartitionSpec


def assert_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5)


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


# ------------------------------------------------------------------------- *_metadata=

# (layer factory, {argument: Variable path}) for every layer with metadata arguments.
LAYERS = {
    "Linear": (
        lambda **kw: Linear(3, 4, **kw, rngs=0),
        {"kernel_metadata": "kernel", "bias_metadata": "bias"},
    ),
    "MLP": (
        lambda **kw: MLP(3, 2, width_size=4, depth=1, **kw, rngs=0),
        {"kernel_metadata": "layers.1.kernel", "bias_metadata": "layers.0.bias"},
    ),
    "Conv": (
        lambda **kw: Conv(3, 4, (3,), **kw, rngs=0),
        {"kernel_metadata": "kernel", "bias_metadata": "bias"},
    ),
    "ConvTranspose": (
        lambda **kw: ConvTranspose(3, 4, (3,), **kw, rngs=0),
        {"kernel_metadata": "kernel", "bias_metadata": "bias"},
    ),
    "Embedding": (lambda **kw: Embedding(5, 4, **kw, rngs=0), {"embedding_metadata": "embedding"}),
    "LayerNorm": (
        lambda **kw: LayerNorm(4, **kw, rngs=0),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    "RMSNorm": (lambda **kw: RMSNorm(4, **kw, rngs=0), {"scale_metadata": "scale"}),
    "GroupNorm": (
        lambda **kw: GroupNorm(4, num_groups=2, **kw, rngs=0),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    "BatchNorm": (
        lambda **kw: BatchNorm(4, **kw, rngs=0),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    "InstanceNorm": (
        lambda **kw: InstanceNorm(4, **kw, rngs=0),
        {"scale_metadata": "scale", "bias_metadata": "bias"},
    ),
    "LSTMCell": (
        lambda **kw: LSTMCell(3, 4, **kw, rngs=0),
        {
            "kernel_metadata": "ig.kernel",
            "recurrent_kernel_metadata": "ho.kernel",
            "bias_metadata": "hf.bias",
        },
    ),
    "OptimizedLSTMCell": (
        lambda **kw: OptimizedLSTMCell(3, 4, **kw, rngs=0),
        {
            "kernel_metadata": "dense_i.kernel",
            "recurrent_kernel_metadata": "dense_h.kernel",
            "bias_metadata": "dense_h.bias",
        },
    ),
    "GRUCell": (
        lambda **kw: GRUCell(3, 4, **kw, rngs=0),
        {
            "kernel_metadata": "dense_i.kernel",
            "recurrent_kernel_metadata": "dense_h.kernel",
            "bias_metadata": "dense_i.bias",
        },
    ),
    "SimpleCell": (
        lambda **kw: SimpleCell(3, 4, **kw, rngs=0),
        {
            "kernel_metadata": "dense_i.kernel",
            "recurrent_kernel_metadata": "dense_h.kernel",
            "bias_metadata": "dense_i.bias",
        },
    ),
    "PReLU": (lambda **kw: PReLU(**kw), {"negative_slope_metadata": "negative_slope"}),
}


def at(model, path):
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


@pytest.mark.parametrize("name", LAYERS)
def test_metadata_arguments_reach_the_params(name):
    make, arguments = LAYERS[name]
    plain = make()
    tags = {argument: {"tag": argument, "group": 3} for argument in arguments}
    layer = make(**tags)
    for argument, path in arguments.items():
        param = at(layer, path)
        assert param.tag == argument and param.get_metadata("group") == 3
        assert param.get_metadata() == {"tag": argument, "group": 3}
        # The values are those the layer draws without metadata: no key is drawn for it.
        np.testing.assert_array_equal(param.value, at(plain, path).value)
        assert at(plain, path).get_metadata() == {}


@pytest.mark.parametrize("name", LAYERS)
def test_bad_metadata_is_refused_naming_the_argument(name):
    make, arguments = LAYERS[name]
    argument = next(iter(arguments))
    with pytest.raises(TypeError, match=f"{argument} must be a mapping"):
        make(**{argument: [("tag", 1)]})
    with pytest.raises(ValueError, match=f"{argument} has the key '_private'"):
        make(**{argument: {"_private": 1}})
    with pytest.raises(ValueError, match=f"{argument} has the key 'value'"):
        make(**{argument: {"value": 1}})
    with pytest.raises(TypeError, match=rf"{argument}\['tag'\] must be hashable"):
        make(**{argument: {"tag": [1, 2]}})


def test_metadata_sharding_is_the_sharding_argument_under_either_name():
    by_argument = Linear(3, 4, kernel_sharding=(None, "model"), rngs=0)
    for key in ("sharding", "out_sharding"):
        layer = Linear(3, 4, kernel_metadata={key: P(None, "model"), "tag": "q"}, rngs=0)
        assert layer.kernel.get_metadata() == {"sharding": (None, "model"), "tag": "q"}
        assert layer.kernel.out_sharding == layer.kernel.sharding == (None, "model")
        np.testing.assert_array_equal(layer.kernel.value, by_argument.kernel.value)
    specs = pg.get_partition_spec(Linear(3, 4, bias_metadata={"out_sharding": ("m",)}, rngs=0))
    assert specs["bias"].value == P("m")
    # A partial PartitionSpec is filled with None, as for `kernel_sharding`.
    assert Conv(3, 4, (3,), kernel_metadata={"sharding": P("a")}, rngs=0).kernel.sharding == (
        "a",
        None,
        None,
    )


def test_sharding_given_twice_or_of_the_wrong_rank_is_refused_and_draws_no_key():
    rngs = Rngs(0)
    count = rngs.params.count.value
    with pytest.raises(ValueError, match=r"more than once \(kernel_sharding, kernel_metadata"):
        Linear(
            3, 4, kernel_sharding=(None, "m"), kernel_metadata={"sharding": (None, "m")}, rngs=rngs
        )
    with pytest.raises(ValueError, match="more than once"):
        LayerNorm(4, scale_metadata={"sharding": ("m",), "out_sharding": ("m",)}, rngs=rngs)
    with pytest.raises(ValueError, match=r"kernel_metadata\['out_sharding'\] has 1 entries"):
        Linear(3, 4, kernel_metadata={"out_sharding": ("m",)}, rngs=rngs)
    with pytest.raises(TypeError, match=r"bias_metadata\['sharding'\] must be a tuple"):
        Linear(3, 4, bias_metadata={"sharding": 3}, rngs=rngs)
    with pytest.raises(ValueError, match="recurrent_kernel_metadata has the key 3"):
        LSTMCell(3, 4, recurrent_kernel_metadata={3: "x"}, rngs=rngs)
    assert rngs.params.count.value == count


def test_metadata_survives_split_merge_jit_and_the_optimizer():
    class Tied(Module):
        def __init__(self):
            self.layer = Linear(2, 2, kernel_metadata={"tag": "shared"}, rngs=0)
            self.again = self.layer

        def __call__(self, x):
            return self.again(self.layer(x))

    model = Tied()
    graphdef, state = pg.split(model)
    merged = pg.merge(graphdef, state)
    assert merged.layer is merged.again and merged.layer.kernel.tag == "shared"

    @pg.jit
    def step(model, optimizer, x):
        grads = pg.grad(lambda m: jnp.sum(m(x) ** 2))(model)
        optimizer.update(model, grads)

    optimizer = Optimizer(model, optax.sgd(0.1))
    before = model.layer.kernel.value
    step(model, optimizer, jnp.ones((3, 2)))
    assert model.layer is model.again and model.layer.kernel.tag == "shared"
    assert not np.allclose(before, model.layer.kernel.value)


def test_prelu_negative_slope_init_is_init_alpha_under_nnx_name():
    x = jnp.array([-2.0, 3.0])
    assert PReLU(negative_slope_init=0.1)(x).tolist() == pytest.approx([-0.2, 3.0])
    assert PReLU()(x).tolist() == [-0.5, 3.0]  # our default slope: 0.25
    layer = PReLU(negative_slope_init=0.5, num_parameters=2)
    np.testing.assert_array_equal(layer.negative_slope.value, [0.5, 0.5])
    with pytest.raises(TypeError, match=r"init_alpha=0\.3 and negative_slope_init=0\.1"):
        PReLU(0.3, negative_slope_init=0.1)
    with pytest.raises(TypeError, match="must be a number or a numeric array"):
        PReLU(negative_slope_init="a")
    sharded = PReLU(jnp.zeros(3), negative_slope_metadata={"out_sharding": ("m",)})
    assert sharded.negative_slope.sharding == ("m",)


# ----------------------------------------------------------------- out_sharding on calls


def explicit_mesh():
    devices = np.array(jax.devices()[:8])
    return jax.sharding.Mesh(devices, ("data",), axis_types=(AxisType.Explicit,))


@pytest.mark.multi_device
def test_out_sharding_lays_out_the_outputs_of_linear_conv_and_embedding():
    mesh = explicit_mesh()
    linear = Linear(4, 16, rngs=0)
    to_scalar = Linear(4, "scalar", rngs=1)
    conv = Conv(4, 16, (3,), rngs=2)
    embed = Embedding(24, 16, rngs=3)
    x = normal(0, (8, 6, 4))
    tokens = jnp.arange(48).reshape(8, 6) % 24
    expected = {
        "linear": x @ linear.kernel.value + linear.bias.value,
        "scalar": (x @ to_scalar.kernel.value + to_scalar.bias.value)[..., 0],
        "conv": conv(x),
        "conv_2_batch": conv(x.reshape(2, 4, 6, 4)),
        "lookup": embed.embedding.value[tokens],
        "attend": x @ linear.kernel.value @ embed.embedding.value.T,
    }
    wanted = {
        "linear": P(None, None, "data"),
        "scalar": P(None, None),  # gathered: by default it would stay split on the batch
        "conv": P(None, None, "data"),
        "conv_2_batch": P(None, None, None, "data"),
        "lookup": P(None, None, "data"),
        "attend": P(None, None, "data"),
    }

    @jax.jit
    def run(x, x4, tokens):
        h = linear(x)
        return {
            "linear": linear(x, out_sharding=wanted["linear"]),
            "scalar": to_scalar(x, out_sharding=wanted["scalar"]),
            "conv": conv(x, out_sharding=wanted["conv"]),
            "conv_2_batch": conv(x4, out_sharding=wanted["conv_2_batch"]),
            "lookup": embed(tokens, out_sharding=wanted["lookup"]),
            "attend": embed.attend(h, out_sharding=wanted["attend"]),
        }

    with jax.set_mesh(mesh):
        x_sharded = jax.sharding.reshard(x, P("data"))
        tokens_sharded = jax.sharding.reshard(tokens, P("data"))
        # Two batch axes are merged into one by a reshape: of a replicated input here, as
        # reshaping an input split on its batch axis is not something JAX does on its own.
        x4 = jax.sharding.reshard(x.reshape(2, 4, 6, 4), P())
        got = run(x_sharded, x4, tokens_sharded)
        without = linear(x_sharded)
    for name, value in got.items():
        assert value.sharding == NamedSharding(mesh, wanted[name]), name
        assert_close(value, expected[name], atol=1e-4)
    # Without out_sharding the output follows the input (split on its batch axis).
    assert without.sharding.spec == P("data", None, None)


# ------------------------------------------------------------------------- InstanceNorm


def instance_norm_reference(x, scale, bias, reduction, feature_axes, epsilon=1e-6):
    mean = jnp.mean(x, reduction, keepdims=True)
    var = jnp.mean((x - mean) ** 2, reduction, keepdims=True)
    shape = [x.shape[a] if a in feature_axes else 1 for a in range(x.ndim)]
    y = (x - mean) / jnp.sqrt(var + epsilon)
    if scale is not None:
        y = y * scale.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def test_instance_norm_matches_hand_written_statistics():
    x = normal(0, (2, 5, 6, 3)) * 3 + 1
    norm = InstanceNorm(3, rngs=0)
    norm.scale.value = jnp.array([1.0, 2.0, -0.5])
    norm.bias.value = jnp.array([0.0, 0.3, 1.0])
    reference = instance_norm_reference(x, norm.scale.value, norm.bias.value, (1, 2), (3,))
    assert_close(norm(x), reference)
    # Each example and channel on its own: changing another example changes nothing.
    assert_close(norm(x.at[1].set(100.0))[0], reference[0])

    # Several feature axes: one (num_features,) scale over their product.
    wide = InstanceNorm(18, feature_axes=(2, 3), use_fast_variance=False, rngs=0)
    wide.scale.value = jnp.linspace(0.5, 2.0, 18)
    reference = instance_norm_reference(x, wide.scale.value, wide.bias.value, (1,), (2, 3))
    assert_close(wide(x), reference)

    bare = InstanceNorm(5, feature_axes=1, use_bias=False, use_scale=False, epsilon=0.1, rngs=0)
    assert bare.scale is None and bare.bias is None
    assert_close(bare(x), instance_norm_reference(x, None, None, (2, 3), (1,), epsilon=0.1))
    # It is LayerNorm over the non-batch, non-feature axes.
    layer_norm = LayerNorm(3, reduction_axes=(1, 2), feature_axes=-1, rngs=0)
    assert_close(InstanceNorm(3, rngs=0)(x), layer_norm(x))


def test_instance_norm_dtypes():
    x = normal(1, (2, 4, 3)).astype(jnp.bfloat16)
    norm = InstanceNorm(3, rngs=0)
    assert norm(x).dtype == jnp.float32  # promoted with the float32 parameters
    half = InstanceNorm(3, param_dtype=jnp.bfloat16, rngs=0)
    y = half(x)
    assert y.dtype == jnp.bfloat16
    reference = instance_norm_reference(x.astype(jnp.float32), None, None, (1,), (2,))
    assert_close(y.astype(jnp.float32), reference, atol=3e-2)
    assert InstanceNorm(3, dtype=jnp.float16, rngs=0)(x).dtype == jnp.float16


def test_instance_norm_errors():
    norm = InstanceNorm(3, rngs=0)
    with pytest.raises(ValueError, match="has 4 features along feature_axes=-1"):
        norm(jnp.ones((2, 5, 4)))
    with pytest.raises(ValueError, match=r"includes the leading axis .* the batch axis"):
        InstanceNorm(2, feature_axes=(0, 2), rngs=0)(jnp.ones((1, 5, 2)))
    with pytest.raises(ValueError, match="includes the leading axis"):
        norm(jnp.ones(3))
    with pytest.raises(TypeError, match="feature_axes must be an int or a tuple"):
        InstanceNorm(3, feature_axes="c", rngs=0)
    with pytest.raises(ValueError, match=r"epsilon must be a number >= 0\.0"):
        InstanceNorm(3, epsilon=-1.0, rngs=0)
    with pytest.raises(ValueError, match="num_features must be a positive int"):
        InstanceNorm(0, rngs=0)


def test_a_shared_instance_norm_trains_once_and_stays_shared():
    class Model(Module):
        def __init__(self):
            self.norm = InstanceNorm(3, rngs=0)
            self.again = self.norm

        def __call__(self, x):
            return self.again(self.norm(x) * 2.0)

    model = Model()
    optimizer = Optimizer(model, optax.sgd(0.1))
    x = normal(2, (2, 4, 3))

    @pg.jit
    def step(model, optimizer):
        loss, grads = pg.value_and_grad(lambda m: jnp.sum(m(x) * jnp.arange(3.0)))(model)
        optimizer.update(model, grads)
        return loss

    step(model, optimizer)
    assert model.norm is model.again
    assert list(pg.state(model).flat_state()) == [("again", "bias"), ("again", "scale")]
    assert not np.allclose(model.norm.bias.value, 0.0)


# ---------------------------------------------------------------------------- SimpleCell


def simple_step(cell, h, x, residual=False):
    pre = x @ cell.dense_i.kernel.value + cell.dense_i.bias.value + h @ cell.dense_h.kernel.value
    return jnp.tanh(pre + h if residual else pre)


@pytest.mark.parametrize("residual", [False, True])
def test_simple_cell_matches_the_equation(residual):
    cell = SimpleCell(3, 4, residual=residual, bias_init=jax.nn.initializers.normal(1.0), rngs=0)
    for batch in [(), (2,), (2, 3)]:
        x = normal(1, (*batch, 3))
        h = normal(2, (*batch, 4))
        new_h, y = cell(h, x)
        assert_close(new_h, simple_step(cell, h, x, residual))
        assert y is new_h or np.array_equal(y, new_h)
    assert cell.dense_i.kernel.value.shape == (3, 4)
    assert cell.dense_h.kernel.value.shape == (4, 4) and cell.dense_h.bias is None
    # The recurrent kernel is drawn first (as in Flax NNX), orthogonal.
    assert_close(cell.dense_h.kernel.value @ cell.dense_h.kernel.value.T, jnp.eye(4))


def test_simple_cell_in_rnn_equals_a_loop():
    cell = SimpleCell(3, 5, activation_fn=jax.nn.relu, rngs=1)
    xs = normal(3, (2, 7, 3))
    carry, ys = RNN(cell, return_carry=True)(xs)
    h = jnp.zeros((2, 5))
    outputs = []
    for t in range(7):
        h = jax.nn.relu(
            xs[:, t] @ cell.dense_i.kernel.value
            + cell.dense_i.bias.value
            + h @ cell.dense_h.kernel.value
        )
        outputs.append(h)
    assert_close(ys, jnp.stack(outputs, 1))
    assert_close(carry, h)


def test_simple_cell_dtypes_and_errors():
    cell = SimpleCell(3, 4, rngs=0)
    h = cell.initialize_carry((2, 3))
    assert h.shape == (2, 4) and h.dtype == jnp.float32
    new_h, y = cell(h.astype(jnp.bfloat16), jnp.ones((2, 3), jnp.bfloat16))
    assert new_h.dtype == jnp.bfloat16 and y.dtype == jnp.float32
    with pytest.raises(TypeError, match="SimpleCell: the carry must be one array h"):
        cell((h,), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="SimpleCell: the carry's h has shape"):
        cell(jnp.zeros((3, 4)), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="in_features=3"):
        cell(h, jnp.ones((2, 5)))
    with pytest.raises(TypeError, match="residual must be True or False"):
        SimpleCell(3, 4, residual=1, rngs=0)
    with pytest.raises(ValueError, match="hidden_features must be a positive int"):
        SimpleCell(3, 0, rngs=0)


# --------------------------------------------------------------------- OptimizedLSTMCell


def fused_from(lstm):
    """An OptimizedLSTMCell holding `lstm`'s weights, gates side by side [i | f | g | o]."""
    fused = OptimizedLSTMCell(lstm.in_features, lstm.hidden_features, rngs=99)
    fused.dense_i.kernel.value = jnp.concatenate(
        [lstm.ii.kernel.value, lstm.if_.kernel.value, lstm.ig.kernel.value, lstm.io.kernel.value],
        -1,
    )
    fused.dense_h.kernel.value = jnp.concatenate(
        [lstm.hi.kernel.value, lstm.hf.kernel.value, lstm.hg.kernel.value, lstm.ho.kernel.value], -1
    )
    fused.dense_h.bias.value = jnp.concatenate(
        [lstm.hi.bias.value, lstm.hf.bias.value, lstm.hg.bias.value, lstm.ho.bias.value], -1
    )
    return fused


def test_optimized_lstm_cell_gives_lstm_cells_numbers_with_the_same_weights():
    lstm = LSTMCell(3, 4, bias_init=jax.nn.initializers.normal(1.0), rngs=0)
    fused = fused_from(lstm)
    for batch in [(), (2,), (2, 3)]:
        x = normal(1, (*batch, 3))
        carry = (normal(2, (*batch, 4)), normal(3, (*batch, 4)))
        assert_close(fused(carry, x), lstm(carry, x))
    # And the step by hand, on the fused weights.
    x, (c, h) = normal(4, (2, 3)), (normal(5, (2, 4)), normal(6, (2, 4)))
    y = x @ fused.dense_i.kernel.value + h @ fused.dense_h.kernel.value + fused.dense_h.bias.value
    i, f, g, o = jnp.split(y, 4, -1)
    new_c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    new_h = jax.nn.sigmoid(o) * jnp.tanh(new_c)
    assert_close(fused((c, h), x), ((new_c, new_h), new_h))

    # Over sequences, and the gradients with respect to the inputs.
    xs = normal(7, (2, 6, 3))
    assert_close(RNN(fused)(xs), RNN(lstm)(xs))
    grad = jax.grad(lambda xs, cell: jnp.sum(RNN(cell)(xs) ** 2))
    assert_close(grad(xs, fused), grad(xs, lstm))


def test_optimized_lstm_cell_layout_dtypes_and_errors():
    cell = OptimizedLSTMCell(3, 4, rngs=0)
    assert cell.dense_i.bias is None and cell.dense_h.bias.value.shape == (16,)
    assert_close(cell.dense_h.kernel.value @ cell.dense_h.kernel.value.T, jnp.eye(4))
    c, h = cell.initialize_carry((5, 3))
    assert c.shape == h.shape == (5, 4)
    (new_c, new_h), _ = cell((c.astype(jnp.bfloat16), h), jnp.ones((5, 3), jnp.bfloat16))
    assert new_c.dtype == jnp.bfloat16 and new_h.dtype == jnp.float32
    with pytest.raises(TypeError, match="OptimizedLSTMCell: the carry must be a pair"):
        cell(c, jnp.ones((5, 3)))
    with pytest.raises(ValueError, match="OptimizedLSTMCell: the carry's c has shape"):
        cell((jnp.zeros((4, 4)), h), jnp.ones((5, 3)))
    with pytest.raises(ValueError, match="in_features must be a positive int"):
        OptimizedLSTMCell(0, 4, rngs=0)


def test_a_shared_cell_stays_shared_and_trains():
    class TwoRuns(Module):
        def __init__(self):
            self.cell = OptimizedLSTMCell(2, 2, rngs=0)
            self.first = RNN(self.cell)
            self.second = RNN(self.cell)

        def __call__(self, x):
            return self.second(self.first(x))

    model = TwoRuns()
    graphdef, state = pg.split(model)
    merged = pg.merge(graphdef, state)
    assert merged.first.cell is merged.second.cell is merged.cell
    optimizer = Optimizer(model, optax.adam(0.05))
    xs = normal(0, (3, 5, 2))

    @pg.jit
    def step(model, optimizer):
        loss, grads = pg.value_and_grad(lambda m: jnp.mean((m(xs) - 0.5) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(20)]
    assert losses[-1] < losses[0]
    assert model.first.cell is model.second.cell is model.cell
