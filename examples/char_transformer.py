"""Train a small character-level transformer on text that ships with Python, then sample from it.

The corpus needs no download: the Zen of Python (the rot13 text inside the standard library's
``this`` module) followed by the docstrings of a fixed list of standard-library modules,
about 73 KB of English prose and code examples (the exact text depends on the Python
version). Its distinct characters are the vocabulary; the last tenth of the text is held out
for validation.

The model is a decoder-only transformer built from ``pytree_nn`` layers: an ``Embedding`` for
the characters and one for their positions (learned), blocks of pre-LayerNorm causal
``MultiHeadAttention`` and an ``MLP`` with ``Dropout`` on both residual branches, a final
``LayerNorm``, and logits from the character table itself
(``Embedding.attend``: input and output embeddings are tied). It trains in the graph style:
an ``Optimizer`` over ``optax.adamw`` and a step under ``pytree_graph.jit`` that takes the
gradients with ``pytree_graph.value_and_grad``; the dropout layers' key counters advance in
place, so every step draws new masks.

At the end the model switches to evaluation mode and writes text from a prompt, one
character at a time, through the attention layers' decode cache: each new character attends
to the keys and values kept from the earlier ones instead of recomputing them. The whole
loop over characters runs compiled (``pytree_graph.scan`` inside ``pytree_graph.jit``).

Run it from the repository root::

    hatch run python examples/char_transformer.py
    hatch run python examples/char_transformer.py --steps 500 --temperature 0 --prompt "Errors "

or ``python examples/char_transformer.py --help`` in an environment with the five packages and
tqdm. The last line printed is the validation loss in nats per character.
"""

import argparse
import codecs
import contextlib
import importlib
import inspect
import io
import math
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import pytree_graph as pg
from pytree_graph import Param
from pytree_nn import (
    MLP,
    Dropout,
    Embedding,
    LayerNorm,
    Module,
    MultiHeadAttention,
    Optimizer,
    Rngs,
    make_causal_mask,
)

# Modules whose docstrings join the Zen of Python in the corpus: about 73 KB, mostly prose.
# The last tenth, held out, falls in logging's docstrings.
DOCSTRING_MODULES = (
    "textwrap",
    "heapq",
    "bisect",
    "functools",
    "itertools",
    "collections",
    "random",
    "string",
    "contextlib",
    "threading",
    "json",
    "calendar",
    "tempfile",
    "shutil",
    "logging",
)
VALIDATION_FRACTION = 0.1
EVAL_BATCH_SIZE = 32  # windows per compiled evaluation call (the last batch is padded)
WARMUP_STEPS = 100
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0
MAX_SEED = 2**32 - 1

DEFAULT_STEPS = 2500
DEFAULT_BATCH_SIZE = 16
DEFAULT_CONTEXT = 64
DEFAULT_LAYERS = 2
DEFAULT_WIDTH = 64
DEFAULT_HEADS = 4
DEFAULT_DROPOUT = 0.1
DEFAULT_LEARNING_RATE = 6e-3
DEFAULT_PROMPT = "Beautiful is "
DEFAULT_SAMPLE_LENGTH = 400
DEFAULT_TEMPERATURE = 0.5


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


class Corpus(NamedTuple):
    """The text, its vocabulary and the encoded training and validation parts."""

    text: str
    vocabulary: Vocabulary
    train: np.ndarray  # int32 character ids, the first 90% of the text
    validation: np.ndarray  # the last 10%


def corpus_text(modules: Sequence[str] = DOCSTRING_MODULES) -> str:
    """The Zen of Python, then the docstrings of `modules` and of their public members.

    Deterministic for a given Python version. Under ``python -OO`` docstrings are stripped
    and only the Zen remains.
    """
    # Importing `this` prints the Zen; only its rot13 text `this.s` is wanted.
    with contextlib.redirect_stdout(io.StringIO()):
        this = importlib.import_module("this")
    parts = [codecs.decode(this.s, "rot13")]
    seen = set()
    for name in modules:
        module = importlib.import_module(name)
        docs = [module.__doc__]
        for attribute in sorted(vars(module)):
            member = getattr(module, attribute)
            # Members imported from elsewhere are left to their own module; those defined
            # in a C half ("_heapq" for heapq) count as the module's own.
            home = getattr(member, "__module__", None)
            if not attribute.startswith("_") and home in (name, f"_{name}"):
                docs.append(member.__doc__)
        for doc in docs:
            if isinstance(doc, str) and doc not in seen:  # e.g. aliases: keep one copy
                seen.add(doc)
                parts.append(inspect.cleandoc(doc))
    return "\n\n".join(parts)


