"""The benchmarks run: one quick `run_all.py` smoke run of every script, and its summary.

The figures are not checked here (performance targets are checked by full benchmark runs);
what is checked is that every script runs and writes its report and tables, and that the
summary and plots come out of them, with each row credited to the right library.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem.removeprefix("bench_") for p in BENCHMARKS.glob("bench_*.py"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load_run_all():
    # benchmarks/ is not a package: its scripts import their siblings as top-level modules
    # (run as scripts, their folder is on the path). Dataclasses look their module up in
    # sys.modules.
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("run_all", BENCHMARKS / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


run_all = _load_run_all()


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "run_all.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`run_all.py --quick` over every benchmark, into a temporary folder."""
    out = tmp_path_factory.mktemp("bench")
    result = _run("--quick", "--results", str(out), "--plots", str(out / "plots"))
    return out, result


def test_quick_run_succeeds(quick_run):
    _, result = quick_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("| package | measurement | baseline (1.00x) |")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_benchmark_writes_its_report_and_tables(quick_run, name):
    out, _ = quick_run
    assert "| measurement |" in (out / f"{name}.md").read_text()
    document = json.loads((out / f"{name}.json").read_text())
    assert document["quick"] is True
    assert document["tables"] and all(table["rows"] for table in document["tables"])
    assert (out / "plots" / f"{name}.png").read_bytes().startswith(PNG_SIGNATURE)


def test_summary_covers_every_benchmark(quick_run):
    out, _ = quick_run
    summary = (out / "summary.md").read_text()
    ran = next(line for line in summary.splitlines() if line.startswith("- Benchmarks run: "))
    assert ran == "- Benchmarks run: " + ", ".join(f"`{name}`" for name in run_all.BENCHMARKS)
    assert sorted(run_all.BENCHMARKS) == SCRIPTS
    # Measurements against plain JAX are summarised even where Equinox and Flax are missing
    # (as in the test environments); those against Equinox alone then have no ratio.
    for package in ("pytree_module", "pytree_transforms", "pytree_graph", "pytree_nn"):
        assert f"| {package} |" in summary
    assert "Quick smoke run" in summary
    assert "<!-- --8<-- [start:table] -->" in summary  # the docs page includes this part
    assert (out / "plots" / "summary.png").read_bytes().startswith(PNG_SIGNATURE)


def _row(implementation, ratio, note="", target="", met=None):
    return {
        "measurement": "op (ratio vs dict)",
        "implementation": implementation,
        "ratio": ratio,
        "note": note,
        "target": target,
        "met": met,
    }


def test_rows_are_credited_to_their_library():
    document = {
        "tables": [
            {
                "title": "t",
                "rows": [
                    _row("dict", 1.0),
                    _row("pytree_module, NNX style", 0.9, target="<= 2x", met=True),
                    _row("pytree_module, Equinox style", 2.5, target="<= 2x", met=False),
                    _row("Equinox", 3.0),
                    _row("Equinox: eqx.filter_jit", 5.0, note="reference"),
                    _row("nnx.jit(f)(model, x)", 7.0, note="flax.nnx.Module"),
                    _row("jax.jit(f)(model, x)", 1.1, note="reference"),
                ],
            }
        ]
    }
    (entry,) = run_all.entries("module", document)
    assert entry.measurement == "op" and entry.baseline == "dict"
    assert entry.ratios == {
        "pytree": [("NNX style", 0.9), ("Equinox style", 2.5)],
        "Equinox": [("", 3.0)],  # the reference row is left out
        "Flax NNX": [("flax.nnx.Module", 7.0)],
    }
    table = run_all.summary_table([entry])
    assert "| pytree_module | op | dict | 0.900x (NNX style)<br>2.50x (Equinox style) |" in table
    assert table.endswith("| 3.00x | 7.00x | <= 2x: **missed** |")


def test_breakdowns_of_our_own_time_are_left_out():
    rows = [_row("pytree_filter.partition", 1.0), _row("pytree_filter.partition", 1.0)]
    for row in rows:
        row["measurement"] = "pieces (ratio vs pytree_filter.partition)"
    assert run_all.entries("filter", {"tables": [{"title": "t", "rows": rows}]}) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "nope"], "argument --only: no benchmark named nope"),
        (["--quick"], "argument --quick: give --results DIR and --plots DIR too"),
    ],
)
def test_bad_arguments(args, message):
    result = _run(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_summarize_only_needs_the_reports(tmp_path):
    result = _run("--summarize-only", "--only", "module", "--results", str(tmp_path))
    assert result.returncode == 1
    assert "module.json is missing: run `hatch run bench:module`" in result.stderr


def test_scaling_curves_are_drawn_one_plot_per_measurement(quick_run):
    out, _ = quick_run
    for name in ("flatten", "unflatten", "split", "merge", "jit"):
        path = out / "plots" / f"scaling-{name}.png"
        assert path.read_bytes().startswith(PNG_SIGNATURE), path
    summary = (out / "summary.md").read_text()
    assert "`scaling-jit.png`" in summary
    report = (out / "scaling.md").read_text()
    assert "<!-- --8<-- [start:slopes] -->" in report
    assert "<!-- --8<-- [start:linearity] -->" in report


def test_curves_are_read_from_the_size_labels():
    def row(measurement, implementation, time_us):
        return {"measurement": measurement, "implementation": implementation, "time_us": time_us}

    document = {
        "tables": [
            {
                "title": "`jax.tree.flatten` by layers",
                "rows": [
                    row("`jax.tree.flatten` [layers = 2]", "dict of arrays", 2.0),
                    row("`jax.tree.flatten` [layers = 1]", "dict of arrays", 1.0),
                    row("`jax.tree.flatten` [layers = 2]", "Flax NNX", None),
                ],
            },
            {"title": "t", "rows": [row("`jax.tree.flatten`, 2 layers (ratio vs d)", "d", 1.0)]},
        ]
    }
    # Sorted by size; rows without a time, and rows of other tables, are left out.
    assert run_all.curves(document) == {
        "`jax.tree.flatten`": {"layers": {"dict of arrays": [(1, 1.0), (2, 2.0)]}}
    }
    assert run_all.curve_plot_name("`jax.tree.flatten`") == "scaling-flatten.png"
    assert run_all.curve_plot_name("`merge(graphdef, state)`") == "scaling-merge.png"


def _load_bench_scaling():
    spec = importlib.util.spec_from_file_location("bench_scaling", BENCHMARKS / "bench_scaling.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("time", "linear"),
    [
        (lambda n: 2e-8 * n, True),
        (lambda n: 5e-6 + 2e-8 * n, True),  # a fixed cost, which flattens the curve
        (lambda n: 1e-9 * n * n, False),  # quadratic
        (lambda n: 1e-7 * n**1.3, False),
    ],
)
def test_scaling_linearity_check(time, linear):
    bench_scaling = _load_bench_scaling()
    sizes = [2**i for i in range(11)]
    fit = bench_scaling.linearity({n: time(n) for n in sizes})
    assert fit.linear is linear, fit
    if linear:
        assert fit.slope < 1.01 and fit.worst < 1.01, fit
    assert bench_scaling.linearity({4: 1.0}) is None


def test_scaling_slope_of_a_linear_curve_is_one():
    fit = _load_bench_scaling().linearity({n: 3e-8 * n for n in (10, 100, 1000, 10_000)})
    assert fit.slope == pytest.approx(1.0) and fit.worst == pytest.approx(1.0)
