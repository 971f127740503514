"""Run every benchmark in one go; print and write a summary of the ratios, with plots.

Each ``bench_*.py`` runs in its own process (one JAX runtime each, as when run alone) and
writes its full report, ``results/NAME.md``, with its tables as ``results/NAME.json``. This
script then reads the tables and writes:

* ``results/summary.md``: the machine, and one row per measurement with the ratio of
  pytree's implementation(s), Equinox's and Flax NNX's to the measurement's baseline (plain
  JAX on a dict of arrays where there is one), with the targets met or missed;
* ``docs/assets/benchmarks/NAME.png``: one bar chart per benchmark of those ratios, and
  ``summary.png`` with the headline measurements, which the docs' benchmarks page shows;
* ``docs/assets/benchmarks/scaling-NAME.png``: the log-log curves of ``bench_scaling.py``,
  time per call against model size, one plot per measurement.

Usage::

    hatch run bench:all                      # everything, about 15 minutes on 2 cores
    hatch run bench:all --only module graph  # some of them (the summary covers those)
    hatch run bench:all --quick --results /tmp/r --plots /tmp/r   # smoke run, seconds each
    hatch run bench:all --summarize-only     # redo the summary and plots from results/

A quick run must be given ``--results`` and ``--plots`` (it never overwrites the figures of
a full run). The exit status is 1 when a benchmark failed or, in a full run, a target was
missed (a quick run's figures are too rough to judge).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from _format import SIZE_LABEL, format_ratio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
PLOTS = ROOT / "docs" / "assets" / "benchmarks"
# What each benchmark is about, in the summary's first column (and the plot's title).
SUBJECTS = {
    "module": "pytree_module",
    "filter": "pytree_filter",
    "transforms": "pytree_transforms",
    "graph": "pytree_graph",
    "nn": "pytree_nn",
    "llama": "pytree_nn (examples/llama.py)",
    "steps": "training step times (filter_jit, pytree_graph.jit, jit_partial)",
    "deep": "pytree_nn (deep stacks, scan over layers)",
    "import": "import time",
}
_FOUND = {p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py")}
# In the packages' order (each builds on those before), then any newer benchmark.
BENCHMARKS = (*(n for n in SUBJECTS if n in _FOUND), *sorted(_FOUND - SUBJECTS.keys()))
# The libraries of the summary's columns, recognised by how each benchmark names its rows.
OURS, EQUINOX, NNX = "pytree", "Equinox", "Flax NNX"
LIBRARIES = (OURS, EQUINOX, NNX)
_PREFIXES = {
    OURS: ("pytree_", "filter_"),
    EQUINOX: ("Equinox", "eqx."),
    NNX: ("Flax NNX", "nnx."),
}
# The measurements of summary.png: the per-call and training figures a user feels most.
HEADLINE = re.compile(r"per call, depth 32|^training step|^first call|flatten`|^`partition")
COLOURS = {OURS: "#3f6fb5", EQUINOX: "#d9822b", NNX: "#6a9f58"}
# The benchmark whose tables are curves over model sizes, drawn as log-log plots besides its
# bar chart; its ratios at one size repeat those of the headline measurements, so summary.png
# leaves them out.
SCALING = "scaling"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One row of the summary: a measurement and the ratios of each library's rows to its
    baseline (a library may have several rows, e.g. both Module styles)."""

    benchmark: str
    measurement: str  # without the "(ratio vs ...)" suffix
    baseline: str
    ratios: dict[str, list[tuple[str, float]]]  # library -> [(short name, ratio)]
    targets: list[tuple[str, str, bool, float]]  # (implementation, target, met, ratio)


def library_of(implementation: str, note: str = "") -> str | None:
    """Which library a row measures, from its name; None for baselines and references."""
    if note.startswith("reference"):
        return None
    for library, prefixes in _PREFIXES.items():
        if implementation.startswith(prefixes):
            return library
    return None


def _split_label(measurement: str) -> tuple[str, str]:
    """A measurement label's text and the baseline it names: "x (ratio vs y)" -> (x, y)."""
    match = re.fullmatch(r"(.*) \(ratio vs (.*)\)", measurement)
    return (match[1], match[2]) if match else (measurement, "")


