"""Keys of static values: equal only when the values are interchangeable.

A Module's treedef entry is interned per set of static values, and JAX tells treedefs (and so
its compiled functions) apart by those entries. Python's `==` says `1 == 1.0 == True` and
`0.0 == -0.0`, and containers compare their elements the same way, so entries keyed by `==`
would give a module holding `-0.0` the entry of one holding `0.0`: the compilation traced for
the other value, and `0.0` back when it is rebuilt. A key made here carries the type of every
value, recursively through tuples, lists, dicts (keys and values), sets and frozensets, and
compares floats and complex numbers (NumPy's included) by their bits, so `0.0` and `-0.0`
differ and a NaN equals itself.

`pytree_transforms` keys the static arguments of its compilation cache the same way. This is
a separate copy because `pytree_module` is the layer below it and imports neither it nor any
other sibling package.
"""

import struct
from typing import Any

import numpy as np

_float_bits = struct.Struct("<d").pack


def static_key(value: Any) -> Any:
    """A hashable key, equal for two values only if they have the same types and contents."""
    kind = type(value)
    # The common cases first, by exact type: keys are made whenever a module is built.
    if kind is str or kind is int or kind is bool:
        return kind, value
    if kind is float:
        return kind, _float_bits(value)
    if kind is tuple:
        return kind, tuple(map(static_key, value))
    # Before `float` and `complex`: `np.float64` and `np.complex128` subclass them, and other
    # NumPy widths have bits that a double does not hold.
    if issubclass(kind, np.inexact):
        return kind, value.tobytes()
    if issubclass(kind, float):
        return kind, _float_bits(value)
    if issubclass(kind, complex):
        return kind, _float_bits(value.real), _float_bits(value.imag)
    if issubclass(kind, tuple | list):
        return kind, tuple(map(static_key, value))
    if issubclass(kind, dict):
        # In order: a rebuilt module gets a copy of the stored dict, which iterates in the
        # order it was built in.
        return kind, tuple((static_key(k), static_key(v)) for k, v in value.items())
    if issubclass(kind, set | frozenset):
        return kind, frozenset(map(static_key, value))
    return kind, value
