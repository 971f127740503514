"""Scaling curves: how flatten, unflatten, split, merge and jit dispatch grow with model size.

Two families of models, each built from the very same arrays in every form:

* by layers: MLP-like models of L layers (L = 1, 2, 4, ..., 1024), each layer holding two
  arrays, a weight (4 x 4) and a bias (4,), float32: 2 to 2,048 Variables;
* by Variables: one module holding a list of N small arrays of shape (2,) (N = 10 to 100,000,
  log-spaced); the arrays are drawn from a pool of at most 1,024 distinct ones, so that building
  the largest model does not dominate the run.

The forms: a plain dict of arrays (the limit: JAX's own pytree); a pytree_module Module, NNX
style (``pytree_graph.Param`` Variables assigned in ``__init__``, the list a
``pytree_module.List``); a pytree_module Module, Equinox style (annotated fields holding plain
arrays); an ``equinox.Module``; a ``flax.nnx.Module`` (``nnx.Param`` Variables in an
``nnx.List``).

Measured per size, with synchronous CPU dispatch: ``jax.tree.flatten`` and
``jax.tree.unflatten`` of every form; ``pytree_graph.split`` and ``merge`` of the NNX-style
Module against ``nnx.split`` and ``nnx.merge``; the per-call time of a jitted trivial function
``f(model, x) = x + 1`` through ``pytree_graph.jit`` (NNX style),
``pytree_transforms.filter_jit`` (Equinox style), ``jax.jit`` on the dict, ``eqx.filter_jit``
and ``nnx.jit``: the time each wrapper spends on the model's leaves and structure per call.
All the sizes of one measurement are timed in one interleaved comparison (see ``_timing.py``),
so that a change in the machine's load during the run hits every size alike instead of
bending the curves.

Each curve is checked for linear growth: the log-log slope over the upper half of its sizes
(1 for linear growth; a fixed cost per call pulls it below 1 at small sizes), and the worst
ratio of a measured time to a fit ``a + b * n`` over the same points (least squares on the
relative error, so that every size counts alike). A curve whose slope exceeds 1.15 is marked
"not linear". A case is skipped from the first size at which one call takes more than a second
(or would, by the time of the size before scaled linearly), and the report says so.

Usage:
    python benchmarks/bench_scaling.py [--quick] [--out PATH] [--max-layers L]
        [--max-variables N]

``--quick`` is a smoke run of a few seconds at two small sizes per family; it writes a file
only when ``--out`` is given. A full run writes ``benchmarks/results/scaling.md`` unless
``--out`` says otherwise. ``--max-layers`` and ``--max-variables`` cap the sizes (a reduced
run; the report says so). Equinox and Flax are optional: without them their rows say "not
installed". ``run_all.py`` draws the curves from the report's JSON tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Runner, mlp_arrays, named_rows
from _format import format_time, size_label
from _report import Invocation, log, record_table, report_head, run_script, section
from _timing import Row, Settings, Timing, dist_version

import pytree_graph
import pytree_module
import pytree_transforms
from pytree_graph import Param
from pytree_module import Module

try:
    import equinox as eqx
except ImportError:
    eqx = None
try:
    from flax import nnx
except ImportError:
    nnx = None

LAYERS = tuple(2**i for i in range(11))  # 1 ... 1024
VARIABLES = (10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000, 100_000)
QUICK_LAYERS = (1, 4)
QUICK_VARIABLES = (10, 100)
WIDTH = 4
POOL = 1024  # distinct arrays behind the many-Variables models
LIMIT_S = 1.0  # the longest call timed; a case whose next size would take longer is skipped
QUICK_LIMIT_S = 0.05
NOT_LINEAR = 1.15  # a log-log slope above this marks a curve "not linear"

DICT = "dict of arrays"
OURS = "pytree_module, NNX style"
OURS_F = "pytree_module, Equinox style"
EQX = "Equinox"
NNX = "Flax NNX"
FORMS = (DICT, OURS, OURS_F, EQX, NNX)
MISSING = {EQX: "equinox not installed", NNX: "flax not installed"}

GRAPH_SPLIT = "pytree_graph.split(model)"
NNX_SPLIT = "nnx.split(model)"
GRAPH_MERGE = "pytree_graph.merge(graphdef, state)"
NNX_MERGE = "nnx.merge(graphdef, state)"
DICT_JIT = DICT + ": jax.jit"
GRAPH_JIT = "pytree_graph.jit, NNX style"
FILTER_JIT = "pytree_transforms.filter_jit, Equinox style"
EQX_JIT = EQX + ": eqx.filter_jit"
NNX_JIT = NNX + ": nnx.jit"
MISSING_BY_CASE = {
    NNX_SPLIT: MISSING[NNX],
    NNX_MERGE: MISSING[NNX],
    EQX_JIT: MISSING[EQX],
    NNX_JIT: MISSING[NNX],
}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One operation measured at every size: its label, its cases and the baseline of the
    largest size's ratios."""

    key: str
    label: str
    names: tuple[str, ...]
    baseline: str


