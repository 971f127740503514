"""Normalising JAX key paths to plain keys."""

from collections.abc import Sequence
from typing import Any

from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

Path = tuple[Any, ...]


def path_keys(key_path: Sequence[Any]) -> Path:
    """Turn a JAX key path into a tuple of plain keys, the form filter objects see.

    `GetAttrKey` becomes its attribute name, `DictKey` its key, `SequenceKey` its index and
    `FlattenedIndexKey` its index; any other entry is kept as it is.

    Arguments:
        key_path: a key path from `jax.tree_util.tree_flatten_with_path`.

    Returns:
        A tuple such as `('layers', 0, 'weight')`.

    Examples:
        >>> import jax
        >>> from pytree_filter import path_keys
        >>> [(path, leaf)] = jax.tree_util.tree_flatten_with_path({"a": [1]})[0]
        >>> path_keys(path)
        ('a', 0)
    """
    return tuple(_plain(entry) for entry in key_path)


def _plain(entry: Any) -> Any:
    kind = type(entry)
    if kind is GetAttrKey:
        return entry.name
    if kind is DictKey:
        return entry.key
    if kind is SequenceKey:
        return entry.idx
    if kind is FlattenedIndexKey:
        return entry.key
    return entry
