"""RotaryPositionalEmbedding, and MultiHeadAttention with rotary embeddings, against float64
references written out by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_nn import (
    MultiHeadAttention,
    RotaryPositionalEmbedding,
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


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def reference_rope(x, positions=None, theta=10000.0):
    """RoPE in float64 numpy, one pair of features at a time: feature i turns with
    feature i + d/2 by the angle position * theta ** (-2 i / d)."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    positions = np.arange(x.shape[-2]) if positions is None else np.asarray(positions)
    positions = np.broadcast_to(positions, x.shape[:-1]).astype(np.float64)
    out = np.empty_like(x)
    for i in range(d // 2):
        angle = positions * theta ** (-2.0 * i / d)
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * np.cos(angle) - b * np.sin(angle)
        out[..., i + d // 2] = b * np.cos(angle) + a * np.sin(angle)
    return out


# ------------------------------------------------------------------ the layer on its own


@pytest.mark.parametrize("theta", [10000.0, 500000.0, 10.0])
@pytest.mark.parametrize("shape", [(7, 8), (2, 3, 7, 6), (1, 2)])
def test_matches_the_reference(shape, theta):
    x = normal(0, shape)
    rope = RotaryPositionalEmbedding(shape[-1], theta=theta)
    np.testing.assert_allclose(rope(x), reference_rope(x, theta=theta), rtol=1e-5, atol=1e-5)


def test_pairs_each_feature_with_the_one_half_a_vector_away():
    # Rotate-half convention: feature 1 of 8 turns into feature 5, never into feature 0 or 2.
    x = jnp.zeros((3, 8)).at[:, 1].set(1.0)
    y = np.asarray(RotaryPositionalEmbedding(8)(x))
    assert np.all(y[:, [0, 2, 3, 4, 6, 7]] == 0.0)
    angle = np.arange(3) * 10000.0 ** (-2 / 8)
    np.testing.assert_allclose(y[:, 1], np.cos(angle), rtol=1e-6)
    np.testing.assert_allclose(y[:, 5], np.sin(angle), rtol=1e-6)


def test_position_zero_is_unchanged_and_norms_are_kept():
    x = normal(1, (4, 9, 16))
    y = RotaryPositionalEmbedding(16)(x)
    np.testing.assert_array_equal(y[:, 0], x[:, 0])
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)


def test_explicit_positions():
    x = normal(2, (2, 5, 8))
    rope = RotaryPositionalEmbedding(8)
    np.testing.assert_allclose(rope(x, jnp.arange(5)), rope(x), rtol=0, atol=0)
    offset = rope(x, positions=jnp.arange(5) + 17)
    np.testing.assert_allclose(offset, reference_rope(x, np.arange(5) + 17), atol=1e-5)
    # One row of positions per batch entry (packed or left-padded sequences).
    per_batch = jnp.array([[0, 1, 2, 0, 1], [3, 4, 5, 6, 7]])
    np.testing.assert_allclose(rope(x, per_batch), reference_rope(x, per_batch), atol=1e-5)
    # Float positions are used as given.
    np.testing.assert_allclose(
        rope(x, jnp.arange(5) * 0.5), reference_rope(x, np.arange(5) * 0.5), atol=1e-5
    )


def test_dot_products_depend_on_relative_positions_only():
    rope = RotaryPositionalEmbedding(16)
    q, k = normal(3, (1, 16)), normal(4, (1, 16))

    def score(m, n):
        return float((rope(q, jnp.array([m])) * rope(k, jnp.array([n]))).sum())

    for m, n in [(0, 0), (3, 1), (1, 3), (10, 2)]:
        for shift in (1, 7, 250):
            assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(1, 3), abs=1e-3)


def test_dtypes():
    x = normal(5, (4, 8))
    half = x.astype(jnp.bfloat16)
    rope = RotaryPositionalEmbedding(8)
    assert rope(half).dtype == jnp.bfloat16
    # Computed in float32, rounded once at the end.
    np.testing.assert_array_equal(rope(half), rope(half.astype(jnp.float32)).astype(jnp.bfloat16))
    assert RotaryPositionalEmbedding(8, dtype=jnp.bfloat16)(x).dtype == jnp.bfloat16
    ints = jnp.arange(8).reshape(1, 8)
    assert RotaryPositionalEmbedding(8, dtype=jnp.float32)(ints).dtype == jnp.float32
    with pytest.raises(TypeError, match="floating-point arrays, got x of dtype int32"):
        rope(ints)


