"""Cases, targets and the runner that checks and times them, shared by the benchmarks.

A measurement compares implementations of one operation. Each is a `Case`: a name and a
zero-argument call. `Runner.measure` calls every case once (which compiles it) and checks that
the cases agree, so that a table never compares implementations computing different things;
then it times the cases that ran with `_timing.compare` and turns them into table rows: ratios
against a baseline case, and a `Target` met or missed, on the ratio or on the time itself.

Benchmarks that time plain dicts of named calls (no checks) use `Runner.time` and `named_rows`
for the same rows and records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _timing import Row, Settings, Timeable, Timing, compare


@dataclasses.dataclass(frozen=True)
class Target:
    """A limit on a row: on its ratio to the baseline or, when ``absolute``, on its time.

    Attributes:
        label: the text of the table's target column.
        limit: the largest ratio met, or the longest time met in seconds per call.
        absolute: whether ``limit`` bounds the time rather than the ratio.
    """

    label: str
    limit: float
    absolute: bool = False

    def met(self, seconds: float, ratio: float | None) -> bool | None:
        """Whether a time (and its ratio) meets the target; None when the ratio it needs is
        unknown (the baseline did not run)."""
        if self.absolute:
            return seconds <= self.limit
        return None if ratio is None else ratio <= self.limit


def as_list(result: Any) -> list[Any]:
    """The default reading of a result for the check: the result itself, as one array."""
    return [result]


@dataclasses.dataclass
class Case:
    """One implementation of a measurement: its label and the zero-argument call to time.

    Attributes:
        name: the implementation column of its row.
        call: what is timed; None when it cannot run (``why`` says why, in its row).
        why: the note of a row that could not run.
        note: the note of a row that ran (shown in brackets after the name).
        target: the target of its row, if any.
        check: whether its result must agree with those of the other checked cases.
        read: turns its result into the list of arrays compared; None: the runner's default.
        expect_error: set where the call is expected to raise; the note of its row then.
    """

    name: str
    call: Callable[[], Any] | None
    why: str = ""
    note: str = ""
    target: Target | None = None
    check: bool = True
    read: Callable[[Any], list[Any]] | None = None
    expect_error: str = ""


def first_line(error: BaseException) -> str:
    """An exception in one short line that fits in a table cell (no ``|``)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = text.replace("|", "/")
    return f"{type(error).__name__}: {text[:90]}"


def built_case(
    name: str, make: Callable[[], Callable[[], Any]], *, unavailable: str = "", **options: Any
) -> Case:
    """A case whose call is built by `make` (applying the transforms under test).

    Where ``unavailable`` says why the case cannot be built (a library or a function missing),
    or where `make` raises, the case does not run and its row says why, instead of the whole
    benchmark failing.
    """
    if unavailable:
        return Case(name, None, why=unavailable, **options)
    try:
        call = make()
    except Exception as error:
        return Case(name, None, why=f"failed: {first_line(error)}", **options)
    return Case(name, call, **options)


def _agree(got: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    """Whether two lists of arrays are equal in length, shapes and (closely) values."""
    return len(got) == len(expected) and all(
        a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-5)
        for a, b in zip(got, expected, strict=False)
    )


def check_cases(
    cases: Sequence[Case], log: Callable[[str], None], read: Callable[[Any], list[Any]] = as_list
) -> dict[str, str]:
    """Call each case once (compiling it) and compare its result with the first checked one's.

    ``read`` turns a result into the arrays compared, for the cases without their own. Returns
    why each case that must not be timed failed, by name: it could not run, it raised, it did
    not raise as expected, or its result differs.
    """
    failures: dict[str, str] = {}
    expected = None
    for case in cases:
        if case.call is None:
            failures[case.name] = case.why
            continue
        try:
            result = jax.block_until_ready(case.call())
            got = [np.asarray(a) for a in (case.read or read)(result)] if case.check else None
        except Exception as error:
            failures[case.name] = case.expect_error or f"failed: {first_line(error)}"
            if not case.expect_error:
                log(f"  {case.name}: {first_line(error)}")
            continue
        if case.expect_error:
            failures[case.name] = "expected an error, got none"
        elif got is None:
            continue
        elif expected is None:
            expected = got
        elif not _agree(got, expected):
            failures[case.name] = "wrong result"
            log(f"  {case.name}: wrong result")
    return failures


def timed_row(
    measurement: str,
    name: str,
    seconds: float,
    base: float | None,
    target: Target | None = None,
    note: str = "",
    no_baseline: str = "not run",
) -> Row:
    """The row of a case that ran, from its per-call time and the baseline's (None if missing).

    Without a baseline the row has no ratio; if it has a target on the ratio, its note says
    that the baseline is missing and why (``no_baseline``).
    """
    ratio = None if base is None else seconds / base
    met = None if target is None else target.met(seconds, ratio)
    if target is not None and ratio is None and not target.absolute:
        note = f"no baseline: {no_baseline}"
    label = "—" if target is None else target.label
    absolute = target is not None and target.absolute
    return Row(measurement, name, seconds * 1e6, ratio, label, met, note, absolute)


