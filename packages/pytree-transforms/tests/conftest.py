"""Fixtures shared by the tests of pytree-transforms."""

from collections.abc import Callable
from typing import Any

import pytest


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