MEASUREMENTS = (
    Measurement("flatten", "`jax.tree.flatten`", FORMS, DICT),
    Measurement("unflatten", "`jax.tree.unflatten`", FORMS, DICT),
    Measurement("split", "`split(model)`", (GRAPH_SPLIT, NNX_SPLIT), NNX_SPLIT),
    Measurement("merge", "`merge(graphdef, state)`", (GRAPH_MERGE, NNX_MERGE), NNX_MERGE),
    Measurement(
        "dispatch",
        "`jit(f)(model, x)` per call, f trivial",
        (DICT_JIT, GRAPH_JIT, FILTER_JIT, EQX_JIT, NNX_JIT),
        DICT_JIT,
    ),
)


# --------------------------------------------------------------------------- the models


class Linear(Module):
    """NNX style: two Param Variables assigned in ``__init__``."""

    def __init__(self, w: jax.Array, b: jax.Array):
        self.w = Param(w)
        self.b = Param(b)


class MLP(Module):
    def __init__(self, layers: list[Linear]):
        self.layers = pytree_module.List(layers)


class FieldLinear(Module):
    """Equinox style: annotated fields holding plain arrays."""

    w: jax.Array
    b: jax.Array


class FieldMLP(Module):
    layers: list[FieldLinear]


class Bag(Module):
    """NNX style: one List of N Param Variables."""

    def __init__(self, items: list[Param]):
        self.items = pytree_module.List(items)


class FieldBag(Module):
    """Equinox style: one field holding a list of N arrays."""

    items: list[jax.Array]


if eqx is not None:

    class EqxLinear(eqx.Module):
        w: jax.Array
        b: jax.Array

    class EqxMLP(eqx.Module):
        layers: list[EqxLinear]

    class EqxBag(eqx.Module):
        items: list[jax.Array]


if nnx is not None:

    class NnxLinear(nnx.Module):
        def __init__(self, w: jax.Array, b: jax.Array):
            self.w = nnx.Param(w)
            self.b = nnx.Param(b)

    class NnxMLP(nnx.Module):
        def __init__(self, layers: list[NnxLinear]):
            self.layers = nnx.List(layers)

    class NnxBag(nnx.Module):
        def __init__(self, items: list[Any]):
            self.items = nnx.List(items)


def layer_models(depth: int, seed: int) -> dict[str, Any]:
    """Every form of the ``depth``-layer model, holding the same arrays."""
    weights, biases = mlp_arrays(depth, WIDTH, seed)
    pairs = list(zip(weights, biases, strict=True))
    params = {}
    for i, (w, b) in enumerate(pairs):
        params[f"layers_{i}_w"] = w
        params[f"layers_{i}_b"] = b
    models = {
        DICT: params,
        OURS: MLP([Linear(w, b) for w, b in pairs]),
        OURS_F: FieldMLP([FieldLinear(w, b) for w, b in pairs]),
    }
    if eqx is not None:
        models[EQX] = EqxMLP([EqxLinear(w, b) for w, b in pairs])
    if nnx is not None:
        models[NNX] = NnxMLP([NnxLinear(w, b) for w, b in pairs])
    return models


