"""LayerNorm, RMSNorm, GroupNorm and BatchNorm against references written with jax.numpy."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph
from pytree_graph import BatchStat, Param, StateAxes
from pytree_nn import (
    BatchNorm,
    GroupNorm,
    LayerNorm,
    Linear,
    Module,
    RMSNorm,
    Rngs,
    Sequential,
    initializers,
)


def random(shape, seed, dtype=jnp.float32):
    """An input with a nonzero mean and a spread well above 1 (NumPy: nothing to compile)."""
    return jnp.asarray(3.0 * np.random.default_rng(seed).normal(size=shape) + 1.5, dtype)


def randomize(layer, seed=100):
    """Give the layer's scale and bias random values, so that they are tested too."""
    for i, name in enumerate(("scale", "bias")):
        variable = getattr(layer, name, None)
        if variable is not None:
            variable.value = random(variable.value.shape, seed + i, variable.value.dtype)
    return layer


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), tol, tol)


# References: plain jax.numpy, two-pass variance (jnp.var), in float32; each compiled once
# per shape, as eager op-by-op dispatch would dominate the test time.


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def ref_layer_norm(x, scale, bias, axes, epsilon, feature_shape=None):
    x = jnp.asarray(x, jnp.float32)
    y = (x - x.mean(axes, keepdims=True)) / jnp.sqrt(x.var(axes, keepdims=True) + epsilon)
    shape = feature_shape if feature_shape is not None else x.shape[-1:]
    if scale is not None:
        y = y * scale.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


@functools.partial(jax.jit, static_argnums=(2, 3))
def ref_rms_norm(x, scale, axes, epsilon):
    x = jnp.asarray(x, jnp.float32)
    y = x / jnp.sqrt((x * x).mean(axes, keepdims=True) + epsilon)
    return y if scale is None else y * scale


@functools.partial(jax.jit, static_argnums=(3, 4))
def ref_group_norm(x, scale, bias, num_groups, epsilon):
    """Normalize each group of channels separately, over every axis but the first."""
    x = jnp.asarray(x, jnp.float32)
    size = x.shape[-1] // num_groups
    axes = tuple(range(1, x.ndim)) if x.ndim > 1 else (0,)
    pieces = []
    for g in range(num_groups):
        part = x[..., g * size : (g + 1) * size]
        mean = part.mean(axes, keepdims=True)
        var = part.var(axes, keepdims=True)
        pieces.append((part - mean) / jnp.sqrt(var + epsilon))
    y = jnp.concatenate(pieces, axis=-1)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y


@functools.partial(jax.jit, static_argnums=1)
def ref_batch_stats(x, axis):
    """Per-feature mean and (biased) variance over every axis but `axis`."""
    flat = jnp.moveaxis(jnp.asarray(x, jnp.float32), axis, -1).reshape(-1, x.shape[axis])
    return flat.mean(0), flat.var(0)


@functools.partial(jax.jit, static_argnums=(5, 6))
def ref_batch_norm(x, mean, var, scale, bias, axis, epsilon):
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    y = (jnp.asarray(x, jnp.float32) - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + epsilon)
    if scale is not None:
        y = y * scale.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def values(layer, *names):
    return [None if getattr(layer, n) is None else getattr(layer, n).value for n in names]


# LayerNorm


@pytest.mark.parametrize(
    ("shape", "fast"), [((5,), True), ((3, 5), True), ((2, 3, 5), True), ((2, 3, 5), False)]
)
def test_layer_norm_matches_reference(shape, fast):
    layer = randomize(LayerNorm(5, use_fast_variance=fast, rngs=0))
    x = random(shape, 1)
    y = layer(x)
    assert y.shape == shape and y.dtype == jnp.float32
    # E[x^2] - E[x]^2 in float32 loses a few digits when the mean is large.
    close(y, ref_layer_norm(x, *values(layer, "scale", "bias"), -1, 1e-6), 1e-4 if fast else 1e-5)