def load_corpus(text: str | None = None) -> Corpus:
    """Number the characters of `text` (by default `corpus_text()`) and split off the last 10%."""
    text = corpus_text() if text is None else text
    vocabulary = Vocabulary(text)
    ids = vocabulary.encode(text)
    split = len(ids) - math.ceil(VALIDATION_FRACTION * len(ids))
    return Corpus(text, vocabulary, ids[:split], ids[split:])


class Block(Module):
    """A pre-LayerNorm transformer block: causal self-attention, then an MLP, each residual."""

    def __init__(self, width: int, heads: int, dropout: float, rngs: Rngs):
        self.attention_norm = LayerNorm(width, rngs=rngs)
        self.attention = MultiHeadAttention(heads, width, rngs=rngs)
        self.mlp_norm = LayerNorm(width, rngs=rngs)
        self.mlp = MLP(width, width, 4 * width, depth=1, activation=jax.nn.gelu, rngs=rngs)
        self.dropout = Dropout(dropout, rngs=rngs)  # its own stream, forked from "dropout"

    def __call__(self, x: jax.Array, mask: jax.Array | None, decode: bool) -> jax.Array:
        attended = self.attention(self.attention_norm(x), mask=mask, decode=decode)
        x = x + self.dropout(attended)
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class CharTransformer(Module):
    """A decoder-only transformer over character ids, with tied input and output embeddings.

    Called on ids of shape `(*batch, length)` with `length <= context`, it returns logits
    of shape `(*batch, length, vocab_size)`: at each position, scores for the next character,
    computed from that position and the ones before it only.

    In decode mode (after `init_cache`), each call takes the next position(s), starting at
    `start`, and attends to the keys and values cached from the earlier calls.
    """

    def __init__(
        self,
        vocab_size: int,
        context: int,
        width: int,
        heads: int,
        layers: int,
        dropout: float,
        rngs: Rngs,
    ):
        self.tokens = Embedding(vocab_size, width, rngs=rngs)
        self.positions = Embedding(context, width, rngs=rngs)
        self.blocks = [Block(width, heads, dropout, rngs) for _ in range(layers)]
        self.norm = LayerNorm(width, rngs=rngs)
        self.context = context
        self.width = width

    def __call__(
        self, tokens: jax.Array, start: jax.Array | int = 0, decode: bool = False
    ) -> jax.Array:
        positions = start + jnp.arange(tokens.shape[-1])
        x = self.tokens(tokens) + self.positions(positions)
        # In decode mode the cache lets each position see only what was written before it.
        mask = None if decode else make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask, decode)
        return self.tokens.attend(self.norm(x))

    def init_cache(self) -> None:
        """Empty every attention layer's decode cache, for one sequence of `context` positions."""
        for block in self.blocks:
            block.attention.init_cache((self.context, self.width))


def build_model(vocab_size: int, args: argparse.Namespace, key: jax.Array) -> CharTransformer:
    """A model of the size `args` asks for; parameters and dropout masks come from `key`."""
    params_key, dropout_key = jax.random.split(key)
    rngs = Rngs(params=params_key, dropout=dropout_key)
    return CharTransformer(
        vocab_size, args.context, args.width, args.heads, args.layers, args.dropout, rngs
    )


def cross_entropy(model: CharTransformer, windows: jax.Array) -> jax.Array:
    """Mean next-character loss (nats/char) over windows of `context + 1` character ids."""
    logits = model(windows[..., :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, windows[..., 1:]).mean()


@pg.jit
def train_step(model: CharTransformer, optimizer: Optimizer, windows: jax.Array) -> jax.Array:
    """One AdamW step in place; dropout's key counters advance in the caller's model too."""
    loss, grads = pg.value_and_grad(cross_entropy)(model, windows)
    optimizer.update(model, grads)
    return loss


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


@pg.jit
def window_losses(model: CharTransformer, windows: jax.Array) -> jax.Array:
    """The mean next-character loss of each window, shape `(num_windows,)`."""
    logits = model(windows[..., :-1])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, windows[..., 1:])
    return losses.mean(-1)


def evaluate(model: CharTransformer, windows: np.ndarray) -> float:
    """Mean loss in nats/char over `windows`, in evaluation mode (dropout off).

    Windows go through in padded batches of `EVAL_BATCH_SIZE`, so every call has the same
    shapes and the evaluation compiles once. The model is back in training mode afterwards.
    """
    model.eval()
    losses = []
    for start in range(0, len(windows), EVAL_BATCH_SIZE):
        batch = windows[start : start + EVAL_BATCH_SIZE]
        padding = EVAL_BATCH_SIZE - len(batch)
        padded = np.concatenate([batch, np.repeat(batch[:1], padding, axis=0)])
        losses.append(np.asarray(window_losses(model, padded))[: len(batch)])
    model.train()
    return float(np.mean(np.concatenate(losses)))


