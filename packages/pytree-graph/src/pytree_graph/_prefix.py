"""`prefix`: the axis of every Variable and array of an object, computed once from the
object itself, for `vmap`, `pmap` and `scan`'s `in_axes` and `out_axes`."""

from collections.abc import Callable, Mapping
from typing import Any

import jax

from pytree_filter import Path, path_keys, path_text, to_predicate

from ._carry import Carry
from ._graph_mode import resolve_modes
from ._state import check_everything_last
from ._traverse import GraphWalk
from ._variables import Variable
from ._vmap import StateAxes


class PrefixAxes(StateAxes):
    """An axis for each path of one object: what `prefix` returns.

    A `StateAxes` whose entries are paths rather than filters, so it goes wherever a
    `StateAxes` does. A leaf at a path the object did not have (the object passed to the
    transform is not the one the prefix was computed from, or its structure changed since)
    is an error, never a guess.
    """

    __slots__ = ("_by_path",)

    def __init__(self, axes: Mapping[Path, Any]):
        for axis in axes.values():
            self.check_spec(axis)
        self._by_path = dict(axes)
        self._items = tuple(self._by_path.items())
        self._predicates = ()

    def spec_of(self, path: Path, leaf: Any, transform: str) -> Any:
        try:
            return self._by_path[path]
        except KeyError:
            raise ValueError(
                f"{transform}: the prefix has no axis for the {type(leaf).__name__} at "
                f"{path_text(path)}: it was computed from another object, or from this one "
                "before its structure changed. Compute `prefix(...)` from the very objects "
                "passed to the transform, after any change to them."
            ) from None

    def __repr__(self) -> str:
        shown = ", ".join(f"{path_text(p)}: {self.show_spec(a)}" for p, a in self._items)
        return f"PrefixAxes({{{shown}}})"


def prefix(
    node: Any,
    filter_map: Mapping[Any, Any] | Callable[[Path, Any], Any],
    /,
    *,
    graph: bool | None = None,
) -> Any:
    """The axis of each Variable and array of `node`, for a transform's `in_axes` or
    `out_axes`, as Flax NNX's `nnx.prefix`.

    Each leaf's axis is `filter_map(path, leaf)`, or, for a mapping `{filter: axis}`, the
    axis of the first filter the leaf matches. Unlike a `StateAxes`, which applies its
    filters to whatever object it meets, the result is fixed to `node`'s paths: use it for
    axes that depend on where a leaf is in this model rather than on its type. A tuple or
    list of objects gives a tuple with one prefix each (`px1, px2 = prefix((a, b), ...)`),
    each covering all of its object, shared Variables included.

    In tree mode (`graph=False`) the result is instead a plain pytree prefix, as Flax
    NNX's: `node`'s own pytree structure with each Variable and other leaf replaced by
    its axis (a Module of axes for a Module), which `jax.vmap` and the tree-mode
    transforms take as `in_axes` or `out_axes`. A Variable reached twice (tied weights)
    is refused there, as the tree-mode transforms refuse it.

    Arguments:
        node: a Module, Variable, or pytree of them; or a tuple or list of such.
        filter_map: `(path, leaf) -> axis` (an int, `None`, or `Carry` for `scan`), or
            `{filter: axis}` checked in order (end with `...` to cover the rest).
        graph: `False` for tree mode (a pytree prefix, see above). `None` (default) reads
            `set_graph_mode`.

    Returns:
        A `StateAxes` of `node`'s paths (a tuple of them for a tuple or list); in tree
        mode, a pytree of axes with `node`'s structure.

    Raises:
        ValueError: a leaf no filter of `filter_map` matches; in tree mode, a Variable
            reached twice.
        TypeError: an axis that is not an int, `None` or `Carry`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import BatchStat, Param, prefix, vmap
        >>> d = {"a": Param(jnp.array(2.0)), "b": BatchStat(jnp.arange(5.0))}
        >>> axes = prefix(d, lambda path, leaf: 0 if "b" in path else None)
        >>> vmap(lambda d: d["a"].value * d["b"].value, in_axes=(axes,))(d).tolist()
        [0.0, 2.0, 4.0, 6.0, 8.0]
        >>> prefix(d, {Param: None, BatchStat: 0}, graph=False)
        {'a': None, 'b': 0}
    """
    graph, _ = resolve_modes(graph, None)
    if graph and type(node) in (tuple, list):
        return tuple(prefix(item, filter_map, graph=True) for item in node)
    if isinstance(filter_map, Mapping):
        check_everything_last(tuple(filter_map))
        predicates = tuple((to_predicate(f), axis) for f, axis in filter_map.items())

        def axis_of(path: Path, leaf: Any) -> Any:
            for predicate, axis in predicates:
                if predicate(path, leaf):
                    return axis
            raise ValueError(
                f"prefix: no filter matches the {type(leaf).__name__} at {path_text(path)}: "
                "add one for it, or end with `...: axis` for the rest."
            )

    elif callable(filter_map):
        axis_of = filter_map
    else:
        raise TypeError(
            "prefix: filter_map must be a function (path, leaf) -> axis or a dict "
            f"{{filter: axis}}, got {type(filter_map).__name__}."
        )
    if not graph:
        return _tree_prefix(node, axis_of)
    walk = GraphWalk(record_shared=True)
    walk.graphdef(node)
    assert walk.shared_paths is not None
    axes = {}
    for path, leaf in zip(walk.paths, walk.leaves, strict=True):
        axis = axes[path] = axis_of(path, leaf)
        # A Variable reached by several paths has the axis of the first at each of them
        # (a transform looks its axis up under every path, to check they agree).
        index = walk.index.get(id(leaf))
        for alias in () if index is None else walk.shared_paths[index][1:]:
            axes[alias] = axis
    return PrefixAxes(axes)


def _tree_prefix(node: Any, axis_of: Callable[[Path, Any], Any]) -> Any:
    """`node`'s pytree structure with each Variable and leaf replaced by its axis."""
    seen: dict[int, Path] = {}

    def replace(key_path: Any, leaf: Any) -> Any:
        path = path_keys(key_path)
        if isinstance(leaf, Variable):
            first = seen.setdefault(id(leaf), path)
            if first != path:
                raise ValueError(
                    f"prefix(graph=False): the {type(leaf).__name__} at {path_text(path)} is "
                    f"also at {path_text(first)}. Tree mode passes each Variable once, so "
                    "its transforms refuse a Variable reached twice (tied weights): use "
                    "graph mode (`graph=True`), which keeps the sharing."
                )
        axis = axis_of(path, leaf)
        if axis is not None and axis is not Carry and not isinstance(axis, int):
            raise TypeError(
                f"prefix: the axis of the {type(leaf).__name__} at {path_text(path)} is "
                f"{axis!r}: an axis must be an int, None or Carry (for scan)."
            )
        return axis

    return jax.tree_util.tree_map_with_path(
        replace, node, is_leaf=lambda x: isinstance(x, Variable)
    )
