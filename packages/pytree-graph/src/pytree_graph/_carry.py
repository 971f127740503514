"""`Carry`: the marker of what `scan` carries from step to step, in its `in_axes` and
`out_axes`, and the rules a carry follows."""

from typing import Any

import jax
import jax.numpy as jnp

from pytree_module import Module

from ._variables import Variable


class Carry:
    """Marks, in `scan`'s `in_axes` and `out_axes`, what is carried from step to step
    (as Flax NNX's `nnx.Carry`).

    In `in_axes` it marks the positional argument that is the loop's carry (at most one),
    or, as a `StateAxes` entry, the Variables of an argument that are carried (e.g. the
    running statistics of scanned layers); in `out_axes` it marks the output that is the
    next step's carry. Use the class itself, never an instance.

    Examples:
        >>> import jax.numpy as jnp
        >>> import pytree_graph as pg
        >>> @pg.scan(in_axes=(pg.Carry, 0), out_axes=pg.Carry)
        ... def total(carry, x):
        ...     return carry + x
        >>> float(total(jnp.array(0.0), jnp.arange(4.0)))
        6.0
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> "Carry":
        raise TypeError("Carry is a marker, used as it is: `in_axes=(Carry, 0)`, not `Carry()`.")


def show_axis(axis: Any) -> str:
    """An axis of `in_axes` or `out_axes` as written: `Carry`, an int, `None`."""
    return "Carry" if axis is Carry else repr(axis)


_PYTHON_NUMBERS = (bool, int, float, complex)


def _is_python_number(value: Any) -> bool:
    return type(value) in _PYTHON_NUMBERS


def _stops(value: Any) -> bool:
    return isinstance(value, Module | Variable)


def numbers_as_arrays(carry: Any) -> Any:
    """A loop carry with its Python numbers made (weakly typed) arrays, as `jax.lax`
    loops make them: they are the loop's state, not static values. Numbers inside
    Modules and Variables are left as they are (Module attributes are static)."""
    leaves, treedef = jax.tree_util.tree_flatten(carry, is_leaf=_stops)
    if not any(map(_is_python_number, leaves)):
        return carry
    return treedef.unflatten([jnp.asarray(x) if _is_python_number(x) else x for x in leaves])
