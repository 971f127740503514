"""Static values in a `GraphDef`: compared by type as well as by value.

Python says `1 == 1.0 == True` and `0.0 == -0.0`, but a function traced with one of
them may behave differently with another (`type(s) is bool`, `jnp.copysign(1.0, s)`,
the dtype `jnp.asarray(s)` gets). So a graph keeps each static value with a key that
tells them apart: its type, recursively through containers, and floats by their bits.
NaN is a float like any other, so it equals itself (no retracing for a static NaN).
"""

import struct
from typing import Any

_float_bits = struct.Struct("<d").pack


def static_key(value: Any) -> Any:
    """A hashable key of a static value, equal only for values of the same type (down
    through tuples, lists, dicts, sets and frozensets) that are equal, floats and
    complex numbers bit for bit."""
    kind = type(value)
    if kind is float:
        return (float, _float_bits(value))
    if kind is complex:
        return (complex, _float_bits(value.real), _float_bits(value.imag))
    if kind is tuple or kind is list:
        return (kind, tuple(map(static_key, value)))
    if kind is dict:
        return (dict, tuple((static_key(k), static_key(v)) for k, v in value.items()))
    if kind is frozenset or kind is set:
        return (kind, frozenset(map(static_key, value)))
    return (kind, value)


class Static:
    """A static value of a graph, as its record holds it: equal by `static_key`.

    Attributes:
        value: the value itself.
    """

    __slots__ = ("_hash", "key", "value")

    def __init__(self, value: Any):
        self.value = value
        self.key = static_key(value)
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is Static and self._hash == other._hash and self.key == other.key
        )

    def __repr__(self) -> str:
        return f"Static({self.value!r})"
