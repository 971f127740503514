"""`tree_at`: out-of-place replacement of parts of a pytree."""

from collections.abc import Callable, Sequence
from typing import Any

import jax

_NOT_GIVEN = object()


class _Leaf:
    """Unique stand-in for one leaf, so `where` results can be found by identity."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _is_stand_in(x: Any) -> bool:
    return type(x) is _Leaf


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any = _NOT_GIVEN,
    replace_fn: Callable[[Any], Any] | Any = _NOT_GIVEN,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Return a copy of `pytree` with the node(s) picked by `where` replaced.

    This is how frozen Modules are updated, and works on any pytree.

    Arguments:
        where: a function taking the pytree and returning the node to replace, or a tuple
            or list of nodes. It must only navigate the pytree structure (attributes, items).
            A list or tuple that is itself a node of the pytree (`lambda m: m.layers`) is
            that one node, replaced whole; any other list or tuple (`lambda m: (m.a, m.b)`)
            means several nodes.
        pytree: the pytree to update. It is not modified.
        replace: the new value, or a sequence of new values matching `where`'s sequence.
        replace_fn: alternatively, a function from the old node to its new value.
        is_leaf: treat matching subtrees as leaves. Needed to replace a `None` (which is an
            empty node for JAX): `is_leaf=lambda x: x is None`.

    Returns:
        The updated copy.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import tree_at
        >>> tree = {"a": jnp.zeros(2), "b": [1, 2]}
        >>> tree_at(lambda t: t["b"][0], tree, 10)["b"]
        [10, 2]
        >>> tree_at(lambda t: (t["b"][0], t["b"][1]), tree, replace_fn=lambda x: -x)["b"]
        [-1, -2]
        >>> tree_at(lambda t: t["b"], tree, [7, 8, 9])["b"]
        [7, 8, 9]
    """
    if (replace is _NOT_GIVEN) == (replace_fn is _NOT_GIVEN):
        raise ValueError("tree_at needs exactly one of `replace=` or `replace_fn=`.")
    # Rebuild the tree with every leaf swapped for a unique stand-in. Unflattening makes
    # fresh node objects too, so every node `where` can return is identifiable.
    stand_ins = jax.tree.map(_Leaf, pytree, is_leaf=is_leaf)
    picked = where(stand_ins)
    # As in Equinox: a list or tuple is one node when it is found in the tree by identity
    # (every container in `stand_ins` is a fresh object), else a sequence of nodes.
    several = isinstance(picked, tuple | list) and not _is_node_of(stand_ins, picked)
    nodes: Sequence[Any] = tuple(picked) if several else (picked,)
    if replace is not _NOT_GIVEN:
        if several:
            if not isinstance(replace, tuple | list) or len(replace) != len(nodes):
                raise ValueError(
                    f"tree_at: `where` returned {len(nodes)} nodes, so `replace` must be a "
                    f"tuple or list of {len(nodes)} values; got {replace!r}."
                )
            new_values: Sequence[Any] = tuple(replace)
        else:
            new_values = (replace,)
    targets = {id(node): i for i, node in enumerate(nodes)}
    if len(targets) != len(nodes):
        raise ValueError("tree_at: `where` returned the same node more than once.")
    found = [0] * len(nodes)

    def rebuild(node: Any) -> Any:
        index = targets.get(id(node))
        if index is not None:
            found[index] += 1
            if replace is not _NOT_GIVEN:
                return new_values[index]
            return replace_fn(_restore(node))
        if _is_stand_in(node):
            return node.value
        children, treedef = jax.tree.flatten(node, is_leaf=lambda x: x is not node)
        if treedef.num_nodes == 1 and treedef.num_leaves == 0:
            return node
        return jax.tree.unflatten(treedef, [rebuild(child) for child in children])

    result = rebuild(stand_ins)
    for node, count in zip(nodes, found, strict=True):
        if count == 0:
            raise ValueError(
                f"tree_at: `where` returned {_describe(node)}, which is not a node of the "
                "pytree. `where` may only navigate the structure: static attributes are "
                "not part of the pytree, and `None` is an empty node, so to replace a "
                "`None` pass `is_leaf=lambda x: x is None`."
            )
        if count > 1:
            raise ValueError(
                f"tree_at: `where` returned {_describe(node)}, which appears "
                f"{count} times in the pytree, so the replacement is ambiguous. `None` "
                "and empty nodes such as `()` are shared objects: pass `is_leaf` to make "
                "them distinct leaves, e.g. `is_leaf=lambda x: x is None`."
            )
    return result


def _is_node_of(tree: Any, candidate: Any) -> bool:
    """Whether `candidate` is one of the node objects of `tree` (by identity)."""
    found = jax.tree.leaves(tree, is_leaf=lambda x: x is candidate)
    return any(x is candidate for x in found)


def _restore(node: Any) -> Any:
    return jax.tree.map(lambda x: x.value, node, is_leaf=_is_stand_in)


def _describe(node: Any) -> str:
    if _is_stand_in(node):
        return f"the leaf {node.value!r}"
    text = repr(node)
    return text if len(text) <= 60 else f"a {type(node).__name__}"
