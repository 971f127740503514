"""Shared objects in a pytree: one Module or Variable reached by several paths.

JAX flattens a pytree without regard to identity: an object reached by two paths is
flattened twice, and unflattening builds two objects. A model whose decoder holds the
encoder's Param would then get two partial gradients and two separately updated copies, and
the tie would be lost without a word. So the filtered transforms find such objects, pass
each one's leaves once, and rebuild one object for every place it appeared.

What counts as shared: a pytree node that is an object with an identity (a Module, a
Variable, any registered class) reached more than once. Builtin containers (tuples, lists,
dicts, namedtuples) and `None` are values, never shared; so are leaves: the same array at
two places stays two leaves, as in JAX. Where a filter stops flattening at a pytree node (an
`OfType(Param)` filter makes each Param a leaf), that node is still the object it is: one
Param reached twice is shared, whatever the filter.

Finding shared objects takes a walk over the nodes in Python, so callers run it only when a
cheap test says it may find something: an object with array leaves that is reached twice
puts the very same array objects twice among the leaves (`has_repeats`).
"""

import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import flatten_with_mask, path_text

_flatten_one_level = jax.tree_util.default_registry.flatten_one_level


def has_repeats(leaves: Sequence[Any]) -> bool:
    """Whether one object stands at two places among `leaves` (the cheap necessary test)."""
    return len(set(map(id, leaves))) != len(leaves)


def _has_identity(node: Any) -> bool:
    return _has_identity_type(type(node))


class Sharing:
    """Where the shared objects of one pytree structure stand, and how to rebuild them.

    Positions are those of the leaves of the structure's treedef. A position inside the
    second (or later) occurrence of a shared object *repeats* the same position inside its
    first occurrence; `unique` lists the positions that repeat nothing, and the "unique
    leaves" of a tree are its leaves at those positions.

    Instances are interned per (treedef, repeats), so they hash and compare cheaply and can
    be part of a `jax.jit` static key.
    """

    __slots__ = ("__weakref__", "_program", "repeats", "treedef", "unique")

    def __init__(self, treedef: PyTreeDef, repeats: tuple[int, ...], program: Any):
        self.treedef = treedef
        # For each position, the position whose leaf it repeats (its own when it is first).
        self.repeats = repeats
        self.unique = tuple(i for i, source in enumerate(repeats) if source == i)
        self._program = program

    @property
    def num_leaves(self) -> int:
        """How many unique leaves there are (what `unflatten` takes)."""
        return len(self.unique)

    def dedupe(self, leaves: Sequence[Any]) -> list[Any]:
        """The unique leaves, from all the leaves."""
        return [leaves[i] for i in self.unique]

    def unflatten(self, unique_leaves: Sequence[Any]) -> Any:
        """Rebuild the tree from its unique leaves, one object for each shared object."""
        built: dict[int, Any] = {}
        return _build(self._program, iter(unique_leaves), built)

    def __repr__(self) -> str:
        shared = len(self.repeats) - len(self.unique)
        return f"Sharing({shared} of {len(self.repeats)} leaves repeat others)"


# The rebuild program is a tree of tuples, one per node of the structure:
#   ("leaf", memo)                     take the next unique leaf
#   ("whole", treedef, memo)           a subtree with nothing shared inside: one unflatten
#   ("node", one_level, children, memo) rebuild the children, then this node from them
#   ("again", memo)                    the object already built for an earlier occurrence
# `memo` is the index under which a shared object's first occurrence is kept (or None).


def _build(program: tuple, leaves: Any, built: dict[int, Any]) -> Any:
    kind = program[0]
    if kind == "again":
        return built[program[1]]
    if kind == "leaf":
        obj = next(leaves)
        memo = program[1]
    elif kind == "whole":
        _, treedef, memo = program
        obj = treedef.unflatten([next(leaves) for _ in range(treedef.num_leaves)])
    else:
        _, one_level, children, memo = program
        obj = one_level.unflatten([_build(child, leaves, built) for child in children])
    if memo is not None:
        built[memo] = obj
    return obj


