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

Training is character-level next-token prediction on four pages of the repository's own
docs (no download), with an ``Optimizer`` over ``optax.adamw``, a step under
``pytree_graph.jit``, ``pytree_nn.metrics`` (the average loss and the next-character
accuracy) for the logs, and an ``EMA`` of the parameters, evaluated beside the raw weights.
Then low-rank adapters (``LoRA``) are put around the attention and MLP projections and
trained alone (``wrt=LoRAParam``) on another page; the base weights do not move. Text is
generated greedily, one character at a time, with a key/value cache.

Run it from the repository root::

    hatch run python examples/llama.py
    hatch run python examples/llama.py --steps 300 --lora-steps 50 --prompt "A Module "

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
    Rngs,
    RotaryPositionalEmbedding,
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


# ---------------------------------------------------------------------------------------
# Low-rank adapters
# ---------------------------------------------------------------------------------------

# The projections that get adapters: (attribute path from a decoder layer, name).
ADAPTED = (
    ("attention", "query"),
    ("attention", "key"),
    ("attention", "value"),
    ("attention", "output"),
    ("mlp", "gate"),
    ("mlp", "up"),
    ("mlp", "down"),
)


def add_adapters(model: Llama, rank: int, rngs: Rngs) -> None:
    """Wrap each projection of every layer in a `LoRA` of rank `rank`, in place.

    The stacked layer holds each projection once for all layers, so each adapter is
    built stacked too (one `LoRA` per layer, vmapped over split keys) and wraps the
    stacked `Linear` as its `base_module`: the scan over layers then hands each step one
    layer's base kernel and that layer's adapter. The base `Linear`s are held, not copied.
    """
    for owner_name, name in ADAPTED:
        owner = getattr(model.layers, owner_name)
        base = getattr(owner, name)
        in_features, out_features = base.in_features, base.out_features

        @split_rngs(splits=model.config.layers)
        @pg.vmap
        def create(rngs: Rngs, in_features=in_features, out_features=out_features) -> LoRA:
            return LoRA(in_features, rank, out_features, rngs=rngs)

        adapter = create(rngs)
        adapter.base_module = base
        setattr(owner, name, adapter)


# ---------------------------------------------------------------------------------------
# Data: pages of the repository's docs, as characters
# ---------------------------------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_TEXTS = (
    "docs/packages/pytree-module.md",
    "docs/packages/pytree-transforms.md",
    "docs/packages/pytree-graph.md",
    "docs/packages/pytree-nn.md",
)
DEFAULT_LORA_TEXTS = ("docs/development.md",)
VALIDATION_FRACTION = 0.1
EVAL_BATCH_SIZE = 32  # windows per compiled evaluation call (the last batch is padded)
WARMUP_STEPS = 100
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
MAX_SEED = 2**32 - 1

DEFAULT_STEPS = 1500
DEFAULT_BATCH_SIZE = 16
DEFAULT_CONTEXT = 64
DEFAULT_LAYERS = 4
DEFAULT_WIDTH = 64
DEFAULT_HEADS = 4
DEFAULT_KV_HEADS = 2
DEFAULT_HIDDEN = 176
DEFAULT_LEARNING_RATE = 3e-3
DEFAULT_EMA_DECAY = 0.99
DEFAULT_LORA_RANK = 4
DEFAULT_LORA_STEPS = 100
DEFAULT_LORA_LEARNING_RATE = 3e-3
DEFAULT_PROMPT = "The model "
DEFAULT_SAMPLE_LENGTH = 300


class Vocabulary:
    """The distinct characters of a text, numbered in sorted order."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {char: i for i, char in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def unknown(self, text: str) -> list[str]:
        """The characters of `text` that are not in the vocabulary, each once, in order."""
        return list(dict.fromkeys(char for char in text if char not in self.index))

    def encode(self, text: str) -> np.ndarray:
        """The ids of `text`'s characters, as int32.

        Raises:
            ValueError: naming the characters that are not in the vocabulary.
        """
        missing = self.unknown(text)
        if missing:
            raise ValueError(f"characters not in the vocabulary: {''.join(missing)!r}")
        return np.array([self.index[char] for char in text], dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text whose character ids are `ids`."""
        return "".join(self.chars[int(i)] for i in ids)


