"""Data or static: the `data`/`static` wrappers, `is_data` and `register_data_type`."""

from collections.abc import Callable
from typing import Any

import jax

from pytree_filter import SHAPED_TYPES

from ._field import field

# Arrays, and `ShapeDtypeStruct`s standing for them, are data (see pytree_filter.SHAPED_TYPES).
_ARRAY_TYPES = SHAPED_TYPES
_CONTAINER_TYPES = (list, tuple, dict)
_data_types: tuple[type, ...] = ()
# A JAX mutable array reference (`jax.new_ref`) is data, as in Flax NNX: plain `jax.jit`
# then receives it as an argument, writes into it in place. (Compared by type: the
# `isinstance` check of `jax.Ref` costs a microsecond; a traced ref is an array already.)
_REF_TYPE: Any = getattr(jax, "Ref", None)
_NO_VALUE = object()


def is_array(x: Any) -> bool:
    """Whether `x` is a JAX or NumPy array (tracers and `ShapeDtypeStruct` included)."""
    return isinstance(x, _ARRAY_TYPES)


def register_data_type(cls: type) -> type:
    """Make instances of `cls` count as data when a Module infers an attribute's status.

    Arguments:
        cls: the type to register (usually a pytree node type holding arrays).

    Returns:
        `cls` itself, so this works as a class decorator.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import is_data, register_data_type
        >>> @register_data_type
        ... class Box:
        ...     def __init__(self, value):
        ...         self.value = value
        >>> is_data(Box(jnp.zeros(2)))
        True
    """
    global _data_types
    if not isinstance(cls, type):
        raise TypeError(f"register_data_type expects a class, got {cls!r}.")
    if cls not in _data_types:
        _data_types = (*_data_types, cls)
    return cls


def is_data(x: Any) -> bool:
    """Whether a value assigned to an unannotated Module attribute is inferred as data.

    Data: JAX and NumPy arrays, JAX mutable array references (`jax.new_ref`), Modules,
    registered data types (`register_data_type`), lists, tuples and dicts holding any of
    those (at any depth), and empty lists, tuples and dicts (also nested ones such as
    `[[], {}]`: they hold no leaves, so being data costs nothing, and what is added to
    them later is seen by JAX). Everything else (ints, floats, strings, callables,
    dtypes, ...), and containers holding only such values, is static.

    Arguments:
        x: any value.

    Returns:
        `True` if `x` would be a pytree child, `False` if it would live in the treedef.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import is_data
        >>> is_data(jnp.zeros(3)), is_data([1, jnp.zeros(3)]), is_data(42), is_data("hi")
        (True, True, False, False)
        >>> is_data([]), is_data({}), is_data([1, 2])
        (True, True, False)
    """
    return _holds_data(x) or _holds_nothing(x)


def _holds_data(x: Any) -> bool:
    """Whether `x` is, or contains at any depth, an array, Module or registered data type."""
    if isinstance(x, _ARRAY_TYPES) or (_data_types and isinstance(x, _data_types)):
        return True
    if type(x) is _REF_TYPE:
        return True
    if isinstance(x, dict):
        return any(_holds_data(v) for v in x.values())
    if isinstance(x, list | tuple):
        return any(_holds_data(v) for v in x)
    return False


def _holds_nothing(x: Any) -> bool:
    """Whether `x` is a list, tuple or dict with no values but (nested) empty ones.

    An empty container nested next to values (`{"layers": [], "act": "relu"}`) does not
    make the whole value data: that would turn `"relu"` into a leaf.
    """
    if isinstance(x, dict):
        return all(_holds_nothing(v) for v in x.values())
    if isinstance(x, list | tuple):
        return all(_holds_nothing(v) for v in x)
    return False


def contains_array(x: Any) -> bool:
    """Whether any leaf of the pytree `x` is an array."""
    if isinstance(x, _ARRAY_TYPES):
        return True
    try:
        leaves = jax.tree_util.tree_leaves(x)
    except Exception:
        return False
    return any(isinstance(leaf, _ARRAY_TYPES) for leaf in leaves)


class StatusWrapper:
    """A value tagged by `data(...)` or `static(...)`; unwrapped on assignment."""

    __slots__ = ("is_data", "value")

    def __init__(self, value: Any, is_data: bool):
        self.value = value
        self.is_data = is_data

    def __repr__(self) -> str:
        return f"{'data' if self.is_data else 'static'}({self.value!r})"


