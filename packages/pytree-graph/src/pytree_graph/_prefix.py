"""`prefix`: the axis of every Variable and array of an object, computed once from the
object itself, for `vmap`, `pmap` and `scan`'s `in_axes` and `out_axes`."""

from collections.abc import Callable, Mapping
from typing import Any

from pytree_filter import Path, path_text, to_predicate

from ._state import check_everything_last
from ._traverse import GraphWalk
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


def prefix(node: Any, filter_map: Mapping[Any, Any] | Callable[[Path, Any], Any], /) -> Any:
    """The axis of each Variable and array of `node`, for a transform's `in_axes` or
    `out_axes`, as Flax NNX's `nnx.prefix`.

    Each leaf's axis is `filter_map(path, leaf)`, or, for a mapping `{filter: axis}`, the
    axis of the first filter the leaf matches. Unlike a `StateAxes`, which applies its
    filters to whatever object it meets, the result is fixed to `node`'s paths: use it for
    axes that depend on where a leaf is in this model rather than on its type. A tuple or
    list of objects gives a tuple with one prefix each (`px1, px2 = prefix((a, b), ...)`),
    each covering all of its object, shared Variables included.

    Arguments:
        node: a Module, Variable, or pytree of them; or a tuple or list of such.
        filter_map: `(path, leaf) -> axis` (an int, `None`, or `Carry` for `scan`), or
            `{filter: axis}` checked in order (end with `...` to cover the rest).

    Returns:
        A `StateAxes` of `node`'s paths (a tuple of them for a tuple or list).

    Raises:
        ValueError: a leaf no filter of `filter_map` matches.
        TypeError: an axis that is not an int, `None` or `Carry`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import BatchStat, Param, prefix, vmap
        >>> d = {"a": Param(jnp.array(2.0)), "b": BatchStat(jnp.arange(5.0))}
        >>> axes = prefix(d, lambda path, leaf: 0 if "b" in path else None)
        >>> vmap(lambda d: d["a"].value * d["b"].value, in_axes=(axes,))(d).tolist()
        [0.0, 2.0, 4.0, 6.0, 8.0]
    """
    if type(node) in (tuple, list):
        return tuple(prefix(item, filter_map) for item in node)
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