def case_rows(
    measurement: str,
    cases: Sequence[Case],
    timings: Mapping[str, Timing],
    failures: Mapping[str, str],
    baseline: str,
) -> list[Row]:
    """Rows for the cases of one measurement, in order; ratios against the case ``baseline``.

    A case that was not timed gets a row without figures, noting why (from ``failures``).
    """
    base = timings.get(baseline)
    rows = []
    for case in cases:
        if case.name not in timings:
            label = "—" if case.target is None else case.target.label
            note = failures.get(case.name, "not run")
            rows.append(Row(measurement, case.name, None, target=label, note=note))
            continue
        seconds = timings[case.name].median
        base_s = None if base is None else base.median
        why = failures.get(baseline, "not run")
        rows.append(timed_row(measurement, case.name, seconds, base_s, case.target, case.note, why))
    return rows


def named_rows(
    measurement: str,
    names: Sequence[str],
    timings: Mapping[str, Timing],
    baseline: str,
    missing: Mapping[str, str],
    targets: Mapping[str, Target] | None = None,
    notes: Mapping[str, str] | None = None,
    no_ratio: Sequence[str] = (),
) -> list[Row]:
    """Rows for one measurement timed as a dict of named calls, in the order of ``names``.

    A name not timed gets a row without figures, noting why from ``missing`` (looked up by the
    part of the name before any ``": "``, the library; default "not run"). Ratios are against
    ``baseline``, except for the names in ``no_ratio`` (references that are not implementations).
    """
    targets = targets or {}
    notes = notes or {}
    base = timings.get(baseline)
    why_no_base = missing.get(baseline, baseline + " missing")
    rows = []
    for name in names:
        if name not in timings:
            note = missing.get(name.split(": ")[0], "not run")
            rows.append(Row(measurement, name, None, note=note))
            continue
        base_s = None if base is None or name in no_ratio else base.median
        seconds = timings[name].median
        target, note = targets.get(name), notes.get(name, "")
        rows.append(timed_row(measurement, name, seconds, base_s, target, note, why_no_base))
    return rows


class Runner:
    """Checks and times the cases of each measurement; collects their rows and timings.

    ``rows`` are the table's, in the order measured; ``timings`` hold every case's `Timing`
    by ``"measurement / case"``, for the spread line of the report.
    """

    def __init__(
        self,
        settings: Settings,
        log: Callable[[str], None],
        read: Callable[[Any], list[Any]] = as_list,
    ):
        self.settings = settings
        self.log = log
        self.read = read
        self.rows: list[Row] = []
        self.timings: dict[str, Timing] = {}

    def measure(
        self,
        label: str,
        cases: list[Case],
        settings: Settings | None = None,
        baseline: str | None = None,
    ) -> None:
        """Check and time `cases`, adding their rows; ratios against the case named
        ``baseline`` (default: the first). ``settings`` replace the runner's for slow cases."""
        self.log(f"timing {label} ...")
        failures = check_cases(cases, self.log, self.read)
        runnable = {c.name: c.call for c in cases if c.name not in failures}
        timings = self._compare(label, runnable, settings)
        self.rows += case_rows(label, cases, timings, failures, baseline or cases[0].name)

    def time(
        self, label: str, cases: Mapping[str, Timeable], settings: Settings | None = None
    ) -> dict[str, Timing]:
        """Time named calls or statements as they are (no check, no rows) and record them."""
        self.log(f"timing {label} ...")
        return self._compare(label, cases, settings)

    def _compare(
        self, label: str, cases: Mapping[str, Timeable], settings: Settings | None
    ) -> dict[str, Timing]:
        timings = compare(cases, settings or self.settings) if cases else {}
        self.timings.update({f"{label} / {k}": v for k, v in timings.items()})
        return timings


def mlp_arrays(depth: int, width: int, seed: int = 0) -> tuple[list[jax.Array], list[jax.Array]]:
    """The weights (``width`` x ``width``, scaled by 1/sqrt(width)) and biases (``width``) of a
    ``depth``-layer MLP, float32, drawn from a seeded generator: the arrays that every form of
    a benchmark's model holds."""
    rng = np.random.default_rng(seed)
    weights = [
        jnp.asarray(rng.standard_normal((width, width), dtype=np.float32) / width**0.5)
        for _ in range(depth)
    ]
    biases = [jnp.asarray(rng.standard_normal(width, dtype=np.float32)) for _ in range(depth)]
    return weights, biases
