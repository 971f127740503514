"""The command line and the report text shared by the benchmarks.

`run_script` is the whole ``main`` of a benchmark but for what it measures: it reads the
options, makes dispatch synchronous, describes the machine, calls the benchmark's own function
with an `Invocation`, and prints the report that function returns (writing it, on a full
run). The other
functions build the parts that the reports share, in the same words: the head (title,
machine, method, table, spread), the time a wrapper adds per call, and the targets missed or
not measured.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import jax
import numpy as np
from _timing import (
    Row,
    Settings,
    Timing,
    dist_version,
    machine_lines,
    markdown_table,
    parse_options,
    sync_cpu_dispatch,
)

FIGURES = (
    "These figures come from one run on the machine stated above. Absolute times vary "
    "between machines and runs; the ratios within one measurement are the figures to "
    "compare."
)
CONTRACT = "Targets are those of the performance contract (see docs/benchmarks.md)."


def log(message: str) -> None:
    """Progress and failures, on stderr so that stdout holds only the report."""
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Invocation:
    """How a benchmark was run, for its measures and its report.

    Attributes:
        settings: the timing settings (`Settings.quick()` for a quick run).
        quick: whether this is a ``--quick`` smoke run.
        header: the report's bullet lines describing the machine (and a quick run).
        command: the command line, as the report shows it.
        tables: every table of the report by title, as `report_head` and `record_table`
            saw them; `run_script` writes them next to the report as JSON, which
            ``run_all.py`` reads to summarise and plot every benchmark.
    """

    settings: Settings
    quick: bool
    header: list[str]
    command: str
    tables: dict[str, list[Row]] = dataclasses.field(default_factory=dict)


def record_table(invocation: Invocation, title: str, rows: Sequence[Row]) -> None:
    """Keep a table of the report for its JSON form (`report_head` keeps its own)."""
    invocation.tables[title] = list(rows)


def report_json(invocation: Invocation, title: str) -> str:
    """The report's tables as JSON: title, header lines, command and the rows of each table."""
    tables = [
        {"title": name, "rows": [dataclasses.asdict(row) for row in rows]}
        for name, rows in invocation.tables.items()
    ]
    document = {
        "title": title,
        "header": invocation.header,
        "command": invocation.command,
        "quick": invocation.quick,
        "tables": tables,
    }
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


def results_path(script: str) -> Path:
    """Where a full run of the benchmark ``bench_NAME.py`` writes its report: results/NAME.md."""
    path = Path(script).resolve()
    return path.parent / "results" / f"{path.stem.removeprefix('bench_')}.md"


def run_script(
    argv: list[str] | None,
    script: str,
    doc: str,
    quick_help: str,
    versions: Mapping[str, str | None],
    benchmark: Callable[[Invocation], str],
) -> int:
    """Run a benchmark: `benchmark` measures and returns the report, printed and written here.

    ``script`` is the benchmark's ``__file__`` and ``doc`` its docstring, whose first line
    describes the command. ``versions`` are those of the packages it measures, shown between
    JAX's and NumPy's. A full run writes the report to ``results/NAME.md`` next to the script
    ``bench_NAME.py``, or where ``--out`` says, and its tables to the same path with the
    suffix ``.json``.
    """
    default_out = results_path(script)
    out, settings, quick = parse_options(argv, doc.split("\n")[0], default_out, quick_help)
    sync_cpu_dispatch()  # before anything creates JAX's CPU client
    jax_versions = {"jax": jax.__version__, "jaxlib": dist_version("jaxlib")}
    header = machine_lines({**jax_versions, **versions, "numpy": np.__version__})
    if quick:
        header.append("- Quick smoke run (`--quick`): few repeats, not for quoting.")
    command = f"python benchmarks/{Path(script).name}" + (" --quick" if quick else "")
    invocation = Invocation(settings, quick, header, command)
    text = benchmark(invocation)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        title = text.split("\n", 1)[0].removeprefix("# ")
        out.with_suffix(".json").write_text(report_json(invocation, title), encoding="utf-8")
        log(f"wrote {out} and {out.with_suffix('.json').name}")
    return 0


def _spread(timing: Timing) -> float:
    """The interquartile range of a case's repeats, relative to their median."""
    return (timing.q3 - timing.q1) / timing.median


def method_lines(
    settings: Settings, timings: Mapping[str, Timing], subject: str, slow: str
) -> list[str]:
    """The bullet line saying how each time was taken (none when nothing was timed).

    ``subject`` names the times it is about (such as "Each time"); ``slow`` is a sentence on
    the cases timed with other settings, or empty.
    """
    if not timings:
        return []
    fewest = min(t.calls for t in timings.values())
    loops = (
        f"- {subject} is the median per-call time over {settings.repeat} repeats; each repeat "
        f"times a loop of N calls, N set so that a loop lasts about {settings.repeat_s * 1e3:g} ms"
    )
    calls = f"(at least {fewest} calls per case in all)"
    how = f"{loops}. {slow} {calls}." if slow else f"{loops} {calls}."
    order = "in a new shuffled order each round"
    return [how + f" Repeats of the cases of one measurement are interleaved, {order}."]


