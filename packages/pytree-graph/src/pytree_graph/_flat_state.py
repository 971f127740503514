"""`FlatState`: a graph's leaves with their paths, as a sequence and a pytree."""

from collections.abc import Iterator, Sequence
from typing import Any

import jax
from jax.tree_util import SequenceKey

from pytree_filter import Path, path_text

from ._state import State


class FlatState(Sequence):
    """The leaves of a graph with their paths, in the graphdef's order: what `flatten`
    returns. A sequence of `(path, leaf)` pairs, and a pytree whose leaves are the
    leaves' arrays (the paths are static), so it goes through `jax.jit` as it is.

    Arguments:
        paths: the path of each leaf (tuples of keys).
        leaves: the Variables or arrays, one per path.

    Examples:
        >>> from pytree_graph import FlatState, Param
        >>> flat = FlatState((("w",),), [Param(1.0)])
        >>> [(path, leaf.value) for path, leaf in flat]
        [(('w',), 1.0)]
    """

    __slots__ = ("leaves", "paths")

    def __init__(self, paths: Sequence[Path], leaves: Sequence[Any]):
        if len(paths) != len(leaves):
            raise ValueError(
                f"FlatState needs one leaf per path, got {len(paths)} paths and "
                f"{len(leaves)} leaves."
            )
        self.paths = tuple(paths)
        self.leaves = list(leaves)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return FlatState(self.paths[i], self.leaves[i])
        return self.paths[i], self.leaves[i]

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[tuple[Path, Any]]:
        return zip(self.paths, self.leaves, strict=True)

    def __repr__(self) -> str:
        items = ", ".join(f"{path_text(p)}: {leaf!r}" for p, leaf in self)
        return f"FlatState({items})"

    def to_nested_state(self) -> State:
        """The same leaves as a nested `State`."""
        return State.from_flat_path(dict(self))


jax.tree_util.register_pytree_with_keys(
    FlatState,
    lambda f: (tuple((SequenceKey(i), leaf) for i, leaf in enumerate(f.leaves)), f.paths),
    lambda paths, leaves: FlatState(paths, leaves),
    lambda f: (f.leaves, f.paths),
)
