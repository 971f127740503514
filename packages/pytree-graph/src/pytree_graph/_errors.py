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


def donated_positions(
    donate: Any, fun: Any, transform: str, option: str = "donate_argnums"
) -> frozenset[int]:
    """`donate_argnums` (or another `*_argnums` option, named `option` in the errors) as a
    set of positions of `fun`'s positional arguments, checked when the transform is made
    (as `jax.jit` does); a negative one counts from the end.

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
            f"{transform}: {option} must be an int or a tuple of ints, the positions of the "
            f"function's positional arguments; got {donate!r}."
        )
    count = Signature(fun).count
    if count is None:
        negative = [p for p in positions if p < 0]
        if negative:
            raise ValueError(
                f"{transform}: {option}={donate!r} holds {negative[0]}, a position "
                "counted from the end, but the function takes any number of positional "
                "arguments (`*args`): give positions counted from 0."
            )
        return frozenset(positions)
    outside = [p for p in positions if not -count <= p < count]
    if outside:
        name = getattr(fun, "__name__", type(fun).__name__)
        valid = f"0 to {count - 1} (or -{count} to -1)" if count else "none"
        raise ValueError(
            f"{transform}: {option}={donate!r} holds {outside[0]}, but {name} takes "
            f"{count} positional argument(s): the valid positions are {valid}."
        )
    return frozenset(p % count for p in positions)


class Signature:
    """What `*_argnums` and `*_argnames` options need of a function's signature."""

    __slots__ = ("count", "keyword_names", "names", "takes_any_keyword")

    def __init__(self, fun: Any):
        try:
            parameters = list(inspect.signature(fun).parameters.values())
        except (TypeError, ValueError):
            parameters = None
        # `names[i]`: the name positional argument i can also be passed by (None: none).
        self.names: list[str | None] = []
        self.keyword_names: set[str] = set()
        self.count: int | None = 0  # None: any number (`*args`), or unknown
        self.takes_any_keyword = parameters is None
        for parameter in parameters or ():
            kind = parameter.kind
            if kind is parameter.VAR_POSITIONAL:
                self.count = None
            elif kind is parameter.VAR_KEYWORD:
                self.takes_any_keyword = True
            elif kind is parameter.KEYWORD_ONLY:
                self.keyword_names.add(parameter.name)
            else:
                if self.count is not None:
                    self.count += 1
                is_keyword = kind is parameter.POSITIONAL_OR_KEYWORD
                self.names.append(parameter.name if is_keyword else None)
                if is_keyword:
                    self.keyword_names.add(parameter.name)
        if parameters is None:
            self.count = None

    def position_of(self, name: str) -> int | None:
        return self.names.index(name) if name in self.names else None

    def name_at(self, position: int) -> str | None:
        return self.names[position] if position < len(self.names) else None


def _names(value: Any, option: str, transform: str) -> tuple[str, ...]:
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else value
    try:
        names = tuple(names)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"{transform}: {option} must be a str or a sequence of str, the names of the "
            f"function's parameters; got {value!r}."
        )
    return names


def _check_names(
    names: tuple[str, ...], signature: Signature, option: str, fun: Any, transform: str
) -> None:
    if signature.takes_any_keyword:
        return
    unknown = [n for n in names if n not in signature.keyword_names]
    if unknown:
        name = getattr(fun, "__name__", type(fun).__name__)
        known = ", ".join(sorted(signature.keyword_names)) or "none"
        raise ValueError(
            f"{transform}: {option} names {unknown[0]!r}, but {name} has no parameter of "
            f"that name that can be passed by keyword (those it has: {known})."
        )


def resolve_argnums(
    fun: Any, argnums: Any, argnames: Any, option: str, transform: str
) -> tuple[frozenset[int], frozenset[str]]:
    """`<option>_argnums` and `<option>_argnames` (`option`: "static" or "donate") as
    positions and names of `fun`'s arguments, each inferred from the other where only one
    is given (as `jax.jit` does), checked against `fun`'s signature.

    Raises:
        TypeError: an option of the wrong type.
        ValueError: a position or name `fun` does not have.
    """
    signature = Signature(fun)
    names = _names(argnames, f"{option}_argnames", transform)
    _check_names(names, signature, f"{option}_argnames", fun, transform)
    if argnums is None:
        positions = frozenset()
    else:
        positions = donated_positions(argnums, fun, transform, f"{option}_argnums")
    if argnums is None and names:
        positions = frozenset(p for p in map(signature.position_of, names) if p is not None)
    elif argnums is not None and argnames is None:
        names = tuple(n for n in map(signature.name_at, positions) if n is not None)
    return positions, frozenset(names)