def test_layer_norm_parameters_and_defaults():
    layer = LayerNorm(3, rngs=Rngs(0))
    assert isinstance(layer.scale, Param) and isinstance(layer.bias, Param)
    assert layer.scale.value.tolist() == [1.0, 1.0, 1.0]
    assert layer.bias.value.tolist() == [0.0, 0.0, 0.0]
    assert layer.epsilon == 1e-6 and layer.reduction_axes == -1 and layer.feature_axes == -1
    custom = LayerNorm(
        2,
        scale_init=initializers.constant(2.0),
        bias_init=initializers.constant(-1.0),
        param_dtype=jnp.bfloat16,
        rngs=jax.random.key(0),
    )
    assert custom.scale.value.tolist() == [2.0, 2.0] and custom.bias.value.tolist() == [-1.0, -1.0]
    assert custom.scale.value.dtype == jnp.bfloat16


def test_layer_norm_epsilon_inside_the_square_root():
    x = jnp.array([[0.0, 1.0, 2.0, 3.0]])  # variance 1.25
    y = LayerNorm(4, epsilon=0.75, rngs=0)(x)
    close(y, (x - 1.5) / jnp.sqrt(1.25 + 0.75))
    assert not np.allclose(y, (x - 1.5) / (jnp.sqrt(1.25) + 0.75))


def test_layer_norm_variance_is_biased_and_fast_variance_is_clipped():
    x = jnp.array([2.0, 4.0])  # mean 3, biased variance 1 (unbiased would be 2)
    close(LayerNorm(2, epsilon=0.0, rngs=0)(x), jnp.array([-1.0, 1.0]))
    # A constant row: E[x^2] - E[x]^2 may round below zero; it must not give NaN.
    constant = jnp.full((4,), 1e4 + 0.1)
    y = LayerNorm(4, epsilon=1e-6, rngs=0)(constant)
    assert bool(jnp.all(jnp.isfinite(y)))


def test_layer_norm_reduction_and_feature_axes():
    x = random((2, 3, 4), 2)
    layer = randomize(LayerNorm(4, reduction_axes=(1, 2), rngs=0))
    close(layer(x), ref_layer_norm(x, *values(layer, "scale", "bias"), (1, 2), 1e-6))
    both = randomize(LayerNorm(12, reduction_axes=(-2, -1), feature_axes=(-2, -1), rngs=0))
    expected = ref_layer_norm(x, *values(both, "scale", "bias"), (1, 2), 1e-6, (3, 4))
    close(both(x), expected)
    over_batch = LayerNorm(4, reduction_axes=0, rngs=0)
    close(over_batch(x), ref_layer_norm(x, None, None, 0, 1e-6))


@pytest.mark.parametrize(("use_scale", "use_bias"), [(False, True), (True, False), (False, False)])
def test_layer_norm_scale_and_bias_off(use_scale, use_bias):
    layer = randomize(LayerNorm(5, use_scale=use_scale, use_bias=use_bias, rngs=0))
    assert (layer.scale is None) != use_scale and (layer.bias is None) != use_bias
    params = pytree_graph.state(layer, Param)
    assert sorted(params.to_dict()) == [
        n for n, on in (("bias", use_bias), ("scale", use_scale)) if on
    ]
    x = random((3, 5), 3)
    close(layer(x), ref_layer_norm(x, *values(layer, "scale", "bias"), -1, 1e-6))


def test_layer_norm_dtypes():
    x = random((3, 5), 4, jnp.bfloat16)
    layer = randomize(LayerNorm(5, rngs=0))
    expected = ref_layer_norm(x, *values(layer, "scale", "bias"), -1, 1e-6)
    y = layer(x)  # bfloat16 input, float32 parameters: computed and returned in float32
    assert y.dtype == jnp.float32
    close(y, expected)
    low = randomize(LayerNorm(5, dtype=jnp.bfloat16, rngs=0))  # computes in bfloat16
    y = low(x)
    assert y.dtype == jnp.bfloat16
    close(y, expected, 5e-2)
    half = LayerNorm(5, param_dtype=jnp.bfloat16, rngs=0)  # all bfloat16: bfloat16 out
    assert half(x).dtype == jnp.bfloat16
    plain = LayerNorm(5, use_scale=False, use_bias=False, rngs=0)
    assert plain(x).dtype == jnp.bfloat16
    integers = plain(jnp.arange(10).reshape(2, 5))  # integers are normalized in float32
    assert integers.dtype == jnp.float32
    close(integers, ref_layer_norm(jnp.arange(10.0).reshape(2, 5), None, None, -1, 1e-6))


