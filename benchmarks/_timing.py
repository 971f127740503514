"""Timing helpers shared by the benchmarks in this folder.

Method, in short:

* `sync_cpu_dispatch()` turns off JAX's asynchronous CPU dispatch. With it on, per-call times of
  jitted functions on a small CPU are bimodal; synchronous dispatch makes them stable.
* `compare(cases)` times several implementations of one operation. Each case is warmed up, then
  given a loop size ``number`` so that one repeat (a loop of ``number`` calls) lasts about
  ``repeat_s`` seconds. The repeats of all cases are interleaved (case A, case B, ..., then again,
  in a new shuffled order each round), so that a change in machine load during the run hits every
  case alike, and the median of the per-call times over the repeats is reported. The order is
  shuffled (seeded, so runs repeat) rather than rotated: the first calls after switching from
  one compiled program to another are slower, and rotating keeps each case right after the
  same other one (B after A, every round), charging that one switch to it every time. The
  garbage collector is
  off while a loop runs (as in `timeit`).
* `Row` and `markdown_table` turn the results into the table that every benchmark prints.

Ratios between cases of one `compare` call are the figures to read; absolute times depend on
the machine.

Built on these: `_cases.py` checks the implementations of a measurement against each other,
times them and makes their rows; `_report.py` runs a benchmark's command line and writes the
parts of its report that every benchmark shares.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import platform
import random
import statistics
import sys
import timeit
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
from _format import format_ratio, format_time


def sync_cpu_dispatch() -> None:
    """Make JAX dispatch synchronously on CPU (call before any timing)."""
    jax.config.update("jax_cpu_enable_async_dispatch", False)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How long to time each case.

    Attributes:
        repeat: number of timed loops per case; the median of them is reported.
        repeat_s: target duration of one loop, which sets the loop size ``number``.
        min_number: smallest loop size, so that even slow cases run many calls.
        warmup: untimed calls before calibration (compilation, caches).
    """

    repeat: int = 41
    repeat_s: float = 0.02
    min_number: int = 25
    warmup: int = 20

    @classmethod
    def quick(cls) -> Settings:
        """A short smoke run: a few repeats of short loops."""
        return cls(repeat=5, repeat_s=0.001, min_number=3, warmup=2)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-call times of one case, in seconds."""

    median: float
    q1: float
    q3: float
    number: int
    repeat: int

    @property
    def calls(self) -> int:
        """Total number of timed calls."""
        return self.number * self.repeat


Timeable = Callable[[], Any] | tuple[str, Mapping[str, Any]]
"""A zero-argument callable, or ``(statement, globals)`` timed inline like `timeit` does.

A statement avoids the cost of a Python call per iteration, for operations of tens of ns.
"""


def _timer(case: Timeable) -> timeit.Timer:
    if callable(case):
        return timeit.Timer(case)
    stmt, namespace = case
    return timeit.Timer(stmt, globals=dict(namespace))


def _calibrate(timer: timeit.Timer, settings: Settings) -> int:
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= settings.repeat_s / 4 or number >= 1 << 24:
            break
        number *= 4
    per_call = elapsed / number
    return max(settings.min_number, round(settings.repeat_s / max(per_call, 1e-9)))


def compare(cases: Mapping[str, Timeable], settings: Settings) -> dict[str, Timing]:
    """Time each case with interleaved repeats; return the per-call `Timing` by name."""
    timers = {name: _timer(case) for name, case in cases.items()}
    for timer in timers.values():
        timer.timeit(settings.warmup)
    numbers = {name: _calibrate(timer, settings) for name, timer in timers.items()}
    samples: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    order = random.Random(0)  # seeded: the same orders in every run
    for _ in range(settings.repeat):
        # A new order each round, so that no case always runs first or after another.
        order.shuffle(names)
        for name in names:
            samples[name].append(timers[name].timeit(numbers[name]) / numbers[name])
    result = {}
    for name, values in samples.items():
        if len(values) >= 2:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        else:
            q1 = q3 = values[0]
        result[name] = Timing(statistics.median(values), q1, q3, numbers[name], settings.repeat)
    return result


@dataclasses.dataclass
class Row:
    """One line of a results table. ``ratio`` is against the baseline named in ``measurement``.

    ``met`` is None when the row has no target; ``absolute`` says that its target is on the
    time itself, not on the ratio (so a miss is reported as a time).
    """

    measurement: str
    implementation: str
    time_us: float | None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    absolute: bool = False


HEADER = ("measurement", "implementation", "time (us)", "ratio", "target", "met?")


def markdown_table(rows: list[Row]) -> str:
    """Render rows as a markdown table with the columns of `HEADER`."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    for row in rows:
        met = "" if row.met is None else "yes" if row.met else "**no**"
        ratio = "" if row.ratio is None else format_ratio(row.ratio)
        impl = f"{row.implementation} ({row.note})" if row.note else row.implementation
        cells = (row.measurement, impl, format_time(row.time_us), ratio, row.target, met)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_lines(versions: Mapping[str, str | None]) -> list[str]:
    """Markdown bullet lines describing the run: versions, Python, CPUs, load, date."""
    shown = ", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items())
    device = jax.devices()[0]
    try:
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "n/a"
    return [
        f"- Versions: {shown}",
        f"- Python {platform.python_version()} ({sys.implementation.name}) on "
        f"{platform.system()} {platform.machine()}",
        f"- CPUs: {os.cpu_count()}; load average at start (1/5/15 min): {load}",
        f"- JAX backend: {jax.default_backend()} ({device.device_kind}); CPU dispatch "
        f"synchronous: {not jax.config.read('jax_cpu_enable_async_dispatch')}",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
    ]


def dist_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_options(
    argv: list[str] | None, description: str, default_out: Path, quick_help: str
) -> tuple[Path | None, Settings, bool]:
    """The command line every benchmark takes: `--quick` and `--out PATH`.

    Returns the file to write (none for a quick run unless `--out` is given), the timing
    settings, and whether the run is quick.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"markdown file to write (default: {default_out.name} in benchmarks/results for a "
        "full run; none for --quick)",
    )
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else None if args.quick else default_out
    return out, Settings.quick() if args.quick else Settings(), args.quick
