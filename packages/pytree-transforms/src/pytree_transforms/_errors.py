"""Error helpers shared by the filtered transforms."""

from typing import Any

import jax

from pytree_filter import path_keys
from pytree_module import Module


def describe_leaf(tree: Any, index: int, names: tuple[str, ...]) -> str:
    """Name the leaf at flat `index` of `tree` (a tuple), e.g. `args[0].weight`."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if index >= len(paths):
        return f"leaf {index}"
    keys = path_keys(paths[index])
    text = names[keys[0]] if keys and isinstance(keys[0], int) and keys[0] < len(names) else ""
    for key in keys[1:]:
        text += f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
    return f"the leaf at {text or 'the top level'}"


def check_pytree_objects(values: tuple[Any, ...], transform: str) -> None:
    """Refuse `pytree=False` Modules: they are graph objects, not pytrees."""
    for value in values:
        if isinstance(value, Module) and not type(value).__module_pytree__:
            kind = type(value).__name__
            raise TypeError(
                f"{transform} got a {kind}, which is declared `pytree=False`: it is not a "
                "pytree, so a filtered transform cannot see its arrays. Use the graph "
                f"transforms of pytree_graph (e.g. pytree_graph.jit), or declare {kind} "
                "without `pytree=False`."
            )
