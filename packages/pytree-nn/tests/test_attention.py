"""MultiHeadAttention, dot_product_attention and the mask helpers, against jnp references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Cache, Param
from pytree_nn import (
    MultiHeadAttention,
    Rngs,
    combine_masks,
    dot_product_attention,
    make_attention_mask,
    make_causal_mask,
)


@pytest.fixture(autouse=True)
def full_float32_matmuls():
    """Compare at float32 accuracy on every backend (GPUs may default to TF32 matmuls)."""
    with jax.default_matmul_precision("float32"):
        yield


# ------------------------------------------------------------------------- references


def softmax_rows(logits):
    shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
    exp = jnp.exp(shifted)
    return exp / jnp.sum(exp, axis=-1, keepdims=True)


@jax.jit
def reference_weights(q, k, mask=None):
    """Attention weights of one head: softmax(q k^T / sqrt(d)), masked entries excluded."""
    logits = q @ jnp.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    return softmax_rows(logits)


@jax.jit
def reference_attention(att, inputs_q, inputs_k=None, inputs_v=None, mask=None, keep=None):
    """The layer's output computed head by head with explicit matmuls.

    `mask` broadcasts to (batch..., heads, q, kv); `keep` is a dropout multiplier that
    broadcasts to the weights of one head.
    """
    inputs_k = inputs_q if inputs_k is None else inputs_k
    inputs_v = inputs_k if inputs_v is None else inputs_v
    heads = att.num_heads
    weights_shape = (*inputs_q.shape[:-2], heads, inputs_q.shape[-2], inputs_k.shape[-2])
    if mask is not None:
        mask = jnp.broadcast_to(mask, weights_shape).astype(bool)
    outputs = []
    for h in range(heads):
        q = inputs_q @ att.query.kernel.value[:, h, :] + att.query.bias.value[h]
        k = inputs_k @ att.key.kernel.value[:, h, :] + att.key.bias.value[h]
        v = inputs_v @ att.value.kernel.value[:, h, :] + att.value.bias.value[h]
        w = reference_weights(q, k, None if mask is None else mask[..., h, :, :])
        if keep is not None:
            w = w * keep
        outputs.append(w @ v)
    merged = jnp.concatenate(outputs, axis=-1)  # (..., q, heads * head_dim), head-major
    out_kernel = att.out.kernel.value.reshape(heads * att.head_dim, att.out_features)
    return merged @ out_kernel + att.out.bias.value


def normal(seed, shape):
    # NumPy draws: compiling jax.random for every test shape would dominate the run time.
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def randomize_biases(att, seed=0):
    """Non-zero biases, so that the reference checks them too."""
    for i, layer in enumerate((att.query, att.key, att.value, att.out)):
        layer.bias.value = 0.1 * normal(seed + i, layer.bias.value.shape)
    return att


# ---------------------------------------------------------------- MultiHeadAttention


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=["unbatched", "batch", "two-batch"])
def test_self_attention_matches_the_per_head_reference(batch):
    att = randomize_biases(MultiHeadAttention(num_heads=2, in_features=4, rngs=0))
    x = normal(1, (*batch, 5, 4))
    y = att(x)
    assert y.shape == (*batch, 5, 4)
    np.testing.assert_allclose(y, reference_attention(att, x), atol=1e-5)
    assert jnp.array_equal(y, att(x, x)) and jnp.array_equal(y, att(x, x, x))


def test_qkv_and_out_features_set_the_projection_shapes():
    att = randomize_biases(MultiHeadAttention(3, 4, qkv_features=6, out_features=5, rngs=0))
    assert att.head_dim == 2
    assert att.query.kernel.value.shape == (4, 3, 2) and att.query.bias.value.shape == (3, 2)
    assert att.key.kernel.value.shape == att.value.kernel.value.shape == (4, 3, 2)
    assert att.out.kernel.value.shape == (3, 2, 5) and att.out.bias.value.shape == (5,)
    x = normal(1, (2, 5, 4))
    np.testing.assert_allclose(att(x), reference_attention(att, x), atol=1e-5)
    no_bias = MultiHeadAttention(2, 4, use_bias=False, rngs=0)
    assert no_bias.query.bias is None and no_bias.out.bias is None
    assert no_bias(jnp.ones((3, 4))).shape == (3, 4)


def test_cross_attention_with_other_lengths_and_kv_features():
    att = randomize_biases(MultiHeadAttention(2, 4, qkv_features=6, in_kv_features=3, rngs=0))
    assert att.key.kernel.value.shape == (3, 2, 3)
    q, kv, v = normal(1, (2, 7, 4)), normal(2, (2, 4, 3)), normal(3, (2, 4, 3))
    np.testing.assert_allclose(att(q, kv, v), reference_attention(att, q, kv, v), atol=1e-5)
    assert jnp.array_equal(att(q, kv), att(q, kv, kv))  # inputs_v defaults to inputs_k
    np.testing.assert_allclose(att(q[0], kv[0], v[0]), att(q, kv, v)[0], atol=1e-6)


def test_causal_padding_and_per_head_masks():
    att = randomize_biases(MultiHeadAttention(2, 4, rngs=0))
    x = normal(1, (2, 5, 4))
    causal = make_causal_mask(jnp.zeros((2, 5)))
    np.testing.assert_allclose(
        att(x, mask=causal), reference_attention(att, x, mask=jnp.tril(jnp.ones((5, 5)))), atol=1e-5
    )
    # Padding: the second sequence has two padding positions at the end.
    real = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    padding = make_attention_mask(real, real)
    explicit = real[:, None, :, None] & real[:, None, None, :]  # (batch, 1, q, kv)
    both = combine_masks(causal, padding)
    y = att(x, mask=both)
    expected = reference_attention(att, x, mask=explicit & jnp.tril(jnp.ones((5, 5), bool)))
    np.testing.assert_allclose(y[0], expected[0], atol=1e-5)
    np.testing.assert_allclose(y[1, :3], expected[1, :3], atol=1e-5)  # real queries
    # A mask that differs per head, and a boolean one without batch axes.
    per_head = (normal(3, (2, 2, 5, 5)) > -0.3).at[..., 0].set(True)
    np.testing.assert_allclose(
        att(x, mask=per_head), reference_attention(att, x, mask=per_head), atol=1e-5
    )
    tril = jnp.tril(jnp.ones((5, 5), bool))
    assert jnp.allclose(att(x, mask=tril), att(x, mask=causal), atol=1e-6)
    # A masked-out key does not influence the outputs.
    changed = x.at[:, 4].set(100.0)
    assert jnp.allclose(att(x, mask=causal)[:, :4], att(changed, mask=causal)[:, :4], atol=1e-5)


def test_mask_helpers_match_explicit_masks():
    tokens = jnp.array([[3, 1, 0], [2, 0, 0]])
    padding = make_attention_mask(tokens > 0, tokens > 0)
    assert padding.shape == (2, 1, 3, 3) and padding.dtype == jnp.float32
    real = np.asarray(tokens > 0)
    np.testing.assert_array_equal(padding[:, 0], np.einsum("bq,bk->bqk", real, real))
    causal = make_causal_mask(tokens, extra_batch_dims=1, dtype=jnp.bool_)
    assert causal.shape == (1, 2, 1, 3, 3) and causal.dtype == jnp.bool_
    np.testing.assert_array_equal(causal[0, 1, 0], np.tril(np.ones((3, 3), bool)))
    # pairwise_fn compares the query and key values (e.g. segment ids).
    segments = jnp.array([0, 0, 1, 1])
    same = make_attention_mask(segments, segments, jnp.equal)
    np.testing.assert_array_equal(same[0], segments[:, None] == segments[None, :])
    cross = make_attention_mask(jnp.ones(2), jnp.ones(4))
    assert cross.shape == (1, 2, 4)
    combined = combine_masks(make_causal_mask(tokens), padding, None)
    np.testing.assert_array_equal(combined, np.tril(np.ones((3, 3))) * np.asarray(padding))
    assert combine_masks(jnp.ones((3, 3)), jnp.ones((2, 1, 3, 3))).shape == (2, 1, 3, 3)
    assert combine_masks(None, None) is None
    with pytest.raises(ValueError, match=r"masks of shapes \(2, 3\), \(4, 3\) do not broadcast"):
        combine_masks(jnp.ones((2, 3)), jnp.ones((4, 3)))
    with pytest.raises(ValueError, match=r"query_input \(2,\) and key_input \(3,\) do not"):
        make_attention_mask(jnp.ones((2, 4)), jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="one value per position; got shapes"):
        make_attention_mask(jnp.ones(()), jnp.ones(3))
    with pytest.raises(ValueError, match="extra_batch_dims must be an int >= 0, got -1"):
        make_causal_mask(tokens, extra_batch_dims=-1)
    with pytest.raises(ValueError, match=r"make_causal_mask expects .* got a scalar"):
        make_causal_mask(jnp.ones(()))


def test_dtypes():
    att = MultiHeadAttention(2, 4, dtype=jnp.bfloat16, rngs=0)
    x = normal(1, (2, 3, 4))
    y = att(x)
    assert y.dtype == jnp.bfloat16 and att.query.kernel.value.dtype == jnp.float32
    np.testing.assert_allclose(y.astype(jnp.float32), reference_attention(att, x), atol=5e-2)
    half_params = MultiHeadAttention(2, 4, param_dtype=jnp.bfloat16, rngs=0)
    assert half_params.out.kernel.value.dtype == jnp.bfloat16
    assert half_params(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16
    assert half_params(x).dtype == jnp.float32  # promoted with the float32 inputs
    assert MultiHeadAttention(2, 4, rngs=0)(x.astype(jnp.float16)).dtype == jnp.float32


def test_default_initialisation():
    att = MultiHeadAttention(4, 64, qkv_features=128, out_features=32, rngs=0)
    # LeCun normal with the projections' true fan-in (not the kernels' 3-d shapes).
    assert abs(float(att.query.kernel.value.std()) - 1 / math.sqrt(64)) < 0.01
    assert abs(float(att.out.kernel.value.std()) - 1 / math.sqrt(128)) < 0.01
    assert all(float(jnp.abs(p.bias.value).sum()) == 0 for p in (att.query, att.out))
    custom = MultiHeadAttention(
        2,
        4,
        kernel_init=jax.nn.initializers.ones,
        out_kernel_init=jax.nn.initializers.zeros,
        rngs=0,
    )
    assert float(custom.key.kernel.value.min()) == 1.0
    assert float(jnp.abs(custom.out.kernel.value).max()) == 0.0
    # Different layers from different keys; the same seed gives the same parameters.
    assert not jnp.array_equal(att.query.kernel.value, att.key.kernel.value)
    again = MultiHeadAttention(4, 64, qkv_features=128, out_features=32, rngs=0)
    assert jnp.array_equal(att.value.kernel.value, again.value.kernel.value)


def test_attention_dropout_uses_the_kept_rngs_and_eval_turns_it_off():
    att = randomize_biases(MultiHeadAttention(2, 4, dropout_rate=0.5, rngs=Rngs(0, dropout=1)))
    x = normal(1, (2, 5, 4))
    # The layer draws its key from a stream of its own, forked from the Rngs' `dropout`
    # stream when it was built.
    key = pg.clone(att.rngs).dropout()
    keep = jax.random.bernoulli(key, 0.5, (1, 1, 5, 5)) / 0.5  # shared by batch and heads
    y = att(x)
    np.testing.assert_allclose(y, reference_attention(att, x, keep=keep[0]), atol=1e-5)
    assert not jnp.allclose(att(x), y)  # a new key each call
    att.eval()
    assert att.deterministic
    np.testing.assert_allclose(att(x), reference_attention(att, x), atol=1e-5)
    att.train()
    np.testing.assert_allclose(att(x, deterministic=True), reference_attention(att, x), atol=1e-5)
    # Keys given to the call instead of the layer's.
    call_key = Rngs(7).dropout()
    keep = jax.random.bernoulli(call_key, 0.5, (1, 1, 5, 5))[0] / 0.5
    np.testing.assert_allclose(att(x, rngs=7), reference_attention(att, x, keep=keep), atol=1e-5)
    # Under pytree_graph.jit the layer's stream advances in place.
    step = pg.jit(lambda m, x: m(x))
    count = int(att.rngs.dropout.count.value)
    assert not jnp.allclose(step(att, x), step(att, x))
    assert int(att.rngs.dropout.count.value) == count + 2
    # Without dropout no stream is kept.
    assert MultiHeadAttention(2, 4, rngs=0).rngs is None


def test_dot_product_attention_matches_the_reference():
    q, k, v = normal(1, (2, 6, 3, 4)), normal(2, (2, 5, 3, 4)), normal(3, (2, 5, 3, 2))
    out = dot_product_attention(q, k, v)
    assert out.shape == (2, 6, 3, 2)
    for h in range(3):
        w = reference_weights(q[:, :, h], k[:, :, h])
        np.testing.assert_allclose(out[:, :, h], w @ v[:, :, h], atol=1e-5)
    # bias is added to the logits; no batch axes at all works too.
    bias = normal(4, (3, 6, 5))
    out = dot_product_attention(q[0], k[0], v[0], bias=bias)
    for h in range(3):
        logits = q[0, :, h] @ k[0, :, h].T / 2.0 + bias[h]
        np.testing.assert_allclose(out[:, h], softmax_rows(logits) @ v[0, :, h], atol=1e-5)
    # A row masked everywhere gets uniform weights (no NaN).
    masked = dot_product_attention(q, k, v, mask=jnp.zeros((6, 5), bool))
    np.testing.assert_allclose(
        masked, jnp.broadcast_to(v.mean(1, keepdims=True), masked.shape), atol=1e-5
    )
    half = dot_product_attention(q, k, v, dtype=jnp.bfloat16)
    assert half.dtype == jnp.bfloat16
    assert dot_product_attention(q.astype(jnp.float16), k, v).dtype == jnp.float32


def test_dot_product_attention_dropout_statistics():
    # Equal logits and one-hot values: the output rows are the attention weights, 1/kv.
    kv, heads = 40, 3
    q = jnp.zeros((4, 30, heads, 2))
    k = jnp.zeros((4, kv, heads, 2))
    v = jnp.broadcast_to(jnp.eye(kv)[:, None, :], (4, kv, heads, kv))
    key = jax.random.key(0)
    w = dot_product_attention(q, k, v, dropout_rng=key, dropout_rate=0.25)
    dropped = w == 0
    assert abs(float(dropped.mean()) - 0.25) < 0.03
    np.testing.assert_allclose(w[~dropped], 1 / kv / 0.75, rtol=1e-5)
    # broadcast_dropout: one mask for every batch entry and head.
    assert bool(jnp.all(dropped == dropped[:1, :, :1]))
    apart = dot_product_attention(
        q, k, v, dropout_rng=key, dropout_rate=0.25, broadcast_dropout=False
    )
    assert not bool(jnp.all((apart == 0) == (apart == 0)[:1, :, :1]))
    # The mean is kept; deterministic and rate 0 turn dropout off; rate 1 drops all.
    assert abs(float(w.sum(-1).mean()) - 1.0) < 0.03
    uniform = jnp.full(w.shape, 1 / kv)
    for off in (
        dict(dropout_rng=key, dropout_rate=0.25, deterministic=True),
        dict(dropout_rate=0.0),
    ):
        np.testing.assert_allclose(dot_product_attention(q, k, v, **off), uniform, rtol=1e-5)
    assert (
        float(jnp.abs(dot_product_attention(q, k, v, dropout_rng=key, dropout_rate=1.0)).max()) == 0
    )


def test_dot_product_attention_errors():
    q, k, v = jnp.ones((2, 6, 3, 4)), jnp.ones((2, 5, 3, 4)), jnp.ones((2, 5, 3, 2))
    with pytest.raises(ValueError, match=r"expects key of shape \(batch..., length, num_heads"):
        dot_product_attention(q, jnp.ones((5, 4)), v)
    with pytest.raises(ValueError, match="same batch axes; got query"):
        dot_product_attention(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="key and value must have the same length"):
        dot_product_attention(q, k, v[:, :4])
    with pytest.raises(ValueError, match="multiple of the number of key/value heads"):
        dot_product_attention(q, k[:, :, :2], v[:, :, :2])
    with pytest.raises(ValueError, match="key and value must have the same number of heads"):
        dot_product_attention(q, k, v[:, :, :1])
    with pytest.raises(TypeError, match="is_causal must be True or False, got 1"):
        dot_product_attention(q, k, v, is_causal=1)
    with pytest.raises(ValueError, match="implementation must be None, 'einsum', 'xla'"):
        dot_product_attention(q, k, v, implementation="flash")
    with pytest.raises(ValueError, match="cannot compute this call: the values' head_dim"):
        dot_product_attention(q, k, v, implementation="xla")
    with pytest.raises(ValueError, match="query and key must have the same head_dim"):
        dot_product_attention(q, k[..., :3], v)
    with pytest.raises(
        ValueError, match=r"mask of shape \(2, 6, 6\) does not broadcast .* \(2, 3, 6, 5\)"
    ):
        dot_product_attention(q, k, v, mask=jnp.ones((2, 6, 6)))
    with pytest.raises(ValueError, match=r"bias of shape \(4, 6, 5\) does not broadcast"):
        dot_product_attention(q, k, v, bias=jnp.ones((4, 6, 5)))
    with pytest.raises(ValueError, match="needs dropout_rng=<a PRNG key>"):
        dot_product_attention(q, k, v, dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\], got 2"):
        dot_product_attention(q, k, v, dropout_rate=2)
    with pytest.raises(TypeError, match="computes in a floating dtype, got int32"):
        dot_product_attention(q.astype(jnp.int32), k.astype(jnp.int32), v.astype(jnp.int32))


def test_custom_attention_fn_gets_the_projected_heads():
    seen = {}

    def attention_fn(query, key, value, **kwargs):
        seen.update(shapes=(query.shape, key.shape, value.shape), keys=sorted(kwargs))
        return dot_product_attention(query, key, value, **kwargs)

    att = MultiHeadAttention(2, 4, qkv_features=6, attention_fn=attention_fn, rngs=0)
    att(jnp.ones((1, 3, 4)), jnp.ones((1, 5, 4)))
    assert seen["shapes"] == ((1, 3, 2, 3), (1, 5, 2, 3), (1, 5, 2, 3))
    assert seen["keys"] == [
        "broadcast_dropout",
        "deterministic",
        "dropout_rate",
        "dropout_rng",
        "dtype",
        "mask",
        "precision",
    ]


def test_gradients_and_transforms():
    att = MultiHeadAttention(2, 4, rngs=0)
    x = normal(1, (2, 3, 4))
    grads = pg.grad(lambda m: jnp.sum(m(x) ** 2))(att)
    assert grads["query"]["kernel"].value.shape == (4, 2, 2)
    assert float(jnp.abs(grads["key"]["kernel"].value).sum()) > 0
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(att, x), att(x), atol=1e-6)
    np.testing.assert_allclose(pg.jit(lambda m, x: m(x))(att, x), att(x), atol=1e-6)


def test_multi_head_attention_errors():
    with pytest.raises(ValueError, match="num_heads=4 must divide qkv_features=6"):
        MultiHeadAttention(4, 6, rngs=0)
    with pytest.raises(
        ValueError, match=r"num_heads=3 must divide qkv_features=8 .* e.g. qkv_features=6"
    ):
        MultiHeadAttention(3, 4, qkv_features=8, rngs=0)
    with pytest.raises(ValueError, match="num_heads must be a positive int, got 0"):
        MultiHeadAttention(0, 4, rngs=0)
    with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\]"):
        MultiHeadAttention(2, 4, dropout_rate=-0.1, rngs=0)
    with pytest.raises(TypeError, match="attention_fn must be a function"):
        MultiHeadAttention(2, 4, attention_fn="flash", rngs=0)
    with pytest.raises(TypeError, match="MultiHeadAttention needs `rngs=`"):
        MultiHeadAttention(2, 4)
    att = MultiHeadAttention(2, 4, in_kv_features=6, rngs=0)
    with pytest.raises(
        ValueError, match=r"inputs_q whose last dimension is in_features=4, .* \(3, 5\)"
    ):
        att(jnp.ones((3, 5)), jnp.ones((3, 6)))
    with pytest.raises(ValueError, match=r"inputs_k whose last dimension is in_kv_features=6"):
        att(jnp.ones((3, 4)))  # self-attention needs in_kv_features == in_features
    with pytest.raises(ValueError, match=r"inputs_v whose last dimension is in_kv_features=6"):
        att(jnp.ones((3, 4)), jnp.ones((3, 6)), jnp.ones((3, 4)))
    with pytest.raises(
        ValueError, match=r"inputs_q of shape \(batch..., length, in_features\), got shape \(4,\)"
    ):
        att(jnp.ones(4), jnp.ones((3, 6)))
    with pytest.raises(ValueError, match="same batch axes; got shapes"):
        att(jnp.ones((2, 3, 4)), jnp.ones((3, 3, 6)))
    with pytest.raises(ValueError, match="inputs_k and inputs_v must have the same length"):
        att(jnp.ones((3, 4)), jnp.ones((3, 6)), jnp.ones((2, 6)))
    with pytest.raises(ValueError, match="inputs_v was given without inputs_k"):
        att(jnp.ones((3, 4)), inputs_v=jnp.ones((3, 6)))
    with pytest.raises(ValueError, match="mask of shape"):
        MultiHeadAttention(2, 4, rngs=0)(jnp.ones((3, 4)), mask=jnp.ones((2, 3)))
    no_keys = MultiHeadAttention(2, 4, rngs=0)
    no_keys.dropout_rate = 0.5  # made without dropout, so it kept no Rngs
    with pytest.raises(ValueError, match="needs random keys for attention dropout"):
        no_keys(jnp.ones((3, 4)))
    assert no_keys(jnp.ones((3, 4)), rngs=0).shape == (3, 4)


# ----------------------------------------------------------------------- decoding


def decode_by_chunks(att, x, sizes, step=None):
    step = step or (lambda m, chunk: m(chunk))
    outputs, start = [], 0
    for size in sizes:
        outputs.append(step(att, x[..., start : start + size, :]))
        start += size
    return jnp.concatenate(outputs, axis=-2)


@pytest.mark.parametrize("batch", [(), (2,)], ids=["unbatched", "batch"])
def test_decoding_token_by_token_equals_the_causal_forward_pass(batch):
    att = randomize_biases(MultiHeadAttention(2, 4, qkv_features=6, rngs=0))
    x = normal(1, (*batch, 6, 4))
    full = att(x, mask=make_causal_mask(jnp.zeros((*batch, 6))))
    att.init_cache(x.shape)
    assert isinstance(att.cached_key, Cache) and att.cached_key.value.shape == (*batch, 6, 2, 3)
    assert isinstance(att.cache_index, Cache) and int(att.cache_index.value) == 0
    # decode=True for the call; the layer was built with decode=False.
    stepwise = decode_by_chunks(att, x, [1] * 6, lambda m, c: m(c, decode=True))
    np.testing.assert_allclose(stepwise, full, atol=1e-5)
    assert int(att.cache_index.value) == 6
    # The cache holds the key projections of every position.
    keys = jnp.einsum("...ti,ihd->...thd", x, att.key.kernel.value) + att.key.bias.value
    np.testing.assert_allclose(att.cached_key.value, keys, atol=1e-5)
    if batch:  # Several positions per call: causal among themselves.
        att.decode = True
        att.init_cache(x.shape)
        np.testing.assert_allclose(decode_by_chunks(att, x, [2, 3, 1]), full, atol=1e-5)


def test_decoding_inside_graph_jit_writes_the_cache_back():
    att = randomize_biases(MultiHeadAttention(2, 4, decode=True, rngs=0))
    x = normal(1, (2, 5, 4))
    full = att(x, mask=make_causal_mask(jnp.zeros((2, 5))), decode=False)
    att.init_cache((2, 8, 4), dtype=jnp.float32)  # room for more than we feed
    step = pg.jit(lambda m, chunk: m(chunk))
    np.testing.assert_allclose(decode_by_chunks(att, x, [1] * 5, step), full, atol=1e-5)
    assert int(att.cache_index.value) == 5
    assert float(jnp.abs(att.cached_value.value[:, 5:]).max()) == 0.0  # untouched slots
    # Past the end of the cache, a compiled call cannot raise: its outputs are NaN.
    att.init_cache((2, 2, 4))
    assert not bool(jnp.isnan(step(att, x[:, :2])).any())
    assert bool(jnp.isnan(step(att, x[:, :1])).all())


def test_decoding_errors():
    att = MultiHeadAttention(2, 4, decode=True, rngs=0)
    with pytest.raises(ValueError, match=r"decode mode needs a cache. Call att.init_cache"):
        att(jnp.ones((1, 1, 4)))
    att.init_cache((1, 3, 4))
    att(jnp.ones((1, 2, 4)))
    before = (att.cached_key.value, int(att.cache_index.value))
    with pytest.raises(
        ValueError,
        match="decode cache is full: it holds 3 positions, 2 are filled and this call adds 2",
    ):
        att(jnp.ones((1, 2, 4)))
    assert jnp.array_equal(att.cached_key.value, before[0])  # unchanged
    assert int(att.cache_index.value) == before[1]
    with pytest.raises(
        ValueError, match=r"batch axes \(2,\) differ from the decode cache's \(1,\)"
    ):
        att(jnp.ones((2, 1, 4)))
    with pytest.raises(ValueError, match="inputs_q has 1 and inputs_k 2"):
        att(jnp.ones((1, 1, 4)), jnp.ones((1, 2, 4)))
    with pytest.raises(
        ValueError, match=r"input_shape = \(batch..., max_length, features\), positive"
    ):
        att.init_cache((4,))
    with pytest.raises(ValueError, match=r"with features=4, got \(1, 8\)"):
        att.init_cache((1, 8))  # the features axis forgotten
    assert isinstance(att.query.kernel, Param)