def contains_wrapper(x: Any) -> bool:
    """Whether a `data(...)`/`static(...)` wrapper hides inside a container."""
    if isinstance(x, StatusWrapper):
        return True
    if isinstance(x, dict):
        return any(contains_wrapper(v) for v in x.values())
    if isinstance(x, list | tuple | set | frozenset):
        return any(contains_wrapper(v) for v in x)
    return False


def _wrap_or_declare(value: Any, is_data_: bool, field_kwargs: dict[str, Any]) -> Any:
    name = "data" if is_data_ else "static"
    if value is _NO_VALUE:
        return field(static=not is_data_, **field_kwargs)
    if field_kwargs:
        raise TypeError(
            f"{name}(value) wraps a value on assignment and takes no options; got "
            f"{sorted(field_kwargs)}. To declare a field with options, call it without a "
            f"value: `x: int = {name}(default=...)`."
        )
    if isinstance(value, StatusWrapper):
        raise ValueError(f"{name}(...) was applied to an already wrapped value {value!r}.")
    return StatusWrapper(value, is_data_)


def data(value: Any = _NO_VALUE, /, **field_kwargs: Any) -> Any:
    """Mark a Module attribute as data (a pytree child), overriding inference.

    Two uses. On assignment, `self.x = data(value)` forces the status of `x` to data, e.g.
    for a Python float that should be traced or differentiated. Without a value, as a class
    attribute, `x: int = data(default=0)` declares a data field (`field` options accepted).

    Arguments:
        value: the value to assign (omit to declare a field).
        **field_kwargs: `default`, `default_factory`, `init`, `repr`, `kw_only`,
            `converter`, `metadata` when declaring a field.

    Returns:
        A wrapper that Module assignment unwraps, or a `dataclasses.Field`.

    Examples:
        >>> import jax
        >>> from pytree_module import Module, data
        >>> class Counter(Module):
        ...     def __init__(self):
        ...         self.count = data(0)
        >>> jax.tree.leaves(Counter())
        [0]
    """
    return _wrap_or_declare(value, True, field_kwargs)


def static(value: Any = _NO_VALUE, /, **field_kwargs: Any) -> Any:
    """Mark a Module attribute as static (part of the treedef), overriding inference.

    On assignment, `self.x = static(value)` forces `x` to be static; it is an error if
    `value` holds arrays. Without a value, `s: str = static(default="hi", kw_only=True)`
    declares a static field.

    Arguments:
        value: the value to assign (omit to declare a field).
        **field_kwargs: `field` options when declaring a field.

    Returns:
        A wrapper that Module assignment unwraps, or a `dataclasses.Field`.

    Examples:
        >>> import jax
        >>> from pytree_module import Module, static
        >>> class Shapes(Module):
        ...     def __init__(self):
        ...         self.sizes = static([8, 16])
        >>> jax.tree.leaves(Shapes())
        []
    """
    return _wrap_or_declare(value, False, field_kwargs)


def check_static_value(value: Any, describe: Callable[[], str]) -> None:
    """Raise `ValueError` if `value` cannot be a static attribute (arrays, unhashable)."""
    if contains_array(value):
        raise ValueError(
            f"{describe()} is static but its value holds arrays: {_short(value)}.\n"
            "Static values live in the treedef and are never traced. Either:\n"
            "  1. make it data: assign it wrapped as `data(...)`, or annotate the field "
            "without `static=True`;\n"
            "  2. or remove the arrays from the value."
        )
    try:
        hash_static(value)
    except TypeError as error:
        raise ValueError(
            f"{describe()} is static, so its value must be hashable, but {_short(value)} "
            f"is not ({error}). Use a tuple or frozenset, a list/dict/set of hashable "
            "values, or make it data with `data(...)`."
        ) from None


def hash_static(value: Any) -> int:
    """Hash a static value, by content for lists, dicts and sets."""
    return hash(freeze(value))


def freeze(value: Any) -> Any:
    """A hashable stand-in for a list/dict/set of hashable values (else the value)."""
    if isinstance(value, list):
        return (list, tuple(freeze(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, set):
        return (set, frozenset(value))
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
