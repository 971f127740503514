"""`static_argnums`, `static_argnames` and `donate_argnames` of the graph `jit`s.

Graph mode hands `jax.jit` the call's structure and values, not the user's arguments, so
these options are resolved here, once, against the function's signature (as `jax.jit`
does: numbers give names, and names give numbers, where the parameter can be passed
either way). A call then takes its static arguments out of the arguments it lifts (each
leaves `None` in its place) and passes them to `jax.jit` as one static argument: they are
hashed and compared with `==`, as `jax.jit`'s, and a new value traces anew.
"""

from collections.abc import Callable
from typing import Any

from ._boundary import holds_graph_nodes
from ._errors import Signature, resolve_argnums

# `donate_argnums` not given (None, `jax.jit`'s default, means the same).
NOT_GIVEN: Any = object()


class StaticArguments:
    """The static arguments of a graph `jit`: where they are, and how a call takes them
    out of the arguments it lifts and puts them back inside.

    Attributes:
        positions: the positions of the static positional arguments, in order.
        names: the names of the static keyword arguments, in order.
    """

    __slots__ = ("fun_name", "labels", "names", "positions", "transform")

    def __init__(self, positions: frozenset[int], names: frozenset[str], fun: Any, transform: str):
        self.positions = tuple(sorted(positions))
        self.names = tuple(sorted(names))
        self.fun_name = getattr(fun, "__name__", type(fun).__name__)
        self.transform = transform
        # The parameter name of each static position, to name it in errors.
        names_at = Signature(fun).names
        self.labels = {p: names_at[p] for p in self.positions if p < len(names_at)}

    def split(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any], tuple]:
        """A call's arguments without the static ones (`None` in their places), and the
        static ones: `(args, kwargs, statics)`, `statics` a hashable tuple if they are."""
        count = len(args)
        at = [p for p in self.positions if p < count]
        if at:
            values = [args[p] for p in at]
            args = list(args)
            for p in at:
                args[p] = None
            args = tuple(args)
        else:
            values = []
        if kwargs and any(n in kwargs for n in self.names):
            kwargs = dict(kwargs)
            named = tuple((n, kwargs.pop(n)) for n in self.names if n in kwargs)
        else:
            named = ()
        return args, kwargs, (tuple(values), named)

    def insert(self, args: tuple, kwargs: dict[str, Any], statics: tuple) -> tuple[tuple, dict]:
        """The arguments (rebuilt inside) with the static ones back in their places."""
        values, named = statics
        if values:
            args = list(args)
            # Positions are in order, so the ones present are the first `len(values)`.
            for p, value in zip(self.positions, values, strict=False):
                args[p] = value
            args = tuple(args)
        if named:
            kwargs = {**kwargs, **dict(named)}
        return args, kwargs

    def check(self, statics: tuple) -> None:
        """Refuse a static argument that holds a Module or Variable, or is not hashable,
        naming it.

        Raises:
            ValueError: naming the argument and what to do.
        """
        values, named = statics
        for at, value in zip(self.positions, values, strict=False):
            self.check_value(at, value)
        for at, value in named:
            self.check_value(at, value)

    def check_value(self, at: int | str, value: Any) -> None:
        """Refuse the static argument at position or name `at` if it holds a Module or
        Variable or is not hashable (see `check`)."""
        where = f"{self.transform}({self.fun_name})"
        name = self.labels.get(at) if type(at) is int else None
        label = f"argument {at!r}" if name is None else f"argument {at} ({name!r})"
        # ValueError, as `jax.jit` and Flax NNX raise for a static argument they refuse.
        if holds_graph_nodes(value):
            raise ValueError(
                f"{where}: the static {label} is or holds a Module or Variable. Static "
                "arguments are hashed and kept in the compiled program's key, so their "
                "changes would not be written back: pass Modules and Variables as "
                "ordinary arguments (graph mode lifts them), and take the argument out "
                "of static_argnums / static_argnames."
            )
        try:
            hash(value)
        except TypeError:
            raise ValueError(
                f"{where}: the static {label} is of type {type(value).__name__}, which is not "
                "hashable. Static arguments are hashed and compared with `==` to find "
                "the compiled program: pass a hashable value (a tuple instead of a "
                "list), or pass arrays as ordinary (traced) arguments and take the "
                "argument out of static_argnums / static_argnames."
            ) from None


def with_static_entries(in_shardings: Any, static_positions: Any) -> Any:
    """`in_shardings` with a `None` entry at each static position (in increasing order)
    where it is a tuple with one per positional argument: as `jax.jit`'s, it has none for
    them (the function compiled holds `None` in their places, laid out by no sharding)."""
    if not isinstance(in_shardings, tuple | list) or not static_positions:
        return in_shardings
    expanded = list(in_shardings)
    for position in static_positions:
        expanded.insert(position, None)
    return tuple(expanded)


def static_arguments(
    fun: Callable[..., Any], argnums: Any, argnames: Any, transform: str
) -> StaticArguments | None:
    """A graph `jit`'s `static_argnums` and `static_argnames`, resolved against `fun`'s
    signature; None where there are none.

    Raises:
        TypeError: an option of the wrong type.
        ValueError: a position or name `fun` does not have.
    """
    positions, names = resolve_argnums(fun, argnums, argnames, "static", transform)
    if not positions and not names:
        return None
    return StaticArguments(positions, names, fun, transform)


def donated_arguments(
    fun: Callable[..., Any],
    argnums: Any,
    argnames: Any,
    transform: str,
    static: StaticArguments | None = None,
) -> frozenset[int | str]:
    """A graph `jit`'s `donate_argnums` (`NOT_GIVEN` or None where it was not) and
    `donate_argnames`: the positions and names of the arguments donated (each inferred
    from the other where only one is given).

    Raises:
        TypeError: an option of the wrong type.
        ValueError: a position or name `fun` does not have, or an argument both static
            and donated.
    """
    if argnums is None or argnums is NOT_GIVEN:
        # `jax.jit`'s default, None, is "not given" too: inferred from the names.
        argnums = () if argnames is None else None
    positions, names = resolve_argnums(fun, argnums, argnames, "donate", transform)
    if static is not None:
        both = sorted(positions.intersection(static.positions), key=str) + sorted(
            names.intersection(static.names)
        )
        if both:
            raise ValueError(
                f"{transform}: argument {both[0]!r} is both static and donated. A static "
                "argument is not passed to the compiled program, so it has no buffers to "
                "donate: take it out of one of the options."
            )
    return frozenset(positions) | frozenset(names)