def spread_lines(timings: Mapping[str, Timing]) -> list[str]:
    """The line naming the least steady row, and a blank line (none when nothing was timed)."""
    if not timings:
        return []
    widest = max(timings, key=lambda k: _spread(timings[k]))
    return [
        f"Largest interquartile range of any row: {_spread(timings[widest]):.1%} of its median "
        f"({widest}).",
        "",
    ]


def section(name: str, lines: Sequence[str]) -> list[str]:
    """``lines`` between the markers that let the docs include them by name.

    The docs' benchmarks page shows the reports' parts with ``--8<-- "FILE:NAME"``
    (pymdownx.snippets), so it always shows the figures of the last full run; the markers
    are HTML comments, invisible where the markdown is rendered.
    """
    return [f"<!-- --8<-- [start:{name}] -->", *lines, f"<!-- --8<-- [end:{name}] -->"]


def report_head(
    invocation: Invocation,
    title: str,
    description: str,
    rows: list[Row],
    timings: Mapping[str, Timing],
    *,
    subject: str = "Each time",
    slow: str = "",
    closing: str = CONTRACT,
) -> list[str]:
    """The lines every report starts with: title, description, machine and method, the table.

    ``subject`` and ``slow`` go to `method_lines`; ``closing`` ends the paragraph on how to
    read the figures (by default: where the targets come from).
    """
    record_table(invocation, title, rows)
    return [
        f"# {title}",
        "",
        description,
        "",
        *section(
            "machine",
            [
                *invocation.header,
                f"- Command: `{invocation.command}`",
                *method_lines(invocation.settings, timings, subject, slow),
            ],
        ),
        "",
        f"{FIGURES} {closing}",
        "",
        *section("table", [markdown_table(rows)]),
        "",
        *spread_lines(timings),
    ]


def overhead_section(
    wrapper: str, rows: Iterable[Row], prefix: str, base: str, ours: str, direct: str, what: str
) -> list[str]:
    """ "Time `wrapper` adds per call:", for each measurement whose label starts with ``prefix``.

    In each, ``ours`` (the wrapper's row) minus ``base`` (jax.jit on a dict) and, where it ran,
    minus ``direct`` (jax.jit with ``what``, the model, passed directly): one bullet line each,
    after the heading and a blank line, then a blank line. Nothing when no such row ran.
    """
    by_label: dict[str, dict[str, Row]] = {}
    for row in rows:
        by_label.setdefault(row.measurement, {})[row.implementation] = row
    lines = []
    for label, found in by_label.items():
        base_row, ours_row, direct_row = (found.get(name) for name in (base, ours, direct))
        if not label.startswith(prefix) or base_row is None or ours_row is None:
            continue
        if base_row.time_us is None or ours_row.time_us is None:
            continue
        where = label.split(" per call, ")[1].split(" (")[0]
        text = f"- {where}: {ours_row.time_us - base_row.time_us:+.1f} us against the dict"
        if direct_row is not None and direct_row.time_us is not None:
            added = ours_row.time_us - direct_row.time_us
            text += f", {added:+.1f} us against {what} under jax.jit"
        lines.append(text + ".")
    if not lines:
        return []
    return [*section("overhead", [f"Time `{wrapper}` adds per call:", "", *lines]), ""]


def target_lines(
    rows: Iterable[Row], missed: Sequence[str] = (), unmeasured: Sequence[str] = ()
) -> list[str]:
    """The targets missed, and those not measured, closing every report.

    "Targets missed:" heads a line per row that misses its target (its time where the target
    is absolute, else its ratio) and the ``missed`` lines (misses outside the table), or says
    "none."; "Targets not measured:" follows, after a blank line, only where a row with a target
    did not run (with why) or ``unmeasured`` has lines.
    """
    rows = list(rows)
    missed_lines = []
    for r in rows:
        if r.met is False:
            got = f"{r.time_us:.0f} us" if r.absolute else f"{r.ratio:.3f}x"
            missed_lines.append(f"- {r.implementation}, {r.measurement}: {got} ({r.target})")
    missed_lines += missed
    lines = ["Targets missed:" + ("" if missed_lines else " none."), *missed_lines]
    unmeasured_lines = [
        f"- {r.implementation}, {r.measurement}: {r.note}"
        for r in rows
        if r.time_us is None and r.target not in ("", "—")
    ]
    unmeasured_lines += unmeasured
    if unmeasured_lines:
        lines += ["", "Targets not measured:", *unmeasured_lines]
    return section("targets", lines)
