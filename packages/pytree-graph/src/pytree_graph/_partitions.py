"""refx's partition functions over any pytree: `tree_partition`, `merge_partitions`,
`get_partition`, and the `NOTHING` marker.

A partition is a flat dict `{path: leaf}` over every leaf place of the tree, holding the
leaf where the partition's predicate chose it and `NOTHING` elsewhere. Variables (and
`deref`'s `VariableValue` / `VariableIndex`) are leaves here, so a tree of references splits
by reference. `NOTHING` is a pytree with no leaves: a partition goes through `jax.grad`,
`jax.jit` or `jax.tree.map` as a pytree of only the leaves it holds.
"""

from collections.abc import Callable
from typing import Any

import jax

from pytree_filter import path_keys, to_predicate

from ._refs import VariableIndex, VariableValue
from ._variables import Variable

Partition = dict[tuple[str, ...], Any]


class _Nothing:
    """The marker for a place a partition does not hold (a pytree with no leaves)."""

    __slots__ = ()
    _instance: "_Nothing | None" = None

    def __new__(cls) -> "_Nothing":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOTHING"

    def __reduce__(self) -> str:
        return "NOTHING"


NOTHING = _Nothing()
"""The marker `tree_partition` puts where a partition does not hold the leaf (it went to
another partition), as refx's `NOTHING`. It is a pytree with no leaves, so a partition goes
through `jax.grad` or `jax.jit` as it is, and `merge_partitions` takes each place from the
partition that does not hold `NOTHING` there. It is one object: test with `x is NOTHING`.

Example:
    >>> import jax.numpy as jnp
    >>> import pytree_graph as pg
    >>> (small, rest), treedef = pg.tree_partition(
    ...     {"a": jnp.zeros(2), "b": jnp.zeros(5)}, lambda path, x: x.size < 3
    ... )
    >>> small[("b",)] is pg.NOTHING, rest[("a",)]
    (True, NOTHING)
"""
jax.tree_util.register_pytree_node(_Nothing, lambda _: ((), None), lambda _, __: NOTHING)


def _is_reference(x: Any) -> bool:
    return isinstance(x, Variable | VariableValue | VariableIndex)


def _path_text(key: Any) -> str:
    # refx's keys: each path entry as text ('a', '0'), whatever kind of key it was.
    for attribute in ("name", "key", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


class PartitionDef:
    """How to put partitions back together: the tree's structure and its leaf paths in order.

    What `tree_partition` returns beside the partitions, for `merge_partitions`. Static: it
    holds no arrays, is hashable and compares by value, so it may be closed over or passed as
    a static argument.

    Attributes:
        treedef: the JAX treedef of the tree, Variables as leaves.
        paths: each leaf's path, in leaf order (the partitions' keys).
    """

    __slots__ = ("paths", "treedef")

    def __init__(self, treedef: jax.tree_util.PyTreeDef, paths: tuple[tuple[str, ...], ...]):
        self.treedef = treedef
        self.paths = paths

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, PartitionDef)
            and self.treedef == other.treedef
            and self.paths == other.paths
        )

    def __hash__(self) -> int:
        return hash((self.treedef, self.paths))

    def __repr__(self) -> str:
        return f"PartitionDef({self.treedef}, {len(self.paths)} paths)"


