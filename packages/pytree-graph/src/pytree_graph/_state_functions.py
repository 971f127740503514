"""Functions on States, under Flax NNX's names: `to_flat_state`, `filter_state`,
`split_state`, and the annotation aliases `PureState` and `A`."""

from collections.abc import Mapping
from typing import Any, TypeVar

from ._flat_state import FlatState
from ._graphdef import GraphDef
from ._state import State

A = TypeVar("A")
"""A type variable for annotations such as `Variable[A]`, as Flax NNX's `nnx.A`."""

Node = TypeVar("Node")

PureState = tuple[GraphDef[Node], State]
"""The annotation of what `split(node)` returns with no filter: `(graphdef, state)`.
`PureState[MyModel]` is the pair for a `MyModel`, as Flax NNX's `nnx.PureState`."""


def _as_state(state: Any, function: str) -> State:
    if isinstance(state, State):
        return state
    if isinstance(state, Mapping):
        return State(state)
    raise TypeError(
        f"{function} expects a State (from `split` or `state`), got a "
        f"{type(state).__name__}. Take the State of a graph with `pytree_graph.state(node)`."
    )


def to_flat_state(state: Any) -> FlatState:
    """A State's leaves with their paths, as a flat sequence of `(path, leaf)` pairs.

    The same as `State.flat_state`, as a `FlatState` (a pytree and a sequence, with
    `.paths` and `.leaves`), as Flax NNX's `nnx.to_flat_state`. `len` of it counts the
    leaves: a Variable shared in the graph is one leaf of its State.

    Arguments:
        state: a `State` (or a nested dict of leaves).

    Returns:
        The `FlatState`, its pairs in the State's order.

    Raises:
        TypeError: `state` is not a State or a mapping.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, split, to_flat_state
        >>> shared = Param(jnp.ones(2))
        >>> graphdef, state = split([shared, shared])
        >>> flat = to_flat_state(state)
        >>> len(flat), flat.paths, flat.leaves[0] is shared
        (1, ((0,),), True)
    """
    flat = _as_state(state, "to_flat_state").flat_state()
    return FlatState(tuple(flat), list(flat.values()))


def filter_state(state: Any, first: Any, /, *filters: Any) -> Any:
    """The leaves of a State matching each filter, one State per filter (leaves matching
    none are left out): `State.filter` as a function, as Flax NNX's `nnx.filter_state`.

    Arguments:
        state: a `State` (or a nested dict of leaves).
        first: a filter (a Variable type, `...`, a filter object, a predicate).
        *filters: more filters; a leaf goes to the first it matches.

    Returns:
        A State, or a tuple of States with several filters.

    Raises:
        TypeError: `state` is not a State or a mapping.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import BatchStat, Param, State, filter_state
        >>> state = State({"w": Param(jnp.ones(1)), "mean": BatchStat(jnp.zeros(1))})
        >>> list(filter_state(state, Param))
        ['w']
    """
    return _as_state(state, "filter_state").filter(first, *filters)


def split_state(state: Any, first: Any, /, *filters: Any) -> Any:
    """A State split by filters, one State per filter, every leaf matching one (end with
    `...` for the rest): `State.split` as a function, as Flax NNX's `nnx.split_state`.

    Arguments:
        state: a `State` (or a nested dict of leaves).
        first: a filter.
        *filters: more filters; a leaf goes to the first it matches.

    Returns:
        A State, or a tuple of States with several filters.

    Raises:
        TypeError: `state` is not a State or a mapping.
        ValueError: a leaf matches no filter (the message names its path), or `...` is
            not the last filter.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import BatchStat, Param, State, split_state
        >>> state = State({"w": Param(jnp.ones(1)), "mean": BatchStat(jnp.zeros(1))})
        >>> params, rest = split_state(state, Param, ...)
        >>> list(params), list(rest)
        (['w'], ['mean'])
    """
    return _as_state(state, "split_state").split(first, *filters)
