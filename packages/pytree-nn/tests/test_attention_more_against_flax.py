"""Grouped-query attention, `normalize_qk`, `is_causal`, `keep_rngs`, `out_bias_init` and
grouped-query decoding side by side with Flax NNX 0.12: NNX's weights copied into ours,
the same inputs, the same outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
import pytree_nn as pnn

nnx = pytest.importorskip("flax.nnx")


@pytest.fixture(autouse=True)
def full_float32_matmuls():
    with jax.default_matmul_precision("float32"):
        yield


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def assert_close(actual, expected, tol=1e-5):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=tol, atol=tol)


PARAMS = [
    ("query", "kernel"),
    ("query", "bias"),
    ("key", "kernel"),
    ("key", "bias"),
    ("value", "kernel"),
    ("value", "bias"),
    ("out", "kernel"),
    ("out", "bias"),
    ("query_ln", "scale"),
    ("key_ln", "scale"),
]


def pair(seed=0, **kwargs):
    """NNX's MultiHeadAttention and ours with its weights (drawn afresh, so that LayerNorm
    scales and biases are not 1 and 0)."""
    theirs = nnx.MultiHeadAttention(**kwargs, decode=False, rngs=nnx.Rngs(seed))
    ours = pnn.MultiHeadAttention(**kwargs, rngs=seed)
    keys = iter(jax.random.split(jax.random.key(seed + 100), len(PARAMS)))
    for layer, name in PARAMS:
        key = next(keys)
        their_layer = getattr(theirs, layer)
        if their_layer is None or getattr(their_layer, name, None) is None:
            assert getattr(getattr(ours, layer), name, None) is None, (layer, name)
            continue
        variable = getattr(their_layer, name)
        variable.value = 0.5 * jax.random.normal(key, variable.value.shape) + 0.1
        getattr(getattr(ours, layer), name).value = variable.value
    return ours, theirs


LAYERS = [
    dict(num_heads=4, in_features=8, num_kv_heads=2),
    dict(num_heads=4, in_features=8, qkv_features=16, num_kv_heads=1, out_features=5),
    dict(num_heads=4, in_features=8, normalize_qk=True),
    dict(num_heads=6, in_features=8, qkv_features=12, num_kv_heads=3, normalize_qk=True),
    dict(num_heads=4, in_features=8, num_kv_heads=2, in_kv_features=6, use_bias=False),
]


@pytest.mark.parametrize("kwargs", LAYERS, ids=str)
def test_layer_like_nnx(kwargs):
    ours, theirs = pair(**kwargs)
    for name in ("query", "key", "value", "out"):
        assert getattr(ours, name).kernel.value.shape == getattr(theirs, name).kernel.shape
    x = normal(1, (2, 5, 8))
    kv = normal(2, (2, 7, kwargs.get("in_kv_features", 8)))
    mask = jax.random.bernoulli(jax.random.key(3), 0.7, (2, 1, 5, 7))
    assert_close(ours(x, kv), theirs(x, kv))
    assert_close(ours(x, kv, mask=mask), theirs(x, kv, mask=mask))
    if "in_kv_features" not in kwargs:
        assert_close(ours(x, is_causal=True), theirs(x, is_causal=True))
        causal = pnn.make_causal_mask(jnp.zeros((2, 5)))
        assert_close(ours(x, mask=causal, is_causal=True), theirs(x, mask=causal, is_causal=True))


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (4, 1)], ids=str)
def test_dot_product_attention_like_nnx(heads, kv_heads):
    q = normal(1, (2, 5, heads, 3))
    k, v = normal(2, (2, 7, kv_heads, 3)), normal(3, (2, 7, kv_heads, 3))
    mask = jax.random.bernoulli(jax.random.key(4), 0.7, (2, 1, 5, 7))
    bias = normal(5, (2, heads, 5, 7))
    for kwargs in [{}, {"is_causal": True}, {"mask": mask, "bias": bias, "is_causal": True}]:
        expected = nnx.dot_product_attention(q, k, v, **kwargs)
        for implementation in (None, "einsum"):
            actual = pnn.dot_product_attention(q, k, v, implementation=implementation, **kwargs)
            assert_close(actual, expected)
    # NNX's einsum path (taken with a dropout rate, here switched off) agrees too.
    off = dict(dropout_rate=0.5, deterministic=True)
    assert_close(
        pnn.dot_product_attention(q, k, v, mask=mask, is_causal=True, **off),
        nnx.dot_product_attention(q, k, v, mask=mask, is_causal=True, **off),
    )


@pytest.mark.parametrize("broadcast_dropout", [True, False])
def test_grouped_dropout_like_nnx(broadcast_dropout):
    q, kv = normal(1, (2, 5, 4, 3)), normal(2, (2, 5, 2, 3))
    kwargs = dict(
        dropout_rng=jax.random.key(9), dropout_rate=0.4, broadcast_dropout=broadcast_dropout
    )
    assert_close(
        pnn.dot_product_attention(q, kv, kv, **kwargs),
        nnx.dot_product_attention(q, kv, kv, **kwargs),
    )


def test_keep_rngs_like_nnx():
    kwargs = dict(num_heads=4, in_features=8, num_kv_heads=2, dropout_rate=0.3)
    ours, theirs = pair(**kwargs, keep_rngs=False, deterministic=False)
    assert ours.rngs is None and theirs.rngs is None
    x = normal(1, (2, 5, 8))
    with pytest.raises(ValueError):
        theirs(x)
    with pytest.raises(ValueError, match="needs random keys for attention dropout"):
        ours(x)
    assert_close(ours(x, rngs=pnn.Rngs(dropout=4)), theirs(x, rngs=nnx.Rngs(dropout=4)))
    kept_ours, kept_theirs = pair(**kwargs, deterministic=False)
    assert kept_ours.rngs is not None and kept_theirs.rngs is not None


def test_out_bias_init_like_nnx():
    kwargs = dict(num_heads=2, in_features=4, out_bias_init=jax.nn.initializers.constant(0.3))
    theirs = nnx.MultiHeadAttention(**kwargs, decode=False, rngs=nnx.Rngs(0))
    ours = pnn.MultiHeadAttention(**kwargs, rngs=0)
    assert_close(ours.out.bias.value, theirs.out.bias.value, tol=0)
    assert_close(ours.query.bias.value, theirs.query.bias.value, tol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_heads=4, in_features=8, num_kv_heads=2),
        dict(num_heads=4, in_features=8, num_kv_heads=1, normalize_qk=True),
    ],
    ids=str,
)
def test_grouped_decoding_like_nnx(kwargs):
    """NNX decodes one position per call; both caches hold num_kv_heads heads, and the
    steps give the full causal pass's outputs."""
    ours, theirs = pair(**kwargs)
    x = normal(1, (2, 6, 8))
    full = theirs(x, is_causal=True)
    assert_close(ours(x, is_causal=True), full)

    ours.init_cache(x.shape)
    theirs.init_cache(x.shape)
    cache_shape = (2, 6, kwargs["num_kv_heads"], 2)
    assert ours.cached_key.value.shape == theirs.cached_key.shape == cache_shape
    our_step = pg.jit(lambda model, x: model(x, decode=True))
    their_step = nnx.jit(lambda model, x: model(x, decode=True))
    our_steps = []
    for t in range(x.shape[1]):
        our_steps.append(our_step(ours, x[:, t : t + 1]))
        assert_close(our_steps[-1], their_step(theirs, x[:, t : t + 1]))
    assert_close(jnp.concatenate(our_steps, axis=1), full)
    assert_close(ours.cached_key.value, theirs.cached_key.value)
    assert_close(ours.cached_value.value, theirs.cached_value.value)