@pg.jit
def sample_window(
    model: CharTransformer,
    buffer: jax.Array,
    known: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
) -> jax.Array:
    """Fill `buffer` (`context + 1` ids, the first `known` given) one character at a time.

    Position `t` goes through the model in decode mode, attending to the cached keys and
    values of positions `0 .. t - 1`; its logits choose the character at `t + 1`, unless that
    one is given. `known` and `temperature` are arrays, so one compiled function serves
    every prompt and temperature. Call `model.init_cache()` first.
    """

    def step(carry, position):
        model, buffer = carry
        logits = model(buffer[position][None], start=position, decode=True)[0]
        step_key = jax.random.fold_in(key, position)
        greedy = temperature == 0
        drawn = jax.random.categorical(step_key, logits / jnp.where(greedy, 1.0, temperature))
        choice = jnp.where(greedy, jnp.argmax(logits), drawn)
        given = position + 1 < known
        buffer = buffer.at[position + 1].set(jnp.where(given, buffer[position + 1], choice))
        return (model, buffer), None

    (model, buffer), _ = pg.scan(step, (model, buffer), jnp.arange(model.context))
    return buffer


def sample(
    model: CharTransformer,
    prompt_ids: np.ndarray,
    length: int,
    temperature: float,
    key: jax.Array,
) -> np.ndarray:
    """`length` new character ids continuing `prompt_ids`, drawn with the decode cache.

    Positions are learned only up to `context`, and the cached keys depend on their
    positions, so text is written in windows of `context + 1` characters, each with a fresh
    cache: the first starts from (the last `context` characters of) the prompt, and each
    later one from the last `max(1, context // 2)` characters written. The model should be
    in evaluation mode.
    """
    keep = max(1, model.context // 2)
    ids = list(prompt_ids)
    generated = 0
    window_index = 0
    while generated < length:
        known = ids[-(model.context if window_index == 0 else keep) :]
        buffer = np.zeros(model.context + 1, np.int32)
        buffer[: len(known)] = known
        model.init_cache()
        window_key = jax.random.fold_in(key, window_index)
        filled = sample_window(
            model, buffer, np.int32(len(known)), window_key, np.float32(temperature)
        )
        new = np.asarray(filled)[len(known) :].tolist()[: length - generated]
        ids.extend(new)
        generated += len(new)
        window_index += 1
    return np.array(ids[len(prompt_ids) :], np.int32)


def train(
    model: CharTransformer,
    optimizer: Optimizer,
    ids: np.ndarray,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> float:
    """Run `args.steps` steps on random windows of `ids`; return the last reported loss."""
    report_every = max(1, args.steps // 100)
    recent = []
    loss = float("nan")
    progress = tqdm(range(args.steps), desc="training", unit="step", file=sys.stderr)
    for step in progress:
        windows = random_windows(ids, args.context, args.batch_size, rng)
        recent.append(train_step(model, optimizer, windows))
        # Reading a loss waits for its step; averaging a few at a time keeps JAX running ahead.
        if len(recent) == report_every or step == args.steps - 1:
            loss = float(jnp.mean(jnp.stack(recent)))
            recent = []
            progress.set_postfix(loss=f"{loss:.3f}")
    return loss


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, with an "s" unless there is one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Train a character-level transformer on stdlib text with pytree_nn.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--steps", type=int, default=DEFAULT_STEPS, help="training steps (>= 1)")
    add("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="windows per step (>= 1)")
    add("--context", type=int, default=DEFAULT_CONTEXT, help="window length in characters")
    add("--layers", type=int, default=DEFAULT_LAYERS, help="transformer blocks (>= 1)")
    add("--width", type=int, default=DEFAULT_WIDTH, help="model width (a multiple of --heads)")
    add("--heads", type=int, default=DEFAULT_HEADS, help="attention heads per block (>= 1)")
    add("--dropout", type=float, default=DEFAULT_DROPOUT, help="dropout rate, in [0, 1)")
    add(
        "--learning-rate",
        type=float,
        default=DEFAULT_LEARNING_RATE,
        help="AdamW's peak learning rate (warmed up, then cosine-decayed to zero)",
    )
    add("--seed", type=int, default=0, help=f"seed of everything random (0 to {MAX_SEED})")
    add("--prompt", default=DEFAULT_PROMPT, help="text to continue (corpus characters only)")
    add("--sample-length", type=int, default=DEFAULT_SAMPLE_LENGTH, help="characters to write")
    add(
        "--temperature",
        type=float,
        default=DEFAULT_TEMPERATURE,
        help="sampling temperature (0: always the likeliest character)",
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what argparse's types let through, exiting with status 2 before any work."""
    at_least_one = ("steps", "batch_size", "context", "layers", "width", "heads")
    for name in at_least_one:
        value = getattr(args, name)
        if value < 1:
            parser.error(f"argument --{name.replace('_', '-')}: must be at least 1, got {value}")
    if args.width % args.heads:
        parser.error(
            f"argument --width: must be a multiple of --heads ({args.heads}), got {args.width}"
        )
    if not 0 <= args.dropout < 1:
        parser.error(f"argument --dropout: must be in [0, 1), got {args.dropout}")
    if not (args.learning_rate > 0 and math.isfinite(args.learning_rate)):
        parser.error(f"argument --learning-rate: must be positive, got {args.learning_rate}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"argument --seed: must be between 0 and {MAX_SEED}, got {args.seed}")
    if not args.prompt:
        parser.error("argument --prompt: must not be empty")
    if args.sample_length < 0:
        parser.error(f"argument --sample-length: must be at least 0, got {args.sample_length}")
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):
        parser.error(f"argument --temperature: must be 0 or more, got {args.temperature}")


def check_against_corpus(
    parser: argparse.ArgumentParser, args: argparse.Namespace, corpus: Corpus
) -> None:
    """Reject a prompt or a context that this corpus cannot serve."""
    missing = corpus.vocabulary.unknown(args.prompt)
    if missing:
        parser.error(
            f"argument --prompt: {''.join(missing)!r} never occurs in the corpus; use only "
            f"these characters: {''.join(corpus.vocabulary.chars)!r}"
        )
    longest = len(corpus.validation) - 1
    if args.context > longest:
        parser.error(
            f"argument --context: must be at most {longest} (the validation text holds "
            f"{len(corpus.validation)} characters), got {args.context}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, train, report the losses and print a sample; the last line is the
    validation loss. Returns 0."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    corpus = load_corpus()
    check_against_corpus(parser, args, corpus)

    model_key, sample_key = jax.random.split(jax.random.key(args.seed))
    model = build_model(len(corpus.vocabulary), args, model_key)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, args.learning_rate, min(WARMUP_STEPS, args.steps // 10), args.steps
    )
    tx = optax.chain(
        optax.clip_by_global_norm(MAX_GRAD_NORM),
        optax.adamw(schedule, weight_decay=WEIGHT_DECAY),
    )
    optimizer = Optimizer(model, tx, wrt=Param)
    parameters = sum(leaf.size for leaf in jax.tree.leaves(pg.state(model, Param)))
    print(
        f"corpus: {len(corpus.text):,} characters (the Zen of Python and the docstrings of "
        f"{len(DOCSTRING_MODULES)} stdlib modules), {len(corpus.vocabulary)} distinct; "
        f"{len(corpus.train):,} for training, {len(corpus.validation):,} held out"
    )
    print(
        f"model: {plural(args.layers, 'block')} of width {args.width} with "
        f"{plural(args.heads, 'head')}, context {args.context}, {parameters:,} parameters; "
        f"AdamW, {plural(args.steps, 'step')} of {args.batch_size} windows, seed {args.seed}"
    )

    train_windows = tiled_windows(corpus.train, args.context)
    validation_windows = tiled_windows(corpus.validation, args.context)
    start_train = evaluate(model, train_windows)
    start_validation = evaluate(model, validation_windows)
    print(
        f"before training: training loss {start_train:.3f}, validation loss "
        f"{start_validation:.3f} nats/char (uniform guess: {math.log(len(corpus.vocabulary)):.3f})"
    )
    started = time.perf_counter()
    train(model, optimizer, corpus.train, args, np.random.default_rng(args.seed))
    # pytree_graph.jit wrote the dropout stream's counter back after every step.
    keys = int(model.blocks[0].dropout.rngs.default.count.value)
    print(
        f"trained in {time.perf_counter() - started:.1f} s (compilation included); "
        f"dropout drew {plural(keys, 'key')}"
    )
    end_train = evaluate(model, train_windows)
    end_validation = evaluate(model, validation_windows)
    print(
        f"after training: training loss {end_train:.3f}, validation loss "
        f"{end_validation:.3f} nats/char"
    )

    model.eval()
    prompt_ids = corpus.vocabulary.encode(args.prompt)
    ids = sample(model, prompt_ids, args.sample_length, args.temperature, sample_key)
    print(
        f"sample ({args.sample_length} characters at temperature {args.temperature}, "
        "decoded with the attention cache):"
    )
    print(args.prompt + corpus.vocabulary.decode(ids))
    print(f"validation loss: {end_validation:.3f} nats/char")
    return 0


if __name__ == "__main__":
    sys.exit(main())
