"""Flax NNX options the layers take: `mask=` on the normalization layers, `strides=None`
and dilations of None on the convolutions, a one-vector `Embedding`, and `'...'` in an
`Einsum` kernel's subscripts. Numbers against hand-written `jax.numpy`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_nn as pnn


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def masked_moments(x, mask, axes):
    count = jnp.sum(mask, axes, keepdims=True)
    mean = jnp.sum(jnp.where(mask, x, 0.0), axes, keepdims=True) / count
    var = jnp.sum(jnp.where(mask, (x - mean) ** 2, 0.0), axes, keepdims=True) / count
    return mean, var


@pytest.mark.parametrize("fast", [True, False])
def test_layer_norm_mask_counts_only_kept_entries(fast):
    x = normal(0, (4, 6)) * 3 + 1
    mask = jnp.array([True, False, True, True, False, True])
    norm = pnn.LayerNorm(6, epsilon=1e-5, use_fast_variance=fast, rngs=0)
    norm.scale.value = normal(1, (6,))
    norm.bias.value = normal(2, (6,))
    mean, var = masked_moments(x, jnp.broadcast_to(mask, x.shape), -1)
    want = (x - mean) / jnp.sqrt(var + 1e-5) * norm.scale.value + norm.bias.value
    np.testing.assert_allclose(norm(x, mask=mask), want, rtol=1e-5, atol=1e-5)
    # No mask: every entry counts.
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mean) / jnp.sqrt(var + 1e-5) * norm.scale.value + norm.bias.value
    np.testing.assert_allclose(norm(x), want, rtol=1e-5, atol=1e-5)


def test_rms_norm_mask_and_use_fast_variance():
    x = normal(0, (3, 5))
    mask = x > -0.5
    norm = pnn.RMSNorm(5, epsilon=1e-6, use_fast_variance=False, rngs=0)
    assert norm.use_fast_variance is False
    mean_square = jnp.sum(jnp.where(mask, x**2, 0.0), -1, keepdims=True) / mask.sum(
        -1, keepdims=True
    )
    np.testing.assert_allclose(norm(x, mask=mask), x / jnp.sqrt(mean_square + 1e-6), rtol=1e-5)


def test_group_norm_mask_per_group():
    x = normal(0, (2, 3, 6))
    mask = normal(1, (2, 3, 6)) > 0
    norm = pnn.GroupNorm(6, num_groups=2, epsilon=1e-5, rngs=0)
    grouped, gmask = x.reshape(2, 3, 2, 3), mask.reshape(2, 3, 2, 3)
    mean, var = masked_moments(grouped, gmask, (1, 3))
    want = ((grouped - mean) / jnp.sqrt(var + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(norm(x, mask=mask), want, rtol=1e-4, atol=1e-5)


def test_instance_norm_mask():
    x = normal(0, (2, 5, 3))
    mask = normal(1, (2, 5, 1)) > -0.3
    norm = pnn.InstanceNorm(3, epsilon=1e-5, rngs=0)
    mean, var = masked_moments(x, jnp.broadcast_to(mask, x.shape), (1,))
    np.testing.assert_allclose(
        norm(x, mask=mask), (x - mean) / jnp.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5
    )


def test_batch_norm_mask_statistics_and_running_averages():
    x = normal(0, (8, 3))
    mask = jnp.arange(8)[:, None] < 5  # the first five examples count
    norm = pnn.BatchNorm(3, momentum=0.5, epsilon=1e-5, rngs=0)
    y = norm(x, use_running_average=False, mask=mask)
    mean, var = x[:5].mean(0), x[:5].var(0)
    np.testing.assert_allclose(y, (x - mean) / jnp.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(norm.mean.value, 0.5 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.var.value, 0.5 + 0.5 * var, rtol=1e-5)


def test_mask_errors():
    norm = pnn.LayerNorm(4, rngs=0)
    with pytest.raises(TypeError, match="mask must be an array of booleans"):
        norm(jnp.ones((2, 4)), mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match=r"mask of shape \(3,\) does not broadcast"):
        norm(jnp.ones((2, 4)), mask=jnp.ones(3, bool))
    batch = pnn.BatchNorm(4, rngs=0)
    before = batch.mean.value
    with pytest.raises(ValueError, match="mask of shape"):
        batch(jnp.ones((2, 4)), use_running_average=False, mask=jnp.ones((3, 4), bool))
    assert batch.mean.value is before  # nothing changed


def test_conv_strides_and_dilations_none_are_one():
    x = normal(0, (1, 9, 8, 3))
    a = pnn.Conv(3, 4, (3, 3), None, input_dilation=None, kernel_dilation=None, rngs=0)
    b = pnn.Conv(3, 4, (3, 3), 1, rngs=0)
    assert a.strides == a.input_dilation == a.kernel_dilation == (1, 1)
    np.testing.assert_allclose(a(x), b(x), rtol=1e-6)
    t = pnn.ConvTranspose(3, 4, (3, 3), None, kernel_dilation=None, rngs=0)
    assert t.strides == t.kernel_dilation == (1, 1)
    want = jax.lax.conv_transpose(
        x, t.kernel.value, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    np.testing.assert_allclose(t(x), want + t.bias.value, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="strides must be an int"):
        pnn.Conv(3, 4, (3, 3), "2", rngs=0)


def test_one_vector_embedding_broadcasts():
    table = pnn.Embedding(1, 4, rngs=0)
    out = table(jnp.array([[0, 3], [7, 0]], jnp.int16))
    assert out.shape == (2, 2, 4)
    np.testing.assert_array_equal(out, jnp.broadcast_to(table.embedding.value[0], (2, 2, 4)))
    # Larger tables keep NaN for an index past the end.
    assert bool(jnp.isnan(pnn.Embedding(3, 2, rngs=0)(jnp.array([5]))).all())


def test_einsum_kernel_ellipsis_numbers_and_bias():
    x = normal(0, (8, 6, 7, 3, 4))
    layer = pnn.Einsum("d...ab,bc...->ad...c", (4, 5, 6, 7), (6, 7, 5), rngs=0)
    layer.bias.value = normal(1, (6, 7, 5))
    kernel = layer.kernel.value
    want = jnp.einsum("dxyab,bcxy->adxyc", x, kernel) + layer.bias.value
    np.testing.assert_allclose(layer(x), want, rtol=1e-5, atol=1e-5)
    # Without '...' in the input, the kernel's '...' axes are output axes of their own.
    layer = pnn.Einsum("ab,bc...->ac...", (4, 5, 6), (5, 6), rngs=0)
    y = jnp.ones((3, 4))
    np.testing.assert_allclose(
        layer(y), jnp.einsum("ab,bcx->acx", y, layer.kernel.value) + layer.bias.value, rtol=1e-5
    )


def test_einsum_kernel_ellipsis_errors():
    with pytest.raises(ValueError, match="kernel_shape=\\(4,\\) has only 1"):
        pnn.Einsum("...ab,ab...->...", (4,), rngs=0)
    with pytest.raises(ValueError, match="bias_shape=\\(5,\\) does not fit"):
        pnn.Einsum("d...ab,bc...->ad...c", (4, 5, 6, 7), (5,), rngs=0)


def test_einsum_and_linear_general_metadata():
    layer = pnn.Einsum(
        "ik,kj->ij",
        (5, 4),
        (4,),
        kernel_metadata={"tag": "proj", "sharding": ("a", None)},
        bias_metadata={"tag": "b"},
        rngs=0,
    )
    assert (layer.kernel.tag, layer.kernel.sharding, layer.bias.tag) == ("proj", ("a", None), "b")
    general = pnn.LinearGeneral(
        2, (3, 4), kernel_metadata={"tag": "k"}, bias_metadata={"x": 1}, rngs=0
    )
    assert (general.kernel.tag, general.bias.x) == ("k", 1)
    with pytest.raises(ValueError, match="bias_metadata was given but bias_shape is None"):
        pnn.Einsum("ik,kj->ij", (5, 4), bias_metadata={"tag": "b"}, rngs=0)
    with pytest.raises(TypeError, match="kernel_metadata must be a mapping"):
        pnn.LinearGeneral(2, 3, kernel_metadata=["tag"], rngs=0)
    with pytest.raises(ValueError, match="sharding"):
        pnn.LinearGeneral(
            2, 3, kernel_sharding=("a", None), kernel_metadata={"sharding": (None, "a")}, rngs=0
        )


def test_multi_head_attention_metadata():
    attention = pnn.MultiHeadAttention(
        2,
        4,
        normalize_qk=True,
        kernel_metadata={"tag": "qkv"},
        bias_metadata={"tag": "qkv_b"},
        out_kernel_metadata={"tag": "out", "sharding": ("model", None, None)},
        out_bias_metadata={"tag": "out_b"},
        query_ln_scale_metadata={"tag": "q_ln"},
        key_ln_scale_metadata={"tag": "k_ln"},
        rngs=0,
    )
    for layer in (attention.query, attention.key, attention.value):
        assert (layer.kernel.tag, layer.bias.tag) == ("qkv", "qkv_b")
    assert (attention.out.kernel.tag, attention.out.bias.tag) == ("out", "out_b")
    assert attention.out.kernel.sharding == ("model", None, None)
    assert (attention.query_ln.scale.tag, attention.key_ln.scale.tag) == ("q_ln", "k_ln")
    with pytest.raises(ValueError, match="kernel_metadata\\['sharding'\\] has 1 entries"):
        pnn.MultiHeadAttention(2, 4, kernel_metadata={"sharding": (None,)}, rngs=0)
    with pytest.raises(ValueError, match="out_kernel_sharding"):
        pnn.MultiHeadAttention(
            2,
            4,
            out_kernel_sharding=(None, None, None),
            out_kernel_metadata={"sharding": ("a", None, None)},
            rngs=0,
        )


def test_dot_product_attention_module_records_weights():
    from pytree_graph import Intermediate, pop

    q, k, v = normal(0, (2, 5, 4, 8)), normal(1, (2, 6, 2, 8)), normal(2, (2, 6, 2, 8))
    holder = pnn.Module()
    out = pnn.dot_product_attention(q, k, v, module=holder)
    (weights,) = pop(holder, Intermediate)["attention_weights"].value
    repeated_k = jnp.repeat(k, 2, axis=-2)
    want = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, repeated_k) / jnp.sqrt(8.0), -1)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, pnn.dot_product_attention(q, k, v), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="module must be a Module"):
        pnn.dot_product_attention(q, k, v, module=object())
    with pytest.raises(ValueError, match="cannot record them"):
        pnn.dot_product_attention(q, k, v, module=holder, implementation="xla")


def test_multi_head_attention_sow_weights():
    from pytree_graph import Intermediate, pop

    attention = pnn.MultiHeadAttention(2, 4, rngs=0)
    x = normal(0, (3, 5, 4))
    attention(x, sow_weights=True)
    attention(x)  # not recorded
    (weights,) = pop(attention, Intermediate)["attention_weights"].value
    assert weights.shape == (3, 2, 5, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(TypeError, match="sow_weights must be True or False"):
        attention(x, sow_weights="yes")
