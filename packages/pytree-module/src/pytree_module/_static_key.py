"""Keys of static values: equal only when the values are interchangeable.

A Module's treedef entry is interned per set of static values, and JAX tells treedefs (and so
its compiled functions) apart by those entries. Python's `==` says `1 == 1.0 == True` and
`0.0 == -0.0`, and containers compare their elements the same way, so entries keyed by `==`
would give a module holding `-0.0` the entry of one holding `0.0`: the compilation traced for
the other value, and `0.0` back when it is rebuilt. A key made here carries the type of every
value, recursively through tuples, lists, dicts (keys and values), sets and frozensets, and
compares floats and complex numbers (NumPy's included) by their bits, so `0.0` and `-0.0`
differ and a NaN equals itself.

This is the one definition of that rule: `pytree_module.extend` publishes it, and
pytree_transforms (its compilation caches) and pytree_graph (GraphDefs, Variable metadata)
key their static values with it, so that a value never shares a compilation in one package
that it would not share in another.
"""

import struct
from typing import Any

import numpy as np

_float_bits = struct.Struct("<d").pack

# Keyed as they are, `(type, value)`: two values of one of these types that `==` calls equal
# are interchangeable. Checked first, by exact type: keys are made whenever a module is built,
# on every call of a filtered transform with keyed statics, and on every graph split.
_SELF_KEYED = frozenset({str, int, bool, bytes, type(None)})

# Keyed by their contents (see `static_key`), subclasses included; values of any other type
# are keyed as they are.
_KEYED_BY_CONTENT = (float, complex, np.inexact, tuple, list, dict, set, frozenset)


def static_key(value: Any) -> Any:
    """A hashable key of a static value, equal for two values only if they are interchangeable.

    Python's `==` says `1 == 1.0 == True` and `0.0 == -0.0`, so a cache of compilations
    keyed by static values as they are hands the function traced for one of them to a call
    with another, whose result may differ (`jnp.copysign(1.0, s)`, `type(s) is bool`, the
    dtype `jnp.asarray(s)` gets). The key made here tells them apart:

    - floats and complex numbers, NumPy's included, are compared by their bits and type:
      `0.0` and `-0.0` differ, `np.float32(1.0)` and `1.0` differ, and a NaN equals itself;
    - tuples, lists, dicts and sets (their subclasses, such as NamedTuples, included) by
      their type and their elements' keys, recursively; a dict's items in order, since a
      function that iterates it sees that order (so the same dict in another order is
      another key: at worst one more compilation, never a result traced for another order);
    - any other value by its type and itself, so it compares with its own `==`.

    The key is hashable when the value and every element it holds are.

    Arguments:
        value: a static value: anything hashable, or a list, dict or set of such values.

    Returns:
        A key that compares equal to another value's key only if the two values have the
        same type, down through their containers, and are equal (numbers bit for bit).

    Examples:
        >>> from pytree_module.extend import static_key
        >>> static_key(1) == static_key(1.0), static_key(1) == static_key(True)
        (False, False)
        >>> static_key(0.0) == static_key(-0.0)
        False
        >>> static_key((1, [2.5, "a"])) == static_key((1, [2.5, "a"]))
        True
        >>> static_key({"a": 1, "b": 2}) == static_key({"b": 2, "a": 1})
        False
        >>> nan = float("nan")
        >>> nan == nan, static_key(nan) == static_key(float("nan"))
        (False, True)
    """
    kind = type(value)
    if kind in _SELF_KEYED:
        return kind, value
    if kind is float:
        return kind, _float_bits(value)
    if kind is tuple or kind is list:
        return kind, tuple(map(static_key, value))
    if not issubclass(kind, _KEYED_BY_CONTENT):
        return kind, value
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
        # order it was built in, and a traced function sees that order.
        return kind, tuple((static_key(k), static_key(v)) for k, v in value.items())
    return kind, frozenset(map(static_key, value))
