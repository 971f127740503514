"""Benchmark the compile time of a Runge-Kutta step with its vector field noinline, or not.

A solver's step evaluates its vector field once per stage. Under ``jax.jit`` each evaluation
is a copy of the vector field in the compiled program, so the compile time grows with the
number of stages; ``pytree_transforms.noinline`` (and Equinox's ``eqx.internal.noinline``,
which diffrax uses for this) compiles the vector field once, as its own program, and calls
it from each stage. The step here is an explicit Runge-Kutta step of 4 and of 16 stages
(a dense lower-triangular tableau); the vector field is an MLP ``dy/dt = mlp(y)`` (tanh,
2 hidden layers), called once per stage. Three forms of the step, from the same arrays:

* ``jax.jit(step)``, the vector field an ordinary function: inlined at every stage (the
  baseline);
* ``jax.jit(step)`` with the vector field ``pytree_transforms.noinline(field)``;
* the same with ``equinox.internal.noinline(field)``.

Measured, each the median over fresh runs:

1. Compile time: ``jax.jit(step).lower(...).compile()`` from cold (JAX's, pytree_transforms'
   and Equinox's caches cleared before each run), so tracing and lowering are included.
2. First call: the same, then one step run to completion. With ``noinline`` the vector
   field's own program is compiled when the step first runs, once for all the stages, so
   this is the full price of a new step.
3. Time per step once compiled (per-call medians over interleaved repeats): what calling
   the vector field out of the step's program costs at run time.

The results of the three forms are checked equal after one step. Synchronous CPU dispatch.

Usage:
    python benchmarks/bench_noinline.py [--quick] [--out PATH]

``--quick`` is a smoke run (a small MLP, one run each); it writes a file only when ``--out``
is given. A full run writes ``benchmarks/results/noinline.md`` unless ``--out`` says
otherwise. Equinox is optional: without it its rows say "not installed".
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Target
from _report import Invocation, log, report_head, run_script, section, target_lines
from _timing import Row, Timing, compare, dist_version

import pytree_transforms

try:
    import equinox as eqx
except ImportError:  # optional: its rows then say so
    eqx = None

STAGES = (4, 16)
FULL_WIDTH, QUICK_WIDTH = 256, 16  # the state's size and the MLP's hidden width
DEPTH = 2  # hidden layers
FULL_RUNS, QUICK_RUNS = 5, 1  # fresh compilations per form and measurement

INLINED = "jax.jit(step), vector field inlined"
OURS = "pytree_transforms.noinline(field)"
EQUINOX = "Equinox: eqx.internal.noinline(field)"
FORMS = (INLINED, OURS, EQUINOX)
NOT_INSTALLED = "equinox not installed"
# The point of noinline: a 16-stage step compiles in well under the time of the inlined one.
COMPILE_TARGET = Target("<= 0.5x at 16 stages", 0.5)


def field(params: list[tuple[jax.Array, jax.Array]], y: jax.Array) -> jax.Array:
    """The vector field: an MLP of `y`, tanh between layers."""
    for w, b in params[:-1]:
        y = jnp.tanh(w @ y + b)
    w, b = params[-1]
    return w @ y + b


def mlp_params(width: int) -> list[tuple[jax.Array, jax.Array]]:
    keys = jax.random.split(jax.random.key(0), DEPTH + 1)
    scale = 1 / np.sqrt(width)
    return [(scale * jax.random.normal(k, (width, width)), jnp.zeros(width)) for k in keys]


def tableau(stages: int) -> tuple[np.ndarray, np.ndarray]:
    """A dense explicit tableau: `a[i, j]` for `j < i` (rows summing to c_i), weights `b`."""
    a = np.tril(np.ones((stages, stages)), -1) / np.maximum(np.arange(stages), 1)[:, None]
    a *= np.linspace(0, 1, stages)[:, None]
    b = np.full(stages, 1 / stages)
    return a, b


def rk_step(vector_field: Callable[..., Any], stages: int) -> Callable[..., jax.Array]:
    """An explicit Runge-Kutta step of `stages` stages, step size 0.1."""
    a, b = tableau(stages)
    h = 0.1

    def step(params: Any, y: jax.Array) -> jax.Array:
        ks: list[jax.Array] = []
        for i in range(stages):
            yi = y + h * sum((a[i, j] * k for j, k in enumerate(ks)), jnp.zeros_like(y))
            ks.append(vector_field(params, yi))
        return y + h * sum(bi * k for bi, k in zip(b, ks, strict=True))

    return step


def make_step(form: str, stages: int) -> Callable[..., jax.Array]:
    """A freshly jitted step of the form: nothing cached from earlier runs."""
    if form == INLINED:
        vector_field = field
    elif form == OURS:
        vector_field = pytree_transforms.noinline(field)
    else:
        vector_field = eqx.internal.noinline(field)
    return jax.jit(rk_step(vector_field, stages))


def clear_caches() -> None:
    pytree_transforms.clear_caches()  # JAX's too
    if eqx is not None:
        eqx.clear_caches()


def compile_seconds(form: str, stages: int, params: Any, y: jax.Array, run: bool) -> float:
    """Cold lower and compile of a new step (and, with `run`, its first call)."""
    clear_caches()
    step = make_step(form, stages)
    start = time.perf_counter()
    compiled = step.lower(params, y).compile()
    if run:
        jax.block_until_ready(compiled(params, y))
    return time.perf_counter() - start


def available(form: str) -> bool:
    return form != EQUINOX or eqx is not None


def median_rows(
    label: str, seconds: Callable[[str], float], runs: int, target: Target | None
) -> list[Row]:
    """The median of `runs` timings of each form (interleaved), with ratios to the inlined."""
    times: dict[str, list[float]] = {f: [] for f in FORMS if available(f)}
    for _ in range(runs):
        for form in times:
            times[form].append(seconds(form))
    medians = {f: statistics.median(t) for f, t in times.items()}
    rows = []
    for form in FORMS:
        if form not in medians:
            rows.append(Row(label, form, None, note=NOT_INSTALLED))
            continue
        ratio = medians[form] / medians[INLINED]
        if form == OURS and target is not None:
            rows.append(
                Row(
                    label,
                    form,
                    medians[form] * 1e6,
                    ratio,
                    target.label,
                    target.met(medians[form], ratio),
                )
            )
        else:
            rows.append(Row(label, form, medians[form] * 1e6, ratio, "—"))
    return rows


def check_agree(stages: int, params: Any, y: jax.Array) -> None:
    results = {f: np.asarray(make_step(f, stages)(params, y)) for f in FORMS if available(f)}
    for form, value in results.items():
        if not np.allclose(value, results[INLINED], rtol=1e-5, atol=1e-5):
            raise AssertionError(f"{form} disagrees with the inlined step at {stages} stages")


def run(invocation: Invocation) -> tuple[list[Row], dict[str, Timing]]:
    width = QUICK_WIDTH if invocation.quick else FULL_WIDTH
    runs = QUICK_RUNS if invocation.quick else FULL_RUNS
    params = mlp_params(width)
    y = jnp.linspace(-1, 1, width)
    rows: list[Row] = []
    timings: dict[str, Timing] = {}
    for stages in STAGES:
        check_agree(stages, params, y)
        log(f"  compile, {stages} stages")
        rows += median_rows(
            f"compile, {stages} stages (ratio vs inlined)",
            lambda f, s=stages: compile_seconds(f, s, params, y, run=False),
            runs,
            COMPILE_TARGET if stages == 16 else None,
        )
        log(f"  first call, {stages} stages")
        rows += median_rows(
            f"compile and first call, {stages} stages (ratio vs inlined)",
            lambda f, s=stages: compile_seconds(f, s, params, y, run=True),
            runs,
            None,
        )
    for stages in STAGES:
        log(f"  per step, {stages} stages")
        label = f"time per step, {stages} stages (ratio vs inlined)"
        steps = {f: make_step(f, stages) for f in FORMS if available(f)}
        cases = {f: (lambda s=s: s(params, y)) for f, s in steps.items()}
        for case in cases.values():
            jax.block_until_ready(case())
        found = compare(cases, invocation.settings)
        for form in FORMS:
            if form not in found:
                rows.append(Row(label, form, None, note=NOT_INSTALLED))
                continue
            timings[f"{form}, {stages} stages"] = found[form]
            ratio = found[form].median / found[INLINED].median
            rows.append(Row(label, form, found[form].median * 1e6, ratio, "—"))
    return rows, timings


def growth_lines(rows: list[Row]) -> list[str]:
    """How much longer each form takes to compile 16 stages than 4."""
    compile_us = {
        (r.implementation, r.measurement.split(", ")[1].split(" ")[0]): r.time_us
        for r in rows
        if r.measurement.startswith("compile, ") and r.time_us is not None
    }
    lines = []
    for form in FORMS:
        four, sixteen = compile_us.get((form, "4")), compile_us.get((form, "16"))
        if four and sixteen:
            lines.append(f"- {form}: {sixteen / four:.2f}x")
    if not lines:
        return []
    return [*section("growth", ["Compile time at 16 stages over that at 4:", "", *lines]), ""]


def benchmark(invocation: Invocation) -> str:
    rows, timings = run(invocation)
    width = QUICK_WIDTH if invocation.quick else FULL_WIDTH
    runs = QUICK_RUNS if invocation.quick else FULL_RUNS
    description = (
        f"An explicit Runge-Kutta step of {' and '.join(map(str, STAGES))} stages on a state "
        f"of size {width}; the vector field an MLP ({DEPTH} hidden layers of width {width}, "
        "tanh), called once per stage: inlined into the step's program, or "
        "`pytree_transforms.noinline`, or `eqx.internal.noinline`. Compile times are from "
        f"cold (caches cleared), each the median of {runs} fresh compilations of the form "
        "(the forms interleaved); the first call adds one step, which for the noinline "
        "forms includes compiling the vector field's own program."
    )
    lines = report_head(
        invocation,
        "pytree_transforms.noinline: compile time of a Runge-Kutta step",
        description,
        rows,
        timings,
        subject="Each time per step",
    )
    lines += growth_lines(rows)
    lines += target_lines(rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_transforms": pytree_transforms.__version__,
        "equinox": dist_version("equinox") if eqx is not None else None,
    }
    quick_help = "short smoke run (a small MLP, one compilation each)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
