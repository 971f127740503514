"""Benchmark the time `import pytree_nn` (and each other package) adds to `import jax`.

Each measurement runs in a fresh Python process: it imports ``jax`` (timed alone: the
baseline), then the package measured, and reports the time of the second import only, so
that what a package adds is measured apart from JAX's own start-up. Measured beside them,
in the same rounds: ``import equinox`` and ``import flax.nnx``, and optax (a reference: what
pytree_nn would add if it imported optax itself).

Processes start with bytecode caches written (one untimed import first, into a temporary
``PYTHONPYCACHEPREFIX``), as an installed package has them: without them the time is that of
compiling the sources, paid once after installation. The rounds are interleaved (every case
once per round, in a new shuffled order), and each figure is the median over the rounds.

Usage:
    python benchmarks/bench_import.py [--quick] [--out PATH]

``--quick`` is a smoke run (2 rounds, the first writing the bytecode caches as it goes); it
writes a file only when ``--out`` is given. A full run (11 rounds, about a minute) writes
``benchmarks/results/import.md``. Equinox and Flax are optional: without them their rows say
"not installed".
"""

from __future__ import annotations

import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Target, named_rows
from _report import Invocation, log, report_head, run_script, spread_lines, target_lines
from _timing import Timing, dist_version

import pytree_nn

JAX = "import jax"
OURS = "pytree_nn"
EQX = "Equinox: equinox"
NNX = "Flax NNX: flax.nnx"
OPTAX = "optax"
# Case name -> the module imported after jax (None: jax alone, the baseline).
MODULES = {
    JAX: None,
    OURS: "pytree_nn",
    "pytree_graph": "pytree_graph",
    "pytree_transforms": "pytree_transforms",
    "pytree_module": "pytree_module",
    "pytree_filter": "pytree_filter",
    EQX: "equinox",
    NNX: "flax.nnx",
    OPTAX: "optax",
}
PARTS = ("pytree_graph", "pytree_transforms", "pytree_module", "pytree_filter")
MISSING = {"Equinox": "equinox not installed", "Flax NNX": "flax not installed"}
TARGET = Target("<= 0.3 s beyond import jax", 0.3, absolute=True)
ROUNDS, QUICK_ROUNDS = 11, 2

# Prints the time of `import jax`, or of the import after it: one number, in seconds.
CHILD = """\
import time
start = time.perf_counter()
import jax
after_jax = time.perf_counter()
{second}
end = time.perf_counter()
print({which})
"""


def child_code(module: str | None) -> str:
    """The program of one measurement: jax alone, or `module` after jax."""
    if module is None:
        return CHILD.format(second="", which="after_jax - start")
    return CHILD.format(second=f"import {module}", which="end - after_jax")


def run_child(module: str | None, environment: dict[str, str]) -> float:
    """The seconds one fresh process reports for its import."""
    result = subprocess.run(
        [sys.executable, "-c", child_code(module)],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    return float(result.stdout.split()[-1])


def installed(module: str | None) -> bool:
    top = None if module is None else module.split(".")[0]
    return top is None or importlib.util.find_spec(top) is not None


def measure(rounds: int, cache: str, write_caches: bool = True) -> dict[str, Timing]:
    """Every installed case once per round, in a shuffled order; their `Timing`s by name.

    Without `write_caches` (a smoke run, whose figures are not for quoting) the first round
    writes the bytecode caches as it goes, and pays for it: one process less per case.
    """
    environment = {**os.environ, "PYTHONPYCACHEPREFIX": cache}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    cases = {name: module for name, module in MODULES.items() if installed(module)}
    for name, module in cases.items() if write_caches else ():
        log(f"  writing the bytecode caches of {name} ...")
        run_child(module, environment)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    order = random.Random(0)
    for index in range(rounds):
        log(f"timing round {index + 1} of {rounds} ...")
        order.shuffle(names)
        for name in names:
            samples[name].append(run_child(cases[name], environment))
    timings = {}
    for name, values in samples.items():
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        timings[name] = Timing(statistics.median(values), q1, q3, 1, rounds)
    return timings


def benchmark(invocation: Invocation) -> str:
    """Run the measurement; return the report."""
    rounds = QUICK_ROUNDS if invocation.quick else ROUNDS
    with tempfile.TemporaryDirectory(prefix="bench-import-") as cache:
        timings = measure(rounds, cache, write_caches=not invocation.quick)
    label = "import time beyond `import jax` (ratio vs import jax)"
    notes = {
        JAX: "baseline: jax alone",
        OPTAX: "reference: pytree_nn imports it on first use",
        # The packages pytree_nn imports: where its time goes, not other libraries' figures.
        **{name: "reference: part of pytree_nn's time" for name in PARTS},
    }
    rows = named_rows(label, list(MODULES), timings, JAX, MISSING, {OURS: TARGET}, notes)
    description = (
        "The time an `import` adds to `import jax`, each in a fresh process with its bytecode "
        f"caches written; the median over {rounds} interleaved rounds. The `import jax` row is "
        "jax alone; every other row is the import after jax, in the same process."
    )
    title = "Import time: pytree packages, Equinox and Flax NNX beyond `import jax`"
    recorded = {f"{label} / {name}": timing for name, timing in timings.items()}
    lines = report_head(invocation, title, description, rows, {}, closing="")
    lines += spread_lines(recorded)
    lines += target_lines(rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_nn": pytree_nn.__version__,
        "optax": dist_version("optax"),
        "equinox": dist_version("equinox"),
        "flax": dist_version("flax"),
    }
    quick_help = f"smoke run ({QUICK_ROUNDS} rounds)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
