"""A small LLaMA-style language model: trained on the project's docs, then LoRA fine-tuned.

The model is a decoder-only transformer in the shape of Meta's LLaMA, built from
``pytree_nn`` layers at a toy size, over characters:

- ``RMSNorm`` before attention and before the MLP (pre-norm), and once more at the end;
- rotary position embeddings (``RotaryPositionalEmbedding``) on queries and keys, so there
  is no table of learned positions and no limit on positions but the cache's size;
- grouped-query attention: fewer key/value heads than query heads (``kv_heads < heads``),
  each key/value head serving a group of query heads (``dot_product_attention`` does the
  grouping);
- a SwiGLU MLP, ``down(silu(gate(x)) * up(x))``, and no biases anywhere;
- the output head tied to the character embedding (``Embedding.attend``);
- the layers built stacked (one module whose arrays have a leading layer axis, made with
  ``pytree_graph.vmap``) and run with ``pytree_graph.scan``: the program is traced and
  compiled for one layer, whatever the depth.

Training is character-level next-token prediction on two pages of the repository's own
docs (no download), with an ``Optimizer`` over ``optax.adamw``, a step under
``pytree_graph.jit``, ``pytree_nn.metrics`` (the average loss and the next-character
accuracy) for the logs, and an ``EMA`` of the parameters, evaluated beside the raw weights.
Then low-rank adapters (``LoRA``) are put around the attention and MLP projections and
trained alone (``wrt=LoRAParam``) on a third page; the base weights do not move. Text is
generated greedily, one character at a time, with a key/value cache.

Run it from the repository root::

    hatch run python examples/llama.py
    hatch run python examples/llama.py --steps 300 --lora-steps 100 --prompt "The model "

or ``python examples/llama.py --help`` in an environment with the five packages. The last
line printed is the fine-tuned model's loss on the held-out part of the LoRA text.
"""

import argparse
import dataclasses
import math
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pytree_graph as pg
from pytree_filter import All, Not
from pytree_graph import Carry, Param
from pytree_nn import (
    EMA,
    Embedding,
    Linear,
    LoRA,
    LoRAParam,
    Module,
    Optimizer,
    RMSNorm,
    RotaryPositionalEmbedding,
    Rngs,
    dot_product_attention,
    metrics,
    split_rngs,
)

# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """The sizes of a `Llama`.

    Attributes:
        vocab_size: the number of distinct tokens (here characters).
        width: the size of the residual stream (and of the embeddings).
        layers: the number of decoder layers.
        heads: query heads per layer; the head size is `width // heads` (even, for the
            rotary embeddings).
        kv_heads: key/value heads per layer, dividing `heads`: each serves
            `heads // kv_heads` query heads (grouped-query attention; 1 is multi-query
            attention, `heads` is plain multi-head attention).
        hidden: the width of the SwiGLU MLP's hidden layer.
        context: the training window, in tokens (rotary embeddings themselves have no
            limit; generation may go past it, with a cache of its own size).
        rope_theta: the base of the rotary embeddings' frequencies.
        norm_epsilon: the RMSNorms' epsilon.
    """

    vocab_size: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    context: int
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-6

    def __post_init__(self):
        for name in ("vocab_size", "width", "layers", "heads", "kv_heads", "hidden", "context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Config: {name} must be a positive int, got {value!r}")
        if self.width % self.heads:
            raise ValueError(
                f"Config: width ({self.width}) must be a multiple of heads ({self.heads})"
            )
        if self.head_size % 2:
            raise ValueError(
                f"Config: the head size width // heads must be even for the rotary "
                f"embeddings, got {self.width} // {self.heads} = {self.head_size}"
            )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"Config: kv_heads ({self.kv_heads}) must divide heads ({self.heads}): each "
                "key/value head serves the same number of query heads"
            )
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"Config: rope_theta must be positive, got {self.rope_theta}")
        if not (self.norm_epsilon >= 0 and math.isfinite(self.norm_epsilon)):
            raise ValueError(f"Config: norm_epsilon must be 0 or more, got {self.norm_epsilon}")

    @property
    def head_size(self) -> int:
        """The size of each attention head, `width // heads`."""
        return self.width // self.heads


class LayerCache(NamedTuple):
    """The keys and values a layer has seen, `(batch, length, kv_heads, head_size)` each.

    In a `Llama`'s cache every array has a leading layer axis as well."""

    keys: jax.Array
    values: jax.Array


class Attention(Module):
    """Causal grouped-query self-attention with rotary embeddings, without biases."""

    def __init__(self, config: Config, *, rngs: Rngs):
        width, head = config.width, config.head_size
        self.heads, self.kv_heads, self.head_size = config.heads, config.kv_heads, head
        self.query = Linear(width, config.heads * head, use_bias=False, rngs=rngs)
        self.key = Linear(width, config.kv_heads * head, use_bias=False, rngs=rngs)
        self.value = Linear(width, config.kv_heads * head, use_bias=False, rngs=rngs)
        self.output = Linear(config.heads * head, width, use_bias=False, rngs=rngs)
        self.rope = RotaryPositionalEmbedding(head, theta=config.rope_theta)

    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: LayerCache | None = None
    ) -> tuple[jax.Array, LayerCache | None]:
        """Attend over `x` (`(batch, length, width)`, at `positions`, `(length,)`).

        Without a cache, each position attends to itself and the ones before it. With one
        (room for `cache_length` positions), the new keys and values are written at
        `positions` (consecutive), and each position attends to every cached position up
        to its own; the updated cache is returned."""
        batch, length, _ = x.shape
        q = self.query(x).reshape(batch, length, self.heads, self.head_size)
        k = self.key(x).reshape(batch, length, self.kv_heads, self.head_size)
        v = self.value(x).reshape(batch, length, self.kv_heads, self.head_size)
        # The rotation acts on the last axis at each position: one position per (seq, head).
        q = self.rope(q, positions[:, None])
        k = self.rope(k, positions[:, None])
        if cache is None:
            # dot_product_attention pairs query head i with key/value head
            # i // (heads // kv_heads), and computes the softmax in float32.
            attended = dot_product_attention(q, k, v, is_causal=True)
        else:
            start = positions[0]
            keys = jax.lax.dynamic_update_slice_in_dim(
                cache.keys, k.astype(cache.keys.dtype), start, 1
            )
            values = jax.lax.dynamic_update_slice_in_dim(
                cache.values, v.astype(cache.values.dtype), start, 1
            )
            cache = LayerCache(keys, values)
            visible = jnp.arange(keys.shape[1])[None, :] <= positions[:, None]  # (q, kv)
            attended = dot_product_attention(q, keys, values, mask=visible)
        return self.output(attended.reshape(batch, length, self.heads * self.head_size)), cache


