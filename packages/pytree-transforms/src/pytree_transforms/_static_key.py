"""Cache keys for static values: equal only when the values are interchangeable.

Python's `==` says `1 == 1.0 == True` and `0.0 == -0.0`, and containers compare their
elements the same way, so a compilation cache keyed by static values as they are would hand
a function traced for `1` to a call with `1.0` or `True`. Static values are keyed with
`pytree_module.extend.static_key`, the rule Modules' treedefs follow, so a value shares a
compilation here exactly when it would as a Module's static attribute: types recursively,
floats by their bits (`0.0` and `-0.0` differ, a NaN equals itself), dicts in order.
"""

from collections.abc import Iterable
from typing import Any

import numpy as np

from pytree_module.extend import static_key as static_key  # the rule this package keys by

# The types whose values `static_key` keys by contents (its docstring lists them): for any
# other type, values of one type are interchangeable when `==` says so.
_KEYED_BY_CONTENT = (float, complex, np.inexact, tuple, list, dict, set, frozenset)


def needs_static_key(types: Iterable[type]) -> bool:
    """Whether values of these types need `static_key`: False for strings, ints, functions."""
    return any(issubclass(t, _KEYED_BY_CONTENT) for t in types)


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
