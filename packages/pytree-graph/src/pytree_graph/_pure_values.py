"""Plain values checked against a State's paths, shapes and dtypes, and written into it:
what `replace_by_pure_dict` and `update` with a pure dict share. It sees a State only
through its methods (`flat_state`, indexing), so `State` itself can use it."""

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from pytree_filter import Path, path_text

from ._variables import Variable, _guard


def _flatten_plain(mapping: Mapping[Any, Any], prefix: Path, flat: dict[Path, Any]) -> None:
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            _flatten_plain(value, (*prefix, key), flat)
        else:
            flat[(*prefix, key)] = value


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


def _is_key(dtype: Any) -> bool:
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _same_dtype(old: Any, new: Any) -> bool:
    # PRNG key dtypes (`key<fry>`) are JAX's own, which NumPy cannot interpret.
    if _is_key(old) or _is_key(new):
        return old == new
    return np.dtype(old) == new


def _mismatch(path: Path, old: Any, new: Any) -> str | None:
    """Why `new` cannot replace `old` at `path`, or None if it can."""
    old_shape, old_dtype = _shape_and_dtype(old)
    new_shape, new_dtype = _shape_and_dtype(new)
    if old_shape != new_shape:
        return f"at {path_text(path)}: shape {new_shape} where the State has {old_shape}"
    # A Python number has no dtype of its own: JAX gives it the array's.
    if old_dtype is not None and new_dtype is not None and not _same_dtype(old_dtype, new_dtype):
        return f"at {path_text(path)}: dtype {new_dtype} where the State has {old_dtype}"
    return None


def _as_keys(path: Path, old: Any, new: Any) -> tuple[Any, str | None]:
    """`new` as PRNG keys in the place of the keys `old`: keys as they are, or their data
    (`jax.random.key_data`, what a format without key dtypes saves) wrapped with `old`'s
    implementation; and why it cannot be, or None."""
    new_shape, new_dtype = _shape_and_dtype(new)
    if _is_key(new_dtype) or not isinstance(old, jax.Array):
        return new, _mismatch(path, old, new)
    data = jax.random.key_data(old)
    if new_dtype is not None and np.dtype(new_dtype) == data.dtype and new_shape == data.shape:
        return jax.random.wrap_key_data(new, impl=jax.random.key_impl(old)), None
    return new, (
        f"at {path_text(path)}: {new_dtype}{list(new_shape)} where the State has PRNG keys "
        f"{old.dtype}{list(old.shape)}; give keys, or their data "
        f"(`jax.random.key_data`: {data.dtype}{list(data.shape)})"
    )


def checked_pure_dict(
    current: Mapping[Path, Any], pure_dict: Any, function: str, *, partial: bool
) -> dict[Path, Any]:
    """`pure_dict` as `{path: value}` with `current`'s paths, once its paths, shapes and
    dtypes are checked against `current` (a State's `flat_state()`).

    Digit-string keys match int keys. With `partial`, `pure_dict` may leave paths out. In
    the place of PRNG keys, keys of the same implementation, or their data
    (`jax.random.key_data`), which is wrapped into keys of that implementation.

    Raises:
        TypeError: `pure_dict` is not a mapping.
        ValueError: a path `current` lacks (or, unless `partial`, one it has that
            `pure_dict` lacks), or a value of another shape or dtype.
    """
    if not isinstance(pure_dict, Mapping):
        raise TypeError(
            f"{function} expects nested dicts as `pure_dict` (as `to_pure_dict` "
            f"returns), got a {type(pure_dict).__name__}."
        )
    given: dict[Path, Any] = {}
    _flatten_plain(pure_dict, (), given)
    new = {_as_state_path(path, current): value for path, value in given.items()}
    extra = [path_text(p) for p in new if p not in current]
    missing = [] if partial else [path_text(p) for p in current if p not in new]
    if extra or missing:
        raise ValueError(
            f"{function}: `pure_dict` does not have the State's paths. "
            + (f"Not in the State: {', '.join(extra)}. " if extra else "")
            + (f"Missing from `pure_dict`: {', '.join(missing)}. " if missing else "")
            + "Make it with `to_pure_dict` of a State of the same model."
        )
    problems = []
    for path, value in new.items():
        leaf = current[path]
        old = leaf.value if isinstance(leaf, Variable) else leaf
        if _is_key(getattr(old, "dtype", None)):
            new[path], problem = _as_keys(path, old, value)
        else:
            problem = _mismatch(path, old, value)
        if problem is not None:
            problems.append(problem)
    if problems:
        raise ValueError(
            f"{function}: values do not fit the State, "
            + "; ".join(problems)
            + ". Cast or reshape them, or take the State of a model of the same shapes."
        )
    return new


def write_pure_dict(state: Any, pure_dict: Any, function: str) -> None:
    """Write `pure_dict` (with exactly `state`'s paths) into `state` in place, after
    checking it all (see `checked_pure_dict`): nothing changes on an error."""
    current = state.flat_state()
    new = checked_pure_dict(current, pure_dict, function, partial=False)
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
