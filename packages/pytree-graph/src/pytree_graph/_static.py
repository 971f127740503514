"""Static values in a `GraphDef`: compared by type as well as by value.

Python says `1 == 1.0 == True` and `0.0 == -0.0`, but a function traced with one of
them may behave differently with another (`type(s) is bool`, `jnp.copysign(1.0, s)`,
the dtype `jnp.asarray(s)` gets). So a graph keeps each static value (and each Variable
kind keeps its metadata) with `pytree_module.extend.static_key`, the key Modules' treedefs
use: types recursively, subclasses (NamedTuples, NumPy scalars) included, and floats by
their bits. NaN is a float like any other, so it equals itself (no retracing for a static
NaN).
"""

from typing import Any

from pytree_module.extend import static_key as static_key  # the rule graphs key by


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
