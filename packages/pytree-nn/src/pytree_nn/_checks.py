"""Argument and input checks shared by the layers, with messages that name the argument."""

import math
from typing import Any

import jax.numpy as jnp


def check_features(layer: str, **sizes: Any) -> None:
    """Refuse sizes that are not positive ints, naming the argument."""
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{layer}: {name} must be a positive int, got {size!r}.")


def check_number(layer: str, name: str, value: Any, low: float, high: float) -> float:
    """Refuse a value that is not a real number in [low, high], naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        bounds = f"in [{low}, {high}]" if high != math.inf else f">= {low}"
        raise ValueError(f"{layer}: {name} must be a number {bounds}, got {value!r}.")
    return float(value)


def check_input(layer: str, x: Any, axis: int, expected: int, name: str) -> None:
    """Refuse an input whose `axis` is missing or not of size `expected`, naming the argument."""
    shape = jnp.shape(x)
    where = "last dimension" if axis == -1 else f"dimension {axis}"
    if not -len(shape) <= axis < len(shape) or shape[axis] != expected:
        raise ValueError(
            f"{layer} expects inputs whose {where} is {name}={expected}, got an "
            f"input of shape {shape}."
        )