def variable_models(count: int, pool: Sequence[jax.Array]) -> dict[str, Any]:
    """Every form of the model of ``count`` Variables, cycling through the arrays of ``pool``."""
    arrays = [pool[i % len(pool)] for i in range(count)]
    models = {
        DICT: {f"v{i}": a for i, a in enumerate(arrays)},
        OURS: Bag([Param(a) for a in arrays]),
        OURS_F: FieldBag(arrays),
    }
    if eqx is not None:
        models[EQX] = EqxBag(arrays)
    if nnx is not None:
        models[NNX] = NnxBag([nnx.Param(a) for a in arrays])
    return models


def check_models(models: dict[str, Any], count: int) -> None:
    """Every form has ``count`` leaves, the arrays of the dict (each form's own order)."""
    expected = {id(a) for a in models[DICT].values()}
    for name, model in models.items():
        leaves = jax.tree.leaves(model)
        assert len(leaves) == count, (name, len(leaves), count)
        assert {id(leaf) for leaf in leaves} == expected, name


# ----------------------------------------------------------------------------- measures


def _trivial_function() -> Callable[[Any, jax.Array], jax.Array]:
    """A new function ``f(tree, x) = x + 1`` for the jits of each size.

    The wrappers of one function share its compilations, and a call of a structure other than
    the last call's takes a slower path; as the sizes of a curve are timed interleaved, each
    size gets its own function, so that every call measured is a call of a steady loop.
    """

    def trivial(tree: Any, x: jax.Array) -> jax.Array:
        del tree
        return x + 1

    return trivial


Make = Callable[[], Callable[[], Any]]
"""Builds one case's zero-argument call, checking what it computes, when the case is timed."""


def _bound(fun: Callable, *args: Any) -> Callable[[], Any]:
    """The call ``fun(*args)``, which needs no setup."""
    return partial(fun, *args)


def _unflatten(model: Any) -> Callable[[], Any]:
    leaves, treedef = jax.tree.flatten(model)
    assert type(jax.tree.unflatten(treedef, leaves)) is type(model)
    return partial(jax.tree.unflatten, treedef, leaves)


def _merge(split: Callable, merge: Callable, model: Any, count: int) -> Callable[[], Any]:
    call = partial(merge, *split(model))
    assert len(jax.tree.leaves(call())) == count
    return call


def _jitted(jit: Callable, model: Any) -> Callable[[], Any]:
    # A function of its own for every jit of every size: see `_trivial_function`.
    x = jnp.ones(WIDTH, jnp.float32)
    call = partial(jit(_trivial_function()), model, x)
    np.testing.assert_array_equal(np.asarray(call()), np.asarray(x) + 1)
    return call


def operation_cases(models: dict[str, Any], count: int) -> dict[str, dict[str, Make]]:
    """What builds the call of every case at one size, by measurement key and case name.

    A case is built (its setup done and its first call made, compiling it) only where it is
    timed: a case skipped at a size costs nothing there.
    """
    cases: dict[str, dict[str, Make]] = {
        "flatten": {name: partial(_bound, jax.tree.flatten, m) for name, m in models.items()},
        "unflatten": {name: partial(_unflatten, model) for name, model in models.items()},
        "split": {GRAPH_SPLIT: partial(_bound, pytree_graph.split, models[OURS])},
        "merge": {
            GRAPH_MERGE: partial(
                _merge, pytree_graph.split, pytree_graph.merge, models[OURS], count
            )
        },
        "dispatch": {
            DICT_JIT: partial(_jitted, jax.jit, models[DICT]),
            GRAPH_JIT: partial(_jitted, pytree_graph.jit, models[OURS]),
            FILTER_JIT: partial(_jitted, pytree_transforms.filter_jit, models[OURS_F]),
        },
    }
    if eqx is not None:
        cases["dispatch"][EQX_JIT] = partial(_jitted, eqx.filter_jit, models[EQX])
    if nnx is not None:
        cases["split"][NNX_SPLIT] = partial(_bound, nnx.split, models[NNX])
        cases["merge"][NNX_MERGE] = partial(_merge, nnx.split, nnx.merge, models[NNX], count)
        cases["dispatch"][NNX_JIT] = partial(_jitted, nnx.jit, models[NNX])
    return cases