def test_layer_norm_complex_input():
    x = random((2, 4), 5) + 1j * random((2, 4), 6)
    y = LayerNorm(4, use_fast_variance=True, rngs=0)(x)
    assert y.dtype == jnp.complex64
    centred = x - x.mean(-1, keepdims=True)
    variance = (jnp.abs(centred) ** 2).mean(-1, keepdims=True)
    expected = centred / jnp.sqrt(variance + 1e-6)
    np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_layer_norm_axis_name_shares_statistics_across_feature_shards():
    x = random((3, 8), 7)
    shards = jnp.stack([x[:, :4], x[:, 4:]])  # the features split in two, across "shard"
    layer = LayerNorm(4, axis_name="shard", rngs=0)
    y = pytree_graph.vmap(lambda m, s: m(s), in_axes=(None, 0), axis_name="shard")(layer, shards)
    close(jnp.concatenate([y[0], y[1]], axis=-1), ref_layer_norm(x, None, None, -1, 1e-6))


def test_layer_norm_under_jit_and_grad():
    layer = randomize(LayerNorm(5, rngs=0))
    x = random((3, 5), 8)
    close(pytree_graph.jit(lambda m, x: m(x))(layer, x), layer(x))
    grads = pytree_graph.grad(lambda m, x: jnp.sum(m(x) * x))(layer, x)
    normalized = ref_layer_norm(x, None, None, -1, 1e-6)
    close(grads["bias"].value, x.sum(0))
    close(grads["scale"].value, (normalized * x).sum(0), 1e-4)


def test_layer_norm_errors():
    layer = LayerNorm(4, rngs=0)
    with pytest.raises(ValueError, match=r"num_features=4.*shape \(2, 3\).*num_features=3"):
        layer(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"reduction_axes=-1 is out of range.*shape \(\)"):
        layer(jnp.array(1.0))
    with pytest.raises(ValueError, match=r"feature_axes=\(-3,\) is out of range"):
        LayerNorm(4, feature_axes=(-3,), rngs=0)(jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="LayerNorm: num_features must be a positive int, got 0"):
        LayerNorm(0, rngs=0)
    with pytest.raises(ValueError, match="LayerNorm: num_features must be a positive int"):
        LayerNorm(4.0, rngs=0)
    with pytest.raises(ValueError, match=r"LayerNorm: epsilon must be a number >= 0.0, got -1"):
        LayerNorm(4, epsilon=-1, rngs=0)
    with pytest.raises(TypeError, match="LayerNorm: reduction_axes must be an int or a tuple"):
        LayerNorm(4, reduction_axes="last", rngs=0)
    with pytest.raises(TypeError, match="LayerNorm: feature_axes must be an int or a tuple"):
        LayerNorm(4, feature_axes=(), rngs=0)
    with pytest.raises(TypeError, match="LayerNorm needs `rngs=`"):
        LayerNorm(4)


# RMSNorm


@pytest.mark.parametrize("shape", [(6,), (2, 6), (2, 3, 6)], ids=str)
def test_rms_norm_matches_reference(shape):
    layer = randomize(RMSNorm(6, rngs=0))
    x = random(shape, 10)
    y = layer(x)
    assert y.shape == shape and y.dtype == jnp.float32
    close(y, ref_rms_norm(x, layer.scale.value, -1, 1e-6))
    assert not hasattr(layer, "bias")


def test_rms_norm_no_centering_and_epsilon():
    x = jnp.array([3.0, 4.0])  # mean square 12.5
    close(RMSNorm(2, epsilon=0.5, rngs=0)(x), x / jnp.sqrt(12.5 + 0.5))
    close(
        RMSNorm(2, epsilon=0.0, use_scale=False, rngs=0)(x + 10.0),
        (x + 10.0) / jnp.sqrt(12.5 + 70.0 + 100.0),
    )


