"""How the benchmark reports write times and ratios; free of JAX, so the run-all driver, which
only reads the reports, can share it with the scripts that time things."""

from __future__ import annotations


def format_time(us: float | None) -> str:
    """A time in microseconds, with three significant figures or more ("n/a" for None)."""
    if us is None:
        return "n/a"
    return f"{us:.3f}" if us < 1 else f"{us:.2f}" if us < 100 else f"{us:.0f}"


def format_ratio(ratio: float) -> str:
    """A ratio to a baseline: three significant figures, whole numbers from 100x up."""
    return f"{ratio:.0f}x" if ratio >= 100 else f"{ratio:#.3g}x"
