"""Checks of a graph transform's arguments, shared by the transforms, with their messages."""

from typing import Any


def check_callable(fun: Any, transform: str) -> None:
    """Refuse a `fun` that is not callable, naming `transform` (before anything runs).

    Raises:
        TypeError: `fun` is not callable.
    """
    if not callable(fun):
        raise TypeError(f"{transform} expects a function, got {type(fun).__name__}: {fun!r}.")
