"""`Carry`: the marker of what `scan` carries from step to step, in its `in_axes` and
`out_axes`, and the rules a carry follows."""

from collections.abc import Callable
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


def _type_of(value: Any) -> Any:
    try:
        return jax.typeof(value)
    except TypeError:  # not an array: a value that only the structure check looks at
        return None


def check_carried_types(
    before: list[Any], after: list[Any], where: Callable[[int], str], transform: str, what: str
) -> None:
    """Refuse a step that changed the shape or dtype of a carried value, naming where it is
    (`where(position)`), before `jax.lax` refuses it with its own names for the leaves.

    As `jax.lax`, a weakly typed value (a Python number) may come back with another dtype:
    the loop is then traced again from it converted to the dtype the two promote to, and
    this check, on that trace, refuses what is still different.
    """
    for position, (old, new) in enumerate(zip(before, after, strict=True)):
        old_type, new_type = _type_of(old), _type_of(new)
        if old_type is None or new_type is None:
            continue
        same_shape = old_type.shape == new_type.shape
        if same_shape and (old_type.dtype == new_type.dtype or old_type.weak_type):
            continue
        want = f"{old_type.dtype}{list(old_type.shape)}"
        got = f"{new_type.dtype}{list(new_type.shape)}"
        raise ValueError(
            f"{transform}: {what} changed the array at {where(position)} from {want} to "
            f"{got}. A loop carry keeps its shapes and dtypes from step to step (a Python "
            "number may take the dtype the step gives it, as in jax.lax): cast or reshape "
            f"the new value to the old one's (e.g. `.astype(jnp.{old_type.dtype})`)."
        )