_INTERNED: dict[tuple[PyTreeDef, tuple[int, ...]], Sharing] = {}


def find_sharing(tree: Any, treedef: PyTreeDef | None = None) -> Sharing | None:
    """The shared objects of `tree`, or None when no object in it is reached twice.

    Arguments:
        tree: any pytree.
        treedef: the treedef `tree` was flattened with (where it was flattened with
            `is_leaf`, this says where its leaves are); by default `jax.tree.structure(tree)`.

    Returns:
        A `Sharing`, or None.
    """
    if treedef is None:
        treedef = jax.tree.structure(tree)
    counts: dict[int, list[Any]] = {}
    _count(tree, treedef, counts)
    shared = {key for key, (n, _) in counts.items() if n > 1}
    if not shared:
        return None
    repeats: list[int] = []
    first: dict[int, tuple[int, int, int]] = {}
    program, _ = _program(tree, treedef, shared, first, repeats)
    key = (treedef, tuple(repeats))
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) > 1024:
            _INTERNED.clear()
        found = _INTERNED[key] = Sharing(treedef, key[1], program)
    return found


def clear_interned() -> None:
    """Forget the interned `Sharing`s (`find_sharing` makes them again as needed)."""
    _INTERNED.clear()


def _is_leaf(treedef: PyTreeDef) -> bool:
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _is_node_leaf(node: Any) -> bool:
    """Whether a leaf of the treedef is a pytree node that flattening stopped at (`is_leaf`):
    an object that can be shared, unlike an array or a number."""
    return _has_identity(node) and _flatten_one_level(node) is not None


def _children(node: Any, treedef: PyTreeDef) -> tuple[list[Any], list[PyTreeDef]]:
    flat = _flatten_one_level(node)
    children = [] if flat is None else list(flat[0])
    return children, treedef.children()


def _count(node: Any, treedef: PyTreeDef, counts: dict[int, list[Any]]) -> None:
    """Count how often each object with an identity is reached (not entering repeats).

    Each counted object is kept alive in `counts` until the walk ends: a node's flatten may
    make its children afresh, and a freed temporary's id could be taken by the next one.
    """
    leaf = _is_leaf(treedef)
    if leaf and not _is_node_leaf(node):
        return
    if _has_identity(node):
        key = id(node)
        if key in counts:
            counts[key][0] += 1
            return
        counts[key] = [1, node]
    if leaf:
        return
    for child, child_def in zip(*_children(node, treedef), strict=True):
        _count(child, child_def, counts)


def _program(
    node: Any,
    treedef: PyTreeDef,
    shared: set[int],
    first: dict[int, tuple[int, int, int]],
    repeats: list[int],
) -> tuple[tuple, bool]:
    """The rebuild program of `node`, and whether it holds a shared object."""
    leaf = _is_leaf(treedef)
    key = id(node)
    if leaf and key not in shared:
        repeats.append(len(repeats))
        return _LEAF, False
    memo = None
    if key in shared:
        if key in first:
            memo, start, count = first[key]
            repeats.extend(repeats[start : start + count])
            return ("again", memo), True
        memo = len(first)
    start = len(repeats)
    if memo is not None:
        first[key] = (memo, start, treedef.num_leaves)
    if leaf:
        repeats.append(start)
        return ("leaf", memo), True
    children, child_defs = _children(node, treedef)
    programs = []
    inner = False
    for child, child_def in zip(children, child_defs, strict=True):
        program, holds = _program(child, child_def, shared, first, repeats)
        programs.append(program)
        inner = inner or holds
    if not inner:
        return ("whole", treedef, memo), memo is not None
    one_level = jax.tree.structure(node, is_leaf=lambda x: x is not node)
    return ("node", one_level, tuple(programs), memo), True


_LEAF = ("leaf", None)


