"""The nodes of a pytree: `tree_flatten_one_level` and `tree_check`."""

from collections.abc import Callable
from typing import Any, NoReturn

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import path_text

KeyPath = tuple[Any, ...]
# Stands in `tree_check`'s stack for the moment it is done with the node of that id.
_LEAVING = object()


def tree_flatten_one_level(tree: Any) -> tuple[list[Any], PyTreeDef]:
    """The immediate children of a pytree node, and the structure that holds them.

    As `jax.tree_util.tree_flatten`, but stopping one level down: each child is returned
    whole, however deep it is. A leaf is its own only child: `tree_flatten_one_level(x)`
    is `([x], PyTreeDef(*))`. `None` and empty containers have no children.

    Arguments:
        tree: a pytree node (a Module, dict, list, tuple, `None`, any registered node) or
            a leaf.

    Returns:
        `(children, treedef)`; `jax.tree.unflatten(treedef, children)` rebuilds `tree`.

    Raises:
        ValueError: `tree` holds itself as one of its children (`x = []; x.append(x)`).

    Examples:
        >>> from pytree_module import tree_flatten_one_level
        >>> tree_flatten_one_level({"a": 3, "b": (1, 2)})
        ([3, (1, 2)], PyTreeDef({'a': *, 'b': *}))
        >>> tree_flatten_one_level(4)
        ([4], PyTreeDef(*))
    """
    children, treedef = jax.tree.flatten(tree, is_leaf=_children_of(tree))
    # A leaf is its own child; a node holding itself has more than the one node.
    if treedef.num_nodes > 1 and any(child is tree for child in children):
        keyed, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_children_of(tree))
        where = next(path for path, child in keyed if child is tree)
        raise ValueError(
            f"tree_flatten_one_level: the {type(tree).__name__} passed holds itself at "
            f"{path_text(where)}. A pytree cannot contain itself (as in `x = []; "
            "x.append(x)`): JAX would flatten it forever. Remove that reference, or keep "
            "it out of the pytree."
        )
    return children, treedef


def tree_check(tree: Any) -> None:
    """Check that no node of a pytree appears twice in it, nor inside itself.

    JAX does not keep shared objects: flattening and unflattening a pytree (as crossing
    `jax.jit` does) turns an object held at two places into two separate copies. Call this
    to make sure a pytree has no such sharing before it meets a transform.

    Only nodes with children count. Leaves (arrays, numbers, ...), `None`, empty
    containers and Modules without data fields may appear any number of times: they hold
    no data that separate copies could disagree on. A node that is merely equal to another
    (`[[1], [1]]`) is not a repeat.

    Arguments:
        tree: the pytree to check.

    Returns:
        None when every node is held once.

    Raises:
        ValueError: a node is held at two paths (the message names both), or a node holds
            itself (the message names where it is and where it recurs).

    Examples:
        >>> from pytree_module import tree_check
        >>> shared = [1.0]
        >>> tree_check({"a": [1.0], "b": [1.0]})
        >>> tree_check({"a": shared, "b": shared})
        Traceback (most recent call last):
        ...
        ValueError: tree_check: the same list object is at ['a'] and at ['b']...
    """
    # Holding each node (not only its id) keeps its id from being reused by a temporary
    # child that some node's flatten builds, which would look like a repeat.
    first_seen: dict[int, tuple[Any, KeyPath]] = {}
    ancestors: set[int] = set()
    # An explicit stack, not recursion, so a deep pytree does not reach Python's limit.
    pending: list[tuple[Any, KeyPath, int]] = [(tree, (), id(tree))]
    while pending:
        node, path, node_id = pending.pop()
        if node is _LEAVING:
            ancestors.discard(node_id)
            continue
        keyed, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=_children_of(node))
        # One node in the structure: a leaf, or a node without children (`None`, `[]`), of
        # which no copy could differ from another.
        if treedef.num_nodes == 1:
            continue
        if node_id in first_seen:
            _, first_path = first_seen[node_id]
            _raise_repeat(node, first_path, path, is_cycle=node_id in ancestors)
        first_seen[node_id] = (node, path)
        ancestors.add(node_id)
        pending.append((_LEAVING, path, node_id))
        pending.extend((child, path + key, id(child)) for key, child in reversed(keyed))


def _raise_repeat(node: Any, first: KeyPath, second: KeyPath, *, is_cycle: bool) -> NoReturn:
    """Raise the `tree_check` error for a node met at `first` and again at `second`."""
    kind = type(node).__name__
    if is_cycle:
        raise ValueError(
            f"tree_check: the {kind} at {path_text(first)} contains itself again at "
            f"{path_text(second)}. A pytree cannot hold a cycle: JAX would flatten it "
            f"forever. Remove the reference at {path_text(second)}, or keep it out of the "
            "pytree."
        )
    raise ValueError(
        f"tree_check: the same {kind} object is at {path_text(first)} and at "
        f"{path_text(second)}. JAX does not keep shared objects: flattening and "
        "unflattening (e.g. crossing `jax.jit`) makes them two separate copies, and a "
        "change made through one path no longer shows through the other. Give each place "
        f"its own {kind}, or, to share it on purpose, use the transforms of pytree_graph, "
        "which keep sharing."
    )


def _children_of(node: Any) -> Callable[[Any], bool]:
    """An `is_leaf` that lets JAX flatten `node` itself and nothing below it."""
    entered = False

    def is_leaf(x: Any) -> bool:
        nonlocal entered
        # JAX asks about the root first; asked again, `node` is its own child, a leaf.
        if x is node and not entered:
            entered = True
            return False
        return True

    return is_leaf
