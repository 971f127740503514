"""Benchmark step-time stability: every step of a long training run, not just the median.

A 3-layer MLP of width 32 (float32) is trained with ``optax.adam(1e-3)`` on the loss
``sum(model(x) ** 2)``, one step at a time, in each form:

* ``jax.jit`` of a step on a dict of arrays and its optax state, returned and rebound by the
  caller: the baseline;
* ``pytree_transforms.filter_jit`` of the same step on a ``pytree_module`` MLP holding plain
  arrays (Equinox style: the new model and optimizer state returned and rebound);
* ``pytree_graph.jit(step)(model, optimizer, x)`` and
  ``pytree_graph.jit_partial(step, model, optimizer)(x)`` on an MLP of ``Param`` Variables
  with a ``pytree_nn.Optimizer`` (updated in place);
* ``eqx.filter_jit`` (Equinox's functional step) and ``nnx.jit`` (Flax NNX's in-place step).

Every form runs the same number of steps, interleaved: each round runs one step of every
form, in a new shuffled order, so that a change in machine load or a pause of the whole
process falls on all of them alike. Each step is timed on its own (``perf_counter_ns``),
with synchronous CPU dispatch and Python's garbage collector on, as in a user's loop. The
first steps of each form (compiling, warming caches) are left out. The report gives the
median, 99th percentile and slowest step of each form: a garbage-collection pause or a
hidden retrace shows in the last two, not in the median. Python's collections are timed
through ``gc.callbacks``, and the slowest step's row says whether one ran during it.

Usage:
    python benchmarks/bench_steps.py [--quick] [--out PATH]

``--quick`` runs a few hundred steps; it writes a file only when ``--out`` is given. A full
run (10,000 steps of each form) writes ``benchmarks/results/steps.md`` unless ``--out``
says otherwise. Equinox and Flax are optional: without them their rows say "not installed".
"""

from __future__ import annotations

import dataclasses
import gc
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import mlp_arrays
from _report import Invocation, log, record_table, run_script, section, target_lines
from _timing import Row, dist_version, markdown_table

# The models of bench_graph (a `Linear` of two Params; NNX's equivalent) and its plain one,
# and bench_jit_partial's step on a dict (the same adam step, written with jax and optax).
from bench_graph import MLP, ArrayLinear, Linear, nnx
from bench_jit_partial import LR, Models, OnDict, graph_step, make_dict_step, nnx_step

import pytree_graph
import pytree_module
import pytree_transforms
from pytree_nn import Optimizer

if nnx is not None:
    from bench_graph import NnxLinear, NnxMLP

try:
    import equinox as eqx
except ImportError:
    eqx = None

DEPTH = 3
WIDTH = 32
STEPS = 10_000
QUICK_STEPS = 300
WARMUP = 100  # steps of each form left out (the first compiles)
QUICK_WARMUP = 20

BASE = "jax.jit(step)(params, opt_state, x), rebound"
FILTER_JIT = "filter_jit(step)(model, opt_state, x), rebound"
GRAPH_JIT = "pytree_graph.jit(step)(model, optimizer, x)"
PARTIAL = "pytree_graph.jit_partial(step, model, optimizer)(x)"
EQX = "eqx.filter_jit(step)(model, opt_state, x), rebound"
NNX = "nnx.jit(step)(model, optimizer, x)"
OURS = (FILTER_JIT, GRAPH_JIT, PARTIAL)
P99_LIMIT = 1.2
MAX_LIMIT = 2.0


def _loss(m: Any, x: jax.Array) -> jax.Array:
    return jnp.sum(m(x) ** 2)


def dict_form(pairs: list[tuple[jax.Array, jax.Array]], x: jax.Array) -> Callable[[], Any]:
    """bench_jit_partial's step on a dict of the arrays, rebound by the caller each step."""
    params = Models(pairs).params()
    return OnDict(make_dict_step(len(pairs)), params, optax.adam(LR).init(params), x)


