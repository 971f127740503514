"""A State as plain nested dicts of arrays, and back: the form checkpoint libraries save."""

from collections.abc import Mapping
from typing import Any

import numpy as np

from pytree_filter import Path, path_text

from ._state import State, _flatten_into
from ._variables import Variable, _guard


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
    writes such dicts back.

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


def _as_state_path(path: Path, known: Mapping[Path, Any]) -> Path:
    """`path`, or the same path with digit strings as ints where that is a State path:
    checkpoint formats that keep only string keys turn list positions into `"0"`."""
    if path in known:
        return path
    converted = tuple(int(k) if isinstance(k, str) and k.isdigit() else k for k in path)
    return converted if converted in known else path


def _shape_and_dtype(value: Any) -> tuple[tuple[int, ...], Any]:
    shape = getattr(value, "shape", None)
    return (np.shape(value) if shape is None else tuple(shape)), getattr(value, "dtype", None)


def _mismatch(path: Path, old: Any, new: Any) -> str | None:
    """Why `new` cannot replace `old` at `path`, or None if it can."""
    old_shape, old_dtype = _shape_and_dtype(old)
    new_shape, new_dtype = _shape_and_dtype(new)
    if old_shape != new_shape:
        return f"at {path_text(path)}: shape {new_shape} where the State has {old_shape}"
    # A Python number has no dtype of its own: JAX gives it the array's.
    if old_dtype is not None and new_dtype is not None and np.dtype(old_dtype) != new_dtype:
        return f"at {path_text(path)}: dtype {new_dtype} where the State has {old_dtype}"
    return None


def replace_by_pure_dict(state: State, pure_dict: Mapping[Any, Any]) -> None:
    """Write the values of plain nested dicts (`to_pure_dict`'s form) into a State, in place.

    Each Variable of the State gets the new value (`variable.value = new`), so a State
    from `state(model)` writes into `model` itself; a bare array in the State is
    replaced in the State. Every entry is checked before anything is written: on an error,
    nothing has changed. Digit-string keys (`"0"`, as some checkpoint formats save list
    positions) match the State's int keys.

    Arguments:
        state: a State, from `state(model)` or `split`.
        pure_dict: nested dicts with exactly the State's paths, holding values of the
            same shapes and dtypes.

    Returns:
        None; `state` (and the Variables it holds) is changed.

    Raises:
        TypeError: `state` is not a State, or `pure_dict` is not a mapping.
        ValueError: a path of the State is missing from `pure_dict`, `pure_dict` has a
            path the State lacks, or a value's shape or dtype differs from the State's.

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
    if not isinstance(pure_dict, Mapping):
        raise TypeError(
            "replace_by_pure_dict expects nested dicts as `pure_dict` (as `to_pure_dict` "
            f"returns), got a {type(pure_dict).__name__}."
        )
    current = state.flat_state()
    given: dict[Path, Any] = {}
    _flatten_into(pure_dict, (), given)
    new = {_as_state_path(path, current): value for path, value in given.items()}
    extra = [path_text(p) for p in new if p not in current]
    missing = [path_text(p) for p in current if p not in new]
    if extra or missing:
        raise ValueError(
            "replace_by_pure_dict: `pure_dict` does not have the State's paths. "
            + (f"Not in the State: {', '.join(extra)}. " if extra else "")
            + (f"Missing from `pure_dict`: {', '.join(missing)}. " if missing else "")
            + "Make it with `to_pure_dict` of a State of the same model."
        )
    problems = []
    for path, leaf in current.items():
        old = leaf.value if isinstance(leaf, Variable) else leaf
        problem = _mismatch(path, old, new[path])
        if problem is not None:
            problems.append(problem)
    if problems:
        raise ValueError(
            "replace_by_pure_dict: values do not fit the State, "
            + "; ".join(problems)
            + ". Cast or reshape them, or take the State of a model of the same shapes."
        )
    for leaf in current.values():
        if isinstance(leaf, Variable):
            _guard(leaf, "set the value")
    for path, leaf in current.items():
        if isinstance(leaf, Variable):
            leaf.value = new[path]
        else:
            parent = state
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = new[path]
