"""Fixtures shared by the tests of pytree-transforms."""

import pathlib
import sys
from collections.abc import Callable
from typing import Any

import pytest

# The tests import the helper module beside them by name (`from runtime_checks import
# assert_check_fails`), and --import-mode=importlib (pytest.ini) puts no test folder on
# sys.path.
sys.path.append(str(pathlib.Path(__file__).parent))


def _counting(fun: Callable[..., Any]) -> tuple[Callable[..., Any], list[int]]:
    """`fun` wrapped to record each call (each trace, under a jit), and the record."""
    traces: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        traces.append(1)
        return fun(*args, **kwargs)

    return counted, traces


@pytest.fixture
def counting() -> Callable[..., tuple[Callable[..., Any], list[int]]]:
    """`counting(fun) -> (counted, traces)`: count how often a function is traced."""
    return _counting