def entries(benchmark: str, document: dict) -> list[Entry]:
    """The summary rows of one benchmark's JSON tables, in the order measured.

    Measurements whose baseline is our own implementation (breakdowns of where its time
    goes) and those with no library row are left out: they compare nothing across libraries.
    """
    grouped: dict[str, list[dict]] = {}
    for table in document["tables"]:
        for row in table["rows"]:
            grouped.setdefault(row["measurement"], []).append(row)
    found = []
    for measurement, rows in grouped.items():
        text, baseline = _split_label(measurement)
        if library_of(baseline) == OURS:
            continue
        ratios: dict[str, list[tuple[str, float]]] = {}
        targets = []
        for row in rows:
            library = library_of(row["implementation"], row["note"])
            if library is None or row["ratio"] is None:
                continue
            name = _short_name(row["implementation"], row["note"])
            ratios.setdefault(library, []).append((name, row["ratio"]))
            if row["met"] is not None:
                targets.append((row["implementation"], row["target"], row["met"], row["ratio"]))
        if OURS in ratios:
            found.append(Entry(benchmark, text, baseline, ratios, targets))
    return found


def _short_name(implementation: str, note: str) -> str:
    """What tells a library's rows of one measurement apart: the Module or training style,
    else the row's note or what follows the library's name."""
    for marker in ("NNX style", "Equinox style", "graph style", "functional style"):
        if marker in implementation:
            return marker
    return note or implementation.partition(": ")[2]


def _cell(found: list[tuple[str, float]] | None) -> str:
    if not found:
        return "—"
    if len(found) == 1:
        return format_ratio(found[0][1])
    parts = [
        f"{format_ratio(ratio)} ({name})" if name else format_ratio(ratio) for name, ratio in found
    ]
    return "<br>".join(parts)


def _targets_cell(entry: Entry) -> str:
    if not entry.targets:
        return ""
    missed = [t for t in entry.targets if not t[2]]
    labels = sorted({t[1] for t in entry.targets})
    return "; ".join(labels) + (": **missed**" if missed else ": met")


