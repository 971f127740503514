"""How the benchmark reports write times and ratios; free of JAX, so the run-all driver, which
only reads the reports, can share it with the scripts that time things."""

from __future__ import annotations

import re


def format_time(us: float | None) -> str:
    """A time in microseconds, with three significant figures or more ("n/a" for None)."""
    if us is None:
        return "n/a"
    return f"{us:.3f}" if us < 1 else f"{us:.2f}" if us < 100 else f"{us:.0f}"


def format_ratio(ratio: float) -> str:
    """A ratio to a baseline: three significant figures, whole numbers from 100x up."""
    return f"{ratio:.0f}x" if ratio >= 100 else f"{ratio:#.3g}x"


# The rows of a scaling curve carry their size in their measurement label, in this form, so that
# the run-all driver can draw the curves from the JSON tables alone.
SIZE_LABEL = re.compile(r"(?P<measurement>.+) \[(?P<axis>[A-Za-z]+) = (?P<size>\d+)\]")


def size_label(measurement: str, axis: str, size: int) -> str:
    """The label of one point of a scaling curve: ``"MEASUREMENT [AXIS = SIZE]"``."""
    return f"{measurement} [{axis} = {size}]"
