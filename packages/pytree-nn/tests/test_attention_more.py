"""Grouped-query and multi-query attention, `is_causal`, `normalize_qk`, `keep_rngs`,
`out_bias_init`, decoding with a grouped-query cache, and which kernel path runs, against
hand-written jax.numpy attention on fixed weights."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_nn import (
    LayerNorm,
    Module,
    MultiHeadAttention,
    Optimizer,
    Rngs,
    RngState,
    RotaryPositionalEmbedding,
    dot_product_attention,
    initializers,
    make_causal_mask,
)


@pytest.fixture(autouse=True)
def full_float32_matmuls():
    """Compare at float32 accuracy on every backend (GPUs may default to TF32 matmuls)."""
    with jax.default_matmul_precision("float32"):
        yield


def normal(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


# ------------------------------------------------------------------------- references


def reference_attention(q, k, v, mask=None, bias=None, is_causal=False):
    """Attention with the key/value heads repeated for their query heads, plain jnp."""
    groups = q.shape[-2] // k.shape[-2]
    k, v = jnp.repeat(k, groups, axis=-2), jnp.repeat(v, groups, axis=-2)
    logits = jnp.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias
    allowed = jnp.ones(logits.shape, bool)
    if mask is not None:
        allowed = allowed & jnp.asarray(mask, bool)
    if is_causal:
        allowed = allowed & jnp.tril(jnp.ones(logits.shape[-2:], bool))
    # A large finite value: a row masked everywhere gets uniform weights.
    logits = jnp.where(allowed, logits, -1e30)
    weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return jnp.einsum("...hqk,...khd->...qhd", weights, v)


def reference_layer_norm(x, scale, epsilon=1e-6):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(variance + epsilon) * scale


def reference_layer(att, x, mask=None, is_causal=False):
    """`att(x)` computed from its weights with einsums."""

    def project(layer, x):
        y = jnp.einsum("...f,fhd->...hd", x, layer.kernel.value)
        return y + layer.bias.value if layer.bias is not None else y

    q, k, v = project(att.query, x), project(att.key, x), project(att.value, x)
    if att.normalize_qk:
        q = reference_layer_norm(q, att.query_ln.scale.value)
        k = reference_layer_norm(k, att.key_ln.scale.value)
    heads = reference_attention(q, k, v, mask=mask, is_causal=is_causal)
    out = jnp.einsum("...hd,hdo->...o", heads, att.out.kernel.value)
    return out + att.out.bias.value if att.out.bias is not None else out


def randomized(att, seed=10):
    """`att` with every Param drawn afresh (scales and biases away from 1 and 0)."""
    graphdef, params, rest = pg.split(att, Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    pairs = zip(keys, leaves, strict=True)
    leaves = [0.5 * jax.random.normal(key, x.shape) + 0.1 for key, x in pairs]
    return pg.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest)


def assert_close(actual, expected, tol=2e-5):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=tol, atol=tol)


# ------------------------------------------------------------------------- dot_product_attention

HEADS = [(4, 4), (4, 2), (4, 1)]  # (num_heads, num_kv_heads): MHA, GQA, MQA


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS, ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("batch", [(), (2, 3)], ids=str)
def test_grouped_attention_matches_reference(heads, kv_heads, batch):
    q = normal(1, (*batch, 5, heads, 3))
    k, v = normal(2, (*batch, 7, kv_heads, 3)), normal(3, (*batch, 7, kv_heads, 3))
    # Some rows masked everywhere (uniform weights), per-batch masks, a per-head bias.
    mask = jax.random.bernoulli(jax.random.key(4), 0.5, (*batch, 1, 5, 7))
    bias = normal(5, (heads, 5, 7))
    cases = [{}, {"is_causal": True}, {"mask": mask, "bias": bias, "is_causal": True}]
    for implementation in (None, "einsum"):
        for kwargs in cases:
            assert_close(
                dot_product_attention(q, k, v, implementation=implementation, **kwargs),
                reference_attention(q, k, v, **kwargs),
            )


def test_is_causal_counts_from_the_start_of_both():
    # Three queries over five keys: query i sees keys 0..i, as jax.nn.dot_product_attention.
    q, k, v = normal(1, (3, 2, 4)), normal(2, (5, 2, 4)), normal(3, (5, 2, 4))
    mask = jnp.tril(jnp.ones((3, 5), bool))
    for implementation in (None, "einsum"):
        out = dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
        assert_close(out, dot_product_attention(q, k, v, mask=mask))
        fused = jax.nn.dot_product_attention(q[None], k[None], v[None], is_causal=True)
        assert_close(out, fused[0])


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS, ids=["mha", "gqa", "mqa"])
def test_both_paths_give_the_same_numbers(heads, kv_heads):
    q = normal(1, (2, 6, heads, 8))
    k, v = normal(2, (2, 6, kv_heads, 8)), normal(3, (2, 6, kv_heads, 8))
    mask = jax.random.bernoulli(jax.random.key(4), 0.6, (2, 1, 6, 6))
    bias = normal(5, (1, heads, 6, 6))
    for kwargs in [{}, {"is_causal": True, "mask": mask, "bias": bias}]:
        fused = dot_product_attention(q, k, v, **kwargs)
        einsum = dot_product_attention(q, k, v, implementation="einsum", **kwargs)
        np.testing.assert_allclose(np.asarray(fused), np.asarray(einsum), rtol=1e-6, atol=1e-6)
    # Half precision: the logits and softmax in float32 on both paths, weights cast back.
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    fused = dot_product_attention(q, k, v, mask=mask, is_causal=True)
    einsum = dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation="einsum")
    assert fused.dtype == einsum.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(fused, np.float32), np.asarray(einsum, np.float32), rtol=1e-2, atol=1e-2
    )


def test_which_path_runs(monkeypatch):
    calls = []
    fused = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs["implementation"])
        return fused(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    q, kv = normal(1, (2, 5, 4, 3)), normal(2, (2, 5, 2, 3))
    key = jax.random.key(0)
    cases = [
        ({}, [None]),
        ({"implementation": "xla"}, ["xla"]),
        ({"implementation": "einsum"}, []),
        ({"dropout_rate": 0.5, "dropout_rng": key}, []),
        ({"dropout_rate": 0.5, "dropout_rng": key, "deterministic": True}, [None]),
        ({"precision": jax.lax.Precision.HIGHEST}, []),
    ]
    for kwargs, expected in cases:
        calls.clear()
        dot_product_attention(q, kv, kv, **kwargs)
        assert calls == expected, kwargs
    calls.clear()
    dot_product_attention(q, kv, jnp.ones((2, 5, 2, 6)))  # values of another head_dim
    assert calls == []
    with pytest.raises(ValueError, match="cannot compute this call: attention dropout is on"):
        dot_product_attention(q, kv, kv, dropout_rate=0.5, dropout_rng=key, implementation="cudnn")


def test_grouped_attention_dropout_drops_the_weights():
    """With dropout (the einsum path) each query head's weights are dropped, the
    broadcast mask shared by all heads."""
    q, kv = normal(1, (5, 4, 3)), normal(2, (5, 2, 3))
    key, rate = jax.random.key(7), 0.5
    out = dot_product_attention(q, kv, kv, dropout_rng=key, dropout_rate=rate)
    keep = jax.random.bernoulli(key, 1 - rate, (1, 5, 5))
    logits = jnp.einsum("qhd,khd->hqk", q, jnp.repeat(kv, 2, axis=-2)) / math.sqrt(3)
    weights = jnp.where(keep, jax.nn.softmax(logits) / (1 - rate), 0.0)
    assert_close(out, jnp.einsum("hqk,khd->qhd", weights, jnp.repeat(kv, 2, axis=-2)))


# ------------------------------------------------------------------------- MultiHeadAttention


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS, ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("normalize_qk", [False, True], ids=["plain", "normalize_qk"])
def test_layer_matches_reference(heads, kv_heads, normalize_qk):
    att = MultiHeadAttention(
        heads, 6, qkv_features=8, num_kv_heads=kv_heads, normalize_qk=normalize_qk, rngs=0
    )
    assert att.query.kernel.value.shape == (6, heads, 2)
    assert att.key.kernel.value.shape == att.value.kernel.value.shape == (6, kv_heads, 2)
    assert att.key.bias.value.shape == (kv_heads, 2)
    if normalize_qk:
        assert isinstance(att.query_ln, LayerNorm) and att.query_ln.bias is None
        assert att.query_ln.scale.value.shape == att.key_ln.scale.value.shape == (2,)
        assert att.query_ln.epsilon == 1e-6
    else:
        assert att.query_ln is None and att.key_ln is None
    att = randomized(att)
    x = normal(1, (2, 5, 6))
    causal = make_causal_mask(jnp.zeros((2, 5)))
    # The LayerNorms of normalize_qk work over heads of 2 features, where the layer's
    # variance (mean of squares less the squared mean, as Flax's) and the reference's
    # (mean of squared deviations) round apart by a few 1e-5, by how the CPU orders the sums.
    tol = 1e-4 if normalize_qk else 2e-5
    assert_close(att(x), reference_layer(att, x), tol)
    assert_close(att(x, is_causal=True), reference_layer(att, x, is_causal=True), tol)
    assert_close(att(x, mask=causal), reference_layer(att, x, is_causal=True), tol)


def test_normalize_qk_is_applied_before_rotary():
    rotary = RotaryPositionalEmbedding(4)
    att = randomized(MultiHeadAttention(2, 8, normalize_qk=True, rotary=rotary, rngs=0))
    x = normal(1, (5, 8))
    q = jnp.einsum("lf,fhd->lhd", x, att.query.kernel.value) + att.query.bias.value
    k = jnp.einsum("lf,fhd->lhd", x, att.key.kernel.value) + att.key.bias.value
    v = jnp.einsum("lf,fhd->lhd", x, att.value.kernel.value) + att.value.bias.value
    q = reference_layer_norm(q, att.query_ln.scale.value)
    k = reference_layer_norm(k, att.key_ln.scale.value)
    rotate = lambda h: jnp.swapaxes(rotary(jnp.swapaxes(h, 0, 1)), 0, 1)  # noqa: E731
    heads = reference_attention(rotate(q), rotate(k), v, is_causal=True)
    expected = jnp.einsum("lhd,hdo->lo", heads, att.out.kernel.value) + att.out.bias.value
    assert_close(att(x, is_causal=True), expected)


def test_out_bias_init():
    att = MultiHeadAttention(2, 4, out_bias_init=initializers.ones, rngs=0)
    assert np.all(att.out.bias.value == 1.0)
    assert np.all(att.query.bias.value == 0.0) and np.all(att.value.bias.value == 0.0)
    # Without it the out bias takes bias_init, as before.
    att = MultiHeadAttention(2, 4, bias_init=initializers.constant(0.5), rngs=0)
    assert np.all(att.out.bias.value == 0.5)


def test_keep_rngs():
    x = normal(1, (1, 4, 4))
    kept = MultiHeadAttention(2, 4, dropout_rate=0.5, rngs=Rngs(0, dropout=3))
    dropped = MultiHeadAttention(2, 4, dropout_rate=0.5, keep_rngs=False, rngs=Rngs(0, dropout=3))
    assert isinstance(kept.rngs, Rngs) and dropped.rngs is None
    assert len(pg.split(dropped, RngState, ...)[1]) == 0
    # The same parameters: keep_rngs changes only whether the dropout stream is kept.
    np.testing.assert_array_equal(kept.query.kernel.value, dropped.query.kernel.value)
    with pytest.raises(ValueError, match="needs random keys for attention dropout"):
        dropped(x)
    np.testing.assert_array_equal(dropped(x, rngs=Rngs(dropout=5)), kept(x, rngs=Rngs(dropout=5)))
    np.testing.assert_array_equal(dropped(x, deterministic=True), kept(x, deterministic=True))


def test_is_causal_reaches_attention_fn_only_when_asked():
    seen = []

    def attention_fn(query, key, value, **kwargs):
        seen.append(kwargs.get("is_causal"))
        return dot_product_attention(query, key, value, **kwargs)

    att = MultiHeadAttention(2, 4, attention_fn=attention_fn, rngs=0)
    x = normal(1, (1, 3, 4))
    att(x)
    att(x, is_causal=True)
    att.init_cache(x.shape)
    att(x[:, :1], decode=True, is_causal=True)  # the cache's mask is causal already
    assert seen == [None, True, None]


def test_errors():
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        MultiHeadAttention(4, 8, num_kv_heads=3, rngs=0)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int, got 0"):
        MultiHeadAttention(4, 8, num_kv_heads=0, rngs=0)
    with pytest.raises(TypeError, match="normalize_qk must be True or False, got 1"):
        MultiHeadAttention(4, 8, normalize_qk=1, rngs=0)
    with pytest.raises(TypeError, match="keep_rngs must be True or False"):
        MultiHeadAttention(4, 8, keep_rngs=None, rngs=0)
    att = MultiHeadAttention(4, 8, num_kv_heads=2, decode=True, rngs=0)
    att.init_cache((1, 4, 8))
    with pytest.raises(TypeError, match="is_causal must be True or False, got 'yes'"):
        att(jnp.ones((1, 1, 8)), is_causal="yes")
    assert int(att.cache_index.value) == 0  # the failed call left the cache as it was


# ------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(("heads", "kv_heads"), HEADS, ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("extras", ["", "normalize_qk, rotary"])
def test_decoding_matches_the_causal_forward_pass(heads, kv_heads, extras):
    rotary = RotaryPositionalEmbedding(4) if "rotary" in extras else None
    att = MultiHeadAttention(
        heads,
        6,
        qkv_features=16,
        num_kv_heads=kv_heads,
        normalize_qk="normalize_qk" in extras,
        rotary=rotary,
        rngs=0,
    )
    att = randomized(att)
    x = normal(1, (2, 7, 6))
    full = att(x, is_causal=True)
    assert_close(full, att(x, mask=make_causal_mask(jnp.zeros((2, 7)))))

    att.init_cache(x.shape)
    assert att.cached_key.value.shape == att.cached_value.value.shape == (2, 7, kv_heads, 4)
    step = pg.jit(lambda model, x: model(x, decode=True))
    # One position, then two at once, then the rest one by one.
    chunks = [(0, 1), (1, 3), *((t, t + 1) for t in range(3, 7))]
    steps = [step(att, x[:, start:stop]) for start, stop in chunks]
    assert_close(jnp.concatenate(steps, axis=1), full)
    assert int(att.cache_index.value) == 7

    # The cache holds the keys and values of the kv heads (normalized and rotated).
    def project(layer):
        return jnp.einsum("...f,fhd->...hd", x, layer.kernel.value) + layer.bias.value

    keys, values = project(att.key), project(att.value)
    if att.normalize_qk:
        keys = reference_layer_norm(keys, att.key_ln.scale.value)
    if rotary is not None:
        keys = jnp.swapaxes(rotary(jnp.swapaxes(keys, -3, -2)), -3, -2)
    assert_close(att.cached_key.value, keys, tol=1e-4)
    assert_close(att.cached_value.value, values)


# ------------------------------------------------------------------------- tied


class TiedBlocks(Module):
    """One grouped-query attention layer applied twice."""

    def __init__(self):
        self.first = MultiHeadAttention(
            4, 8, qkv_features=16, num_kv_heads=2, normalize_qk=True, rngs=0
        )
        self.second = self.first

    def __call__(self, x):
        return self.second(self.first(x, is_causal=True), is_causal=True)


def test_tied_attention_stays_shared():
    model = TiedBlocks()
    x = normal(1, (2, 5, 8))
    graphdef, state = pg.split(model)
    copy = pg.merge(graphdef, state)
    assert copy.first is copy.second
    assert_close(copy(x), model(x))

    def loss(model, x):
        return jnp.mean(model(x) ** 2)

    # The expected step, on an untied view: gradients of the Params the graph holds once.
    param_graphdef, before, rest = pg.split(model, Param, ...)
    before = jax.tree.map(jnp.copy, before)
    expected_value, expected = jax.value_and_grad(
        lambda params: loss(pg.merge(param_graphdef, params, rest, copy=True), x)
    )(before)

    optimizer = Optimizer(model, optax.sgd(0.1), wrt=Param)

    @pg.jit
    def train_step(model, optimizer, x):
        value, grads = pg.value_and_grad(loss)(model, x)
        optimizer.update(model, grads)
        return value, grads

    value, grads = train_step(model, optimizer, x)
    assert model.first is model.second
    assert_close(value, expected_value)
    after = pg.split(model, Param, ...)[1]
    leaves = zip(*(jax.tree.leaves(t) for t in (grads, expected, before, after)), strict=True)
    for grad, expected_grad, old, new in leaves:
        assert_close(grad, expected_grad, tol=1e-4)
        assert_close(new, old - 0.1 * expected_grad, tol=1e-4)
