"""Benchmark pytree_module.Module against a dict of arrays, Equinox and Flax NNX.

The model is a 32-layer MLP of width 32 (float32) whose activation function (``jax.nn.relu``)
is a static attribute, built from the very same arrays in each form:

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

from _cases import Runner, Target, mlp_arrays, named_rows
from _report import Invocation, log, report_head, run_script, target_lines
from _timing import Settings, dist_version

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
ACTIVATION = jax.nn.relu

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
    def __init__(self, layers: list[Linear], activation: Callable[[jax.Array], jax.Array]):
        self.layers = layers
        self.activation = activation  # a function: static, inferred


class FieldLinear(Module):
    """Equinox style: annotated fields and a generated ``__init__``."""

    weight: jax.Array
    bias: jax.Array
    in_features: int = field(static=True)
    out_features: int = field(static=True)


class FieldMLP(Module):
    layers: list[FieldLinear]
    activation: Callable[[jax.Array], jax.Array] = field(static=True)


@dataclasses.dataclass
class PlainLinear:
    weight: jax.Array
    bias: jax.Array
    in_features: int
    out_features: int


@dataclasses.dataclass
class PlainMLP:
    layers: list[PlainLinear]
    activation: Callable[[jax.Array], jax.Array]


if eqx is not None:

    class EqxLinear(eqx.Module):
        weight: jax.Array
        bias: jax.Array
        in_features: int = eqx.field(static=True)
        out_features: int = eqx.field(static=True)

    class EqxMLP(eqx.Module):
        layers: list[EqxLinear]
        activation: Callable[[jax.Array], jax.Array] = eqx.field(static=True)


if nnx is not None:

    class NnxLinear(nnx.Module):
        def __init__(self, weight: jax.Array, bias: jax.Array):
            self.in_features = weight.shape[0]
            self.out_features = weight.shape[1]
            self.weight = nnx.Param(weight)
            self.bias = nnx.Param(bias)

    class NnxMLP(nnx.Module):
        def __init__(self, layers: list[NnxLinear], activation: Callable[[jax.Array], jax.Array]):
            self.layers = getattr(nnx, "List", list)(layers)
            self.activation = activation


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
        OURS: lambda: MLP([Linear(w, b) for w, b in pairs], ACTIVATION),
        OURS_F: lambda: FieldMLP([FieldLinear(w, b, WIDTH, WIDTH) for w, b in pairs], ACTIVATION),
        PLAIN: lambda: PlainMLP([PlainLinear(w, b, WIDTH, WIDTH) for w, b in pairs], ACTIVATION),
    }
    if eqx is not None:
        found[EQX] = lambda: EqxMLP([EqxLinear(w, b, WIDTH, WIDTH) for w, b in pairs], ACTIVATION)
    if nnx is not None:
        found[NNX] = lambda: NnxMLP([NnxLinear(w, b) for w, b in pairs], ACTIVATION)
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


def run(settings: Settings, log: Callable[[str], None]) -> Runner:
    weights, biases = mlp_arrays(DEPTH, WIDTH)
    build = builders(weights, biases)
    models = {name: make() for name, make in build.items()}
    check_models(models, weights)
    trees = {k: v for k, v in models.items() if k != PLAIN}
    order = [DICT, OURS, OURS_F, EQX, NNX]
    runner = Runner(settings, log)

    # (1) flatten: ratio vs dict, target ours <= 2x.
    label = "`jax.tree.flatten` (ratio vs dict)"
    timings = runner.time(label, {n: partial(jax.tree.flatten, t) for n, t in trees.items()})
    targets = dict.fromkeys((OURS, OURS_F), Target("<= 2x dict", 2.0))
    runner.rows += named_rows(label, order, timings, DICT, MISSING, targets)

    # (2) unflatten: ratio vs Equinox, target ours <= 0.75x.
    label = "`jax.tree.unflatten` (ratio vs Equinox)"
    flat = {n: jax.tree.flatten(t) for n, t in trees.items()}
    for name, (leaves, treedef) in flat.items():
        rebuilt = jax.tree.unflatten(treedef, leaves)
        assert type(rebuilt) is type(trees[name]), name
    cases = {n: partial(jax.tree.unflatten, td, leaves) for n, (leaves, td) in flat.items()}
    timings = runner.time(label, cases)
    targets = dict.fromkeys((OURS, OURS_F), Target("<= 0.75x Equinox", 0.75))
    runner.rows += named_rows(label, order, timings, EQX, MISSING, targets)

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
    timings = runner.time(label, calls)
    targets = dict.fromkeys((OURS, OURS_F), Target("<= 1.2x dict", 1.2))
    notes = {EQX + ": eqx.filter_jit": "reference", NNX + ": nnx.jit": "reference"}
    names = [*order, EQX + ": eqx.filter_jit", NNX + ": nnx.jit"]
    runner.rows += named_rows(label, names, timings, DICT, MISSING, targets, notes)

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
    timings = runner.time(label, cases)
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
    runner.rows += named_rows(label, names, timings, PLAIN, MISSING, notes=notes, no_ratio=[LOOP])

    # (5) construction of the whole MLP from the arrays; ratio vs Equinox. No target.
    label = "build the whole MLP (ratio vs Equinox)"
    timings = runner.time(label, build)
    names = [DICT, PLAIN, OURS, OURS_F, EQX, NNX]
    notes = {DICT: "reference", PLAIN: "reference"}
    runner.rows += named_rows(label, names, timings, EQX, MISSING, notes=notes)
    return runner


# ------------------------------------------------------------------------------- report


def report(runner: Runner, invocation: Invocation) -> str:
    description = (
        f"A {DEPTH}-layer MLP of width {WIDTH} (float32; {2 * DEPTH} arrays) whose activation "
        "function is a static attribute, the very same arrays in each form."
    )
    title = "pytree_module: Module vs dict of arrays, Equinox and Flax NNX"
    lines = report_head(invocation, title, description, runner.rows, runner.timings)
    lines += target_lines(runner.rows)
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    return report(run(invocation.settings, log), invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_module": pytree_module.__version__,
        "equinox": eqx.__version__ if eqx is not None else None,
        "flax": dist_version("flax") if nnx is not None else None,
    }
    quick_help = "short smoke run (a few seconds)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
