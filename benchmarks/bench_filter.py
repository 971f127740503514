"""Benchmark pytree_filter.partition and combine against Equinox and the cost of a bare flatten.

The model is a 32-layer MLP of width 32 (float32). Each layer has a 32x32 ``weight``, a 32
``bias`` and an activation name (the string ``"relu"``). It comes in two forms, built from the
very same arrays:

* plain nested containers: ``{"layers": [{"weight": w, "bias": b, "activation": "relu"}, ...]}``
  (96 leaves: the string is a leaf);
* a pytree_module ``MLP`` holding a list of ``Linear`` modules, whose ``activation`` is a static
  field (64 leaves: the string lives in the treedef).

Measured in one run, for each form: ``pytree_filter.partition(tree, is_array)`` against
``equinox.partition(tree, equinox.is_array)`` and against two floors that every partition pays:

* ``leaves, treedef = jax.tree.flatten(tree); [x if is_array(x) else None for x in leaves]``;
* the same, plus the list of the other leaves and the two ``treedef.unflatten`` calls that
  build the two parts.

Also ``pytree_filter.combine(*parts)`` against ``equinox.combine(*parts)`` on the nested
containers (no target), and the pieces of a partition (flatten, the predicate on every leaf,
the two leaf lists, one unflatten) for each form, to show where the time goes. The target,
``partition`` at most 0.25x ``eqx.partition``, is checked on the nested containers; the Module
form is reported against its floor, since two Module unflattens alone cost about 0.3x there.

Usage:
    python benchmarks/bench_filter.py [--quick] [--out PATH]

``--quick`` is a smoke run of a few seconds; it writes a file only when ``--out`` is given.
A full run writes ``benchmarks/results/filter.md`` unless ``--out`` says otherwise.
Equinox is optional: without it its rows say "not installed".
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Runner, Target, mlp_arrays, named_rows
from _report import Invocation, log, report_head, run_script, section, target_lines
from _timing import Settings

import pytree_filter
import pytree_module
from pytree_module import Module, field

try:
    import equinox as eqx
except ImportError:
    eqx = None

DEPTH = 32
WIDTH = 32
ACTIVATION = "relu"

CONTAINERS = "nested containers"
MODULE = "pytree_module MLP"

OURS = "pytree_filter.partition"
EQX = "eqx.partition"
FLOOR = "floor: flatten + is_array list"
FLOOR_2 = "floor + 2 unflatten"
OURS_C = "pytree_filter.combine"
EQX_C = "eqx.combine"
MISSING = {EQX: "equinox not installed", EQX_C: "equinox not installed"}

TARGET = Target("<= 0.25x eqx.partition", 0.25)


# --------------------------------------------------------------------------- the models


class Linear(Module):
    weight: jax.Array
    bias: jax.Array
    activation: str = field(static=True)


class MLP(Module):
    layers: list[Linear]


def make_trees(weights: list[jax.Array], biases: list[jax.Array]) -> dict[str, Any]:
    """The MLP in both forms, from the very same arrays."""
    pairs = list(zip(weights, biases, strict=True))
    return {
        CONTAINERS: {
            "layers": [{"weight": w, "bias": b, "activation": ACTIVATION} for w, b in pairs]
        },
        MODULE: MLP([Linear(w, b, ACTIVATION) for w, b in pairs]),
    }


def _same(a: Any, b: Any) -> bool:
    """Same structure (``None`` placeholders included) and the very same leaves."""
    la, da = jax.tree.flatten(a, is_leaf=lambda x: x is None)
    lb, db = jax.tree.flatten(b, is_leaf=lambda x: x is None)
    return da == db and len(la) == len(lb) and all(x is y for x, y in zip(la, lb, strict=True))


def check_trees(trees: dict[str, Any], weights: list[jax.Array]) -> None:
    """Each form holds the same 64 arrays; partitions agree with Equinox's and round-trip."""
    expected = {id(a) for a in weights}
    counts = {CONTAINERS: 3 * DEPTH, MODULE: 2 * DEPTH}
    for name, tree in trees.items():
        leaves = jax.tree.leaves(tree)
        assert len(leaves) == counts[name], (name, len(leaves))
        arrays = [x for x in leaves if pytree_filter.is_array(x)]
        assert len(arrays) == 2 * DEPTH, name
        assert expected <= {id(x) for x in arrays}, name
        parts = pytree_filter.partition(tree, pytree_filter.is_array)
        assert len(jax.tree.leaves(parts[0])) == 2 * DEPTH, name
        assert _same(pytree_filter.combine(*parts), tree), name
        if eqx is not None:
            theirs = eqx.partition(tree, eqx.is_array)
            assert all(_same(p, q) for p, q in zip(parts, theirs, strict=True)), name
            assert _same(eqx.combine(*parts), tree), name


# ----------------------------------------------------------------------------- measures

# Statements timed inline (see `_timing.Timeable`): no extra Python call around what is measured.
FLOOR_STMT = """\
leaves, treedef = flatten(tree)
[x if is_array(x) else None for x in leaves]"""
FLOOR_2_STMT = """\
leaves, treedef = flatten(tree)
kept = [x if is_array(x) else None for x in leaves]
treedef.unflatten(kept)
treedef.unflatten([None if k is not None else x for k, x in zip(kept, leaves)])"""


def _namespace(tree: Any) -> dict[str, Any]:
    return {
        "tree": tree,
        "partition": pytree_filter.partition,
        "combine": pytree_filter.combine,
        "is_array": pytree_filter.is_array,
        "flatten": jax.tree.flatten,
        "eqx": eqx,
    }