def test_rms_norm_options_and_dtypes():
    x = random((2, 3, 4), 11)
    layer = RMSNorm(4, reduction_axes=(1, 2), use_scale=False, rngs=0)
    assert layer.scale is None
    close(layer(x), ref_rms_norm(x, None, (1, 2), 1e-6))
    wide = randomize(RMSNorm(12, reduction_axes=(-2, -1), feature_axes=(-2, -1), rngs=0))
    close(wide(x), ref_rms_norm(x, wide.scale.value.reshape(3, 4), (1, 2), 1e-6))
    low = random((2, 4), 12, jnp.bfloat16)
    scaled = randomize(RMSNorm(4, rngs=0))
    assert scaled(low).dtype == jnp.float32
    close(scaled(low), ref_rms_norm(low, scaled.scale.value, -1, 1e-6))
    fixed = randomize(RMSNorm(4, dtype=jnp.bfloat16, rngs=0))
    assert fixed(low).dtype == jnp.bfloat16
    close(fixed(low), ref_rms_norm(low, fixed.scale.value, -1, 1e-6), 5e-2)
    assert RMSNorm(4, use_scale=False, rngs=0)(low).dtype == jnp.bfloat16


def test_rms_norm_errors():
    with pytest.raises(ValueError, match=r"RMSNorm was built with num_features=4.*shape \(5,\)"):
        RMSNorm(4, rngs=0)(jnp.ones(5))
    with pytest.raises(ValueError, match="RMSNorm: num_features must be a positive int"):
        RMSNorm(-2, rngs=0)
    with pytest.raises(ValueError, match="RMSNorm: epsilon must be a number"):
        RMSNorm(2, epsilon=True, rngs=0)
    with pytest.raises(TypeError, match="RMSNorm: reduction_axes must be an int or a tuple"):
        RMSNorm(2, reduction_axes=(0, 1.5), rngs=0)
    with pytest.raises(TypeError, match="RMSNorm needs `rngs=`"):
        RMSNorm(2)


# GroupNorm


@pytest.mark.parametrize(
    ("shape", "fast"),
    [((8,), True), ((2, 8), True), ((2, 3, 8), True), ((2, 3, 4, 8), True), ((2, 8), False)],
)
def test_group_norm_matches_reference(shape, fast):
    layer = randomize(GroupNorm(8, num_groups=4, use_fast_variance=fast, rngs=0))
    x = random(shape, 20)
    y = layer(x)
    assert y.shape == shape and y.dtype == jnp.float32
    expected = ref_group_norm(x, *values(layer, "scale", "bias"), 4, 1e-6)
    close(y, expected, 1e-4 if fast else 1e-5)


def test_group_norm_group_size_and_special_cases():
    x = random((2, 3, 4, 6), 21)
    by_size = GroupNorm(6, num_groups=None, group_size=2, rngs=0)
    assert (by_size.num_groups, by_size.group_size) == (3, 2)
    close(by_size(x), GroupNorm(6, num_groups=3, rngs=0)(x))
    close(by_size(x), ref_group_norm(x, None, None, 3, 1e-6))
    # One group: a layer norm over every axis but the batch.
    close(GroupNorm(6, num_groups=1, rngs=0)(x), ref_layer_norm(x, None, None, (1, 2, 3), 1e-6))
    # Groups of one channel: instance normalization.
    close(GroupNorm(6, num_groups=6, rngs=0)(x), ref_layer_norm(x, None, None, (1, 2), 1e-6))
    assert GroupNorm(64, rngs=0).num_groups == 32  # the default


def test_group_norm_statistics_are_per_example_and_per_group():
    x = jnp.array([[0.0, 2.0, 10.0, 30.0], [1.0, 1.0, 5.0, 7.0]])
    y = GroupNorm(4, num_groups=2, rngs=0)(x)
    close(y, jnp.array([[-1.0, 1.0, -1.0, 1.0], [0.0, 0.0, -1.0, 1.0]]))


