"""The benchmark scripts run (a short smoke run; figures are not checked here)."""

import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("bench_*.py")), ids=lambda p: p.name)
def test_benchmark_smoke_run(script, tmp_path):
    out = tmp_path / "table.md"
    result = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| measurement |" in out.read_text()
