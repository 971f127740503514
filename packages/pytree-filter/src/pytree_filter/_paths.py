"""Paths into pytrees: JAX key paths as plain keys (`path_keys`), and as text (`path_text`)."""

from collections.abc import Sequence
from typing import Any

from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

Path = tuple[Any, ...]
"""A path as plain keys, outermost first: `('layers', 0, 'weight')`."""


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


def path_text(path: Sequence[Any], *, root: str = "the top level") -> str:
    """A path as text, the way every message of these packages shows one: `.layers[0].w`.

    A plain string key that is a Python identifier reads as an attribute (`.w`), any other
    plain key as an index (`[0]`, `['a b']`). Entries of a JAX key path keep what they say,
    as `jax.tree_util.keystr` prints them (`GetAttrKey` reads `.w`, `DictKey` reads `['w']`,
    `SequenceKey` reads `[0]`), so a key path can be passed as it is.

    Arguments:
        path: plain keys (a `Path`), or a JAX key path.
        root: the text for the empty path, the whole tree.

    Returns:
        The path as text, or `root` when `path` is empty.

    Raises:
        TypeError: when `path` is not a sequence of keys (a single key, a string).

    Examples:
        >>> import jax
        >>> from pytree_filter import path_text
        >>> path_text(("layers", 0, "weight"))
        '.layers[0].weight'
        >>> path_text(("scores", "not an identifier"))
        ".scores['not an identifier']"
        >>> [(key_path, _)] = jax.tree_util.tree_flatten_with_path({"w": [1]})[0]
        >>> path_text(key_path)
        "['w'][0]"
        >>> path_text(())
        'the top level'
    """
    if type(path) is not tuple and (
        isinstance(path, str | bytes) or not isinstance(path, Sequence)
    ):
        raise TypeError(
            f"path_text expects a path, a sequence of keys such as ('layers', 0, 'w') or a "
            f"JAX key path; got {path!r}, a {type(path).__name__}. A single key is a path "
            f"of one: `path_text(({path!r},))`."
        )
    if not path:
        return root
    return "".join(map(_key_text, path))


def _key_text(key: Any) -> str:
    kind = type(key)
    if kind is GetAttrKey:
        return f".{key.name}"
    if kind is DictKey:
        return f"[{key.key!r}]"
    if kind is SequenceKey:
        return f"[{key.idx}]"
    if kind is FlattenedIndexKey:
        return f"[{key.key}]"
    return f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"


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