def scaling_settings(quick: bool) -> Settings:
    """The timing of every curve: loops of at least one call, as the largest models take
    up to a second a call; the smallest get many calls a loop all the same."""
    if quick:
        return Settings(repeat=3, repeat_s=0.001, min_number=1, warmup=1)
    return Settings(repeat=15, repeat_s=0.01, min_number=1, warmup=2)


@dataclasses.dataclass(frozen=True)
class Axis:
    """One family of models: its name, its sizes and the Variables of a model of each size."""

    name: str
    sizes: tuple[int, ...]
    variables: Callable[[int], int]


@dataclasses.dataclass
class Curves:
    """Every curve measured: per-call `Timing` by (measurement key, axis, case) and size, and
    why a case was skipped from some size on."""

    sizes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    times: dict[tuple[str, str, str], dict[int, Timing]] = dataclasses.field(default_factory=dict)
    skipped: dict[tuple[str, str, str], str] = dataclasses.field(default_factory=dict)


def _one_call(call: Callable[[], Any]) -> float:
    """The seconds one call takes (after the call that compiled it)."""
    start = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - start


def measure_axis(
    runner: Runner,
    curves: Curves,
    axis: Axis,
    build: Callable[[int], dict[str, Any]],
    settings: Settings,
    limit: float,
) -> None:
    """Time every measurement at every size of one axis.

    All sizes of a measurement are timed in one `compare`, their repeats interleaved, so that
    a change in the machine's load during the run bends no curve: it hits every size alike.
    A case is left out from the first size at which one call takes more than ``limit``
    seconds (or would, scaled linearly from the size before).
    """
    curves.sizes[axis.name] = axis.sizes
    calls: dict[str, dict[str, dict[int, Callable[[], Any]]]] = {}
    last: dict[tuple[str, str], tuple[int, float]] = {}
    for size in axis.sizes:
        count = axis.variables(size)
        log(f"building the models of {size} {axis.name} ...")
        models = build(size)
        check_models(models, count)
        for key, cases in operation_cases(models, count).items():
            for name, make in cases.items():
                if (key, axis.name, name) in curves.skipped:
                    continue
                previous = last.get((key, name))
                guess = None if previous is None else previous[1] * size / previous[0]
                call = None if guess is not None and guess > limit else make()
                took = None if call is None else _one_call(call)
                if took is None or took > limit:
                    seconds = guess if took is None else took
                    curves.skipped[(key, axis.name, name)] = (
                        f"skipped from {size:,} {axis.name} on: one call takes about "
                        f"{seconds:.2g} s (over {limit:g} s)"
                    )
                    continue
                last[(key, name)] = (size, took)
                calls.setdefault(key, {}).setdefault(name, {})[size] = call
    for measurement in MEASUREMENTS:
        found = calls.get(measurement.key, {})
        cases = {
            size_label(name, axis.name, size): call
            for name, by_size in found.items()
            for size, call in by_size.items()
        }
        timings = runner.time(f"{measurement.label} by {axis.name}", cases, settings)
        for name, by_size in found.items():
            for size in by_size:
                timing = timings[size_label(name, axis.name, size)]
                curves.times.setdefault((measurement.key, axis.name, name), {})[size] = timing


def run(
    settings: Settings, quick: bool, max_layers: int, max_variables: int
) -> tuple[Runner, Curves]:
    runner = Runner(settings, log)
    curves = Curves()
    limit = QUICK_LIMIT_S if quick else LIMIT_S
    layers = QUICK_LAYERS if quick else tuple(n for n in LAYERS if n <= max_layers)
    counts = QUICK_VARIABLES if quick else tuple(n for n in VARIABLES if n <= max_variables)
    axis = Axis("layers", layers, lambda depth: 2 * depth)
    measure_axis(runner, curves, axis, lambda depth: layer_models(depth, depth), settings, limit)
    rng = np.random.default_rng(0)
    pool = list(jnp.asarray(rng.standard_normal((min(POOL, max(counts)), 2), dtype=np.float32)))
    axis = Axis("Variables", counts, lambda count: count)
    measure_axis(runner, curves, axis, lambda count: variable_models(count, pool), settings, limit)
    return runner, curves


# ---------------------------------------------------------------------------- linearity


