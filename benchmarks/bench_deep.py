"""Benchmark the first training step of deep transformer stacks: stacked and scanned, or not.

The model is a stack of identical pre-norm transformer blocks (self-attention, then a gelu
MLP of 4x the width; LayerNorm, ``MultiHeadAttention`` and ``Linear`` from pytree_nn), width
64, 4 heads, on sequences of 16, batch 4, float32: small, so that tracing and compiling
dominate the first step. Three forms, each at 1, 2, 12, 24 and 48 blocks:

* stacked: the blocks built as one with ``pytree_graph.vmap`` (every Variable has a leading
  layer axis) and run by ``pytree_graph.scan``, one layer per step (see
  docs/graph/scan-over-layers.md);
* unstacked, the baseline of each depth: the same blocks in a list, run by a Python loop, so
  the program holds every block once;
* Flax NNX stacked: NNX's own pattern (``nnx.vmap`` under ``nnx.split_rngs`` to build,
  ``nnx.scan`` to run), with ``nnx`` layers of the same shapes.

Each training step is ``optax.adam(1e-3)`` on every parameter of a mean squared output,
under ``pytree_graph.jit`` with ``pytree_graph.value_and_grad`` and ``Optimizer.update``
(``nnx.jit``, ``nnx.value_and_grad`` and ``nnx.Optimizer.update`` for NNX). The time is that
of the first call of a freshly built model and freshly wrapped step: tracing, compiling and
running one step; the median over a few builds. The persistent compilation cache is off.

The target is the issue's: the first step of a 48-block stack in at most 1.3x the time of a
1-block stack. The report also gives each depth against 2 blocks: XLA removes a loop that
runs once, so a 1-block stack compiles as one block without a loop, a smaller program than
any deeper stack's.

Usage:
    python benchmarks/bench_deep.py [--quick] [--out PATH]

``--quick`` is a smoke run (width 16, stacks of 1, 2 and 4 blocks, one build each); it writes
a file only when ``--out`` is given. A full run writes ``benchmarks/results/deep.md`` unless
``--out`` says otherwise. Flax is optional: without it its rows say "not installed".
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Target, first_line
from _report import Invocation, log, record_table, report_head, run_script, section, target_lines
from _timing import Row, dist_version, markdown_table

import pytree_graph as pg
import pytree_nn
from pytree_graph import PARTITION_NAME, Carry, Param
from pytree_nn import LayerNorm, Linear, MultiHeadAttention, Optimizer, Rngs

try:
    from flax import nnx
except ImportError:
    nnx = None

LEARNING_RATE = 1e-3
EPSILON = 1e-6
LAYERS = {PARTITION_NAME: "layers"}

STACKED = "pytree_nn stacked: pg.vmap to build, pg.scan to run"
UNSTACKED = "unstacked: pytree_nn blocks in a list, a Python loop"
NNX_STACKED = "Flax NNX stacked: nnx.vmap to build, nnx.scan to run"
FLAT_TARGET = Target("<= 1.3x the 1-block stack", 1.3)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sizes of a run."""

    width: int
    heads: int
    sequence: int
    batch: int
    depths: tuple[int, ...]
    repeats: int  # fresh builds per form and depth; the median is reported


FULL = Shapes(width=64, heads=4, sequence=16, batch=4, depths=(1, 2, 12, 24, 48), repeats=3)
QUICK = Shapes(width=16, heads=2, sequence=8, batch=2, depths=(1, 2, 4), repeats=1)


# ------------------------------------------------------------------------------ the models


class Block(pytree_nn.Module):
    """A pre-norm transformer block: self-attention, then a gelu MLP."""

    def __init__(self, width: int, heads: int, rngs: Rngs):
        self.ln1 = LayerNorm(width, epsilon=EPSILON, rngs=rngs)
        self.attn = MultiHeadAttention(heads, width, decode=False, rngs=rngs)
        self.ln2 = LayerNorm(width, epsilon=EPSILON, rngs=rngs)
        self.up = Linear(width, 4 * width, rngs=rngs)
        self.down = Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class Stacked(pytree_nn.Module):
    """`depth` blocks built as one (a leading layer axis), run by `pg.scan`."""

    def __init__(self, depth: int, shapes: Shapes, rngs: Rngs):
        @pg.vmap(in_axes=0, out_axes=0, transform_metadata=LAYERS)
        def create(rngs: Rngs) -> Block:
            return Block(shapes.width, shapes.heads, rngs)

        self.blocks = create(rngs.split(depth))

    def __call__(self, x: jax.Array) -> jax.Array:
        @pg.scan(in_axes=(Carry, 0), out_axes=Carry, transform_metadata=LAYERS)
        def forward(x: jax.Array, block: Block) -> jax.Array:
            return block(x)

        return forward(x, self.blocks)