def _flatten(tree: Any, where: str) -> tuple[list[Any], list[tuple], PartitionDef]:
    """The leaves, their paths as filters see them (plain keys), and the PartitionDef."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_reference)
    paths = tuple(tuple(_path_text(key) for key in path) for path, _ in pairs)
    if len(set(paths)) != len(paths):
        seen: set[tuple[str, ...]] = set()
        twice = next(p for p in paths if p in seen or seen.add(p))  # type: ignore[func-returns-value]
        raise ValueError(
            f"{where}: two places of the tree have the same path {twice} once written as text "
            "(a key 0 and a key '0' in one dict?). Rename one: partitions are keyed by path."
        )
    leaves = [leaf for _, leaf in pairs]
    return leaves, [path_keys(path) for path, _ in pairs], PartitionDef(treedef, paths)


def _predicates(predicates: tuple[Any, ...], where: str) -> list[Callable[[Any, Any], bool]]:
    try:
        return [to_predicate(p) for p in predicates]
    except TypeError as error:
        raise TypeError(
            f"{where}: {error} A predicate here is a function `f(leaf) -> bool` (as refx's) or "
            "any filter: a Variable type, a string tag, `...`, a filter object."
        ) from None


def tree_partition(tree: Any, *predicates: Any) -> tuple[tuple[Partition, ...], PartitionDef]:
    """Split a pytree's leaves among predicates: one partition per predicate, plus the rest.

    Each leaf (a Variable, a `deref`'d `VariableValue` / `VariableIndex`, or any other pytree
    leaf) goes to the first predicate that selects it, or to the last partition if none
    does. A `deref`'d place is also tested as the Variable it stands for (same type and
    metadata), so `Param` selects a `deref`'d Param too. A partition holds every path of
    the tree, with `NOTHING` where the leaf went elsewhere, so that partitions line up for
    `jax.tree.map` and `merge_partitions`.

    Arguments:
        tree: any pytree; Variables are leaves.
        *predicates: functions `f(leaf) -> bool` (refx's form) or any filter of
            `pytree_filter` (a Variable type, a string tag, a path predicate
            `f(path, leaf)`, ...).

    Returns:
        `(partitions, partitiondef)`: `len(predicates) + 1` dicts `{path: leaf or NOTHING}`
        (paths as tuples of text, refx's `('a', '0')`), and what `merge_partitions` needs.

    Raises:
        TypeError: a predicate is not a filter.
        ValueError: two paths of the tree read the same as text.

    Examples:
        >>> import pytree_graph as pg
        >>> r1, r2 = pg.Param(1.0), pg.BatchStat(2.0)
        >>> tree = {"a": [r1, r1, r2], "b": r2}
        >>> (params, rest), partitiondef = pg.tree_partition(tree, pg.Param)
        >>> params == {("a", "0"): r1, ("a", "1"): r1, ("a", "2"): pg.NOTHING, ("b",): pg.NOTHING}
        True
        >>> rest[("b",)] is r2
        True
        >>> pg.merge_partitions((params, rest), partitiondef)["a"][2] is r2
        True
    """
    where = "tree_partition"
    tests = _predicates(predicates, where)
    leaves, key_paths, partitiondef = _flatten(tree, where)
    partitions: list[Partition] = [{} for _ in range(len(tests) + 1)]
    stand_ins: dict[Any, Variable] = {}
    for path, key, leaf in zip(partitiondef.paths, key_paths, leaves, strict=True):
        chosen = next((i for i, test in enumerate(tests) if test(key, leaf)), None)
        if chosen is None and isinstance(leaf, VariableValue | VariableIndex):
            # A deref'd place counts as the Variable it stands for, so `Param` or a test
            # of its metadata selects it as it would the Variable.
            variable = _stand_in(leaf, stand_ins)
            chosen = next((i for i, test in enumerate(tests) if test(key, variable)), None)
        if chosen is None:
            chosen = len(tests)
        for i, partition in enumerate(partitions):
            partition[path] = leaf if i == chosen else NOTHING
    return tuple(partitions), partitiondef


def _stand_in(place: VariableValue | VariableIndex, made: dict[Any, Variable]) -> Variable:
    """A Variable of the type and metadata a deref'd place stands for (its value, if any)."""
    if isinstance(place, VariableValue):
        return place.kind((place.value,))
    found = made.get(place.kind)
    if found is None:
        found = made[place.kind] = place.kind((None,))
    return found


def get_partition(tree: Any, predicate: Any) -> Partition:
    """The one partition `predicate` selects: `tree_partition(tree, predicate)[0][0]`.

    Arguments:
        tree: any pytree; Variables are leaves.
        predicate: a function `f(leaf) -> bool` or any filter.

    Returns:
        A dict `{path: leaf or NOTHING}` over every leaf place of the tree.

    Examples:
        >>> import pytree_graph as pg
        >>> r1, r2 = pg.Param(1.0), pg.BatchStat(2.0)
        >>> pg.get_partition({"a": [r1, r2]}, pg.Param)
        {('a', '0'): Param(value=1.0), ('a', '1'): NOTHING}
    """
    return tree_partition(tree, predicate)[0][0]


def merge_partitions(partitions: Any, partitiondef: PartitionDef) -> Any:
    """Put a tree back together from its partitions (the inverse of `tree_partition`).

    Each path takes its leaf from the one partition that holds it (not `NOTHING`). The
    partitions may have been transformed (values replaced, as `jax.grad` or `jax.tree.map`
    do); their keys must be the tree's paths.

    Arguments:
        partitions: a sequence of partitions from `tree_partition` (or of the same keys).
        partitiondef: the `PartitionDef` `tree_partition` returned with them.

    Returns:
        The tree, with the partitions' leaves in its places.

    Raises:
        ValueError: a path held by no partition, or by two, or a partition with keys the
            tree does not have (nothing is built).

    Examples:
        >>> import pytree_graph as pg
        >>> is_float = lambda x: isinstance(x, float)
        >>> parts, partitiondef = pg.tree_partition({"w": 1.0, "n": 2}, is_float)
        >>> pg.merge_partitions(parts, partitiondef)
        {'n': 2, 'w': 1.0}
    """
    where = "merge_partitions"
    if not isinstance(partitiondef, PartitionDef):
        raise TypeError(
            f"{where}: the second argument must be the PartitionDef tree_partition returned "
            f"with the partitions, got {type(partitiondef).__name__}."
        )
    if isinstance(partitions, dict):
        partitions = (partitions,)
    partitions = tuple(partitions)
    known = set(partitiondef.paths)
    for i, partition in enumerate(partitions):
        if not isinstance(partition, dict):
            raise TypeError(
                f"{where}: partition {i} is a {type(partition).__name__}; partitions are the "
                "dicts tree_partition returned."
            )
        unknown = [path for path in partition if path not in known]
        if unknown:
            raise ValueError(
                f"{where}: partition {i} has paths the tree does not have: {unknown[:3]}. "
                "Merge partitions with the PartitionDef of the same tree_partition call."
            )
    leaves = []
    for path in partitiondef.paths:
        holders = [i for i, p in enumerate(partitions) if p.get(path, NOTHING) is not NOTHING]
        if len(holders) != 1:
            held = "no partition holds" if not holders else f"partitions {holders} all hold"
            raise ValueError(
                f"{where}: {held} the leaf at {path}; each place must be held by exactly one "
                "partition. Pass all the partitions of one tree_partition call."
            )
        leaves.append(partitions[holders[0]][path])
    return partitiondef.treedef.unflatten(leaves)