class Split(NamedTuple):
    """A text's ids: the first 90% to train on, the last 10% held out."""

    train: np.ndarray
    validation: np.ndarray


def read_texts(paths: Sequence[str]) -> str:
    """The files at `paths` (relative to the repository root, or absolute), joined by a
    blank line."""
    return "\n\n".join((ROOT / path).read_text(encoding="utf-8") for path in paths)


def split(vocabulary: Vocabulary, text: str) -> Split:
    """`text` encoded, its last tenth held out."""
    ids = vocabulary.encode(text)
    cut = len(ids) - math.ceil(VALIDATION_FRACTION * len(ids))
    return Split(ids[:cut], ids[cut:])


def random_windows(
    ids: np.ndarray, context: int, batch_size: int, rng: np.random.Generator
) -> np.ndarray:
    """`batch_size` windows of `context + 1` consecutive ids, at random starts."""
    starts = rng.integers(0, len(ids) - context, size=batch_size)
    return ids[starts[:, None] + np.arange(context + 1)]


def tiled_windows(ids: np.ndarray, context: int) -> np.ndarray:
    """Windows of `context + 1` ids starting every `context` ids: each target counted once."""
    starts = np.arange(0, len(ids) - context, context)
    return ids[starts[:, None] + np.arange(context + 1)]


# ---------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------


def new_metrics() -> metrics.MultiMetric:
    """The logs: the mean loss (nats/char) and the next-character accuracy."""
    return metrics.MultiMetric(loss=metrics.Average("loss"), accuracy=metrics.Accuracy())


@pg.jit
def train_step(
    model: Llama,
    optimizer: Optimizer,
    logs: metrics.MultiMetric,
    windows: jax.Array,
    ema: EMA | None = None,
) -> None:
    """One step of `optimizer` on `windows`, in place; the EMA (if any) and the logs follow.

    The gradients are taken with respect to what the optimizer trains (`optimizer.wrt`):
    all the parameters in pre-training, the adapters alone in fine-tuning."""

    def loss_fn(model: Llama) -> tuple[jax.Array, jax.Array]:
        logits = model(windows[:, :-1])
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
        return losses.mean(), logits

    (loss, logits), grads = pg.value_and_grad(loss_fn, has_aux=True, wrt=optimizer.wrt)(model)
    optimizer.update(model, grads)
    if ema is not None:
        ema.update(model)
    logs.update(loss=loss, logits=logits, labels=windows[:, 1:])


@pg.jit
def eval_step(model: Llama, logs: metrics.MultiMetric, windows: jax.Array, keep: jax.Array) -> None:
    """Add the losses and predictions of the windows where `keep` is true to `logs`."""
    logits = model(windows[:, :-1])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
    logs.update(loss=losses, logits=logits, labels=windows[:, 1:], mask=keep[:, None])


def evaluate(model: Llama, windows: np.ndarray) -> dict[str, float]:
    """The loss (nats/char) and accuracy of `model` over every target of `windows`.

    Windows go through in batches of `EVAL_BATCH_SIZE`, the last one padded and its
    padding masked out of the metrics, so the evaluation compiles once per model structure."""
    logs = new_metrics()
    for start in range(0, len(windows), EVAL_BATCH_SIZE):
        batch = windows[start : start + EVAL_BATCH_SIZE]
        keep = np.arange(EVAL_BATCH_SIZE) < len(batch)
        padded = np.concatenate([batch, np.repeat(batch[:1], EVAL_BATCH_SIZE - len(batch), 0)])
        eval_step(model, logs, padded, keep)
    return {name: float(value) for name, value in logs.compute().items()}