def test_group_norm_reduction_axes_for_several_batch_axes():
    x = random((2, 3, 4, 5, 6), 22)  # two batch axes, then (H, W, C)
    layer = GroupNorm(6, num_groups=2, reduction_axes=(-3, -2, -1), rngs=0)
    flat = ref_group_norm(x.reshape(6, 4, 5, 6), None, None, 2, 1e-6)
    close(layer(x), flat.reshape(x.shape))


def test_group_norm_scale_bias_and_dtypes():
    x = random((2, 3, 8), 23, jnp.bfloat16)
    layer = randomize(GroupNorm(8, num_groups=2, rngs=0))
    y = layer(x)
    assert y.dtype == jnp.float32
    close(y, ref_group_norm(x, *values(layer, "scale", "bias"), 2, 1e-6))
    low = randomize(GroupNorm(8, num_groups=2, dtype=jnp.bfloat16, rngs=0))
    assert low(x).dtype == jnp.bfloat16
    close(low(x), ref_group_norm(x, *values(low, "scale", "bias"), 2, 1e-6), 5e-2)
    bare = GroupNorm(8, num_groups=2, use_scale=False, use_bias=False, rngs=0)
    assert bare.scale is None and bare.bias is None and bare(x).dtype == jnp.bfloat16
    assert pytree_graph.state(bare, Param).to_dict() == {}
    only_bias = randomize(GroupNorm(8, num_groups=2, use_scale=False, rngs=0))
    close(only_bias(x), ref_group_norm(x, None, only_bias.bias.value, 2, 1e-6))


def test_group_norm_errors():
    with pytest.raises(ValueError, match="exactly one of num_groups and group_size, got neither"):
        GroupNorm(8, num_groups=None, rngs=0)
    with pytest.raises(ValueError, match=r"got num_groups=32 and group_size=4.*num_groups=None"):
        GroupNorm(8, group_size=4, rngs=0)
    with pytest.raises(
        ValueError, match=r"num_groups=3 does not divide num_features=8; use one of \[1, 2, 4, 8\]"
    ):
        GroupNorm(8, num_groups=3, rngs=0)
    with pytest.raises(ValueError, match="num_groups=32 does not divide num_features=16"):
        GroupNorm(16, rngs=0)
    with pytest.raises(ValueError, match="group_size=3 does not divide num_features=8"):
        GroupNorm(8, num_groups=None, group_size=3, rngs=0)
    with pytest.raises(ValueError, match="GroupNorm: num_groups must be a positive int, got 0"):
        GroupNorm(8, num_groups=0, rngs=0)
    with pytest.raises(ValueError, match="GroupNorm: group_size must be a positive int, got True"):
        GroupNorm(8, num_groups=None, group_size=True, rngs=0)
    layer = GroupNorm(8, num_groups=2, rngs=0)
    with pytest.raises(ValueError, match=r"num_features=8, but the input of shape \(2, 6\) has 6"):
        layer(jnp.ones((2, 6)))
    with pytest.raises(ValueError, match="got a scalar"):
        layer(jnp.array(1.0))
    with pytest.raises(ValueError, match=r"reduction_axes=\(1,\) must include the channel axis"):
        GroupNorm(8, num_groups=2, reduction_axes=(1,), rngs=0)(jnp.ones((2, 3, 8)))
    with pytest.raises(TypeError, match="GroupNorm needs `rngs=`"):
        GroupNorm(8, num_groups=2)


# BatchNorm


def test_batch_norm_parameters_statistics_and_defaults():
    layer = BatchNorm(3, rngs=0)
    assert isinstance(layer.mean, BatchStat) and isinstance(layer.var, BatchStat)
    assert isinstance(layer.scale, Param) and isinstance(layer.bias, Param)
    assert layer.mean.value.tolist() == [0.0] * 3 and layer.var.value.tolist() == [1.0] * 3
    assert layer.mean.value.dtype == jnp.float32
    assert layer.use_running_average is False
    assert (layer.momentum, layer.epsilon, layer.axis) == (0.99, 1e-5, -1)
    stats = pytree_graph.state(layer, BatchStat).to_dict()
    assert sorted(stats) == ["mean", "var"]


