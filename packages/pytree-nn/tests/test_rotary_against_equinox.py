"""RotaryPositionalEmbedding, and MultiHeadAttention with it, side by side with Equinox's
RotaryPositionalEmbedding and its MultiheadAttention with `process_heads`.

Equinox's layer takes one sequence `(seq_len, embedding_size)`; ours takes any leading
axes, so Equinox's is vmapped over them. Equinox caches its sines and cosines per
`(embedding_size, dtype)`, not per `theta`, so each theta here gets a size of its own.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_nn as pnn

eqx = pytest.importorskip("equinox")


@pytest.fixture(autouse=True)
def full_float32_matmuls():
    """Compare at float32 accuracy on every backend (GPUs may default to TF32 matmuls)."""
    with jax.default_matmul_precision("float32"):
        yield


def normal(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


@pytest.mark.parametrize(
    ("size", "theta"), [(8, 10000.0), (64, 10000.0), (6, 500000.0), (10, 10.0)]
)
@pytest.mark.parametrize("length", [1, 5, 33])
def test_same_numbers_as_equinox(size, theta, length):
    x = normal(0, (length, size))
    ours = pnn.RotaryPositionalEmbedding(size, theta=theta)(x)
    theirs = eqx.nn.RotaryPositionalEmbedding(size, theta=theta)(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_same_numbers_as_equinox_in_bfloat16():
    x = normal(1, (9, 12), jnp.bfloat16)
    ours = pnn.RotaryPositionalEmbedding(12)(x)
    theirs = eqx.nn.RotaryPositionalEmbedding(12)(x)
    assert ours.dtype == theirs.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        ours.astype(jnp.float32), theirs.astype(jnp.float32), rtol=1e-2, atol=1e-2
    )


def test_leading_axes_equal_equinox_vmapped():
    x = normal(2, (2, 3, 7, 16))  # (batch, heads, seq_len, embedding_size)
    theirs = jax.vmap(jax.vmap(eqx.nn.RotaryPositionalEmbedding(16)))(x)
    np.testing.assert_allclose(pnn.RotaryPositionalEmbedding(16)(x), theirs, atol=1e-6)


def test_positions_with_an_offset_equal_equinox_on_the_longer_sequence():
    # Equinox has no positions: rotating positions 4.. equals its rows 4.. of a longer input.
    x = normal(3, (9, 8))
    theirs = eqx.nn.RotaryPositionalEmbedding(8)(x)[4:]
    ours = pnn.RotaryPositionalEmbedding(8)(x[4:], positions=jnp.arange(4, 9))
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def equinox_rope_heads(rope):
    """Equinox's documented `process_heads` that applies `rope` to queries and keys."""

    def process_heads(query_heads, key_heads, value_heads):
        query_heads = jax.vmap(rope, in_axes=1, out_axes=1)(query_heads)
        key_heads = jax.vmap(rope, in_axes=1, out_axes=1)(key_heads)
        return query_heads, key_heads, value_heads

    return process_heads


def copy_equinox_attention(theirs, num_heads, features):
    """Our attention with Equinox's projection weights (it has no biases by default)."""
    head_dim = features // num_heads
    ours = pnn.MultiHeadAttention(
        num_heads,
        features,
        use_bias=False,
        rotary=pnn.RotaryPositionalEmbedding(head_dim),
        rngs=0,
    )
    for name, proj in (("query", "query_proj"), ("key", "key_proj"), ("value", "value_proj")):
        weight = getattr(theirs, proj).weight  # (num_heads * head_dim, features)
        getattr(ours, name).kernel.value = weight.T.reshape(features, num_heads, head_dim)
    ours.out.kernel.value = theirs.output_proj.weight.T.reshape(num_heads, head_dim, features)
    return ours


def test_attention_with_rotary_equals_equinox_process_heads():
    num_heads, features, length = 4, 32, 6
    theirs = eqx.nn.MultiheadAttention(num_heads, features, key=jax.random.key(0))
    ours = copy_equinox_attention(theirs, num_heads, features)
    process_heads = equinox_rope_heads(eqx.nn.RotaryPositionalEmbedding(features // num_heads))
    x = normal(4, (length, features))
    causal = jnp.tril(jnp.ones((length, length), bool))
    expected = theirs(x, x, x, mask=causal, process_heads=process_heads)
    np.testing.assert_allclose(ours(x, mask=causal), expected, atol=1e-5)
    # Batched: ours takes the batch axis, Equinox's is vmapped.
    xs = normal(5, (3, length, features))
    expected = jax.vmap(lambda x: theirs(x, x, x, process_heads=process_heads))(xs)
    np.testing.assert_allclose(ours(xs), expected, atol=1e-5)


@pytest.mark.parametrize(
    "setting",
    [lambda: jax.numpy_rank_promotion("raise"), lambda: jax.numpy_dtype_promotion("strict")],
    ids=["rank-raise", "dtype-strict"],
)
def test_runs_under_strict_promotion_as_equinoxs_does(setting):
    x = normal(0, (2, 5, 8))
    with setting():
        ours = pnn.RotaryPositionalEmbedding(8)(x)
        theirs = jax.vmap(eqx.nn.RotaryPositionalEmbedding(8))(x)
        slopes = jnp.full((8,), 0.2)
        our_prelu = pnn.PReLU(0.2, num_parameters=8)(x)
        their_prelu = eqx.nn.PReLU(slopes)(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(our_prelu, their_prelu)