def summary_table(found: Sequence[Entry]) -> str:
    """The markdown table of ratios, one row per measurement."""
    lines = [
        "| package | measurement | baseline (1.00x) | pytree | Equinox | Flax NNX | target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in found:
        cells = [
            SUBJECTS.get(entry.benchmark, entry.benchmark),
            entry.measurement,
            entry.baseline,
            *(_cell(entry.ratios.get(library)) for library in LIBRARIES),
            _targets_cell(entry),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(documents: dict[str, dict], found: Sequence[Entry], plots: Path) -> str:
    """results/summary.md: the machine, the method, the ratio table and the plots' names."""
    first = next(iter(documents.values()))
    missed = [
        f"- {SUBJECTS.get(e.benchmark, e.benchmark)}, {e.measurement}: {impl}, "
        f"{format_ratio(ratio)} ({target})"
        for e in found
        for impl, target, met, ratio in e.targets
        if not met
    ]
    quick = any(document["quick"] for document in documents.values())
    lines = [
        "# Benchmark summary",
        "",
        "Every benchmark's ratios to its baseline, from one run of `hatch run bench:all` "
        "(each benchmark in its own process, one after the other). Lower is faster. Where "
        "pytree has several rows in a measurement (the two Module styles, the two training "
        "styles), each is shown. The full tables, with times and the reference rows left out "
        "here, are in each benchmark's own report next to this file.",
        "",
        "<!-- --8<-- [start:machine] -->",
        *first["header"],
        "- Benchmarks run: " + ", ".join(f"`{name}`" for name in documents),
        *(["- Quick smoke run: few repeats, not for quoting."] if quick else []),
        "<!-- --8<-- [end:machine] -->",
        "",
        "<!-- --8<-- [start:table] -->",
        summary_table(found),
        "<!-- --8<-- [end:table] -->",
        "",
        "<!-- --8<-- [start:missed] -->",
        "Targets missed:" + ("" if missed else " none."),
        *missed,
        "<!-- --8<-- [end:missed] -->",
        "",
        f"Plots: {', '.join(f'`{name}`' for name in plot_names(documents))} in "
        f"`{_shown_path(plots)}`.",
        "",
    ]
    return "\n".join(lines)


def plot_names(documents: dict[str, dict]) -> list[str]:
    """The files `summarize` draws: a bar chart per benchmark, summary.png and the curves."""
    names = [f"{name}.png" for name in [*documents, "summary"]]
    if SCALING in documents:
        names += [curve_plot_name(m) for m in curves(documents[SCALING])]
    return names


def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _plot_label(entry: Entry, with_package: bool) -> str:
    text = entry.measurement.replace("`", "")
    text = text if len(text) <= 58 else text[:55] + "..."
    return f"{SUBJECTS.get(entry.benchmark, entry.benchmark)}: {text}" if with_package else text


def plot(found: Sequence[Entry], title: str, path: Path, with_package: bool = False) -> None:
    """A horizontal bar chart of the ratios (log scale), one group of bars per measurement."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bars = []  # (group, library, name, ratio); a name only where a library has several rows
    for group, entry in enumerate(found):
        for library in LIBRARIES:
            rows = entry.ratios.get(library, [])
            bars += [(group, library, name if len(rows) > 1 else "", r) for name, r in rows]
    slots = max((sum(1 for b in bars if b[0] == g) for g in range(len(found))), default=1)
    height = 0.8 / slots
    figure = Figure(figsize=(10, 0.5 + 0.32 * len(bars) + 0.25 * len(found)))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    seen: set[str] = set()
    for group in range(len(found)):
        mine = [b for b in bars if b[0] == group]
        for slot, (_, library, name, ratio) in enumerate(mine):
            y = group + (slot - (len(mine) - 1) / 2) * height
            legend = library if library not in seen else None
            seen.add(library)
            axes.barh(y, ratio, height * 0.9, color=COLOURS[library], label=legend)
            text = f" {format_ratio(ratio)}" + (f" ({name})" if name else "")
            axes.text(ratio, y, text, va="center", fontsize=7)
    axes.set_yticks(range(len(found)), [_plot_label(e, with_package) for e in found], fontsize=8)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.set_xlabel(
        "time relative to the measurement's baseline, the line at 1 (log scale; lower is faster)"
    )
    axes.set_title(title, fontsize=10)
    axes.legend(loc="lower right", fontsize=8)
    axes.margins(x=0.25)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def curves(document: dict) -> dict[str, dict[str, dict[str, list[tuple[int, float]]]]]:
    """The points of the curves in a benchmark's JSON tables: the rows whose measurement is a
    `_format.size_label`, as measurement -> axis -> implementation -> [(size, us)], by size."""
    found: dict[str, dict[str, dict[str, list[tuple[int, float]]]]] = {}
    for table in document["tables"]:
        for row in table["rows"]:
            match = SIZE_LABEL.fullmatch(row["measurement"])
            if match is None or row["time_us"] is None:
                continue
            axes = found.setdefault(match["measurement"], {})
            line = axes.setdefault(match["axis"], {}).setdefault(row["implementation"], [])
            line.append((int(match["size"]), row["time_us"]))
    for axes in found.values():
        for lines in axes.values():
            for points in lines.values():
                points.sort()
    return found


def curve_plot_name(measurement: str) -> str:
    """The file of a measurement's curves: ``scaling-NAME.png``, NAME the operation's name
    (the last dotted part of the first name in backquotes: `jax.tree.flatten` -> flatten)."""
    match = re.search(r"`(?:\w+\.)*(\w+)", measurement)
    name = match[1] if match else re.sub(r"\W+", "-", measurement).strip("-").lower()
    return f"{SCALING}-{name}.png"


def plot_curves(document: dict, plots: Path) -> list[Path]:
    """One log-log plot per measurement of the curves in ``document``, a panel per axis and a
    line per implementation (coloured by library; the dict of arrays in black), with a line of
    slope 1 for comparison; the files."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    for measurement, axes in curves(document).items():
        figure = Figure(figsize=(5 * len(axes), 4.2))
        FigureCanvasAgg(figure)
        for index, (axis, lines) in enumerate(axes.items()):
            panel = figure.add_subplot(1, len(axes), index + 1)
            styles: dict[str | None, int] = {}
            for implementation, points in lines.items():
                library = library_of(implementation)
                style = ("-", "--", ":", "-.")[styles.get(library, 0) % 4]
                styles[library] = styles.get(library, 0) + 1
                sizes, times = zip(*points, strict=True)
                colour = COLOURS.get(library, "black") if library else "black"
                panel.plot(
                    sizes,
                    times,
                    style,
                    marker="o",
                    markersize=3,
                    color=colour,
                    label=implementation,
                )
            # A line of slope 1 through the top of the first curve: linear growth runs
            # parallel to it.
            first = next(iter(lines.values()))
            (low, _), (high, top) = first[0], first[-1]
            panel.plot(
                [low, high],
                [top * low / high, top],
                ":",
                color="grey",
                linewidth=0.8,
                label="slope 1 (linear)",
            )
            panel.set_xscale("log")
            panel.set_yscale("log")
            panel.set_xlabel(axis)
            panel.set_ylabel("time per call (us, log scale)")
            panel.set_title(f"by {axis}", fontsize=9)
            panel.grid(True, which="major", linewidth=0.3)
            panel.legend(fontsize=6)
        figure.suptitle(f"{measurement.replace('`', '')}: time by model size", fontsize=10)
        figure.tight_layout()
        path = plots / curve_plot_name(measurement)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100)
        written.append(path)
    return written


def run_benchmark(name: str, results: Path, quick: bool) -> bool:
    """Run bench_NAME.py, writing results/NAME.md and .json; whether it succeeded."""
    command = [sys.executable, str(HERE / f"bench_{name}.py"), "--out", str(results / f"{name}.md")]
    command += ["--quick"] if quick else []
    print(f"=== bench_{name}.py", file=sys.stderr, flush=True)
    start = time.perf_counter()
    # The report also goes to the file; keep stdout for the summary.
    status = subprocess.run(command, stdout=subprocess.DEVNULL, cwd=ROOT).returncode
    took = time.perf_counter() - start
    print(f"=== bench_{name}.py: exit {status} after {took:.0f} s", file=sys.stderr, flush=True)
    return status == 0


def load(results: Path, names: Sequence[str]) -> dict[str, dict]:
    """The JSON tables of the benchmarks named, by name; a missing one is an error."""
    documents = {}
    for name in names:
        path = results / f"{name}.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: run `hatch run bench:{name}` (or bench:all without "
                "--summarize-only) first."
            )
        documents[name] = json.loads(path.read_text(encoding="utf-8"))
    return documents


