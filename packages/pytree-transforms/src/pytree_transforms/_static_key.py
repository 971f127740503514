"""Cache keys for static values: equal only when the values are interchangeable.

Python's `==` says `1 == 1.0 == True` and `0.0 == -0.0`, and containers compare their
elements the same way, so a compilation cache keyed by static values as they are would hand
a function traced for `1` to a call with `1.0` or `True`. A key made here carries the type of
every value, recursively through tuples, lists, dicts and sets, and compares floats by their
bits (so `0.0` and `-0.0` differ, and a NaN equals itself).
"""

from collections.abc import Iterable
from typing import Any

import numpy as np

# Types whose values need more than their own `==` to be told apart.
_NEEDS_KEY = (float, complex, np.inexact, tuple, list, dict, set, frozenset)


def needs_static_key(types: Iterable[type]) -> bool:
    """Whether values of these types need `static_key`: False for strings, ints, functions."""
    return any(issubclass(t, _NEEDS_KEY) for t in types)


def static_key(value: Any) -> Any:
    """A hashable key equal for two values only if they have the same types and contents."""
    kind = type(value)
    if issubclass(kind, float):
        return kind, value.hex()
    if issubclass(kind, complex):
        return kind, value.real.hex(), value.imag.hex()
    if issubclass(kind, np.inexact):
        return kind, value.tobytes()
    if issubclass(kind, tuple | list):
        return kind, tuple(map(static_key, value))
    if issubclass(kind, dict):
        return kind, frozenset((static_key(k), static_key(v)) for k, v in value.items())
    if issubclass(kind, set | frozenset):
        return kind, frozenset(map(static_key, value))
    return kind, value


class KeyedStatics:
    """Static leaves as the static argument of `jax.jit`: compared and hashed by their
    `static_key`, so that JAX's cache tells `1.0` from `1` and `0.0` from `-0.0`."""

    __slots__ = ("_hash", "key", "values")

    def __init__(self, values: tuple[Any, ...]):
        self.values = values
        self.key = tuple(map(static_key, values))
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return type(other) is KeyedStatics and self.key == other.key

    def __repr__(self) -> str:
        return f"KeyedStatics{self.values!r}"