@dataclasses.dataclass(frozen=True)
class Fit:
    """How linear one curve is.

    Attributes:
        slope: the log-log slope over the upper half of the sizes (1: linear).
        worst: the largest ratio of a measured time to the fit ``a + b * n`` over those sizes.
    """

    slope: float
    worst: float

    @property
    def linear(self) -> bool:
        return self.slope <= NOT_LINEAR


def linearity(points: dict[int, float]) -> Fit | None:
    """The `Fit` of per-call times by size; None with fewer than two sizes."""
    sizes = sorted(points)
    if len(sizes) < 2:
        return None
    n = np.array(sizes, dtype=float)
    t = np.array([points[s] for s in sizes])
    # The upper half of the sizes, at least two: the fixed cost of a call, which flattens the
    # curve at small sizes, weighs least there.
    upper = slice(min(len(sizes) // 2, len(sizes) - 2), None)
    slope = float(np.polyfit(np.log(n[upper]), np.log(t[upper]), 1)[0])
    # a + b * n fitted to the relative error: over log-spaced sizes an absolute least squares
    # would follow the largest sizes alone and always fit them.
    (a, b), *_ = np.linalg.lstsq(np.stack([1 / t, n / t], axis=1), np.ones_like(t), rcond=None)
    worst = float(np.max(t[upper] / (a + b * n[upper])))
    return Fit(slope, worst)


# ------------------------------------------------------------------------------- report


def _name_cell(name: str) -> str:
    return name.replace("|", "/")


def largest_rows(curves: Curves) -> list[Row]:
    """Each measurement at the largest size of each axis, with ratios to its baseline."""
    rows = []
    for axis, sizes in curves.sizes.items():
        size = sizes[-1]
        for m in MEASUREMENTS:
            label = f"{m.label}, {size} {axis} (ratio vs {m.baseline})"
            timings = {}
            missing = {**MISSING, **MISSING_BY_CASE}
            for name in m.names:
                key = (m.key, axis, name)
                if size in curves.times.get(key, {}):
                    timings[name] = curves.times[key][size]
                elif key in curves.skipped:
                    missing[name.split(": ")[0]] = curves.skipped[key]
            rows += named_rows(label, list(m.names), timings, m.baseline, missing)
    return rows


def curve_tables(curves: Curves) -> list[str]:
    """Per measurement and axis, the per-call time of each case at every size (us)."""
    lines = []
    for m in MEASUREMENTS:
        for axis, sizes in curves.sizes.items():
            lines += [
                f"{m.label} by {axis} (us per call):",
                "",
                "| implementation | " + " | ".join(f"{s:,}" for s in sizes) + " |",
                "| --- |" + " --- |" * len(sizes),
            ]
            for name in m.names:
                times = curves.times.get((m.key, axis, name), {})
                if not times and (m.key, axis, name) not in curves.skipped:
                    continue
                cells = [format_time(times[s].median * 1e6) if s in times else "—" for s in sizes]
                lines.append(f"| {_name_cell(name)} | " + " | ".join(cells) + " |")
            lines.append("")
    return lines


def slope_table(curves: Curves) -> tuple[list[str], list[str]]:
    """The linearity of every curve as a table, and the lines naming the curves not linear."""
    lines = [
        "| measurement | models | implementation | sizes | smallest (us) | largest (us) "
        "| slope, upper half | worst time / fit | linear? |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    not_linear = []
    for m in MEASUREMENTS:
        for axis in curves.sizes:
            for name in m.names:
                times = curves.times.get((m.key, axis, name), {})
                fit = linearity({s: t.median for s, t in times.items()})
                if fit is None:
                    continue
                low, high = min(times), max(times)
                verdict = "yes" if fit.linear else "**not linear**"
                cells = [
                    m.label,
                    f"by {axis}",
                    _name_cell(name),
                    f"{low:,} to {high:,}",
                    format_time(times[low].median * 1e6),
                    format_time(times[high].median * 1e6),
                    f"{fit.slope:.2f}",
                    f"{fit.worst:.2f}",
                    verdict,
                ]
                lines.append("| " + " | ".join(cells) + " |")
                if not fit.linear:
                    not_linear.append(f"- {name}, {m.label} by {axis}: slope {fit.slope:.2f}")
    return lines, not_linear


def record_curves(invocation: Invocation, curves: Curves) -> None:
    """Every point of every curve as a row of the JSON tables, from which run_all.py draws."""
    for m in MEASUREMENTS:
        for axis in curves.sizes:
            rows = []
            for name in m.names:
                key = (m.key, axis, name)
                for size, timing in sorted(curves.times.get(key, {}).items()):
                    label = size_label(m.label, axis, size)
                    rows.append(Row(label, name, timing.median * 1e6))
            if rows:
                record_table(invocation, f"{m.label} by {axis}", rows)


def report(runner: Runner, curves: Curves, invocation: Invocation, reduced: str) -> str:
    sizes = {axis: f"{s[0]:,} to {s[-1]:,}" for axis, s in curves.sizes.items()}
    description = (
        f"Models of {sizes['layers']} layers (two arrays each: {WIDTH}x{WIDTH} and {WIDTH}, "
        f"float32) and of {sizes['Variables']} Variables (one list of arrays of shape (2,)), "
        "the very same arrays in every form: a dict of arrays, pytree_module Modules in the "
        "NNX style (`pytree_graph.Param`) and the Equinox style (plain arrays), "
        "`equinox.Module` and `flax.nnx.Module`. The jitted function is `f(model, x) = x + 1`: "
        "its time per call is the wrapper's dispatch."
    )
    if reduced:
        invocation.header.append(f"- Reduced run: {reduced}.")
    rows = largest_rows(curves)
    lines = report_head(
        dataclasses.replace(invocation, settings=scaling_settings(invocation.quick)),
        "Scaling: flatten, unflatten, split, merge and jit dispatch by model size",
        description,
        rows,
        runner.timings,
        slow="All sizes of a measurement are timed together, their repeats interleaved, and "
        "a loop of the largest models may hold one call",
        closing="The table shows the largest size of each family; the slopes below say how "
        "each time grows. No row has a target.",
    )
    record_curves(invocation, curves)
    slopes, not_linear = slope_table(curves)
    skipped = [
        f"- {name}, {label} by {axis}: {why}"
        for (key, axis, name), why in curves.skipped.items()
        for label in [next(m.label for m in MEASUREMENTS if m.key == key)]
    ]
    lines += section(
        "slopes",
        [
            "How each curve grows: the log-log slope over the upper half of its sizes (1 is "
            f"linear; above {NOT_LINEAR} the curve is marked not linear) and the worst ratio "
            "of a measured time to the fit `a + b * n` over those sizes.",
            "",
            *slopes,
        ],
    )
    lines += [""]
    lines += section(
        "linearity",
        [
            "Curves not linear:" + ("" if not_linear else " none."),
            *not_linear,
            *(["", "Cases skipped:", *skipped] if skipped else []),
        ],
    )
    lines += ["", *section("curves", curve_tables(curves))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--max-layers", type=int, default=LAYERS[-1])
    parser.add_argument("--max-variables", type=int, default=VARIABLES[-1])
    caps, rest = parser.parse_known_args(argv)
    for option, value, smallest in (
        ("--max-layers", caps.max_layers, LAYERS[1]),
        ("--max-variables", caps.max_variables, VARIABLES[1]),
    ):
        if value < smallest:
            parser.error(f"argument {option}: at least {smallest} (two sizes), got {value}")
    reduced = ", ".join(
        f"{option} {value}"
        for option, value, full in (
            ("--max-layers", caps.max_layers, LAYERS[-1]),
            ("--max-variables", caps.max_variables, VARIABLES[-1]),
        )
        if value < full
    )

    def benchmark(invocation: Invocation) -> str:
        settings = scaling_settings(invocation.quick)
        runner, curves = run(settings, invocation.quick, caps.max_layers, caps.max_variables)
        return report(runner, curves, invocation, reduced)

    versions = {
        "pytree_module": pytree_module.__version__,
        "pytree_transforms": pytree_transforms.__version__,
        "pytree_graph": pytree_graph.__version__,
        "equinox": eqx.__version__ if eqx is not None else None,
        "flax": dist_version("flax") if nnx is not None else None,
    }
    quick_help = "short smoke run (a few seconds, two small sizes per family)"
    return run_script(rest, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
