"""Benchmark the training step of the LLaMA-style example against Flax NNX and hand-written JAX.

The model is the one of ``examples/llama.py`` (imported from its file, as the tests do): a
decoder of RMSNorm, rotary embeddings, grouped-query causal attention and a SwiGLU MLP, its
layers stacked on a leading axis and run with a scan, the output head tied to the token
embedding. It is built once, with the example's ``Llama``; every other form holds copies of
its arrays (float32):

* hand-written: a dict of the model's arrays and a forward pass written with ``jax.numpy`` /
  ``jax.lax``, the stacked layers run by ``jax.lax.scan``; ``jax.value_and_grad``,
  ``tx.update`` and ``optax.apply_updates`` under ``jax.jit``: the baseline (target for
  pytree_nn: at least its throughput, 1.0x);
* pytree_nn, graph style: the example's ``Llama``, ``Optimizer(model, tx, wrt=Param)`` and
  ``optimizer.update(model, grads)`` inside ``pytree_graph.jit``, with
  ``pytree_graph.value_and_grad``;
* pytree_nn, functional style: the same model through ``filter_value_and_grad``,
  ``tx.update`` and ``apply_updates`` inside ``pytree_transforms.filter_jit``;
* Equinox: ``eqx.nn.Embedding``, ``RMSNorm``, ``Linear`` and ``RotaryPositionalEmbedding``
  (unbatched, as Equinox writes them, under ``jax.vmap``), the layers stacked and run with
  ``jax.lax.scan`` over their arrays (``eqx.partition`` / ``eqx.combine``),
  ``eqx.filter_value_and_grad`` and ``eqx.apply_updates`` in ``eqx.filter_jit``;
* Flax NNX: ``nnx.Embed`` (its ``attend`` for the head), ``nnx.RMSNorm``, ``nnx.Linear``,
  rotary embeddings written by hand, the layers built stacked with ``nnx.vmap`` and run with
  ``nnx.scan``; ``nnx.Optimizer`` and ``nnx.value_and_grad`` in ``nnx.jit``.

The Equinox and Flax NNX forms compute attention itself (the softmax of the rotated queries
against the keys) with the hand-written function, as neither library's attention layer
takes fewer key/value heads than query heads.

Every form trains with ``optax.adam(1e-3)`` on every parameter, on the same batch of token
windows (random characters of the vocabulary; the loss is the mean next-token
cross-entropy, as the example's ``next_token_loss``). Before timing, one step of each is
checked against the others: the loss it returns (at the shared starting weights) and the
loss after it (so the update itself is compared).

Measured in one run, with synchronous CPU dispatch:

1. The time per training step of each form (ratios against hand-written).
2. The time of the first call of a freshly wrapped step: tracing, compiling and running one
   step (ratios against hand-written; the point of comparison is Flax NNX's). For the
   hand-written step the report also splits this into tracing, lowering and compiling, with
   JAX's ahead-of-time API; and for every form, the time to trace and lower a freshly
   wrapped step (``.lower``), the part of the first call that the library's Python takes.
3. What XLA compiled for the hand-written and the graph-style steps (FLOPs, matrix
   products, fusions, instructions): whether the two run the same program.

Usage:
    python benchmarks/bench_llama.py [--quick] [--out PATH]

``--quick`` is a smoke run (a tiny model, few repeats); it writes a file only when ``--out``
is given. A full run writes ``benchmarks/results/llama.md`` unless ``--out`` says otherwise.
Equinox and Flax are optional: without them their rows say "not installed".
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import math
import re
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Runner, Target, built_case
from _report import Invocation, log, record_table, report_head, run_script, section, target_lines
from _timing import Row, Settings, dist_version, markdown_table
from bench_nn import (
    EQUINOX,
    FUNCTIONAL,
    GRAPH,
    HAND,
    LEARNING_RATE,
    NNX,
    Problem,
    Trainer,
    _unavailable,
    aot_split,
    cross_entropy,
    equinox_style,
    first_call_seconds,
    functional_style,
    graph_style,
    hand_written,
    median_rows,
    nnx_style,
    step_settings,
)

import pytree_graph
import pytree_nn
import pytree_transforms

try:
    import equinox as eqx
except ImportError:
    eqx = None
try:
    from flax import nnx
except ImportError:
    nnx = None

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama.py"


def load_example() -> ModuleType:
    """``examples/llama.py`` imported as a module (examples/ is not a package), registered in
    ``sys.modules``, where dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location("example_llama", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


llama = load_example()


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sizes of a run: the model's (the example's `Config`) and the batch."""

    vocab_size: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    context: int
    batch: int

    def config(self) -> Any:
        sizes = dataclasses.asdict(self)
        del sizes["batch"]
        return llama.Config(**sizes)


# About a hundred characters of text, the sizes.
FULL = Shapes(
    vocab_size=96, width=128, layers=4, heads=4, kv_heads=2, hidden=384, context=64, batch=16
)
# A smoke run checks that everything runs: a tiny model compiles in a fraction of the time.
QUICK = Shapes(
    vocab_size=16, width=16, layers=2, heads=2, kv_heads=1, hidden=32, context=8, batch=2
)

THROUGHPUT_TARGET = Target(">= 1.0x throughput (<= 1.000x time)", 1.0)


# ------------------------------------------------------------- hand-written: a dict of arrays


def rms_norm(x: jax.Array, scale: jax.Array, epsilon: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + epsilon) * scale


def rotary(x: jax.Array, theta: float) -> jax.Array:
    """Rotary embeddings of ``x`` (batch, seq, heads, head) at positions 0..seq-1, pairing
    each feature of the first half with the one half a head further ("rotate half")."""
    seq, size = x.shape[1], x.shape[-1]
    frequencies = 1.0 / theta ** (jnp.arange(0, size, 2, dtype=jnp.float32) / size)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * frequencies  # (seq, size / 2)
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Grouped-query causal attention: q (batch, seq, heads, head), k and v (batch, seq,
    kv_heads, head); query head i reads kv head i // (heads // kv_heads). Returns (batch,
    seq, heads * head)."""
    batch, seq, heads, size = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(batch, seq, kv_heads, heads // kv_heads, size)  # head i: (i // g, i % g)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / math.sqrt(size)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
    mixed = jnp.einsum("bkgqs,bskd->bqkgd", jax.nn.softmax(logits, axis=-1), v)
    return mixed.reshape(batch, seq, heads * size)


def decoder_layer(
    config: Any, p: dict[str, jax.Array], x: jax.Array, attend: Callable = causal_attention
) -> jax.Array:
    """One decoder layer on ``x`` (batch, seq, width), with one layer's slices of the
    stacked arrays ``p`` (named below ``layers/``)."""
    batch, seq, _ = x.shape
    size = config.width // config.heads
    h = rms_norm(x, p["attention_norm/scale"], config.norm_epsilon)
    q = (h @ p["attention/query/kernel"]).reshape(batch, seq, config.heads, size)
    k = (h @ p["attention/key/kernel"]).reshape(batch, seq, config.kv_heads, size)
    v = (h @ p["attention/value/kernel"]).reshape(batch, seq, config.kv_heads, size)
    q, k = rotary(q, config.rope_theta), rotary(k, config.rope_theta)
    x = x + attend(q, k, v) @ p["attention/output/kernel"]
    h = rms_norm(x, p["mlp_norm/scale"], config.norm_epsilon)
    gated = jax.nn.silu(h @ p["mlp/gate/kernel"]) * (h @ p["mlp/up/kernel"])
    return x + gated @ p["mlp/down/kernel"]


def dict_forward(config: Any, p: dict[str, jax.Array], tokens: jax.Array) -> jax.Array:
    """The logits (batch, seq, vocab) of the model held in the dict ``p``."""
    table = p["embed/embedding"]
    layers = {k.removeprefix("layers/"): v for k, v in p.items() if k.startswith("layers/")}

    def step(x: jax.Array, layer: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        return decoder_layer(config, layer, x), None

    x, _ = jax.lax.scan(step, table[tokens], layers)
    return rms_norm(x, p["norm/scale"], config.norm_epsilon) @ table.T


# ------------------------------------------------------------------------------ Equinox


def _equinox_linear(kernel: jax.Array) -> Any:
    """An `eqx.nn.Linear` without bias holding ``kernel`` (in, out), stacked or not: Equinox
    keeps it as (out, in)."""
    layer = eqx.nn.Linear(kernel.shape[-2], kernel.shape[-1], use_bias=False, key=jax.random.key(0))
    return eqx.tree_at(lambda m: m.weight, layer, jnp.swapaxes(kernel, -1, -2))


def _equinox_norm(scale: jax.Array, epsilon: float) -> Any:
    layer = eqx.nn.RMSNorm(scale.shape[-1], eps=epsilon, use_bias=False)
    return eqx.tree_at(lambda m: m.weight, layer, scale)


if eqx is not None:

    class EquinoxLayer(eqx.Module):
        """One decoder layer (or, holding stacked arrays, all of them) for one sequence."""

        attention_norm: Any
        query: Any
        key: Any
        value: Any
        output: Any
        rope: Any
        mlp_norm: Any
        gate: Any
        up: Any
        down: Any
        heads: int = eqx.field(static=True)
        kv_heads: int = eqx.field(static=True)

        def __init__(self, config: Any, p: dict[str, jax.Array]):
            def norm(name: str) -> Any:
                return _equinox_norm(p[f"layers/{name}/scale"], config.norm_epsilon)

            self.attention_norm, self.mlp_norm = norm("attention_norm"), norm("mlp_norm")
            self.query, self.key, self.value, self.output, self.gate, self.up, self.down = (
                _equinox_linear(p[f"layers/{name}/kernel"])
                for name in (
                    "attention/query",
                    "attention/key",
                    "attention/value",
                    "attention/output",
                    "mlp/gate",
                    "mlp/up",
                    "mlp/down",
                )
            )
            size = config.width // config.heads
            self.rope = eqx.nn.RotaryPositionalEmbedding(size, theta=config.rope_theta)
            self.heads, self.kv_heads = config.heads, config.kv_heads

        def __call__(self, x: jax.Array) -> jax.Array:  # one sequence (seq, width)
            seq = x.shape[0]
            each = jax.vmap  # Equinox layers take one vector: mapped over the sequence
            h = each(self.attention_norm)(x)
            q = each(self.query)(h).reshape(seq, self.heads, -1)
            k = each(self.key)(h).reshape(seq, self.kv_heads, -1)
            v = each(self.value)(h).reshape(seq, self.kv_heads, -1)
            # The rotary layer takes one head's sequence (seq, head): mapped over the heads.
            q, k = (jax.vmap(self.rope, in_axes=1, out_axes=1)(t) for t in (q, k))
            mixed = causal_attention(q[None], k[None], v[None])[0]
            x = x + each(self.output)(mixed)
            h = each(self.mlp_norm)(x)
            return x + each(self.down)(jax.nn.silu(each(self.gate)(h)) * each(self.up)(h))

    class EquinoxLlama(eqx.Module):
        embed: Any
        layers: EquinoxLayer
        norm: Any

        def __init__(self, config: Any, p: dict[str, jax.Array]):
            table = p["embed/embedding"]
            embed = eqx.nn.Embedding(*table.shape, key=jax.random.key(0))
            self.embed = eqx.tree_at(lambda m: m.weight, embed, table)
            self.layers = EquinoxLayer(config, p)  # its arrays stacked, one row per layer
            self.norm = _equinox_norm(p["norm/scale"], config.norm_epsilon)

        def __call__(self, tokens: jax.Array) -> jax.Array:  # one sequence (seq,)
            x = jax.vmap(self.embed)(tokens)
            arrays, static = eqx.partition(self.layers, eqx.is_array)

            def step(x: jax.Array, layer: Any) -> tuple[jax.Array, None]:
                return eqx.combine(layer, static)(x), None

            x, _ = jax.lax.scan(step, x, arrays)
            return jax.vmap(self.norm)(x) @ self.embed.weight.T


def equinox_forward(model: Any, tokens: jax.Array) -> jax.Array:
    return jax.vmap(model)(tokens)


# ------------------------------------------------------------------------------- Flax NNX


if nnx is not None:

    class NnxAttention(nnx.Module):
        def __init__(self, config: Any, rngs: Any):
            size = config.width // config.heads
            self.heads, self.kv_heads, self.theta = config.heads, config.kv_heads, config.rope_theta

            def linear(into: int, out: int) -> Any:
                return nnx.Linear(into, out, use_bias=False, rngs=rngs)

            self.query = linear(config.width, config.heads * size)
            self.key = linear(config.width, config.kv_heads * size)
            self.value = linear(config.width, config.kv_heads * size)
            self.output = linear(config.heads * size, config.width)

        def __call__(self, x: jax.Array) -> jax.Array:
            batch, seq, _ = x.shape
            q = self.query(x).reshape(batch, seq, self.heads, -1)
            k = self.key(x).reshape(batch, seq, self.kv_heads, -1)
            v = self.value(x).reshape(batch, seq, self.kv_heads, -1)
            q, k = rotary(q, self.theta), rotary(k, self.theta)
            return self.output(causal_attention(q, k, v))

    class NnxMlp(nnx.Module):
        def __init__(self, config: Any, rngs: Any):
            self.gate = nnx.Linear(config.width, config.hidden, use_bias=False, rngs=rngs)
            self.up = nnx.Linear(config.width, config.hidden, use_bias=False, rngs=rngs)
            self.down = nnx.Linear(config.hidden, config.width, use_bias=False, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.down(jax.nn.silu(self.gate(x)) * self.up(x))

    class NnxLayer(nnx.Module):
        def __init__(self, config: Any, rngs: Any):
            epsilon = config.norm_epsilon
            self.attention_norm = nnx.RMSNorm(config.width, epsilon=epsilon, rngs=rngs)
            self.attention = NnxAttention(config, rngs)
            self.mlp_norm = nnx.RMSNorm(config.width, epsilon=epsilon, rngs=rngs)
            self.mlp = NnxMlp(config, rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            h = x + self.attention(self.attention_norm(x))
            return h + self.mlp(self.mlp_norm(h))

    class NnxLlama(nnx.Module):
        def __init__(self, config: Any, rngs: Any):
            self.embed = nnx.Embed(config.vocab_size, config.width, rngs=rngs)

            @nnx.split_rngs(splits=config.layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create(rngs: Any) -> NnxLayer:
                return NnxLayer(config, rngs)

            self.layers = create(rngs)
            self.norm = nnx.RMSNorm(config.width, epsilon=config.norm_epsilon, rngs=rngs)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def forward(x: jax.Array, layer: NnxLayer) -> jax.Array:
                return layer(x)

            x = forward(self.embed(tokens), self.layers)
            return self.embed.attend(self.norm(x))


# -------------------------------------------------------------------------- the problem


def llama_problem(shapes: Shapes) -> Problem:
    """The example's model at ``shapes``, its batch of windows and every form of it."""
    config = shapes.config()
    windows = jax.random.randint(
        jax.random.key(1), (shapes.batch, shapes.context + 1), 0, shapes.vocab_size, jnp.int32
    )
    model = llama.Llama(config, rngs=pytree_nn.Rngs(0))
    return Problem(
        f"LLaMA-style decoder, {shapes.layers} layers",
        model,
        windows[:, :-1],  # the tokens read ...
        windows[:, 1:],  # ... and the next token of each, predicted
        cross_entropy,  # the mean over every position, as `next_token_loss`
        partial(dict_forward, config),
        lambda p: EquinoxLlama(config, p),
        equinox_forward,
        lambda: NnxLlama(config, nnx.Rngs(0)),
    )


def example_loss(problem: Problem) -> float:
    """The example's own ``next_token_loss`` of the model on the batch, checked against the
    loss that every form's step computes (the same cross-entropy on the same windows), so
    that the benchmark times the example's objective."""
    windows = jnp.concatenate([problem.x, problem.y[:, -1:]], axis=1)
    expected = float(llama.next_token_loss(problem.model, windows))
    got = float(problem.loss(problem.model(problem.x), problem.y))
    if not math.isclose(got, expected, rel_tol=1e-6):
        raise RuntimeError(
            f"the benchmark's loss ({got}) differs from the example's next_token_loss "
            f"({expected}) on the same model and windows: align llama_problem with "
            "examples/llama.py"
        )
    return expected


# name, make, library (True: always there), distribution
FORMS: list[tuple[str, Callable[..., Trainer], Any, str]] = [
    (HAND, hand_written, True, ""),
    (GRAPH, graph_style, True, ""),
    (FUNCTIONAL, functional_style, True, ""),
    (EQUINOX, equinox_style, eqx, "equinox"),
    (NNX, nnx_style, nnx, "flax"),
]
# Each form's own jit, which wraps its step.
JITS: dict[str, Callable] = {
    HAND: jax.jit,
    GRAPH: pytree_graph.jit,
    FUNCTIONAL: pytree_transforms.filter_jit,
    EQUINOX: eqx.filter_jit if eqx is not None else None,
    NNX: nnx.jit if nnx is not None else None,
}


def step_cases(problem: Problem) -> list[Any]:
    """A training step of each form; each checked by its first loss and the loss after it."""
    cases = []
    for name, make, library, dist in FORMS:
        trainer: list[Trainer] = []

        def build(make: Callable[[Problem], Trainer] = make, trainer: list = trainer) -> Any:
            trainer.append(make(problem))
            return trainer[0].step

        ours = name in (GRAPH, FUNCTIONAL)
        cases.append(
            built_case(
                name,
                build,
                unavailable="" if library is True else _unavailable(library, dist),
                target=THROUGHPUT_TARGET if ours else None,
                read=lambda loss, trainer=trainer: [loss, trainer[0].loss()],
            )
        )
    return cases


# ------------------------------------------------------------------ the compiled programs


def wrapped_step(make: Callable[..., Trainer], jit: Callable, problem: Problem) -> Any:
    """A freshly built form's training step, as its `jit` wraps it, and its arguments."""
    wrapped: list[Any] = []

    def capture(f: Callable) -> Any:
        wrapped.append(jit(f))
        return wrapped[-1]

    trainer = make(problem, capture)
    return wrapped[0], trainer.inputs()  # the step is the first function a form wraps


def lowering_seconds(form: tuple[Callable[..., Trainer], Callable], problem: Problem) -> float:
    """The time to trace and lower a freshly wrapped step: the library's share of the first
    call, before XLA compiles."""
    step, inputs = wrapped_step(*form, problem)
    start = time.perf_counter()
    step.lower(*inputs)
    return time.perf_counter() - start


def program_summary(lowered: Any) -> dict[str, float]:
    """What XLA made of a lowered step: its FLOPs (XLA's cost analysis), its matrix
    products, its fusions and its instructions in all."""
    compiled = lowered.compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ops = collections.Counter(re.findall(r"=\s+\S+\s+([a-z][a-z0-9-]*)\(", compiled.as_text()))
    return {
        "FLOPs": float((cost or {}).get("flops", float("nan"))),
        "dots": ops["dot"],
        "fusions": ops["fusion"],
        "instructions": sum(ops.values()),
    }


def compiled_programs(problem: Problem) -> dict[str, dict[str, float]]:
    """The compiled training steps of the hand-written and the graph-style forms, side by
    side: what each runs per step once the Python around it is gone."""
    summaries = {}
    for name, make, jit in ((HAND, hand_written, jax.jit), (GRAPH, graph_style, pytree_graph.jit)):
        step, inputs = wrapped_step(make, jit, problem)
        summaries[name] = program_summary(step.lower(*inputs))
    return summaries


# ---------------------------------------------------------------------------------- run


@dataclasses.dataclass
class Results:
    runner: Runner
    first_call: list[Row]
    first_call_medians: dict[str, float]
    lowering: list[Row]
    lowering_medians: dict[str, float]
    lowering_repeats: int
    aot: dict[str, float]
    shapes: Shapes
    repeats: int
    example_loss: float
    programs: dict[str, dict[str, float]]


def run(settings: Settings, quick: bool) -> Results:
    runner = Runner(settings, log)
    shapes = QUICK if quick else FULL
    problem = llama_problem(shapes)
    example_loss_value = example_loss(problem)
    runner.measure(f"training step, {problem.name} (ratio vs hand-written)", step_cases(problem))
    repeats = 1 if quick else 3
    label = f"first call (trace, compile, one step), {problem.name} (ratio vs hand-written)"
    log(f"timing {label} ...")
    seconds = partial(first_call_seconds, problem=problem)
    rows, medians = median_rows(FORMS, seconds, repeats, label, "first call")
    label = f"tracing and lowering the step, {problem.name} (ratio vs hand-written)"
    log(f"timing {label} ...")
    forms = [(name, (make, JITS[name]), lib, dist) for name, make, lib, dist in FORMS]
    seconds = partial(lowering_seconds, problem=problem)
    lowering_repeats = 1 if quick else 5
    lowering, lowering_medians = median_rows(forms, seconds, lowering_repeats, label, "lowering")
    aot = aot_split(problem)
    programs = {}
    if not quick:  # two more compiles, which a smoke run spares
        log("compiling the hand-written and graph-style steps for their programs ...")
        programs = compiled_programs(problem)
    return Results(
        runner,
        rows,
        medians,
        lowering,
        lowering_medians,
        lowering_repeats,
        aot,
        shapes,
        repeats,
        example_loss_value,
        programs,
    )


# ------------------------------------------------------------------------------- report


def throughput_lines(rows: list[Row]) -> list[str]:
    """Each form's throughput relative to the hand-written step."""
    lines = ["Throughput relative to the hand-written step (1 / time ratio):", ""]
    for row in rows:
        if row.ratio is None or row.implementation == HAND:
            continue
        lines.append(f"- {row.implementation.split(':')[0]}: {1 / row.ratio:.3f}x")
    return [*section("throughput", lines), ""]


FIRST_CALL_TITLE = "First call of the training step"


def _against_nnx(medians: dict[str, float], what: str) -> list[str]:
    """Our forms' time relative to Flax NNX's, in one line and a blank one (none without
    NNX's)."""
    if NNX not in medians:
        return []
    ratios = ", ".join(
        f"{name.split(':')[0]} {medians[name] / medians[NNX]:.2f}x"
        for name in (GRAPH, FUNCTIONAL)
        if name in medians
    )
    return [f"Against Flax NNX's {what}: {ratios}.", ""]


LOWERING_TITLE = "Tracing and lowering the training step"


def first_call_lines(results: Results) -> list[str]:
    split = ", ".join(f"{part} {seconds:.2f} s" for part, seconds in results.aot.items())
    explanation = (
        "Each form is built afresh and its step function wrapped anew, so nothing is cached; "
        "the time is that of its first call: tracing, compiling and running one step, the "
        f"median of {results.repeats} builds. Times in the table are in microseconds."
    )
    lowering = (
        "The library's share of it: the time to trace and lower a freshly wrapped step "
        "(`.lower(...)` of each form's jit, which runs the Python of the model and the "
        "transforms and emits the program, without compiling it); the median of "
        f"{results.lowering_repeats} fresh steps, "
        "in microseconds."
    )
    return [
        f"## {FIRST_CALL_TITLE}",
        "",
        *section(
            "first-call",
            [
                explanation,
                "",
                markdown_table(results.first_call),
                "",
                *_against_nnx(results.first_call_medians, "first call"),
                f"The hand-written step, with JAX's ahead-of-time API: {split}.",
                "",
                lowering,
                "",
                markdown_table(results.lowering),
                "",
                *_against_nnx(results.lowering_medians, "tracing and lowering")[:1],
            ],
        ),
        "",
    ]


PROGRAMS_TITLE = "The compiled steps"


def program_lines(results: Results) -> list[str]:
    if not results.programs:
        return [f"## {PROGRAMS_TITLE}", "", "Not compiled in a quick run.", ""]
    names = list(results.programs)
    counts = list(next(iter(results.programs.values())))
    header = ["| compiled step | " + " | ".join(counts) + " |", "|---" * (len(counts) + 1) + "|"]
    body = [
        f"| {name.split(':')[0]} | "
        + " | ".join(f"{results.programs[name][c]:.4g}" for c in counts)
        + " |"
        for name in names
    ]
    explanation = (
        "What XLA compiled for the hand-written step and for the graph-style step: its "
        "floating-point operations by XLA's cost analysis (which counts the body of the loop "
        "over the layers once), its matrix products (`dot`), fusions and instructions, "
        "counted in the compiled program's text. Beyond the compiled program, a "
        "graph-style call splits the model and optimizer into arrays, looks the program up "
        "and writes the results back into their Variables: a fixed cost of a fraction of a "
        "millisecond, whatever the size of the arrays."
    )
    return [
        f"## {PROGRAMS_TITLE}",
        "",
        *section("programs", [explanation, "", *header, *body]),
        "",
    ]


def report(results: Results, invocation: Invocation) -> str:
    settings = step_settings(invocation.quick)
    s = results.shapes
    description = (
        f"A training step (`optax.adam({LEARNING_RATE:g})` on every parameter) of the "
        "LLaMA-style decoder of `examples/llama.py`: token embedding tied to the output head, "
        f"{s.layers} layers stacked and scanned (width {s.width}, {s.heads} query heads and "
        f"{s.kv_heads} key/value heads with rotary embeddings, SwiGLU MLP {s.hidden}, RMSNorm "
        f"before each), vocabulary {s.vocab_size}; windows of {s.context} tokens and the next, "
        f"batch {s.batch}, next-token cross-entropy, float32. The model is built once with the "
        "example's `Llama`; the hand-written, Equinox and Flax NNX forms hold copies of its "
        "arrays, and one step of each is checked against the others (the loss before and "
        "after it) before timing. The example's own `next_token_loss` gives "
        f"{results.example_loss:.6f} on the batch, the forms' first loss."
    )
    lines = report_head(
        dataclasses.replace(invocation, settings=settings),
        "pytree_nn: the LLaMA-style example's training step vs hand-written JAX + optax, "
        "Equinox and Flax NNX",
        description,
        results.runner.rows,
        results.runner.timings,
        subject="Each step time",
        slow="",
        closing=(
            f"Steps are timed in loops of about {settings.repeat_s * 1e3:g} ms. The target is "
            "the issue's: at least the throughput of the hand-written step."
        ),
    )
    lines += throughput_lines(results.runner.rows)
    lines += first_call_lines(results)
    record_table(invocation, FIRST_CALL_TITLE, results.first_call)
    record_table(invocation, LOWERING_TITLE, results.lowering)
    lines += program_lines(results)
    lines += target_lines(results.runner.rows)
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    settings = step_settings(invocation.quick)
    return report(run(settings, invocation.quick), invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_nn": pytree_nn.__version__,
        "optax": dist_version("optax"),
        "equinox": dist_version("equinox") if eqx is not None else None,
        "flax": dist_version("flax") if nnx is not None else None,
    }
    quick_help = "short smoke run (a tiny model, few repeats)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
