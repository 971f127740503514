"""A State as plain nested dicts of arrays, and back: the form checkpoint libraries save."""

from collections.abc import Mapping
from typing import Any

from ._pure_values import write_pure_dict
from ._state import State


def _check_state(state: Any, function: str) -> None:
    if not isinstance(state, State):
        raise TypeError(
            f"{function} expects a State as its first argument `state`, got a "
            f"{type(state).__name__}. Take the State of a model with "
            "`pytree_graph.state(model)` (or from `split`)."
        )


def to_pure_dict(state: State) -> dict[Any, Any]:
    """The values of a State as plain nested dicts: each Variable replaced by its `.value`.

    The keys are the State's (attribute names, and list positions as ints). The result
    holds no Variables, so any checkpoint library can save it; `replace_by_pure_dict`
    writes such dicts back. PRNG keys (the streams of `Rngs`) stay typed keys, as in
    Flax NNX; for a format without key dtypes, save their `jax.random.key_data`, which
    `replace_by_pure_dict` and `update` take back in their place.

    Arguments:
        state: a State, from `state(model)` or `split`.

    Returns:
        Nested dicts of arrays (or whatever the Variables hold).

    Raises:
        TypeError: `state` is not a State.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, state, to_pure_dict
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> to_pure_dict(state(Linear()))
        {'w': Array([1., 1.], dtype=float32)}
    """
    _check_state(state, "to_pure_dict")
    return state.to_pure_dict()


def replace_by_pure_dict(state: State, pure_dict: Mapping[Any, Any]) -> None:
    """Write the values of plain nested dicts (`to_pure_dict`'s form) into a State, in place.

    Each Variable of the State gets the new value (`variable.value = new`), so a State
    from `state(model)` writes into `model` itself; a bare array in the State is
    replaced in the State. Every entry is checked before anything is written: on an error,
    nothing has changed. Digit-string keys (`"0"`, as some checkpoint formats save list
    positions) match the State's int keys. In the place of PRNG keys, give keys of the
    same implementation, or their data (`jax.random.key_data`): it becomes keys of the
    implementation of those it replaces.

    Arguments:
        state: a State, from `state(model)` or `split`.
        pure_dict: nested dicts with exactly the State's paths, holding values of the
            same shapes and dtypes.

    Returns:
        None; `state` (and the Variables it holds) is changed.

    Raises:
        TypeError: `state` is not a State, or `pure_dict` is not a mapping.
        ValueError: a path of the State is missing from `pure_dict`, `pure_dict` has a
            path the State lacks, or a value's shape or dtype differs from the State's
            (for PRNG keys: neither keys of the same implementation nor their data).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, replace_by_pure_dict, state, to_pure_dict
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> model = Linear()
        >>> replace_by_pure_dict(state(model), {"w": jnp.zeros(2)})
        >>> model.w.value
        Array([0., 0.], dtype=float32)
    """
    _check_state(state, "replace_by_pure_dict")
    write_pure_dict(state, pure_dict, "replace_by_pure_dict")
