"""Layers built eagerly draw their parameters flat, which XLA compiles fast: the values must
be exactly those of a draw in the parameter's own shape (pytree_nn/_flat_draws.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_nn import (
    Conv,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    LSTMCell,
    MultiHeadAttention,
    Rngs,
    initializers,
)
from pytree_nn._embedding import default_embedding_init
from pytree_nn._flat_draws import flat_when_eager
from pytree_nn._linear import default_kernel_init

SHAPES = [(), (0,), (7,), (5, 7), (3, 1, 2, 2, 1)]

SAMPLERS = {
    "truncated_normal": lambda key, shape: jax.random.truncated_normal(key, -2.0, 2.0, shape),
    "normal": jax.random.normal,
    "uniform": lambda key, shape: jax.random.uniform(key, shape, minval=-1.0),
    "bernoulli": lambda key, shape: jax.random.bernoulli(key, 0.3, shape),
    "bits": jax.random.bits,
}

INITIALIZERS = {
    "lecun_normal": initializers.lecun_normal(),
    "glorot_uniform": initializers.glorot_uniform(),
    "he_normal": initializers.he_normal(),
    "fan_avg normal": initializers.variance_scaling(0.5, "fan_avg", "normal"),
    "fan_out uniform": initializers.variance_scaling(2.0, "fan_out", "uniform", in_axis=0),
    "normal": initializers.normal(0.02),
    "uniform": initializers.uniform(),
    "truncated_normal": initializers.truncated_normal(),
    "orthogonal": initializers.orthogonal(),
}


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(params=[True, False], ids=["partitionable", "not-partitionable"])
def threefry_layout(request):
    """Both of JAX's threefry layouts: the flat draw must match each."""
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", request.param)
    yield
    jax.config.update("jax_threefry_partitionable", before)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("sampler", SAMPLERS.values(), ids=SAMPLERS)
def test_every_sampler_draws_the_same_values(threefry_layout, sampler, shape):
    key = jax.random.fold_in(jax.random.key(3), 11)
    _same(sampler(flat_when_eager(key), shape), sampler(key, shape))


@pytest.mark.parametrize("shape", [(3, 2, 2, 1)], ids=str)
@pytest.mark.parametrize("init", INITIALIZERS.values(), ids=INITIALIZERS)
def test_every_initializer_draws_the_same_values(init, shape):
    key = jax.random.key(0)
    _same(init(flat_when_eager(key), shape, jnp.float32), init(key, shape, jnp.float32))


def test_complex_variance_scaling_draws_the_same_values():
    init = initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    key = jax.random.key(1)
    _same(init(flat_when_eager(key), (3, 2, 1), jnp.complex64), init(key, (3, 2, 1), jnp.complex64))


def test_split_and_fold_in_keys_stay_the_same():
    key = jax.random.key(5)
    flat = flat_when_eager(key)
    _same(
        jax.random.key_data(jax.random.split(flat, 3)),
        jax.random.key_data(jax.random.split(key, 3)),
    )
    _same(
        jax.random.key_data(jax.random.fold_in(flat, 2)),
        jax.random.key_data(jax.random.fold_in(key, 2)),
    )


def test_other_keys_are_returned_as_they_are():
    raw = jax.random.PRNGKey(0)  # a uint32 array: its impl is JAX's default, left alone
    assert flat_when_eager(raw) is raw
    rbg = jax.random.key(0, impl="rbg")
    assert flat_when_eager(rbg) is rbg

    seen = []

    @jax.jit
    def traced(key):
        seen.append(flat_when_eager(key) is key)
        return jax.random.normal(key, (2, 3))

    traced(jax.random.key(0))
    assert seen == [True]  # under a trace a draw keeps its shape (sharded programs)