def test_no_parameters_and_transforms():
    rope = RotaryPositionalEmbedding(8)
    assert jax.tree.leaves(rope) == []
    x = normal(6, (3, 5, 8))
    positions = jnp.array([[4, 5, 6, 7, 8]] * 3)
    eager = rope(x, positions)
    np.testing.assert_allclose(jax.jit(rope)(x, positions), eager, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(rope)(x, positions), eager, atol=1e-6)
    np.testing.assert_allclose(pg.jit(lambda r, x: r(x, positions))(rope, x), eager, atol=1e-6)
    # The rotation is linear: its gradient is the transposed rotation.
    grad = jax.grad(lambda x: (rope(x) * x).sum())(x)
    np.testing.assert_allclose(grad, rope(x) + reference_rope(x, -np.arange(5)), atol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match=r"embedding_size must be even .* got embedding_size=7"):
        RotaryPositionalEmbedding(7)
    with pytest.raises(ValueError, match="embedding_size must be a positive int, got 0"):
        RotaryPositionalEmbedding(0)
    with pytest.raises(ValueError, match=r"theta must be a positive number, got -1\.0"):
        RotaryPositionalEmbedding(8, theta=-1.0)
    rope = RotaryPositionalEmbedding(8)
    with pytest.raises(ValueError, match=r"embedding_size=8, got shape \(3, 6\)"):
        rope(jnp.ones((3, 6)))
    with pytest.raises(ValueError, match=r"got shape \(8,\)"):
        rope(jnp.ones(8))
    with pytest.raises(ValueError, match=r"positions of shape \(4,\) do not broadcast .* \(2, 3\)"):
        rope(jnp.ones((2, 3, 8)), jnp.arange(4))
    with pytest.raises(ValueError, match="do not broadcast"):
        rope(jnp.ones((3, 8)), jnp.zeros((2, 3), jnp.int32))  # would add a batch axis
    with pytest.raises(TypeError, match="integer positions, got an array of dtype bool"):
        rope(jnp.ones((3, 8)), jnp.ones(3, bool))


# ----------------------------------------------------------- inside MultiHeadAttention


def rotary_attention(num_heads=2, features=16, **kwargs):
    head_dim = features // num_heads
    return MultiHeadAttention(
        num_heads, features, rotary=RotaryPositionalEmbedding(head_dim), rngs=0, **kwargs
    )


def reference_attention(att, inputs_q, inputs_k=None, mask=None, q_pos=None, kv_pos=None):
    """The layer's output with the projections, rotations and softmax written out."""
    inputs_k = inputs_q if inputs_k is None else inputs_k
    q, k, v = (
        np.asarray(a, np.float64)
        for a in (att.query(inputs_q), att.key(inputs_k), att.value(inputs_k))
    )
    q_len, kv_len = q.shape[-3], k.shape[-3]
    q_pos = np.arange(q_len) if q_pos is None else np.asarray(q_pos)
    kv_pos = np.arange(kv_len) if kv_pos is None else np.asarray(kv_pos)
    # Rotate each head: (batch..., length, heads, d) -> (batch..., heads, length, d).
    q = reference_rope(
        np.swapaxes(q, -3, -2), np.expand_dims(q_pos, -2) if q_pos.ndim > 1 else q_pos
    )
    k = reference_rope(
        np.swapaxes(k, -3, -2), np.expand_dims(kv_pos, -2) if kv_pos.ndim > 1 else kv_pos
    )
    v = np.swapaxes(v, -3, -2)
    logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = np.where(np.broadcast_to(np.asarray(mask, bool), logits.shape), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True)
    heads = np.swapaxes(weights @ v, -3, -2)
    kernel = np.asarray(att.out.kernel.value, np.float64)
    return np.tensordot(heads, kernel, axes=2) + np.asarray(att.out.bias.value)


def test_attention_with_rotary_matches_the_hand_computation():
    att = rotary_attention()
    x = normal(7, (3, 6, 16))
    np.testing.assert_allclose(att(x), reference_attention(att, x), atol=1e-5)
    positions = jnp.array([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12], [0, 1, 2, 0, 1, 2]])
    np.testing.assert_allclose(
        att(x, positions=positions),
        reference_attention(att, x, q_pos=positions, kv_pos=positions),
        atol=1e-5,
    )
    # The embedding does change the result: same parameters without it differ.
    plain = MultiHeadAttention(2, 16, rngs=0)
    assert not np.allclose(plain(x), att(x), atol=1e-3)


def test_attention_with_rotary_is_invariant_to_shifting_all_positions():
    att = rotary_attention(num_heads=4, features=32)
    tokens = jnp.array([[3, 1, 4, 1, 5, 0, 0], [2, 7, 1, 8, 2, 8, 1]])
    x = normal(8, (2, 7, 32))
    mask = combine_masks(make_causal_mask(tokens), make_attention_mask(tokens != 0, tokens != 0))
    base = att(x, mask=mask)
    for shift in (1, 13, 1000):
        shifted = att(x, mask=mask, positions=jnp.arange(7) + shift)
        np.testing.assert_allclose(shifted, base, atol=2e-5)
    # Shifting each batch entry by its own amount too.
    per_batch = jnp.arange(7) + jnp.array([[5], [300]])
    np.testing.assert_allclose(att(x, mask=mask, positions=per_batch), base, atol=2e-5)
    # Moving one position does not leave the output unchanged.
    moved = att(x, mask=mask, positions=jnp.array([0, 1, 2, 3, 4, 5, 9]))
    assert not np.allclose(moved[1], base[1], atol=1e-3)