@pytest.mark.parametrize(
    ("shape", "axis", "fast"),
    [((6, 4), -1, True), ((3, 2, 4), -1, True), ((3, 4, 5), 1, True), ((6, 4), -1, False)],
)
def test_batch_norm_training_steps_match_reference(shape, axis, fast):
    momentum, epsilon = 0.8, 1e-5
    layer = randomize(BatchNorm(4, axis=axis, momentum=momentum, use_fast_variance=fast, rngs=0))
    scale, bias = values(layer, "scale", "bias")
    running_mean, running_var = jnp.zeros(4), jnp.ones(4)
    for step in range(3):
        x = random(shape, 30 + step)
        batch_mean, batch_var = ref_batch_stats(x, axis)
        y = layer(x)
        assert y.shape == shape
        close(y, ref_batch_norm(x, batch_mean, batch_var, scale, bias, axis, epsilon), 1e-4)
        running_mean = momentum * running_mean + (1 - momentum) * batch_mean
        running_var = momentum * running_var + (1 - momentum) * batch_var
        close(layer.mean.value, running_mean, 1e-4)
        close(layer.var.value, running_var, 1e-4)
    x = random(shape, 40)
    layer.eval()
    close(layer(x), ref_batch_norm(x, running_mean, running_var, scale, bias, axis, epsilon), 1e-4)
    close(layer.mean.value, running_mean, 1e-4)  # evaluation changes nothing
    close(layer.var.value, running_var, 1e-4)


def test_batch_norm_several_feature_axes():
    layer = randomize(BatchNorm(6, axis=(1, 2), momentum=0.5, rngs=0))
    x = random((4, 2, 3), 35)
    flat = x.reshape(4, 6)
    batch_mean, batch_var = ref_batch_stats(flat, -1)
    expected = ref_batch_norm(
        flat, batch_mean, batch_var, *values(layer, "scale", "bias"), -1, 1e-5
    )
    close(layer(x), expected.reshape(x.shape), 1e-4)
    close(layer.mean.value, 0.5 * batch_mean)


def test_batch_norm_epsilon_and_momentum_edges():
    x = jnp.array([[0.0], [2.0]])  # batch mean 1, variance 1
    layer = BatchNorm(1, epsilon=3.0, momentum=1.0, rngs=0)
    close(layer(x), (x - 1.0) / jnp.sqrt(1.0 + 3.0))
    assert layer.mean.value.tolist() == [0.0] and layer.var.value.tolist() == [1.0]
    replace = BatchNorm(1, momentum=0, rngs=0)
    replace(x)
    assert replace.mean.value.tolist() == [1.0] and replace.var.value.tolist() == [1.0]


def test_batch_norm_train_eval_switching():
    model = Sequential(Linear(3, 4, rngs=0), BatchNorm(4, momentum=0.5, rngs=1))
    norm = model.layers[1]
    x = random((5, 3), 41)
    model(x)
    after_one = norm.mean.value
    assert not np.allclose(after_one, 0.0)
    model.eval()
    assert norm.use_running_average is True
    first = model(x)
    close(model(x), first)
    close(norm.mean.value, after_one, 0.0)
    hidden = model.layers[0](x)
    close(
        first, ref_batch_norm(hidden, norm.mean.value, norm.var.value, None, None, -1, 1e-5), 1e-4
    )
    model.train()
    assert norm.use_running_average is False
    model(x)
    assert not np.allclose(norm.mean.value, after_one)
    started_in_eval = BatchNorm(4, use_running_average=True, rngs=0)
    close(started_in_eval(hidden), hidden / jnp.sqrt(1.0 + 1e-5))


def test_batch_norm_call_time_override():
    layer = BatchNorm(2, momentum=0.5, rngs=0)
    x = random((4, 2), 42)
    y = layer(x, use_running_average=True)  # training-mode layer, running averages this call
    close(y, x / jnp.sqrt(1.0 + 1e-5))
    assert layer.mean.value.tolist() == [0.0, 0.0]
    layer.eval()
    batch_mean, batch_var = ref_batch_stats(x, -1)
    y = layer(x, False)  # evaluation-mode layer, batch statistics (and an update) this call
    close(y, ref_batch_norm(x, batch_mean, batch_var, None, None, -1, 1e-5), 1e-4)
    close(layer.mean.value, 0.5 * batch_mean)
    assert layer.use_running_average is True


