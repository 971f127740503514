"""`MLP(scan=True)`: the width -> width layers stacked into one `Linear` and run with
`jax.lax.scan`; the same function as `scan=False`, a traced program whose size does not
depend on depth, and a model like any other for split/merge, Optimizer, checkpoints and
tabulate."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_nn import MLP, Linear, Optimizer, Rngs, load_checkpoint, save_checkpoint, tabulate


def _unstacked(mlp):
    """The layers of a scanned MLP as the separate layers of `scan=False`, as arrays:
    [(kernel, bias or None), ...]."""
    first, stacked, last = mlp.layers
    hidden = [
        (stacked.kernel.value[i], None if stacked.bias is None else stacked.bias.value[i])
        for i in range(stacked.kernel.value.shape[0])
    ]
    return [_arrays(first), *hidden, _arrays(last)]


def _arrays(layer):
    return layer.kernel.value, None if layer.bias is None else layer.bias.value


def _assert_same_layers(scanned, plain):
    unstacked = _unstacked(scanned) if scanned.depth >= 1 else list(map(_arrays, scanned.layers))
    assert len(unstacked) == len(plain.layers)
    for (kernel, bias), layer in zip(unstacked, plain.layers, strict=True):
        np.testing.assert_array_equal(kernel, layer.kernel.value)
        if bias is None:
            assert layer.bias is None
        else:
            np.testing.assert_array_equal(bias, layer.bias.value)


CONFIGS = [
    {},
    {"activation": jnp.tanh, "final_activation": jax.nn.sigmoid},
    {"use_bias": False},
    {"use_bias": False, "use_final_bias": False, "activation": jax.nn.gelu},
]


@pytest.mark.parametrize("depth", [0, 1, 2, 4])
@pytest.mark.parametrize("config", CONFIGS, ids=["default", "tanh-sigmoid", "no-bias", "none"])
def test_same_parameters_outputs_and_gradients_as_scan_false(depth, config):
    plain_rngs, scanned_rngs = Rngs(0), Rngs(0)
    plain = MLP(3, 2, 5, depth, **config, rngs=plain_rngs)
    scanned = MLP(3, 2, 5, depth, **config, scan=True, rngs=scanned_rngs)
    # The same keys drawn, in the same order: the same parameters, stacked.
    assert int(plain_rngs.default.count.value) == int(scanned_rngs.default.count.value)
    _assert_same_layers(scanned, plain)

    x = jax.random.normal(jax.random.key(1), (4, 3))
    np.testing.assert_allclose(scanned(x), plain(x), rtol=1e-6, atol=1e-6)

    def loss(model):
        return jnp.sum(model(x) ** 2)

    plain_grads = jax.grad(loss)(plain)
    scanned_grads = jax.grad(loss)(scanned)
    if depth == 0:
        np.testing.assert_allclose(
            scanned_grads.layers[0].kernel.value, plain_grads.layers[0].kernel.value, rtol=1e-6
        )
        return
    for (kernel, bias), layer in zip(_unstacked(scanned_grads), plain_grads.layers, strict=True):
        np.testing.assert_allclose(kernel, layer.kernel.value, rtol=1e-5, atol=1e-6)
        if bias is not None:
            np.testing.assert_allclose(bias, layer.bias.value, rtol=1e-5, atol=1e-6)


def test_weights_copied_into_the_stack_give_the_unscanned_function():
    plain = MLP(4, 3, 6, 5, activation=jax.nn.silu, rngs=0)
    scanned = MLP(4, 3, 6, 5, activation=jax.nn.silu, scan=True, rngs=1)  # other weights
    x = jax.random.normal(jax.random.key(2), (7, 4))
    assert not np.allclose(scanned(x), plain(x))
    first, stacked, last = scanned.layers
    first.kernel.value, first.bias.value = _arrays(plain.layers[0])
    last.kernel.value, last.bias.value = _arrays(plain.layers[-1])
    stacked.kernel.value = jnp.stack([layer.kernel.value for layer in plain.layers[1:-1]])
    stacked.bias.value = jnp.stack([layer.bias.value for layer in plain.layers[1:-1]])
    np.testing.assert_allclose(scanned(x), plain(x), rtol=1e-6, atol=1e-6)


def test_structure_first_stacked_last_as_equinox():
    mlp = MLP(3, 2, 8, 4, scan=True, rngs=0)
    assert mlp.scan is True
    first, stacked, last = mlp.layers
    assert all(type(layer) is Linear for layer in mlp.layers)
    assert first.kernel.value.shape == (3, 8)
    assert stacked.kernel.value.shape == (3, 8, 8) and stacked.bias.value.shape == (3, 8)
    assert (stacked.in_features, stacked.out_features) == (8, 8)
    assert last.kernel.value.shape == (8, 2)


def test_depth_one_has_an_empty_stack_and_depth_zero_nothing_to_stack():
    # depth=1: (first, a stack of no layers, last), as Equinox; the scan runs no step.
    mlp = MLP(3, 2, 8, 1, scan=True, rngs=0)
    assert [layer.kernel.value.shape for layer in mlp.layers] == [(3, 8), (0, 8, 8), (8, 2)]
    assert mlp.layers[1].bias.value.shape == (0, 8)
    x = jnp.ones((5, 3))
    np.testing.assert_allclose(mlp(x), MLP(3, 2, 8, 1, rngs=0)(x), rtol=1e-6)
    # depth=0: one Linear, the same as scan=False.
    single = MLP(3, 2, 8, 0, scan=True, rngs=0)
    assert len(single.layers) == 1 and single.layers[0].kernel.value.shape == (3, 2)
    np.testing.assert_array_equal(single(x), MLP(3, 2, 8, 0, rngs=0)(x))


def test_a_deep_scanned_mlp_matches_the_unscanned_one():
    x = jax.random.normal(jax.random.key(0), (2, 3))
    plain = MLP(3, 1, 4, 120, activation=jnp.tanh, rngs=0)
    scanned = MLP(3, 1, 4, 120, activation=jnp.tanh, scan=True, rngs=0)
    assert scanned.layers[1].kernel.value.shape == (119, 4, 4)
    np.testing.assert_allclose(scanned(x), plain(x), rtol=1e-5, atol=1e-6)


def _equations(mlp):
    return len(jax.make_jaxpr(lambda model, x: model(x))(mlp, jnp.ones((2, 3))).jaxpr.eqns)


def test_the_traced_program_does_not_grow_with_depth():
    assert _equations(MLP(3, 1, 4, 2, scan=True, rngs=0)) == _equations(
        MLP(3, 1, 4, 50, scan=True, rngs=0)
    )
    shallow, deep = _equations(MLP(3, 1, 4, 2, rngs=0)), _equations(MLP(3, 1, 4, 50, rngs=0))
    assert deep > 10 * shallow


@pytest.mark.parametrize(
    ("dtype", "param_dtype"),
    [(None, jnp.bfloat16), (jnp.bfloat16, jnp.float32), (jnp.float16, jnp.float16)],
)
def test_dtype_and_param_dtype(dtype, param_dtype):
    plain = MLP(3, 2, 8, 3, dtype=dtype, param_dtype=param_dtype, rngs=0)
    scanned = MLP(3, 2, 8, 3, dtype=dtype, param_dtype=param_dtype, scan=True, rngs=0)
    assert scanned.layers[1].kernel.value.dtype == param_dtype
    x = jnp.ones((4, 3), jnp.float32)
    out, expected = scanned(x), plain(x)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(expected, np.float32))


def test_the_stacked_kernel_gets_none_for_the_layer_axis():
    mlp = MLP(
        3, 2, 8, 3, kernel_sharding=("data", None), bias_sharding=("model",), scan=True, rngs=0
    )
    first, stacked, last = mlp.layers
    assert first.kernel.metadata["sharding"] == ("data", None)
    assert stacked.kernel.metadata["sharding"] == (None, "data", None)
    assert stacked.bias.metadata["sharding"] == (None, "model")
    assert last.bias.metadata["sharding"] == ("model",)
    # Without shardings, no metadata, as for the unstacked layers.
    assert "sharding" not in MLP(3, 2, 8, 3, scan=True, rngs=0).layers[1].kernel.metadata
    # The empty stack of depth=1 gets it too.
    assert MLP(3, 2, 8, 1, kernel_sharding=PartitionSpec(None, "m"), scan=True, rngs=0).layers[
        1
    ].kernel.metadata["sharding"] == (None, None, "m")


@pytest.mark.multi_device
def test_create_sharded_splits_the_stacked_kernel_per_layer():
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rngs = Rngs(0)

    def make(rngs):
        return MLP(16, 4, 32, 5, kernel_sharding=("data", None), scan=True, rngs=rngs)

    model = pg.create_sharded(make, mesh, rngs)
    kernel = model.layers[1].kernel.value
    assert kernel.sharding.is_equivalent_to(
        NamedSharding(mesh, PartitionSpec(None, "data", None)), kernel.ndim
    )
    assert {shard.data.shape for shard in kernel.addressable_shards} == {(4, 4, 32)}
    # The same values, and the same keys drawn, as built eagerly (and as scan=False).
    eager_rngs = Rngs(0)
    np.testing.assert_array_equal(kernel, make(eager_rngs).layers[1].kernel.value)
    assert int(rngs.default.count.value) == int(eager_rngs.default.count.value)
    x = jnp.ones((8, 16))
    np.testing.assert_allclose(model(x), MLP(16, 4, 32, 5, rngs=0)(x), rtol=1e-5, atol=1e-6)


def test_scan_must_be_a_bool():
    with pytest.raises(TypeError, match="MLP: scan must be True or False, got 'yes'"):
        MLP(3, 2, 8, 3, scan="yes", rngs=0)


@pytest.mark.parametrize("depth", [1, 4])
def test_split_and_merge(depth):
    mlp = MLP(3, 2, 8, depth, scan=True, rngs=0)
    graphdef, state = pg.split(mlp)
    flat = pg.state(mlp).to_pure_dict()
    assert flat["layers"][1]["kernel"].shape == (depth - 1, 8, 8)
    copy = pg.merge(graphdef, state)
    assert copy is not mlp and copy.scan and len(copy.layers) == 3
    x = jnp.ones((5, 3))
    np.testing.assert_array_equal(copy(x), mlp(x))

    @pg.jit
    def apply(model, x):
        return model(x)

    np.testing.assert_allclose(apply(mlp, x), mlp(x), rtol=1e-6)


def _loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@pg.jit
def _train_step(model, optimizer, x, y):
    loss, grads = pg.value_and_grad(_loss)(model, x, y)
    optimizer.update(model, grads)
    return loss


def test_optimizer_trains_the_scanned_mlp_as_the_unscanned_one():
    x = jax.random.normal(jax.random.key(0), (32, 3))
    y = jnp.sin(x[:, :1]) + x[:, 1:2]
    losses = {}
    models = {}
    for scan in (False, True):
        model = MLP(3, 1, 16, 4, activation=jnp.tanh, scan=scan, rngs=0)
        optimizer = Optimizer(model, optax.adam(1e-2))
        losses[scan] = np.array([float(_train_step(model, optimizer, x, y)) for _ in range(25)])
        models[scan] = model
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4, atol=1e-6)
    assert losses[True][-1] < 0.5 * losses[True][0]
    for (kernel, _), layer in zip(_unstacked(models[True]), models[False].layers, strict=True):
        np.testing.assert_allclose(kernel, layer.kernel.value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("depth", [1, 5])
def test_checkpoint_round_trip(tmp_path, depth):
    saved = MLP(3, 2, 8, depth, scan=True, rngs=0)
    path = tmp_path / "mlp.safetensors"
    save_checkpoint(path, saved)
    model = MLP(3, 2, 8, depth, scan=True, rngs=1)
    assert load_checkpoint(path, model) is model
    _assert_same_layers(model, MLP(3, 2, 8, depth, rngs=0))
    x = jnp.ones((4, 3))
    np.testing.assert_array_equal(model(x), saved(x))
    # An unscanned model has other paths and shapes: the checkpoint does not fit it.
    unscanned = MLP(3, 2, 8, depth, rngs=1)
    with pytest.raises(ValueError):
        load_checkpoint(path, unscanned)
    np.testing.assert_array_equal(
        unscanned.layers[0].kernel.value, MLP(3, 2, 8, depth, rngs=1).layers[0].kernel.value
    )


def test_tabulate_shows_the_stacked_layer():
    table = tabulate(MLP(2, 1, 8, 4, scan=True, rngs=0), jnp.ones((5, 2)))
    assert "| .layers[1] | Linear |" in table
    assert "216 (864 B): bias f32[3,8], kernel f32[3,8,8]" in table
    # As many parameters as the unscanned MLP.
    plain = tabulate(MLP(2, 1, 8, 4, rngs=0))
    assert "Total: 249 (996 B)" in table and "Total: 249 (996 B)" in plain