def test_cross_attention_positions():
    att = rotary_attention()
    x, memory = normal(9, (2, 3, 16)), normal(10, (2, 5, 16))
    np.testing.assert_allclose(att(x, memory), reference_attention(att, x, memory), atol=1e-5)
    got = att(x, memory, positions=jnp.arange(3) + 4, kv_positions=jnp.arange(5) + 2)
    expected = reference_attention(att, x, memory, q_pos=np.arange(3) + 4, kv_pos=np.arange(5) + 2)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    with pytest.raises(
        ValueError, match=r"another length \(5\) than the queries \(3\).*kv_positions"
    ):
        att(x, memory, positions=jnp.arange(3))


@pytest.mark.parametrize("chunks", [(1,) * 6, (2, 1, 3)])
def test_decoding_with_rotary_equals_the_causal_forward_pass(chunks):
    att = rotary_attention()
    x = normal(11, (2, 6, 16))
    full = att(x, mask=make_causal_mask(jnp.zeros((2, 6))))
    att.init_cache((2, 8, 16))
    step = pg.jit(lambda model, x: model(x, decode=True))
    outputs, start = [], 0
    for size in chunks:
        outputs.append(step(att, x[:, start : start + size]))
        start += size
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), full, atol=2e-5)
    assert int(att.cache_index.value) == 6
    # The cache holds rotated keys, at their absolute positions.
    key = att.key(x)
    rotated = reference_rope(np.swapaxes(key, -3, -2))
    np.testing.assert_allclose(att.cached_key.value[:, :6], np.swapaxes(rotated, -3, -2), atol=1e-5)


def test_decoding_with_explicit_positions():
    # Left padding: the second sequence starts two steps later and counts from 0 there.
    att = rotary_attention()
    x = normal(12, (2, 4, 16))
    positions = jnp.array([[0, 1, 2, 3], [0, 0, 0, 1]])
    att.init_cache((2, 4, 16))
    decoded = jnp.concatenate(
        [att(x[:, t : t + 1], decode=True, positions=positions[:, t : t + 1]) for t in range(4)],
        axis=1,
    )
    full = att(x, mask=make_causal_mask(jnp.zeros((2, 4))), positions=positions)
    np.testing.assert_allclose(decoded, full, atol=2e-5)


def test_attention_with_rotary_under_jit_and_vmap():
    att = rotary_attention()
    x = normal(13, (4, 5, 16))
    mask = make_causal_mask(jnp.zeros((4, 5)))
    eager = att(x, mask=mask, positions=jnp.arange(5) + 3)
    jitted = pg.jit(lambda model, x: model(x, mask=mask, positions=jnp.arange(5) + 3))
    np.testing.assert_allclose(jitted(att, x), eager, atol=1e-5)
    mapped = jax.vmap(lambda x, m: att(x, mask=m, positions=jnp.arange(5) + 3))(x, mask)
    np.testing.assert_allclose(mapped, eager, atol=1e-5)
    grads = pg.grad(lambda model: model(x, mask=mask).sum())(att)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))


def test_attention_rotary_errors():
    with pytest.raises(
        ValueError, match=r"head_dim = qkv_features // num_heads = 8, got embedding_size=16"
    ):
        MultiHeadAttention(2, 16, rotary=RotaryPositionalEmbedding(16), rngs=0)
    with pytest.raises(TypeError, match="rotary must be a RotaryPositionalEmbedding"):
        MultiHeadAttention(2, 16, rotary=8, rngs=0)
    plain = MultiHeadAttention(2, 16, rngs=0)
    with pytest.raises(
        ValueError, match=r"has none. Build it with rotary=RotaryPositionalEmbedding\(8\)"
    ):
        plain(jnp.ones((3, 16)), positions=jnp.arange(3))
    att = rotary_attention()
    with pytest.raises(
        ValueError, match=r"positions of shape \(4,\) does not broadcast .* \(2, 3\)"
    ):
        att(jnp.ones((2, 3, 16)), positions=jnp.arange(4))
    with pytest.raises(ValueError, match="decode mode needs a cache"):
        att(jnp.ones((2, 1, 16)), decode=True)


def test_dot_product_attention_is_unchanged_by_the_rotary_layer_option():
    # The rotary option lives in the layer; the function underneath takes rotated heads.
    att = rotary_attention()
    x = normal(14, (5, 16))
    rope = RotaryPositionalEmbedding(8)
    q = jnp.swapaxes(rope(jnp.swapaxes(att.query(x), 0, 1)), 0, 1)
    k = jnp.swapaxes(rope(jnp.swapaxes(att.key(x), 0, 1)), 0, 1)
    heads = dot_product_attention(q, k, att.value(x))
    np.testing.assert_allclose(att.out(heads), att(x), atol=1e-6)