def summarize(results: Path, plots: Path, names: Sequence[str]) -> tuple[str, int]:
    """Write summary.md and the plots from the JSON tables; the table, and the misses."""
    documents = load(results, names)
    found = [e for name, document in documents.items() for e in entries(name, document)]
    (results / "summary.md").write_text(summary_markdown(documents, found, plots), "utf-8")
    for name in documents:
        mine = [e for e in found if e.benchmark == name]
        title = f"{SUBJECTS.get(name, name)} (benchmarks/bench_{name}.py)"
        plot(mine, title, plots / f"{name}.png")
    if SCALING in documents:
        plot_curves(documents[SCALING], plots)
    headline = [e for e in found if e.benchmark != SCALING and HEADLINE.search(e.measurement)]
    plot(headline, "Headline measurements", plots / "summary.png", with_package=True)
    misses = sum(1 for e in found for _, _, met, _ in e.targets if not met)
    return summary_table(found), misses


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke runs of every benchmark")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        default=list(BENCHMARKS),
        help=f"the benchmarks to run (default: all of {', '.join(BENCHMARKS)})",
    )
    parser.add_argument("--results", type=Path, help="folder for the reports (default: results/)")
    parser.add_argument(
        "--plots", type=Path, help="folder for the PNG plots (default: docs/assets/benchmarks/)"
    )
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="run nothing: summarise and plot the reports already in --results",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in BENCHMARKS]
    if unknown:
        parser.error(
            f"argument --only: no benchmark named {', '.join(unknown)}; choose from "
            f"{', '.join(BENCHMARKS)}"
        )
    if args.quick and (args.results is None or args.plots is None):
        parser.error(
            "argument --quick: give --results DIR and --plots DIR too, so that a smoke run "
            "never replaces the figures of a full run"
        )
    if args.quick and args.summarize_only:
        parser.error("argument --summarize-only: not allowed with --quick (it runs nothing)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = args.results or RESULTS
    plots = args.plots or PLOTS
    results.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(args.only))
    failed = []
    if not args.summarize_only:
        failed = [name for name in names if not run_benchmark(name, results, args.quick)]
    ran = [name for name in names if name not in failed]
    if not ran:
        print(f"every benchmark failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    try:
        table, misses = summarize(results, plots, ran)
    except FileNotFoundError as error:
        print(f"run_all.py: {error}", file=sys.stderr)
        return 1
    print(table)
    print(f"\nwrote {_shown_path(results / 'summary.md')} and plots in {_shown_path(plots)}")
    if failed:
        print(f"failed: {', '.join(f'bench_{name}.py' for name in failed)}", file=sys.stderr)
    if misses:
        print(f"{misses} target(s) missed: see {results / 'summary.md'}", file=sys.stderr)
    return 1 if failed or (misses and not args.quick) else 0


if __name__ == "__main__":
    raise SystemExit(main())