class SplitTree:
    """A tree split by a filter into its selected leaves and the rest, each shared object's
    leaves once: what the filtered transforms hand to JAX, and rebuild from what JAX gives.

    Arguments:
        tree: any pytree (the arguments of a call, say).
        spec: a filter spec of `tree` (as for `pytree_filter.filter`).
        what: what the spec selects, for the error of a shared leaf selected at one of its
            places only ("differentiated", "traced").
    """

    __slots__ = ("leaves", "mask", "sharing", "treedef")

    def __init__(self, tree: Any, spec: Any, what: str):
        leaves, mask, treedef = flatten_with_mask(tree, spec)
        # The walk runs only where the cheap test says an object may be reached twice.
        self.sharing = find_sharing(tree, treedef) if has_repeats(leaves) else None
        if self.sharing is not None:
            mask = selected_once(self.sharing, tree, mask, what)
            leaves = self.sharing.dedupe(leaves)
        self.leaves = leaves
        self.mask = [bool(m) for m in mask]
        self.treedef = treedef

    def selected(self) -> list[Any]:
        """The selected leaves (each shared object's once)."""
        return [x for x, m in zip(self.leaves, self.mask, strict=True) if m]

    def rebuild(self, selected: Sequence[Any]) -> Any:
        """The tree with `selected` in place of the selected leaves, one object for each
        shared object."""
        it = iter(selected)
        leaves = [next(it) if m else x for x, m in zip(self.leaves, self.mask, strict=True)]
        return self._unflatten(leaves)

    def selected_tree(self, selected: Sequence[Any]) -> Any:
        """A tree shaped like this one with `selected` at the selected leaves and None at the
        others (a gradient, say), one object for each shared object."""
        it = iter(selected)
        return self._unflatten([next(it) if m else None for m in self.mask])

    def _unflatten(self, leaves: list[Any]) -> Any:
        if self.sharing is not None:
            return self.sharing.unflatten(leaves)
        return self.treedef.unflatten(leaves)


def selected_once(sharing: Sharing, tree: Any, mask: Sequence[Any], what: str) -> list[bool]:
    """The mask of the unique leaves, refusing a shared leaf selected at only some places.

    Arguments:
        sharing: the sharing of `tree`.
        tree: the tree (to name paths in the error).
        mask: one truth value per leaf of `tree`.
        what: what the mask selects, for the error ("differentiated", "traced").

    Returns:
        One bool per unique leaf.
    """
    for position, source in enumerate(sharing.repeats):
        if bool(mask[position]) != bool(mask[source]):
            first, again = describe_positions(tree, sharing.treedef, (source, position))
            raise ValueError(
                f"One object is reached by two paths, {first} and {again}, and the filter "
                f"says its leaf is {what} at one of them but not at the other. A shared "
                "object (a tied weight, a Module used twice) is one object: make the filter "
                "select it at every place it appears, or none."
            )
    return [bool(mask[i]) for i in sharing.unique]


def first_places(sharing: Sharing, leaves: Sequence[Any]) -> list[Any]:
    """The unique leaves of a cotangent (or tangent) given at every place of a tree.

    A shared object is one object, so it has one cotangent: the one at its first place
    (at a later place where the first has None). A cotangent that keeps the object one
    object, as a gradient does, has the same one at every place; one made place by place
    (`jax.tree.map` over the tree) has equal ones. Either way it counts once.

    Arguments:
        sharing: the sharing of the tree.
        leaves: one value (or None) per leaf of the tree.

    Returns:
        One value per unique leaf.
    """
    unique = list(leaves)
    for position, source in enumerate(sharing.repeats):
        if unique[source] is None:
            unique[source] = leaves[position]
    return sharing.dedupe(unique)