class SwiGLU(Module):
    """The gated MLP of LLaMA: `down(silu(gate(x)) * up(x))`, without biases."""

    def __init__(self, config: Config, *, rngs: Rngs):
        self.gate = Linear(config.width, config.hidden, use_bias=False, rngs=rngs)
        self.up = Linear(config.width, config.hidden, use_bias=False, rngs=rngs)
        self.down = Linear(config.hidden, config.width, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class DecoderLayer(Module):
    """Pre-norm attention and MLP, each on a residual branch."""

    def __init__(self, config: Config, *, rngs: Rngs):
        self.attention_norm = RMSNorm(config.width, epsilon=config.norm_epsilon, rngs=rngs)
        self.attention = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.width, epsilon=config.norm_epsilon, rngs=rngs)
        self.mlp = SwiGLU(config, rngs=rngs)

    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: LayerCache | None = None
    ) -> tuple[jax.Array, LayerCache | None]:
        attended, cache = self.attention(self.attention_norm(x), positions, cache)
        h = x + attended
        return h + self.mlp(self.mlp_norm(h)), cache


class Llama(Module):
    """A LLaMA-style decoder over token ids, with a tied output head.

    `model(tokens)` takes int32 ids `(batch, length)` and returns float32 logits
    `(batch, length, vocab_size)`: at each position, scores for the next token, computed
    from that position and the earlier ones only.

    `model.decode(tokens, cache, start)` runs the next positions `start, start + 1, ...`
    against a cache from `init_cache` (or from the previous `decode`), returning their
    logits and the updated cache: the same logits as the full pass gives at those
    positions.

    Attributes:
        config: the `Config`.
        embed: the token `Embedding`; its table is also the output head.
        layers: one `DecoderLayer` whose every array has a leading axis of `config.layers`.
        norm: the final `RMSNorm`.
    """

    def __init__(self, config: Config, *, rngs: Rngs | int | jax.Array):
        rngs = rngs if isinstance(rngs, Rngs) else Rngs(params=rngs)
        self.config = config
        self.embed = Embedding(config.vocab_size, config.width, rngs=rngs)

        # Each layer draws its own keys: the `params` stream is split into one key per
        # layer for the vmapped construction, which stacks the layers' arrays.
        @split_rngs(splits=config.layers)
        @pg.vmap
        def create_layers(rngs: Rngs) -> DecoderLayer:
            return DecoderLayer(config, rngs=rngs)

        self.layers = create_layers(rngs)
        self.norm = RMSNorm(config.width, epsilon=config.norm_epsilon, rngs=rngs)

    def features(self, tokens: jax.Array) -> jax.Array:
        """The final normalized features, `(batch, length, width)`, before the head."""
        positions = jnp.arange(tokens.shape[-1])

        # The residual stream is carried from layer to layer; the stacked layers are
        # scanned over, each step getting one layer's arrays.
        @pg.scan(in_axes=(Carry, 0), out_axes=Carry)
        def run(x: jax.Array, layer: DecoderLayer) -> jax.Array:
            return layer(x, positions)[0]

        return self.norm(run(self.embed(tokens), self.layers))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.embed.attend(self.features(tokens)).astype(jnp.float32)

    def init_cache(self, batch: int, length: int, dtype: Any = jnp.float32) -> LayerCache:
        """An empty cache with room for `length` positions of `batch` sequences."""
        config = self.config
        shape = (config.layers, batch, length, config.kv_heads, config.head_size)
        return LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def decode(
        self, tokens: jax.Array, cache: LayerCache, start: jax.Array | int
    ) -> tuple[jax.Array, LayerCache]:
        """The logits of `tokens` (`(batch, n)`), at positions `start .. start + n - 1`,
        attending to the cached positions before them; and the cache with theirs added."""
        positions = start + jnp.arange(tokens.shape[-1])

        # Each step gets one layer and that layer's slice of the cache, and returns the
        # slice updated: the scan stacks them into the new cache.
        @pg.scan(in_axes=(Carry, 0, 0), out_axes=(Carry, 0))
        def run(x: jax.Array, layer: DecoderLayer, layer_cache: LayerCache):
            return layer(x, positions, layer_cache)

        x, cache = run(self.embed(tokens), self.layers, cache)
        return self.embed.attend(self.norm(x)).astype(jnp.float32), cache


def next_token_loss(model: Llama, windows: jax.Array) -> jax.Array:
    """Mean cross-entropy (nats/token) of predicting `windows[:, 1:]` from `windows[:, :-1]`;
    `windows` are int32 ids of shape `(batch, context + 1)`."""
    logits = model(windows[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean()
