"""Checks of a graph transform's arguments, shared by the transforms, with their messages."""

import inspect
from typing import Any


def check_callable(fun: Any, transform: str) -> None:
    """Refuse a `fun` that is not callable, naming `transform` (before anything runs).

    Raises:
        TypeError: `fun` is not callable.
    """
    if not callable(fun):
        raise TypeError(f"{transform} expects a function, got {type(fun).__name__}: {fun!r}.")


def _positional_count(fun: Any) -> int | None:
    """How many positional parameters `fun` has; None when it takes `*args` or its
    signature is unknown."""
    try:
        parameters = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return None
    count = 0
    for parameter in parameters:
        if parameter.kind is parameter.VAR_POSITIONAL:
            return None
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


def donated_positions(donate: Any, fun: Any, transform: str) -> frozenset[int]:
    """`donate_argnums` as a set of positions of `fun`'s positional arguments, checked
    when the transform is made (as `jax.jit` does); a negative one counts from the end.

    Raises:
        TypeError: `donate` is not an int or a sequence of ints.
        ValueError: a position `fun` does not have.
    """
    if isinstance(donate, int) and not isinstance(donate, bool):
        positions: Any = (donate,)
    elif isinstance(donate, tuple | list):
        positions = tuple(donate)
    else:
        positions = None
    if positions is None or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in positions
    ):
        raise TypeError(
            f"{transform}: donate_argnums must be an int or a tuple of ints, the positions "
            f"of the function's positional arguments whose values to donate; got {donate!r}."
        )
    count = _positional_count(fun)
    if count is None:
        negative = [p for p in positions if p < 0]
        if negative:
            raise ValueError(
                f"{transform}: donate_argnums={donate!r} holds {negative[0]}, a position "
                "counted from the end, but the function takes any number of positional "
                "arguments (`*args`): give positions counted from 0."
            )
        return frozenset(positions)
    outside = [p for p in positions if not -count <= p < count]
    if outside:
        name = getattr(fun, "__name__", type(fun).__name__)
        valid = f"0 to {count - 1} (or -{count} to -1)" if count else "none"
        raise ValueError(
            f"{transform}: donate_argnums={donate!r} holds {outside[0]}, but {name} takes "
            f"{count} positional argument(s): the valid positions are {valid}."
        )
    return frozenset(p % count for p in positions)