def same_axes_once(
    sharing: Sharing,
    tree: Any,
    axes: Sequence[Any],
    transform: str,
    describe: Callable[[Sequence[int]], list[str]] | None = None,
) -> list[Any]:
    """The axes of the unique leaves, refusing a shared leaf given different axes at its
    places (the `selected_once` of axis specs).

    Arguments:
        sharing: the sharing of `tree`.
        tree: the tree (to name paths in the error).
        axes: one axis (an int or None) per leaf of `tree`.
        transform: the transform's name, for the error.
        describe: names leaf positions for the error (by default, their key paths).

    Returns:
        One axis per unique leaf.
    """
    for position, source in enumerate(sharing.repeats):
        if axes[position] != axes[source]:
            if describe is None:
                first, again = describe_positions(tree, sharing.treedef, (source, position))
            else:
                first, again = describe((source, position))
            raise ValueError(
                f"{transform}: one object is reached by two paths, {first} and {again}, and "
                f"the axis spec maps its leaf over axis {axes[source]} at the first and "
                f"{axes[position]} at the second. A shared object (a tied weight, a Module "
                "used twice) is one object: give it the same axis at every place."
            )
    return [axes[i] for i in sharing.unique]


def describe_positions(tree: Any, treedef: PyTreeDef, positions: Sequence[int]) -> list[str]:
    """The key paths of leaf `positions` of `tree` (flattened as `treedef`), as text."""
    paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    if len(paths) != treedef.num_leaves:
        return [f"leaf {i}" for i in positions]
    return [path_text(paths[i][0], root="the root") for i in positions]


def repeat_test(treedef: PyTreeDef, mask: Sequence[Any]) -> Callable[[Sequence[Any]], bool] | None:
    """A cheap test of a call's traced leaves that is true when an object may be shared.

    An object reached twice has the same subtree (the same treedef) at both places, and its
    first traced leaf is then the very same array at both. So only the first traced leaves
    of objects with equal subtree treedefs need comparing, and only with each other. The
    test is made once per structure: small groups compare by `is` in generated code (a
    test on every call, so it must cost next to nothing), larger ones through a set of ids.

    Arguments:
        treedef: the structure of a call.
        mask: one truth value per leaf: whether it is traced.

    Returns:
        `test(traced_leaves) -> bool`, or None when no two objects could be one.
    """
    traced_index: list[int | None] = []
    count = 0
    for m in mask:
        traced_index.append(count if m else None)
        count += bool(m)
    firsts: dict[PyTreeDef, list[int]] = {}
    _collect_firsts(treedef, 0, traced_index, firsts)
    groups = [group for group in firsts.values() if len(group) > 1]
    if not groups:
        return None
    terms = []
    namespace: dict[str, Any] = {"distinct": _distinct}
    for n, group in enumerate(groups):
        if len(group) <= _PAIRWISE:
            terms += [f"d[{a}] is d[{b}]" for i, a in enumerate(group) for b in group[i + 1 :]]
        else:
            namespace[f"g{n}"] = operator.itemgetter(*group)
            terms.append(f"not distinct(g{n}(d))")
    # The source is built from integers and fixed names only.
    exec(f"def test(d):\n    return {' or '.join(terms)}", namespace)
    return namespace["test"]


# Up to this many objects of one structure are compared pairwise (at most 6 `is` tests).
_PAIRWISE = 4


def _distinct(values: Sequence[Any]) -> bool:
    return len(set(map(id, values))) == len(values)


def _collect_firsts(
    treedef: PyTreeDef, start: int, traced_index: list[int | None], firsts: dict
) -> None:
    data = treedef.node_data()
    if data is None:  # a leaf
        return
    if _has_identity_type(data[0]):
        first = next(
            (i for i in traced_index[start : start + treedef.num_leaves] if i is not None), None
        )
        if first is not None:
            firsts.setdefault(treedef, []).append(first)
    for child in treedef.children():
        _collect_firsts(child, start, traced_index, firsts)
        start += child.num_leaves


def _has_identity_type(kind: type) -> bool:
    return kind is not type(None) and not issubclass(kind, tuple | list | dict)