def functional_form(
    model: Any, jit: Callable[..., Any], value_and_grad: Callable[..., Any], x: jax.Array
) -> Callable[[], Any]:
    """A step returning the new model and optimizer state, rebound by the caller (the
    functional style of `filter_jit` and `eqx.filter_jit`)."""
    tx = optax.adam(LR)

    @jit
    def step(model: Any, opt_state: Any, x: jax.Array) -> Any:
        loss, grads = value_and_grad(_loss)(model, x)
        updates, opt_state = tx.update(grads, opt_state, model)
        return optax.apply_updates(model, updates), opt_state, loss

    state = [model, tx.init(model)]

    def run() -> Any:
        state[0], state[1], loss = step(state[0], state[1], x)
        return loss

    return run


def forms(
    pairs: list[tuple[jax.Array, jax.Array]], x: jax.Array
) -> dict[str, Callable[[], Any] | str]:
    """Each form's step (a call with no arguments), or why it cannot run."""
    found: dict[str, Callable[[], Any] | str] = {BASE: dict_form(pairs, x)}
    plain = MLP([ArrayLinear(w, b) for w, b in pairs])
    found[FILTER_JIT] = functional_form(
        plain, pytree_transforms.filter_jit, pytree_transforms.filter_value_and_grad, x
    )
    model = MLP([Linear(w, b) for w, b in pairs])
    found[GRAPH_JIT] = partial(
        pytree_graph.jit(graph_step), model, Optimizer(model, optax.adam(LR)), x
    )
    bound = MLP([Linear(w, b) for w, b in pairs])
    found[PARTIAL] = partial(
        pytree_graph.jit_partial(graph_step, bound, Optimizer(bound, optax.adam(LR))), x
    )
    if eqx is None:
        found[EQX] = "equinox not installed"
    else:

        class EqxLinear(eqx.Module):
            w: jax.Array
            b: jax.Array

            def __call__(self, x: jax.Array) -> jax.Array:
                return x @ self.w + self.b

        class EqxMLP(eqx.Module):
            layers: list[EqxLinear]

            def __call__(self, x: jax.Array) -> jax.Array:
                for layer in self.layers[:-1]:
                    x = jax.nn.relu(layer(x))
                return self.layers[-1](x)

        eqx_model = EqxMLP([EqxLinear(w, b) for w, b in pairs])
        found[EQX] = functional_form(eqx_model, eqx.filter_jit, eqx.filter_value_and_grad, x)
    if nnx is None:
        found[NNX] = "flax not installed"
    else:
        nnx_model = NnxMLP([NnxLinear(w, b) for w, b in pairs])
        optimizer = nnx.Optimizer(nnx_model, optax.adam(LR), wrt=nnx.Param)
        found[NNX] = partial(nnx.jit(nnx_step), nnx_model, optimizer, x)
    return found


class CollectorWatch:
    """Times Python's garbage collections (through `gc.callbacks`): the total so far, in
    nanoseconds, and the oldest generation collected since the caller last set `oldest`
    to -1."""

    def __init__(self) -> None:
        self.total_ns = 0
        self.oldest = -1
        self._started = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
            self.oldest = max(self.oldest, info["generation"])
        else:
            self.total_ns += time.perf_counter_ns() - self._started


@dataclasses.dataclass
class Collections:
    """Python's garbage collections during each step of one form: how long they took (us)
    and the oldest generation collected (-1 where none ran)."""

    paused_us: np.ndarray
    generation: np.ndarray

    def slowest_note(self, times: np.ndarray, warmup: int) -> str:
        """What the slowest step after warm-up held: a collection, or none."""
        slowest = warmup + int(np.argmax(times[warmup:]))
        if self.generation[slowest] < 0:
            return "no garbage collection during it"
        return (
            f"a generation-{self.generation[slowest]} garbage collection of "
            f"{self.paused_us[slowest]:,.0f} us ran during it"
        )