def partition_cases(tree: Any) -> dict[str, Any]:
    ns = _namespace(tree)
    cases: dict[str, Any] = {
        OURS: ("partition(tree, is_array)", ns),
        FLOOR: (FLOOR_STMT, ns),
        FLOOR_2: (FLOOR_2_STMT, ns),
    }
    if eqx is not None:
        cases[EQX] = ("eqx.partition(tree, eqx.is_array)", ns)
    return cases


def piece_cases(tree: Any) -> dict[str, Any]:
    """The pieces of a partition, each alone, next to the whole of it."""
    leaves, treedef = jax.tree.flatten(tree)
    mask = [pytree_filter.is_array(x) for x in leaves]
    kept = [x if m else None for x, m in zip(leaves, mask, strict=True)]
    ns = {**_namespace(tree), "leaves": leaves, "treedef": treedef, "mask": mask, "kept": kept}
    return {
        OURS: ("partition(tree, is_array)", ns),
        "`jax.tree.flatten(tree)`": ("flatten(tree)", ns),
        "`is_array` on every leaf": ("[is_array(x) for x in leaves]", ns),
        "the two leaf lists, from a mask": (
            "[x if m else None for x, m in zip(leaves, mask)]\n"
            "[None if m else x for x, m in zip(leaves, mask)]",
            ns,
        ),
        "one `treedef.unflatten`": ("treedef.unflatten(kept)", ns),
    }


def run(settings: Settings, log: Callable[[str], None]) -> Runner:
    weights, biases = mlp_arrays(DEPTH, WIDTH)
    trees = make_trees(weights, biases)
    check_trees(trees, weights)
    runner = Runner(settings, log)

    # (1), (2) partition by is_array, each form; ratio vs Equinox.
    notes = {
        FLOOR: "reference: `jax.tree.flatten` and one list",
        FLOOR_2: "reference: and the other list, 2 `treedef.unflatten`",
    }
    for form in (CONTAINERS, MODULE):
        label = f"`partition(tree, is_array)`, {form} (ratio vs Equinox)"
        timings = runner.time(label, partition_cases(trees[form]))
        names = [OURS, EQX, FLOOR, FLOOR_2]
        # The target is for a generic pytree. A Module MLP is reported without one: there,
        # the two unflatten calls alone (33 Python objects each) cost about 0.3x eqx.partition.
        targets = {OURS: TARGET} if form == CONTAINERS else None
        runner.rows += named_rows(label, names, timings, EQX, MISSING, targets, notes)

    # (3) combine(*parts) on the nested containers; ratio vs Equinox. No target.
    label = f"`combine(*parts)`, {CONTAINERS} (ratio vs Equinox)"
    parts = pytree_filter.partition(trees[CONTAINERS], pytree_filter.is_array)
    ns = {**_namespace(trees[CONTAINERS]), "parts": parts}
    cases: dict[str, Any] = {OURS_C: ("combine(*parts)", ns)}
    if eqx is not None:
        cases[EQX_C] = ("eqx.combine(*parts)", ns)
    timings = runner.time(label, cases)
    runner.rows += named_rows(label, [OURS_C, EQX_C], timings, EQX_C, MISSING)

    # (4), (5) the pieces of a partition, each form; ratio vs our partition. No target.
    for form in (CONTAINERS, MODULE):
        label = f"pieces of `partition`, {form} (ratio vs pytree_filter.partition)"
        cases = piece_cases(trees[form])
        timings = runner.time(label, cases)
        runner.rows += named_rows(label, list(cases), timings, OURS, MISSING)
    return runner


# ------------------------------------------------------------------------------- report


def _overheads(timings: dict) -> list[str]:
    """Our partition against the floor with its two unflatten calls, per form."""
    lines = []
    for form in (CONTAINERS, MODULE):
        label = f"`partition(tree, is_array)`, {form} (ratio vs Equinox)"
        ours, floor = timings.get(f"{label} / {OURS}"), timings.get(f"{label} / {FLOOR_2}")
        if ours is not None and floor is not None:
            lines.append(
                f"- {form}: {ours.median * 1e6:.1f} us, {ours.median / floor.median:.2f}x the "
                f"floor with its two unflatten calls ({floor.median * 1e6:.1f} us)."
            )
    return lines


def report(runner: Runner, invocation: Invocation) -> str:
    description = (
        f"A {DEPTH}-layer MLP of width {WIDTH} (float32): per layer a weight, a bias and the "
        f'activation name "{ACTIVATION}". As {CONTAINERS} (a dict of a list of dicts; '
        f"{3 * DEPTH} leaves, the strings included) and as a {MODULE} (a list of `Linear` "
        f"modules with a static `activation`; {2 * DEPTH} leaves), from the very same arrays."
    )
    title = "pytree_filter: partition and combine vs Equinox and a bare flatten"
    lines = report_head(invocation, title, description, runner.rows, runner.timings)
    floor = [
        "`pytree_filter.partition` against the floor with its two unflatten calls:",
        "",
        *_overheads(runner.timings),
    ]
    lines += [*section("floor", floor), "", *target_lines(runner.rows)]
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    return report(run(invocation.settings, log), invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_filter": pytree_filter.__version__,
        "pytree_module": pytree_module.__version__,
        "equinox": eqx.__version__ if eqx is not None else None,
    }
    quick_help = "short smoke run (a few seconds)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