class Unstacked(pytree_nn.Module):
    """`depth` separate blocks in a list, run one after another."""

    def __init__(self, depth: int, shapes: Shapes, rngs: Rngs):
        self.blocks = [Block(shapes.width, shapes.heads, rngs) for _ in range(depth)]

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


if nnx is not None:

    class NnxBlock(nnx.Module):
        def __init__(self, width: int, heads: int, rngs: Any):
            self.ln1 = nnx.LayerNorm(width, epsilon=EPSILON, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(width, epsilon=EPSILON, rngs=rngs)
            self.up = nnx.Linear(width, 4 * width, rngs=rngs)
            self.down = nnx.Linear(4 * width, width, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            x = x + self.attn(self.ln1(x))
            return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))

    class NnxStacked(nnx.Module):
        def __init__(self, depth: int, shapes: Shapes, rngs: Any):
            @nnx.split_rngs(splits=depth)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create(rngs: Any) -> NnxBlock:
                return NnxBlock(shapes.width, shapes.heads, rngs)

            self.blocks = create(rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def forward(x: jax.Array, block: Any) -> jax.Array:
                return block(x)

            return forward(x, self.blocks)


# ------------------------------------------------------------------------- the first step


def _ours(model_class: type) -> Callable[[int, Shapes], Callable[[], jax.Array]]:
    def build(depth: int, shapes: Shapes) -> Callable[[], jax.Array]:
        model = model_class(depth, shapes, Rngs(0))
        optimizer = Optimizer(model, optax.adam(LEARNING_RATE), wrt=Param)
        x = jnp.ones((shapes.batch, shapes.sequence, shapes.width))

        @pg.jit
        def step(model: Any, optimizer: Any, x: jax.Array) -> jax.Array:
            loss, grads = pg.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
            optimizer.update(model, grads)
            return loss

        return lambda: step(model, optimizer, x)

    return build


def _nnx(depth: int, shapes: Shapes) -> Callable[[], jax.Array]:
    model = NnxStacked(depth, shapes, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(LEARNING_RATE), wrt=nnx.Param)
    x = jnp.ones((shapes.batch, shapes.sequence, shapes.width))

    @nnx.jit
    def step(model: Any, optimizer: Any, x: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    return lambda: step(model, optimizer, x)


# name, build(depth, shapes) -> the first call, library (None: not installed)
FORMS: list[tuple[str, Callable[[int, Shapes], Callable[[], jax.Array]], Any]] = [
    (UNSTACKED, _ours(Unstacked), True),
    (STACKED, _ours(Stacked), True),
    (NNX_STACKED, _nnx, nnx),
]


def first_step_seconds(
    build: Callable[[int, Shapes], Callable[[], jax.Array]], depth: int, shapes: Shapes
) -> float:
    """The time of the first step of a fresh model and a freshly wrapped step (the model's
    construction is not timed)."""
    call = build(depth, shapes)
    jax.block_until_ready(jax.tree.leaves(call))
    start = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - start


def measure(shapes: Shapes) -> dict[str, dict[int, float | str]]:
    """The median first-step seconds of each form at each depth, or why it did not run."""
    found: dict[str, dict[int, float | str]] = {name: {} for name, *_ in FORMS}
    for depth in shapes.depths:
        for name, build, library in FORMS:
            if library is None:
                found[name][depth] = "flax not installed"
                continue
            log(f"  first step, {depth} blocks: {name}")
            try:
                times = [first_step_seconds(build, depth, shapes) for _ in range(shapes.repeats)]
            except Exception as error:
                found[name][depth] = f"failed: {first_line(error)}"
                log(f"  {name}: {found[name][depth]}")
                continue
            found[name][depth] = statistics.median(times)
    return found


# ------------------------------------------------------------------------------ the tables


def depth_label(depth: int) -> str:
    return f"first training step, {depth} block{'s' if depth > 1 else ''} (ratio vs unstacked)"


def depth_rows(found: dict[str, dict[int, float | str]], shapes: Shapes) -> list[Row]:
    """Each depth: every form's time and its ratio to the unstacked model's."""
    rows = []
    for depth in shapes.depths:
        base = found[UNSTACKED].get(depth)
        for name, *_ in FORMS:
            got = found[name].get(depth)
            label = depth_label(depth)
            if not isinstance(got, float):
                rows.append(Row(label, name, None, note=str(got or "not run")))
                continue
            ratio = got / base if isinstance(base, float) else None
            rows.append(Row(label, name, got * 1e6, ratio, "—"))
    return rows


def flatness_rows(found: dict[str, dict[int, float | str]], shapes: Shapes) -> list[Row]:
    """Each stacked form's first step at every depth against its 1-block and 2-block
    stacks; the target on the deepest against 1 block."""
    rows = []
    deepest = max(shapes.depths)
    for reference in (1, 2):
        for depth in (d for d in shapes.depths if d > reference):
            label = f"first training step, stacked, {depth} blocks (ratio vs {reference} block" + (
                "s)" if reference > 1 else ")"
            )
            for name in (STACKED, NNX_STACKED):
                got, base = found[name].get(depth), found[name].get(reference)
                if not (isinstance(got, float) and isinstance(base, float)):
                    why = got if isinstance(base, float) else base
                    rows.append(Row(label, name, None, note=str(why or "not run")))
                    continue
                ratio = got / base
                target = (
                    FLAT_TARGET if name == STACKED and reference == 1 and depth == deepest else None
                )
                rows.append(
                    Row(
                        label,
                        name,
                        got * 1e6,
                        ratio,
                        target.label if target else "—",
                        target.met(got, ratio) if target else None,
                    )
                )
    return rows


# ---------------------------------------------------------------------------------- report


FLAT_TITLE = "Stacked: deeper stacks against shallow ones"


def report(found: dict[str, dict[int, float | str]], shapes: Shapes, invocation: Invocation) -> str:
    description = (
        f"The first training step (`optax.adam({LEARNING_RATE:g})` on every parameter; "
        "tracing, compiling and one step) of a stack of pre-norm transformer blocks "
        f"(width {shapes.width}, {shapes.heads} heads, MLP {4 * shapes.width} with gelu; "
        f"sequences of {shapes.sequence}, batch {shapes.batch}, float32) at "
        f"{', '.join(map(str, shapes.depths))} blocks: stacked with `pytree_graph.vmap` "
        "and run by `pytree_graph.scan`, unstacked (a list of blocks and a Python loop: the "
        "baseline of each depth), and Flax NNX's stacked pattern (`nnx.vmap` to build, "
        "`nnx.scan` to run). Each time is the median over "
        f"{shapes.repeats} fresh builds of the first call of a freshly wrapped step; the "
        "model's construction is not timed, and the persistent compilation cache is off. "
        "Times are in microseconds."
    )
    rows = depth_rows(found, shapes)
    flat = flatness_rows(found, shapes)
    lines = report_head(
        invocation,
        "Deep stacks: first training step, stacked and scanned against unstacked, and Flax NNX",
        description,
        rows,
        {},
    )
    explanation = (
        "A stacked model's program holds one block, in a loop, whatever the depth; an "
        "unstacked model's holds every block. The ratios below are each stacked form's time "
        "at a depth to its own time at 1 and at 2 blocks. XLA removes a loop that runs "
        "once, so a 1-block stack compiles as a single block without a loop: a smaller "
        "program than any deeper stack's, which all compile the same loop."
    )
    lines += [
        f"## {FLAT_TITLE}",
        "",
        *section("flatness", [explanation, "", markdown_table(flat)]),
        "",
    ]
    record_table(invocation, FLAT_TITLE, flat)
    lines += target_lines([*rows, *flat])
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    shapes = QUICK if invocation.quick else FULL
    cache_was = jax.config.jax_enable_compilation_cache
    # A persistent compilation cache would serve one build's program to the next.
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        found = measure(shapes)
    finally:
        jax.config.update("jax_enable_compilation_cache", cache_was)
    return report(found, shapes, invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_nn": pytree_nn.__version__,
        "optax": dist_version("optax"),
        "flax": dist_version("flax") if nnx is not None else None,
    }
    quick_help = "short smoke run (width 16, stacks of 1, 2 and 4 blocks, one build each)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