def test_batch_norm_updates_are_written_back_from_jit():
    eager = randomize(BatchNorm(3, momentum=0.7, rngs=0))
    compiled = pytree_graph.clone(eager)
    step = pytree_graph.jit(lambda m, x: m(x))
    for i in range(3):
        x = random((5, 3), 50 + i)
        close(step(compiled, x), eager(x), 1e-5)
        close(compiled.mean.value, eager.mean.value)
        close(compiled.var.value, eager.var.value)
    assert not np.allclose(compiled.mean.value, 0.0)
    compiled.eval()
    before = compiled.mean.value
    x = random((5, 3), 60)
    close(step(compiled, x), eager.eval()(x), 1e-5)  # a new mode retraces
    close(compiled.mean.value, before, 0.0)


def test_batch_norm_gradients_in_training_mode():
    layer = randomize(BatchNorm(3, momentum=0.5, rngs=0))
    x = random((6, 3), 61)
    grads = pytree_graph.grad(lambda m, x: jnp.sum(m(x) * x))(layer, x)
    assert sorted(grads.to_dict()) == ["bias", "scale"]
    batch_mean, batch_var = ref_batch_stats(x, -1)
    normalized = ref_batch_norm(x, batch_mean, batch_var, None, None, -1, 1e-5)
    close(grads["bias"].value, x.sum(0), 1e-4)
    close(grads["scale"].value, (normalized * x).sum(0), 1e-4)
    close(layer.mean.value, 0.5 * batch_mean)  # the statistics were updated too


def test_batch_norm_axis_name_under_graph_vmap():
    layer = randomize(BatchNorm(3, axis_name="batch", momentum=0.6, rngs=0))
    scale, bias = values(layer, "scale", "bias")
    axes = StateAxes({Param: None, BatchStat: None})
    step = pytree_graph.vmap(lambda m, x: m(x), in_axes=(axes, 0), axis_name="batch")
    running_mean, running_var = jnp.zeros(3), jnp.ones(3)
    for i in range(2):
        x = random((6, 3), 70 + i)  # each example is unbatched, of shape (3,)
        batch_mean, batch_var = ref_batch_stats(x, -1)
        close(step(layer, x), ref_batch_norm(x, batch_mean, batch_var, scale, bias, -1, 1e-5), 1e-4)
        running_mean = 0.6 * running_mean + 0.4 * batch_mean
        running_var = 0.6 * running_var + 0.4 * batch_var
        close(layer.mean.value, running_mean, 1e-4)
        close(layer.var.value, running_var, 1e-4)
        assert layer.mean.value.shape == (3,)
    # Several examples per vmap entry: statistics over both the local batch and the axis.
    x = random((2, 5, 3), 72)
    batch_mean, batch_var = ref_batch_stats(x, -1)
    close(step(layer, x), ref_batch_norm(x, batch_mean, batch_var, scale, bias, -1, 1e-5), 1e-4)


def test_batch_norm_axis_name_under_jax_vmap():
    layer = BatchNorm(3, axis_name="batch", momentum=0.5, rngs=0)
    graphdef, params, stats = pytree_graph.split(layer, Param, BatchStat)

    def forward(params, stats, x):
        model = pytree_graph.merge(graphdef, params, stats)
        y = model(x)
        return y, pytree_graph.state(model, BatchStat)

    x = random((4, 3), 80)
    y, new_stats = jax.vmap(
        forward, in_axes=(None, None, 0), out_axes=(0, None), axis_name="batch"
    )(params, stats, x)
    batch_mean, batch_var = ref_batch_stats(x, -1)
    close(y, ref_batch_norm(x, batch_mean, batch_var, None, None, -1, 1e-5), 1e-4)
    close(new_stats["mean"].value, 0.5 * batch_mean)
    close(new_stats["var"].value, 0.5 + 0.5 * batch_var)