def run_steps(
    steps: dict[str, Callable[[], Any]], count: int, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, Collections]]:
    """`count` steps of every form, interleaved in a new shuffled order each round: the
    time of each step in microseconds, and the garbage collections during each, so that a
    slow step can be told apart from a collection."""
    rng = random.Random(seed)
    names = list(steps)
    times = {name: np.empty(count) for name in names}
    collections = {
        name: Collections(np.zeros(count), np.full(count, -1, dtype=np.int8)) for name in names
    }
    clock = time.perf_counter_ns
    watch = CollectorWatch()
    gc.callbacks.append(watch)
    try:
        for i in range(count):
            rng.shuffle(names)
            for name in names:
                step = steps[name]
                before, watch.oldest = watch.total_ns, -1
                start = clock()
                step()
                times[name][i] = (clock() - start) / 1e3
                if watch.oldest >= 0:
                    collections[name].paused_us[i] = (watch.total_ns - before) / 1e3
                    collections[name].generation[i] = watch.oldest
    finally:
        gc.callbacks.remove(watch)
    return times, collections


def rows(
    times: dict[str, np.ndarray],
    why: dict[str, str],
    warmup: int,
    collections: dict[str, Collections] | None = None,
) -> list[Row]:
    """p50, p99 and max of each form after warm-up, each against the dict's; the slowest
    step's row says whether a garbage collection ran during it."""
    stats = {
        name: {
            "p50": float(np.percentile(t[warmup:], 50)),
            "p99": float(np.percentile(t[warmup:], 99)),
            "max": float(t[warmup:].max()),
        }
        for name, t in times.items()
    }
    measured = len(next(iter(times.values()))) - warmup
    out = []
    for stat, what, limit in (
        ("p50", "median step time", None),
        ("p99", "99th percentile step time", P99_LIMIT),
        ("max", "slowest step", MAX_LIMIT),
    ):
        label = (
            f"{what}, {measured:,} steps after {warmup} of warm-up, MLP {DEPTH}x{WIDTH} "
            f"(ratio vs the dict's {stat})"
        )
        base = stats[BASE][stat]
        for name in (BASE, *OURS, EQX, NNX):
            if name in why:
                out.append(Row(label, name, None, note=why[name]))
                continue
            value = stats[name][stat]
            ratio = value / base
            target = "" if limit is None or name not in OURS else f"<= {limit:g}x the dict's"
            met = None if not target else ratio <= limit
            note = ""
            if stat == "max" and collections is not None:
                note = collections[name].slowest_note(times[name], warmup)
            out.append(Row(label, name, value, ratio, target, met, note))
    return out


def benchmark(invocation: Invocation) -> str:
    quick = invocation.quick
    count, warmup = (QUICK_STEPS, QUICK_WARMUP) if quick else (STEPS, WARMUP)
    weights, biases = mlp_arrays(DEPTH, WIDTH, 0)
    x = jnp.ones(WIDTH, jnp.float32)
    found = forms(list(zip(weights, biases, strict=True)), x)
    steps = {name: f for name, f in found.items() if callable(f)}
    why = {name: f for name, f in found.items() if isinstance(f, str)}
    log(f"{count} steps of {len(steps)} forms, interleaved")
    times, collections = run_steps(steps, count)
    table = rows(times, why, warmup, collections)
    title = "Step-time stability: every step of a training run, vs jax.jit on a dict"
    record_table(invocation, title, table)
    description = (
        f"A {DEPTH}-layer MLP of width {WIDTH} (float32) trained with `optax.adam({LR:g})` on "
        "`sum(model(x) ** 2)`, one step at a time in each form, the forms interleaved in a "
        "new shuffled order each round. Each step timed on its own with synchronous CPU "
        "dispatch and the garbage collector on. The dict's step (`jax.jit`, parameters and "
        "optimizer state returned and rebound) is the baseline."
    )
    lines = [
        f"# {title}",
        "",
        description,
        "",
        *section("machine", [*invocation.header, f"- Command: `{invocation.command}`"]),
        "",
        "Figures from one run on the machine above; the ratios within one measurement are the "
        "figures to compare. The slowest step of a run on a shared machine is the noisiest "
        "figure of all: a pause of the operating system lands on one form's step.",
        "",
        *section("table", [markdown_table(table)]),
        "",
        *target_lines(table),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_graph": pytree_graph.__version__,
        "pytree_module": pytree_module.__version__,
        "pytree_transforms": pytree_transforms.__version__,
        "equinox": dist_version("equinox") if eqx is not None else None,
        "flax": dist_version("flax") if nnx is not None else None,
        "optax": dist_version("optax"),
    }
    return run_script(argv, __file__, __doc__, "a few hundred steps", versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
