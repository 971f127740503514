"""Parameter initializers: functions `init(key, shape, dtype) -> array`.

These are JAX's (`jax.nn.initializers`), plus `zeros_init()` and `ones_init()` that return
such functions, as Flax NNX names them. Layers take them as `kernel_init=`, `bias_init=`,
and so on.

Examples:
    >>> import jax
    >>> from pytree_nn import initializers
    >>> init = initializers.variance_scaling(2.0, "fan_in", "truncated_normal")
    >>> init(jax.random.key(0), (3, 4)).shape
    (3, 4)
    >>> initializers.zeros_init()(jax.random.key(0), (2,)).tolist()
    [0.0, 0.0]
"""

from collections.abc import Callable
from typing import Any

from jax.nn.initializers import (
    constant,
    delta_orthogonal,
    glorot_normal,
    glorot_uniform,
    he_normal,
    he_uniform,
    kaiming_normal,
    kaiming_uniform,
    lecun_normal,
    lecun_uniform,
    normal,
    ones,
    orthogonal,
    truncated_normal,
    uniform,
    variance_scaling,
    xavier_normal,
    xavier_uniform,
    zeros,
)

Initializer = Callable[..., Any]

__all__ = [
    "Initializer",
    "constant",
    "delta_orthogonal",
    "glorot_normal",
    "glorot_uniform",
    "he_normal",
    "he_uniform",
    "kaiming_normal",
    "kaiming_uniform",
    "lecun_normal",
    "lecun_uniform",
    "normal",
    "ones",
    "ones_init",
    "orthogonal",
    "truncated_normal",
    "uniform",
    "variance_scaling",
    "xavier_normal",
    "xavier_uniform",
    "zeros",
    "zeros_init",
]


def zeros_init() -> Initializer:
    """An initializer of zeros (`jax.nn.initializers.zeros`)."""
    return zeros


def ones_init() -> Initializer:
    """An initializer of ones (`jax.nn.initializers.ones`)."""
    return ones
