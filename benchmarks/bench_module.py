"""Benchmark pytree_module.Module against a dict of arrays, Equinox and Flax NNX.

The model is a 32-layer MLP of width 32 (float32), built from the very same arrays in each form:

* a plain dict of arrays (``layers_0_weight``, ``layers_0_bias``, ...);
* a pytree_module Module, NNX style (attributes assigned in ``__init__``);
* a pytree_module Module, Equinox style (annotated fields);
* an ``equinox.Module`` and a ``flax.nnx.Module`` of the same structure;
* a plain Python dataclass (attribute access and construction only: not a pytree).

Measured in one run: ``jax.tree.flatten``, ``jax.tree.unflatten``, the per-call time of
``jax.jit(f)(tree, x)`` for a trivial ``f`` (dispatch overhead), attribute access
``m.layers[3].weight`` and construction of the whole MLP. The targets are those of the
"Performance contract" in the design notes.

Usage:
    python benchmarks/bench_module.py [--quick] [--out PATH]

``--quick`` is a smoke run of a few seconds; it writes a file only when ``--out`` is given.
A full run writes ``benchmarks/results/module.md`` unless ``--out`` says otherwise.
Equinox and Flax are optional: without them their rows say "not installed".
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import (
    Row,
    Settings,
    compare,
    dist_version,
    machine_lines,
    markdown_table,
    parse_options,
    sync_cpu_dispatch,
)

import pytree_module
from pytree_module import Module, field

try:
    import equinox as eqx
except ImportError:
    eqx = None
try:
    from flax import nnx
except ImportError:
    nnx = None

DEPTH = 32
WIDTH = 32
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "module.md"

DICT = "dict of arrays"
OURS = "pytree_module, NNX style"
OURS_F = "pytree_module, Equinox style"
EQX = "Equinox"
NNX = "Flax NNX"
PLAIN = "Python dataclass"
LOOP = "timing loop alone"
MISSING = {EQX: "equinox not installed", NNX: "flax not installed"}


# --------------------------------------------------------------------------- the models


class Linear(Module):
    """NNX style: statuses inferred when ``__init__`` returns (ints static, arrays data)."""

    def __init__(self, weight: jax.Array, bias: jax.Array):
        self.in_features = weight.shape[0]
        self.out_features = weight.shape[1]
        self.weight = weight
        self.bias = bias


class MLP(Module):
    def __init__(self, layers: list[Linear]):
        self.layers = layers


class FieldLinear(Module):
    """Equinox style: annotated fields and a generated ``__init__``."""

    weight: jax.Array
    bias: jax.Array
    in_features: int = field(static=True)
    out_features: int = field(static=True)


class FieldMLP(Module):
    layers: list[FieldLinear]


@dataclasses.dataclass
class PlainLinear:
    weight: jax.Array
    bias: jax.Array
    in_features: int
    out_features: int


@dataclasses.dataclass
class PlainMLP:
    layers: list[PlainLinear]


if eqx is not None:

    class EqxLinear(eqx.Module):
        weight: jax.Array
        bias: jax.Array
        in_features: int = eqx.field(static=True)
        out_features: int = eqx.field(static=True)

    class EqxMLP(eqx.Module):
        layers: list[EqxLinear]


if nnx is not None:

    class NnxLinear(nnx.Module):
        def __init__(self, weight: jax.Array, bias: jax.Array):
            self.in_features = weight.shape[0]
            self.out_features = weight.shape[1]
            self.weight = nnx.Param(weight)
            self.bias = nnx.Param(bias)

    class NnxMLP(nnx.Module):
        def __init__(self, layers: list[NnxLinear]):
            self.layers = getattr(nnx, "List", list)(layers)


def make_arrays() -> tuple[list[jax.Array], list[jax.Array]]:
    rng = np.random.default_rng(0)
    weights = [
        jnp.asarray(rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / WIDTH**0.5)
        for _ in range(DEPTH)
    ]
    biases = [jnp.asarray(rng.standard_normal(WIDTH, dtype=np.float32)) for _ in range(DEPTH)]
    return weights, biases


def builders(weights: list[jax.Array], biases: list[jax.Array]) -> dict[str, Callable[[], Any]]:
    """Zero-argument functions building the whole MLP in each form from the shared arrays."""
    pairs = list(zip(weights, biases, strict=True))
    keys = [(f"layers_{i}_weight", f"layers_{i}_bias") for i in range(DEPTH)]
    items = list(zip(keys, pairs, strict=True))

    def build_dict():
        d = {}
        for (kw, kb), (w, b) in items:
            d[kw] = w
            d[kb] = b
        return d

    found: dict[str, Callable[[], Any]] = {
        DICT: build_dict,
        OURS: lambda: MLP([Linear(w, b) for w, b in pairs]),
        OURS_F: lambda: FieldMLP([FieldLinear(w, b, WIDTH, WIDTH) for w, b in pairs]),
        PLAIN: lambda: PlainMLP([PlainLinear(w, b, WIDTH, WIDTH) for w, b in pairs]),
    }
    if eqx is not None:
        found[EQX] = lambda: EqxMLP([EqxLinear(w, b, WIDTH, WIDTH) for w, b in pairs])
    if nnx is not None:
        found[NNX] = lambda: NnxMLP([NnxLinear(w, b) for w, b in pairs])
    return found


def check_models(models: dict[str, Any], weights: list[jax.Array]) -> None:
    """Every pytree form holds the very same 64 arrays."""
    expected = {id(a) for a in weights}
    for name, model in models.items():
        if name == PLAIN:
            continue
        leaves = jax.tree.leaves(model)
        assert len(leaves) == 2 * DEPTH, (name, len(leaves))
        assert all(leaf.dtype == jnp.float32 for leaf in leaves), name
        assert expected <= {id(leaf) for leaf in leaves}, name


# ----------------------------------------------------------------------------- measures


def _trivial(tree: Any, x: jax.Array) -> jax.Array:
    del tree
    return x + 1


def _rows(
    measurement: str,
    names: list[str],
    timings: dict,
    baseline: str,
    targets: dict[str, tuple[str, float]] | None = None,
    notes: dict[str, str] | None = None,
) -> list[Row]:
    """Rows for one measurement; ratios against ``baseline``; missing libraries noted."""
    targets = targets or {}
    notes = notes or {}
    base = timings.get(baseline)
    rows = []
    for name in names:
        impl = name.split(": ")[0]
        if name not in timings:
            rows.append(Row(measurement, name, None, note=MISSING.get(impl, "not run")))
            continue
        t = timings[name].median
        ratio = t / base.median if base is not None and name != LOOP else None
        target, limit = targets.get(name, ("", None))
        met = None if limit is None or ratio is None else ratio <= limit
        note = notes.get(name, "")
        if limit is not None and ratio is None:
            note = f"no baseline: {MISSING.get(baseline, baseline + ' missing')}"
        rows.append(Row(measurement, name, t * 1e6, ratio, target or "—", met, note))
    return rows


def run(settings: Settings, log: Callable[[str], None]) -> tuple[list[Row], dict[str, Any]]:
    weights, biases = make_arrays()
    build = builders(weights, biases)
    models = {name: make() for name, make in build.items()}
    check_models(models, weights)
    trees = {k: v for k, v in models.items() if k != PLAIN}
    order = [DICT, OURS, OURS_F, EQX, NNX]
    rows: list[Row] = []
    all_timings: dict[str, Any] = {}

    def measure(label: str, cases: dict[str, Any]) -> dict:
        log(f"timing {label} ...")
        timings = compare(cases, settings)
        all_timings.update({f"{label} / {k}": v for k, v in timings.items()})
        return timings

    # (1) flatten: ratio vs dict, target ours <= 2x.
    label = "`jax.tree.flatten` (ratio vs dict)"
    timings = measure(label, {n: partial(jax.tree.flatten, t) for n, t in trees.items()})
    targets = dict.fromkeys((OURS, OURS_F), ("<= 2x dict", 2.0))
    rows += _rows(label, order, timings, DICT, targets)

    # (2) unflatten: ratio vs Equinox, target ours <= 0.75x.
    label = "`jax.tree.unflatten` (ratio vs Equinox)"
    flat = {n: jax.tree.flatten(t) for n, t in trees.items()}
    for name, (leaves, treedef) in flat.items():
        rebuilt = jax.tree.unflatten(treedef, leaves)
        assert type(rebuilt) is type(trees[name]), name
    cases = {n: partial(jax.tree.unflatten, td, leaves) for n, (leaves, td) in flat.items()}
    timings = measure(label, cases)
    targets = dict.fromkeys((OURS, OURS_F), ("<= 0.75x Equinox", 0.75))
    rows += _rows(label, order, timings, EQX, targets)

    # (3) jit dispatch: per-call time of jax.jit(f)(tree, x); ratio vs dict, target ours <= 1.2x.
    label = "`jax.jit(f)(tree, x)` per call, f trivial (ratio vs dict)"
    x = jnp.ones(WIDTH, jnp.float32)
    expected = np.asarray(x) + 1
    calls = {name: partial(jax.jit(_trivial), tree, x) for name, tree in trees.items()}
    if eqx is not None:
        calls[EQX + ": eqx.filter_jit"] = partial(eqx.filter_jit(_trivial), trees[EQX], x)
    if nnx is not None:
        calls[NNX + ": nnx.jit"] = partial(nnx.jit(_trivial), trees[NNX], x)
    for name, call in calls.items():
        np.testing.assert_array_equal(np.asarray(call()), expected, err_msg=name)
    timings = measure(label, calls)
    targets = dict.fromkeys((OURS, OURS_F), ("<= 1.2x dict", 1.2))
    notes = {EQX + ": eqx.filter_jit": "reference", NNX + ": nnx.jit": "reference"}
    names = [*order, EQX + ": eqx.filter_jit", NNX + ": nnx.jit"]
    rows += _rows(label, names, timings, DICT, targets, notes)

    # (4) attribute access m.layers[3].weight; ratio vs a plain dataclass. No target.
    label = "`m.layers[3].weight` (ratio vs dataclass)"
    stmt = "m.layers[3].weight"
    cases = {
        LOOP: ("pass", {}),
        DICT + ': d["layers_3_weight"]': ('m["layers_3_weight"]', {"m": models[DICT]}),
        PLAIN: (stmt, {"m": models[PLAIN]}),
        OURS: (stmt, {"m": models[OURS]}),
        OURS_F: (stmt, {"m": models[OURS_F]}),
    }
    if eqx is not None:
        cases[EQX] = (stmt, {"m": models[EQX]})
    if nnx is not None:
        cases[NNX] = (stmt, {"m": models[NNX]})
        cases[NNX + ": .weight[...]"] = (stmt + "[...]", {"m": models[NNX]})
    timings = measure(label, cases)
    notes = {
        LOOP: "reference: included in every row",
        DICT + ': d["layers_3_weight"]': "reference",
        NNX: "returns the nnx.Param",
        NNX + ": .weight[...]": "the array",
    }
    names = [
        LOOP,
        DICT + ': d["layers_3_weight"]',
        PLAIN,
        OURS,
        OURS_F,
        EQX,
        NNX,
        NNX + ": .weight[...]",
    ]
    rows += _rows(label, names, timings, PLAIN, notes=notes)

    # (5) construction of the whole MLP from the arrays; ratio vs Equinox. No target.
    label = "build the whole MLP (ratio vs Equinox)"
    timings = measure(label, build)
    names = [DICT, PLAIN, OURS, OURS_F, EQX, NNX]
    rows += _rows(label, names, timings, EQX, notes={DICT: "reference", PLAIN: "reference"})
    return rows, all_timings


# ------------------------------------------------------------------------------- report


def report(rows: list[Row], timings: dict, header: list[str], settings: Settings, argv: str) -> str:
    widest = max(timings, key=lambda k: (timings[k].q3 - timings[k].q1) / timings[k].median)
    spread = (timings[widest].q3 - timings[widest].q1) / timings[widest].median
    fewest = min(t.calls for t in timings.values())
    missed = [r for r in rows if r.met is False]
    lines = [
        "# pytree_module: Module vs dict of arrays, Equinox and Flax NNX",
        "",
        f"A {DEPTH}-layer MLP of width {WIDTH} (float32; {2 * DEPTH} arrays), the very same "
        "arrays in each form.",
        "",
        *header,
        f"- Command: `{argv}`",
        f"- Each time is the median per-call time over {settings.repeat} repeats; each repeat "
        f"times a loop of N calls, N set so that a loop lasts about {settings.repeat_s * 1e3:g} "
        f"ms (at least {fewest} calls per case in all). Repeats of the cases of one measurement "
        "are interleaved, in a rotating order.",
        "",
        "These figures come from one run on the machine stated above. Absolute times vary "
        "between machines and runs; the ratios within one measurement are the figures to "
        "compare. Targets are those of the performance contract (see docs/benchmarks.md).",
        "",
        markdown_table(rows),
        "",
        f"Largest interquartile range of any row: {spread:.1%} of its median ({widest}).",
        "",
        "Targets missed:" + ("" if missed else " none."),
        *(f"- {r.implementation}, {r.measurement}: {r.ratio:.3f}x ({r.target})" for r in missed),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    out, settings, quick = parse_options(
        argv, __doc__.split("\n")[0], DEFAULT_OUT, "short smoke run (a few seconds)"
    )

    sync_cpu_dispatch()
    versions = {
        "jax": jax.__version__,
        "jaxlib": dist_version("jaxlib"),
        "pytree_module": pytree_module.__version__,
        "equinox": eqx.__version__ if eqx is not None else None,
        "flax": dist_version("flax") if nnx is not None else None,
        "numpy": np.__version__,
    }
    header = machine_lines(versions)
    if quick:
        header.append("- Quick smoke run (`--quick`): few repeats, not for quoting.")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    rows, timings = run(settings, log)
    command = "python benchmarks/bench_module.py" + (" --quick" if quick else "")
    text = report(rows, timings, header, settings, command)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