def _kernel_and_bias(seed, kernel_init, kernel_shape, bias_init, bias_shape):
    """What a layer's initializers draw, in the parameters' own shapes, from the keys the
    layer takes (the kernel's first, then the bias's)."""
    rngs = Rngs(seed)
    kernel = kernel_init(rngs.params(), kernel_shape, jnp.float32)
    return [bias_init(rngs.params(), bias_shape, jnp.float32), kernel]


LAYERS = {
    "conv2d": (
        lambda: Conv(3, 8, (3, 3), rngs=0),
        lambda: _kernel_and_bias(0, default_kernel_init, (3, 3, 3, 8), initializers.zeros, (8,)),
    ),
    "conv3d-random-bias": (
        lambda: Conv(2, 4, (2, 3, 2), bias_init=initializers.normal(), rngs=1),
        lambda: _kernel_and_bias(
            1, default_kernel_init, (2, 3, 2, 2, 4), initializers.normal(), (4,)
        ),
    ),
    "linear": (
        lambda: Linear(5, 3, bias_init=initializers.uniform(), rngs=2),
        lambda: _kernel_and_bias(2, default_kernel_init, (5, 3), initializers.uniform(), (3,)),
    ),
    "embedding": (
        lambda: Embedding(10, 4, rngs=3),
        lambda: [default_embedding_init(Rngs(3).params(), (10, 4), jnp.float32)],
    ),
}


@pytest.mark.parametrize(("build", "expected"), LAYERS.values(), ids=LAYERS)
def test_layers_built_eagerly_draw_what_their_initializers_draw(build, expected):
    _same_leaves(build(), expected())


def test_attention_built_eagerly_equals_attention_built_under_jit():
    # Its draws are 2-D (reshaped after), so jit computes them with the same operations: the
    # same bits, and on CPU the same floats. On GPUs XLA may compile the turning of bits into
    # floats differently under jit (seen: 9 units in the last place on an H200).
    eager = jax.tree.leaves(MultiHeadAttention(2, 8, rngs=4))
    jitted = jax.tree.leaves(jax.jit(lambda: MultiHeadAttention(2, 8, rngs=4))())
    assert len(eager) == len(jitted)
    for a, b in zip(eager, jitted, strict=True):
        if jax.default_backend() == "cpu":
            _same(a, b)
        else:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def _same_leaves(a, b):
    leaves, expected = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves) == len(expected)
    for leaf, want in zip(leaves, expected, strict=True):
        _same(leaf, want)


def test_eager_dropout_draws_the_mask_drawn_under_jit():
    x = jnp.ones((4, 3, 5))
    eager = Dropout(0.5, rngs=0)(x)
    compiled = jax.jit(lambda x: Dropout(0.5, rngs=0)(x))(x)
    _same(eager, compiled)
    assert 0 < int((eager == 0).sum()) < x.size


@pytest.mark.parametrize(
    ("module", "build"),
    [
        ("_linear", lambda: Conv(3, 8, (3, 3), rngs=0)),
        ("_linear", lambda: Linear(5, 3, rngs=0)),
        ("_embedding", lambda: Embedding(10, 4, rngs=0)),
        ("_attention", lambda: MultiHeadAttention(2, 8, rngs=0)),
        ("_normalization", lambda: LayerNorm(4, rngs=0)),
        ("_dropout", lambda: Dropout(0.5, rngs=0)(jnp.ones((2, 3)))),
        (
            "_recurrent",
            lambda: LSTMCell(3, 4, rngs=0).initialize_carry(
                (2, 3), rngs=0, carry_init=initializers.normal()
            ),
        ),
    ],
    ids=["conv", "linear", "embedding", "attention", "layernorm", "dropout", "lstm-carry"],
)
def test_every_eager_draw_of_a_layer_is_flat(monkeypatch, module, build):
    drawn = []

    def spy(key):
        flat = flat_when_eager(key)
        drawn.append(flat is not key)
        return flat

    monkeypatch.setattr(f"pytree_nn.{module}.flat_when_eager", spy)
    build()
    assert drawn and all(drawn)