def test_batch_norm_dtypes_and_scale_bias_off():
    x = random((6, 4), 90, jnp.bfloat16)
    layer = randomize(BatchNorm(4, rngs=0))
    y = layer(x)
    assert y.dtype == jnp.float32 and layer.mean.value.dtype == jnp.float32
    batch_mean, batch_var = ref_batch_stats(x, -1)
    close(
        y, ref_batch_norm(x, batch_mean, batch_var, *values(layer, "scale", "bias"), -1, 1e-5), 1e-4
    )
    low = randomize(BatchNorm(4, dtype=jnp.bfloat16, rngs=0))
    y = low(x)
    assert y.dtype == jnp.bfloat16 and low.var.value.dtype == jnp.float32
    close(
        y, ref_batch_norm(x, batch_mean, batch_var, *values(low, "scale", "bias"), -1, 1e-5), 5e-2
    )
    bare = BatchNorm(4, use_scale=False, use_bias=False, rngs=0)
    assert bare.scale is None and bare.bias is None
    assert pytree_graph.state(bare, Param).to_dict() == {}
    y = bare(x)
    assert y.dtype == jnp.bfloat16
    close(y, ref_batch_norm(x, batch_mean, batch_var, None, None, -1, 1e-5), 5e-2)


def test_batch_norm_unbatched_input_in_evaluation_mode():
    layer = randomize(BatchNorm(3, rngs=0)).eval()
    x = random((3,), 91)
    close(
        layer(x),
        ref_batch_norm(x, jnp.zeros(3), jnp.ones(3), *values(layer, "scale", "bias"), 0, 1e-5),
    )


def test_batch_norm_errors_change_nothing():
    for momentum in (-0.1, 1.5, True, "0.9"):
        with pytest.raises(
            ValueError, match=r"BatchNorm: momentum must be a number in \[0.0, 1.0\]"
        ):
            BatchNorm(3, momentum=momentum, rngs=0)
    with pytest.raises(ValueError, match=r"BatchNorm: epsilon must be a number >= 0\.0"):
        BatchNorm(3, epsilon=-1e-5, rngs=0)
    with pytest.raises(TypeError, match="BatchNorm: use_running_average must be True or False"):
        BatchNorm(3, use_running_average=None, rngs=0)
    with pytest.raises(TypeError, match="BatchNorm: axis must be an int or a tuple of ints"):
        BatchNorm(3, axis=None, rngs=0)
    with pytest.raises(ValueError, match="BatchNorm: num_features must be a positive int"):
        BatchNorm(0, rngs=0)
    with pytest.raises(TypeError, match="BatchNorm needs `rngs=`"):
        BatchNorm(3)
    layer = BatchNorm(3, rngs=0)
    with pytest.raises(
        ValueError,
        match=r"num_features=3, but the input of shape \(4, 5\) has 5 features along axis=-1",
    ):
        layer(jnp.ones((4, 5)))
    with pytest.raises(ValueError, match=r"axis=-1 is out of range for an input of shape \(\)"):
        layer(jnp.array(1.0))
    with pytest.raises(
        ValueError, match=r"needs a batch.*shape \(3,\).*axis_name=.*model.eval\(\)"
    ):
        layer(jnp.ones(3))
    with pytest.raises(TypeError, match="use_running_average must be True, False or None"):
        layer(jnp.ones((2, 3)), use_running_average=1)
    assert layer.mean.value.tolist() == [0.0] * 3 and layer.var.value.tolist() == [1.0] * 3


class _Block(Module):
    """Linear then BatchNorm, to check nesting and mode switches inside jit."""

    def __init__(self, rngs):
        self.linear = Linear(2, 3, rngs=rngs)
        self.norm = BatchNorm(3, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.linear(x))


def test_batch_norm_nested_training_step_under_jit():
    model = _Block(Rngs(0))

    @pytree_graph.jit
    def train_step(model, x):
        grads = pytree_graph.grad(lambda m: jnp.mean(m(x) ** 2))(model)
        return grads

    grads = train_step(model, random((8, 2), 95))
    assert sorted(grads.to_dict()) == ["linear", "norm"]
    assert not np.allclose(model.norm.mean.value, 0.0)