def train(
    model: Llama,
    optimizer: Optimizer,
    ids: np.ndarray,
    steps: int,
    args: argparse.Namespace,
    rng: np.random.Generator,
    ema: EMA | None = None,
    label: str = "step",
) -> None:
    """Run `steps` steps on random windows of `ids`, printing the metrics ten times."""
    logs = new_metrics()
    report_every = max(1, steps // 10)
    width = len(str(steps))
    started = time.perf_counter()
    for step in range(1, steps + 1):
        train_step(
            model, optimizer, logs, random_windows(ids, args.context, args.batch_size, rng), ema
        )
        if step % report_every == 0 or step == steps:
            # Computing the metrics waits for the steps so far; in between, JAX runs ahead.
            values = {name: float(value) for name, value in logs.compute().items()}
            logs.reset()
            print(
                f"  {label} {step:>{width}}/{steps}: loss {values['loss']:.3f}, "
                f"accuracy {values['accuracy']:.3f}  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )


def adamw(learning_rate: float, steps: int) -> optax.GradientTransformation:
    """AdamW with clipping, the learning rate warmed up then cosine-decayed to a tenth."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, min(WARMUP_STEPS, steps // 10), steps, end_value=learning_rate / 10
    )
    return optax.chain(
        optax.clip_by_global_norm(MAX_GRAD_NORM),
        optax.adamw(schedule, b2=0.95, weight_decay=WEIGHT_DECAY),
    )


# ---------------------------------------------------------------------------------------
# Greedy generation with the cache
# ---------------------------------------------------------------------------------------


@pg.jit
def generate_window(model: Llama, buffer: jax.Array, known: jax.Array):
    """Fill `buffer` (`context + 1` ids, the first `known` given) one id at a time.

    Position `t` goes through `model.decode` with the cache of positions `0 .. t - 1`;
    its logits choose the id at `t + 1` (the likeliest one) unless that one is given.
    Returns the buffer and the logits of every position, `(context, vocab_size)`."""
    context = buffer.shape[0] - 1
    cache = model.init_cache(1, context)

    def step(carry, position):
        model, buffer, cache = carry
        logits, cache = model.decode(buffer[position][None, None], cache, position)
        logits = logits[0, 0]
        given = position + 1 < known
        choice = jnp.where(given, buffer[position + 1], jnp.argmax(logits).astype(buffer.dtype))
        return (model, buffer.at[position + 1].set(choice), cache), logits

    (_, buffer, _), logits = pg.scan(step, (model, buffer, cache), jnp.arange(context))
    return buffer, logits


def generate(model: Llama, prompt_ids: np.ndarray, length: int) -> np.ndarray:
    """`length` ids continuing `prompt_ids`, each the likeliest after the ones before it.

    The cache holds `context` positions (the length trained on), so text is written in
    windows of `context + 1` ids, each with a fresh cache: the first starts from (the last
    `context` ids of) the prompt, each later one from the last `context // 2` ids written.
    Rotary embeddings encode relative positions, so restarting at position 0 is seamless."""
    context = model.config.context
    keep = max(1, context // 2)
    ids = list(prompt_ids)
    while len(ids) - len(prompt_ids) < length:
        known = ids[-(context if len(ids) == len(prompt_ids) else keep) :]
        buffer = np.zeros(context + 1, np.int32)
        buffer[: len(known)] = known
        filled, _ = generate_window(model, buffer, np.int32(len(known)))
        ids.extend(np.asarray(filled)[len(known) :].tolist())
    return np.array(ids[len(prompt_ids) : len(prompt_ids) + length], np.int32)


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, with an "s" unless there is one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def count(state: Any) -> int:
    """The number of numbers in the arrays of `state`."""
    return sum(leaf.size for leaf in jax.tree.leaves(state))


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Train a small LLaMA-style model on the project's docs, then LoRA "
        "fine-tune it on another page.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--text", nargs="+", default=list(DEFAULT_TEXTS), help="files to pre-train on")
    add("--lora-text", nargs="+", default=list(DEFAULT_LORA_TEXTS), help="files to fine-tune on")
    add("--steps", type=int, default=DEFAULT_STEPS, help="pre-training steps (>= 1)")
    add("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="windows per step (>= 1)")
    add("--context", type=int, default=DEFAULT_CONTEXT, help="window length in characters")
    add("--layers", type=int, default=DEFAULT_LAYERS, help="decoder layers (>= 1)")
    add("--width", type=int, default=DEFAULT_WIDTH, help="model width (a multiple of --heads)")
    add("--heads", type=int, default=DEFAULT_HEADS, help="query heads per layer (>= 1)")
    add("--kv-heads", type=int, default=DEFAULT_KV_HEADS, help="key/value heads, dividing --heads")
    add("--hidden", type=int, default=DEFAULT_HIDDEN, help="SwiGLU hidden width (>= 1)")
    add("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE, help="peak AdamW rate")
    add("--ema-decay", type=float, default=DEFAULT_EMA_DECAY, help="EMA decay, in [0, 1)")
    add("--lora-rank", type=int, default=DEFAULT_LORA_RANK, help="adapters' rank (>= 1)")
    add("--lora-steps", type=int, default=DEFAULT_LORA_STEPS, help="fine-tuning steps (>= 1)")
    add(
        "--lora-learning-rate",
        type=float,
        default=DEFAULT_LORA_LEARNING_RATE,
        help="peak AdamW rate of the adapters",
    )
    add("--seed", type=int, default=0, help=f"seed of everything random (0 to {MAX_SEED})")
    add("--prompt", default=DEFAULT_PROMPT, help="text to continue (corpus characters only)")
    add("--sample-length", type=int, default=DEFAULT_SAMPLE_LENGTH, help="characters to write")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what argparse's types let through, exiting with status 2 before any work."""
    at_least_one = (
        "steps", "batch_size", "context", "layers", "width", "heads", "kv_heads", "hidden",
        "lora_rank", "lora_steps",
    )  # fmt: skip
    for name in at_least_one:
        value = getattr(args, name)
        if value < 1:
            parser.error(f"argument --{name.replace('_', '-')}: must be at least 1, got {value}")
    if args.width % args.heads:
        parser.error(
            f"argument --width: must be a multiple of --heads ({args.heads}), got {args.width}"
        )
    if (args.width // args.heads) % 2:
        parser.error(
            f"argument --width: the head size --width / --heads must be even (rotary "
            f"embeddings turn features in pairs), got {args.width} / {args.heads} = "
            f"{args.width // args.heads}"
        )
    if args.heads % args.kv_heads:
        parser.error(
            f"argument --kv-heads: must divide --heads ({args.heads}), got {args.kv_heads}"
        )
    for name in ("learning_rate", "lora_learning_rate"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            parser.error(f"argument --{name.replace('_', '-')}: must be positive, got {value}")
    if not 0 <= args.ema_decay < 1:
        parser.error(f"argument --ema-decay: must be in [0, 1), got {args.ema_decay}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"argument --seed: must be between 0 and {MAX_SEED}, got {args.seed}")
    if not args.prompt:
        parser.error("argument --prompt: must not be empty")
    if args.sample_length < 0:
        parser.error(f"argument --sample-length: must be at least 0, got {args.sample_length}")
    for option in ("text", "lora_text"):
        for path in getattr(args, option):
            if not (ROOT / path).is_file():
                parser.error(f"argument --{option.replace('_', '-')}: no file at {path!r}")


def check_against_texts(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    vocabulary: Vocabulary,
    splits: dict[str, Split],
) -> None:
    """Reject a prompt or a context that these texts cannot serve."""
    missing = vocabulary.unknown(args.prompt)
    if missing:
        parser.error(
            f"argument --prompt: {''.join(missing)!r} never occurs in the texts; use only "
            f"these characters: {''.join(vocabulary.chars)!r}"
        )
    option, shortest = min(splits.items(), key=lambda item: len(item[1].validation))
    if args.context >= len(shortest.validation):
        parser.error(
            f"argument --context: must be at most {len(shortest.validation) - 1} (the held-out "
            f"part of --{option} has {len(shortest.validation)} characters), got {args.context}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, pre-train, fine-tune, print the logs and a sample; the last line is the
    fine-tuned loss on the held-out part of the LoRA text. Returns 0."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    text, lora_text = read_texts(args.text), read_texts(args.lora_text)
    vocabulary = Vocabulary(text + lora_text)
    splits = {"text": split(vocabulary, text), "lora-text": split(vocabulary, lora_text)}
    check_against_texts(parser, args, vocabulary, splits)
    data, lora_data = splits["text"], splits["lora-text"]

    config = Config(
        vocab_size=len(vocabulary),
        width=args.width,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        hidden=args.hidden,
        context=args.context,
    )
    params_key, lora_key = jax.random.split(jax.random.key(args.seed))
    model = Llama(config, rngs=Rngs(params=params_key))
    rng = np.random.default_rng(args.seed)
    print(
        f"texts: {' + '.join(args.text)} ({len(text):,} characters) to pre-train, "
        f"{' + '.join(args.lora_text)} ({len(lora_text):,}) to fine-tune; "
        f"{len(vocabulary)} distinct characters; the last {VALIDATION_FRACTION:.0%} of each "
        "held out"
    )
    print(
        f"model: {plural(config.layers, 'layer')} of width {config.width}, "
        f"{config.heads} query heads sharing {plural(config.kv_heads, 'key/value head')} "
        f"(size {config.head_size}), SwiGLU width {config.hidden}, context {config.context}; "
        f"{count(pg.state(model, Param)):,} parameters (the output head is the embedding)"
    )

    windows = tiled_windows(data.validation, args.context)
    lora_windows = tiled_windows(lora_data.validation, args.context)
    before = evaluate(model, windows)
    print(
        f"before training: held-out loss {before['loss']:.3f} nats/char, accuracy "
        f"{before['accuracy']:.3f} (uniform guess: {math.log(len(vocabulary)):.3f})"
    )

    # Pre-training: every parameter, with an average of the weights kept on the side.
    optimizer = Optimizer(model, adamw(args.learning_rate, args.steps), wrt=Param)
    ema = EMA(model, args.ema_decay, only=Param)
    print(f"pre-training: {plural(args.steps, 'step')} of {args.batch_size} windows (AdamW)")
    started = time.perf_counter()
    train(model, optimizer, data.train, args.steps, args, rng, ema=ema)
    seconds = time.perf_counter() - started
    raw, averaged = evaluate(model, windows), evaluate(ema.apply_to(model), windows)
    print(
        f"after pre-training ({seconds:.0f} s): held-out loss {raw['loss']:.3f} nats/char, "
        f"accuracy {raw['accuracy']:.3f}; EMA of the weights (decay {args.ema_decay}): loss "
        f"{averaged['loss']:.3f}, accuracy {averaged['accuracy']:.3f}"
    )

    # Fine-tuning: adapters around every projection, trained alone.
    lora_before = evaluate(model, lora_windows)
    base_filter = All(Param, Not(LoRAParam))
    add_adapters(model, args.lora_rank, Rngs(params=lora_key))
    frozen = {path: v.value for path, v in pg.state(model, base_filter).flat_state().items()}
    adapters = count(pg.state(model, LoRAParam))
    lora_optimizer = Optimizer(
        model, adamw(args.lora_learning_rate, args.lora_steps), wrt=LoRAParam
    )
    print(
        f"LoRA: rank-{args.lora_rank} adapters on the {len(ADAPTED)} projections of every "
        f"layer, {adapters:,} parameters ({adapters / count(frozen):.1%} of the base); "
        f"before fine-tuning, held-out loss on the LoRA text {lora_before['loss']:.3f}, "
        f"accuracy {lora_before['accuracy']:.3f}"
    )
    train(model, lora_optimizer, lora_data.train, args.lora_steps, args, rng, label="LoRA step")
    unchanged = all(
        np.array_equal(variable.value, frozen[path])
        for path, variable in pg.state(model, base_filter).flat_state().items()
    )
    lora_after, forgetting = evaluate(model, lora_windows), evaluate(model, windows)
    print(
        f"after fine-tuning: held-out loss on the LoRA text {lora_after['loss']:.3f}, accuracy "
        f"{lora_after['accuracy']:.3f}; on the pre-training text {forgetting['loss']:.3f} "
        f"(was {raw['loss']:.3f}); base weights unchanged: {unchanged}"
    )

    prompt_ids = vocabulary.encode(args.prompt)
    sample = generate(model, prompt_ids, args.sample_length)
    print(f"greedy sample ({args.sample_length} characters, decoded with the key/value cache):")
    print(args.prompt + vocabulary.decode(sample))
    print(f"LoRA text held-out loss: {lora_after['loss']:.3f} nats/char")
    return 0


if __name__ == "__main__":
    sys.exit(main())
