"""Every layer's forward pass under JAX's strict promotion settings,
`jax_numpy_rank_promotion="raise"` and `jax_numpy_dtype_promotion="strict"`: the layers
combine their operands explicitly, so they run there and give the same numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_nn import (
    MLP,
    RNN,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool2d,
    BatchNorm,
    Bidirectional,
    Conv,
    ConvTranspose,
    Dropout,
    Embedding,
    GroupNorm,
    GRUCell,
    LayerNorm,
    Linear,
    LSTMCell,
    MultiHeadAttention,
    PReLU,
    RMSNorm,
    Rngs,
    RotaryPositionalEmbedding,
    Sequential,
    SpectralNorm,
    WeightNorm,
    avg_pool,
    combine_masks,
    dot_product_attention,
    make_attention_mask,
    make_causal_mask,
    max_pool,
)

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
IMAGE = jnp.linspace(-1.0, 1.0, 150).reshape(2, 5, 5, 3)
SEQUENCE = jnp.linspace(-1.0, 1.0, 96).reshape(2, 6, 8)
HEADS = jnp.linspace(-1.0, 1.0, 80).reshape(2, 5, 2, 4)
BF16 = SEQUENCE.astype(jnp.bfloat16)


def _cell(make):
    cell = make()
    return cell(cell.initialize_carry(X.shape), X)


def _decode():
    attention = MultiHeadAttention(2, 8, decode=True, rngs=0)
    attention.init_cache((2, 6, 8))
    return attention(SEQUENCE[:, :2])


LAYERS = {
    "PReLU": lambda: PReLU()(X),
    "PReLU per channel": lambda: PReLU(0.1, num_parameters=3)(X),
    "PReLU array slope": lambda: PReLU(jnp.full((3,), 0.1))(X),
    "PReLU bfloat16": lambda: PReLU(param_dtype=jnp.bfloat16)(X.astype(jnp.bfloat16)),
    "RotaryPositionalEmbedding": lambda: RotaryPositionalEmbedding(8)(SEQUENCE),
    "RotaryPositionalEmbedding positions": lambda: RotaryPositionalEmbedding(8)(
        SEQUENCE, positions=jnp.arange(6) + 3
    ),
    "RotaryPositionalEmbedding bfloat16": lambda: RotaryPositionalEmbedding(8)(BF16),
    "Linear": lambda: Linear(3, 4, rngs=0)(X),
    "Linear bfloat16": lambda: Linear(3, 4, dtype=jnp.bfloat16, rngs=0)(X.astype(jnp.bfloat16)),
    "MLP": lambda: MLP(3, 1, width_size=8, depth=2, rngs=0)(X),
    "MLP scan": lambda: MLP(3, 1, width_size=8, depth=4, scan=True, rngs=0)(X),
    "Sequential": lambda: Sequential(Linear(3, 4, rngs=0), jax.nn.relu, Linear(4, 2, rngs=1))(X),
    "Conv": lambda: Conv(3, 4, (3, 3), strides=2, rngs=0)(IMAGE),
    "Conv circular": lambda: Conv(3, 4, 3, padding="CIRCULAR", rngs=0)(SEQUENCE[0, :, :3]),
    "ConvTranspose": lambda: ConvTranspose(3, 4, (3, 3), strides=2, rngs=0)(IMAGE),
    "Dropout": lambda: Dropout(0.5, rngs=Rngs(0))(X),
    "Embedding": lambda: (lambda e: e.attend(e(jnp.array([[1, 2]]))))(Embedding(10, 4, rngs=0)),
    "LayerNorm": lambda: LayerNorm(3, rngs=0)(X),
    "LayerNorm bfloat16": lambda: LayerNorm(3, dtype=jnp.bfloat16, rngs=0)(X.astype(jnp.bfloat16)),
    "RMSNorm bfloat16": lambda: RMSNorm(3, dtype=jnp.bfloat16, rngs=0)(X.astype(jnp.bfloat16)),
    "GroupNorm": lambda: GroupNorm(3, num_groups=3, rngs=0)(IMAGE),
    "BatchNorm": lambda: BatchNorm(3, rngs=0)(X),
    "MultiHeadAttention": lambda: MultiHeadAttention(2, 8, rngs=0)(
        SEQUENCE, mask=make_causal_mask(jnp.ones((2, 6)))
    ),
    "MultiHeadAttention rotary": lambda: MultiHeadAttention(
        2, 8, rotary=RotaryPositionalEmbedding(4), rngs=0
    )(SEQUENCE),
    "MultiHeadAttention decode": _decode,
    "dot_product_attention": lambda: dot_product_attention(
        HEADS, HEADS, HEADS, bias=jnp.zeros((5, 5)), mask=jnp.tril(jnp.ones((5, 5)))
    ),
    "combine_masks": lambda: combine_masks(
        make_causal_mask(jnp.zeros(3)), make_attention_mask(jnp.ones(3) > 0, jnp.ones(3) > 0)
    ),
    "LSTMCell": lambda: _cell(lambda: LSTMCell(3, 4, rngs=0)),
    "GRUCell": lambda: _cell(lambda: GRUCell(3, 4, rngs=0)),
    "RNN reverse with lengths": lambda: RNN(GRUCell(8, 4, rngs=0), reverse=True, keep_order=True)(
        SEQUENCE, seq_lengths=jnp.array([3, 6])
    ),
    "Bidirectional": lambda: Bidirectional(RNN(LSTMCell(8, 4, rngs=0)), RNN(GRUCell(8, 4, rngs=1)))(
        SEQUENCE, seq_lengths=jnp.array([3, 6])
    ),
    "AdaptiveAvgPool1d": lambda: AdaptiveAvgPool1d(3)(SEQUENCE[0]),
    "AdaptiveAvgPool2d": lambda: AdaptiveAvgPool2d((2, 2))(IMAGE),
    "AdaptiveAvgPool3d": lambda: AdaptiveAvgPool3d((2, 2, 2))(IMAGE),
    "AdaptiveMaxPool2d": lambda: AdaptiveMaxPool2d((2, 2))(IMAGE),
    "max_pool": lambda: max_pool(IMAGE, (2, 2), strides=2),
    "avg_pool": lambda: avg_pool(IMAGE, (2, 2), padding="SAME", count_include_pad=False),
    "WeightNorm": lambda: WeightNorm(Conv(3, 4, (3, 3), rngs=0))(IMAGE),
    "SpectralNorm": lambda: SpectralNorm(Linear(3, 2, rngs=0), rngs=1)(X),
}

SETTINGS = {
    "rank-raise": lambda: jax.numpy_rank_promotion("raise"),
    "dtype-strict": lambda: jax.numpy_dtype_promotion("strict"),
}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("layer", LAYERS)
def test_every_layer_runs_under_strict_promotion_with_the_same_numbers(layer, setting):
    expected = LAYERS[layer]()
    with SETTINGS[setting]():
        got = LAYERS[layer]()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))


def test_a_layer_given_mixed_dtypes_under_strict_promotion_says_how_to_choose_one():
    # Input and parameters of different dtypes would be promoted (dtype=None), which the
    # strict setting refuses, as Equinox's and Flax NNX's Linear do: the error says how.
    with (
        jax.numpy_dtype_promotion("strict"),
        pytest.raises(ValueError, match=r"give the layer dtype=\.\.\."),
    ):
        Linear(3, 4, rngs=0)(X.astype(jnp.bfloat16))
    with jax.numpy_dtype_promotion("strict"):
        y = Linear(3, 4, dtype=jnp.bfloat16, rngs=0)(X.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
