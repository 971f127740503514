"""Pytest's settings for the whole repository (pytest.ini says what runs; this says when).

The repository-wide tests in `tests/` (the docs pages' code, the examples, the benchmarks'
smoke run) check what a user sees with the JAX they would install today, so they run with the
newest JAX only: hatch's test matrix sets `PYTREE_REPOSITORY_TESTS=0` for its oldest-JAX leg
(Python 3.11, hatch.toml), which runs the five packages' own suites. Unset, or any other
value, runs them.
"""

import os
import pathlib

_REPOSITORY_TESTS = pathlib.Path(__file__).resolve().parent / "tests"


def pytest_ignore_collect(collection_path: pathlib.Path) -> bool | None:
    if os.environ.get("PYTREE_REPOSITORY_TESTS") != "0":
        return None
    # `tests` is one of pytest.ini's testpaths, so it is named on the command line, where
    # `collect_ignore` does not reach: this hook sees every path collected.
    return collection_path.resolve().is_relative_to(_REPOSITORY_TESTS) or None
