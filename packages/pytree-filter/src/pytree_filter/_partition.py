"""`filter`, `partition` and `combine`: split a pytree by filters and put it back together."""

import builtins
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from ._filters import Filter, _LeafPredicate, as_filter
from ._paths import path_keys, path_text
from ._predicates import leaf_mask

IsLeaf = Callable[[Any], bool] | None
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)
_converted: dict[Callable[..., Any], "_Spec"] = {}
_NOT_GIVEN: Any = object()


def _is_spec_leaf(x: Any) -> bool:
    # None is a leaf here (Nothing, as in Flax NNX), not the empty subtree JAX makes of it.
    return isinstance(x, Filter | type | bool) or x is Ellipsis or x is None


def _convert(spec: Any) -> "_Spec":
    """Convert a filter spec, reusing the conversion of plain functions such as `is_array`."""
    if isinstance(spec, _FUNCTIONS):
        found = _converted.get(spec)
        if found is None:
            if len(_converted) >= 256:
                _converted.clear()
            found = _converted[spec] = _Spec(spec)
        return found
    return _Spec(spec)


class _Spec:
    """One filter spec, converted: its filter objects and the prefix structure they cover."""

    __slots__ = ("filters", "leaf_types", "needs_path", "predicate", "prefix")

    def __init__(self, spec: Any):
        leaves, prefix = jax.tree.flatten(spec, is_leaf=_is_spec_leaf)
        # A single filter (the common case) needs no prefix matching.
        self.prefix: PyTreeDef | None = (
            None if jax.tree_util.treedef_is_leaf(prefix) and leaves else prefix
        )
        self.filters = [as_filter(leaf) for leaf in leaves]
        self.leaf_types = tuple(t for f in self.filters for t in f.leaf_types())
        self.needs_path = builtins.any(f.needs_path for f in self.filters)
        # A lone leaf predicate (`is_array` and friends) takes the fast path.
        single = self.prefix is None and isinstance(self.filters[0], _LeafPredicate)
        self.predicate = self.filters[0].predicate if single else None


def _leaf_test(is_leaf: IsLeaf, types: tuple[type, ...]) -> IsLeaf:
    if not types:
        return is_leaf
    if is_leaf is None:
        return lambda x: isinstance(x, types)
    return lambda x: isinstance(x, types) or is_leaf(x)


def _masks(
    spec: _Spec,
    tree: Any,
    leaves: list[Any],
    paths: list[tuple[Any, ...]] | None,
    leaf_test: IsLeaf,
) -> list[bool]:
    """For each leaf of `tree`, whether `spec` selects it."""
    if spec.prefix is None:
        (f,) = spec.filters
        if not f.needs_path:
            if isinstance(f, _LeafPredicate):
                # The common case (`is_array` and friends): no path, no wrapper call.
                return leaf_mask(f.predicate, leaves)
            return [f((), x) for x in leaves]
        return [bool(f(p, x)) for p, x in zip(paths, leaves, strict=True)]
    try:
        subtrees = spec.prefix.flatten_up_to(tree)
    except (ValueError, TypeError):
        raise ValueError(_divergence_message(spec.prefix, tree)) from None
    masks: list[bool] = []
    start = 0
    for f, subtree in zip(spec.filters, subtrees, strict=True):
        count = len(jax.tree.leaves(subtree, is_leaf=leaf_test))
        stop = start + count
        if paths is None:
            masks.extend(bool(f((), x)) for x in leaves[start:stop])
        else:
            masks.extend(
                bool(f(p, x)) for p, x in zip(paths[start:stop], leaves[start:stop], strict=True)
            )
        start = stop
    return masks


def _flatten(tree: Any, specs: Sequence[_Spec], is_leaf: IsLeaf):
    leaf_test = _leaf_test(is_leaf, tuple(t for s in specs for t in s.leaf_types))
    if builtins.any(s.needs_path for s in specs):
        with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=leaf_test)
        paths = [path_keys(p) for p, _ in with_paths]
        leaves = [x for _, x in with_paths]
    else:
        leaves, treedef = jax.tree.flatten(tree, is_leaf=leaf_test)
        paths = None
    return leaves, paths, treedef, leaf_test


def flatten_with_mask(
    pytree: Any, filter_spec: Any, is_leaf: IsLeaf = None
) -> tuple[list[Any], list[Any], PyTreeDef]:
    """Flatten `pytree` and say, leaf by leaf, whether `filter_spec` selects it.

    The building block of `filter` and `partition`, for library code that wants the leaves
    themselves (to hand the selected ones to a JAX transform, say). Instances of the types of
    any `OfType` in the spec count as leaves, as everywhere in this package.

    Arguments:
        pytree: any pytree.
        filter_spec: a filter spec, as for `filter`.
        is_leaf: treat matching subtrees as leaves, as in `jax.tree.flatten`.

    Returns:
        `(leaves, mask, treedef)`: the leaves, one truth value per leaf (true where the
        spec selects it), and the treedef that `treedef.unflatten(leaves)` rebuilds `pytree`
        with.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_filter import flatten_with_mask, is_array
        >>> leaves, mask, treedef = flatten_with_mask({"w": jnp.ones(2), "n": 3}, is_array)
        >>> mask
        [False, True]
        >>> treedef.unflatten(leaves)["n"]
        3
    """
    return _flatten_with_mask(pytree, _convert(filter_spec), is_leaf)


def _flatten_with_mask(
    pytree: Any, spec: _Spec, is_leaf: IsLeaf
) -> tuple[list[Any], list[Any], PyTreeDef]:
    if spec.predicate is not None and is_leaf is None:
        leaves, treedef = jax.tree.flatten(pytree)
        return leaves, leaf_mask(spec.predicate, leaves), treedef
    leaves, paths, treedef, leaf_test = _flatten(pytree, [spec], is_leaf)
    return leaves, _masks(spec, pytree, leaves, paths, leaf_test), treedef


def filter(
    pytree: Any,
    filter_spec: Any,
    inverse: bool = False,
    replace: Any = None,
    is_leaf: IsLeaf = None,
) -> Any:
    """Keep the leaves of `pytree` selected by `filter_spec`; replace the others.

    Arguments:
        pytree: any pytree.
        filter_spec: `True`/`False`, a leaf predicate `f(leaf) -> bool` (e.g. `is_array`),
            a type, `...`, a filter object, or a prefix pytree of those: each filter in the
            prefix applies to every leaf of the matching subtree of `pytree`.
        inverse: keep the leaves that are *not* selected instead.
        replace: the value put in place of dropped leaves.
        is_leaf: treat matching subtrees as leaves, as in `jax.tree.flatten`.

    Returns:
        A pytree of the same structure.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_filter import filter, is_array
        >>> filter({"w": jnp.ones(2), "act": "relu"}, is_array)
        {'act': None, 'w': Array([1., 1.], dtype=float32)}
        >>> filter([1, 2, (3, 4)], [True, False, False])
        [1, None, (None, None)]
    """
    leaves, masks, treedef = flatten_with_mask(pytree, filter_spec, is_leaf)
    if inverse:
        return treedef.unflatten([replace if m else x for x, m in zip(leaves, masks, strict=True)])
    return treedef.unflatten([x if m else replace for x, m in zip(leaves, masks, strict=True)])


def partition(
    pytree: Any,
    *filter_specs: Any,
    filter_spec: Any = _NOT_GIVEN,
    replace: Any = None,
    is_leaf: IsLeaf = None,
) -> tuple[Any, ...]:
    """Split `pytree` into one tree per filter spec, plus one for the rest.

    Each leaf goes to the first spec that selects it, or to the rest; everywhere else it is
    replaced by `replace`. So the trees are disjoint and, with the default `replace=None`,
    `combine(*partition(tree, ...))` rebuilds `tree`.

    Arguments:
        pytree: any pytree.
        *filter_specs: one or more filter specs (see `filter`).
        filter_spec: one filter spec given by keyword, Equinox's spelling
            (`partition(tree, filter_spec=is_array)`); not together with positional specs.
        replace: the value put in place of leaves that belong to another part.
        is_leaf: treat matching subtrees as leaves, as in `jax.tree.flatten`.

    Returns:
        A tuple of `len(filter_specs) + 1` pytrees with the structure of `pytree`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_filter import partition, is_array, combine
        >>> tree = {"w": jnp.ones(2), "n": 3, "act": "relu"}
        >>> arrays, rest = partition(tree, is_array)
        >>> arrays
        {'act': None, 'n': None, 'w': Array([1., 1.], dtype=float32)}
        >>> ints, strings, rest = partition(tree, int, str)
        >>> strings
        {'act': 'relu', 'n': None, 'w': None}
        >>> combine(ints, strings, rest) == tree
        True
        >>> partition(tree, filter_spec=is_array)[1]
        {'act': 'relu', 'n': 3, 'w': None}
    """
    if filter_spec is not _NOT_GIVEN:
        if filter_specs:
            raise TypeError(
                "partition got filter specs both by position and as `filter_spec=`: pass "
                "either `partition(tree, spec, ...)` or `partition(tree, filter_spec=spec)`."
            )
        filter_specs = (filter_spec,)
    if not filter_specs:
        raise TypeError("partition needs at least one filter spec: partition(tree, spec, ...).")
    specs = [_convert(s) for s in filter_specs]
    if len(specs) == 1:
        leaves, masks, treedef = _flatten_with_mask(pytree, specs[0], is_leaf)
        return (
            treedef.unflatten([x if m else replace for x, m in zip(leaves, masks, strict=True)]),
            treedef.unflatten([replace if m else x for x, m in zip(leaves, masks, strict=True)]),
        )
    leaves, paths, treedef, leaf_test = _flatten(pytree, specs, is_leaf)
    rest = len(specs)
    owner = [rest] * len(leaves)
    for index, spec in enumerate(specs):
        for i, m in enumerate(_masks(spec, pytree, leaves, paths, leaf_test)):
            if m and owner[i] == rest:
                owner[i] = index
    return tuple(
        treedef.unflatten([x if o == part else replace for x, o in zip(leaves, owner, strict=True)])
        for part in range(rest + 1)
    )


def _pick(*values: Any) -> Any:
    for value in values:
        if value is not None:
            return value
    return None


def combine(*pytrees: Any, is_leaf: IsLeaf = None) -> Any:
    """Merge trees produced by `partition`/`filter`: at each leaf, the first non-`None` value.

    Arguments:
        *pytrees: trees of one structure, where `None` marks a missing leaf. Where one tree
            has a whole node (a node type `partition` kept as a leaf, say) and another has
            `None`, the node is taken.
        is_leaf: treat matching subtrees as leaves, as in `jax.tree.flatten`.

    Returns:
        The combined pytree.

    Examples:
        >>> from pytree_filter import combine
        >>> combine({"a": 1, "b": None}, {"a": None, "b": 2})
        {'a': 1, 'b': 2}
    """
    if not pytrees:
        raise TypeError("combine needs at least one pytree.")

    def none_or_leaf(x: Any) -> bool:
        return x is None or (is_leaf is not None and is_leaf(x))

    first, treedef = jax.tree.flatten(pytrees[0], is_leaf=none_or_leaf)
    try:
        # Where the first tree has a `None` placeholder, the others may hold whole subtrees.
        others = [treedef.flatten_up_to(t) for t in pytrees[1:]]
    except (ValueError, TypeError):
        return _combine_nodes(pytrees, none_or_leaf)
    if len(others) == 1:
        picked = [b if a is None else a for a, b in zip(first, others[0], strict=True)]
    else:
        picked = [_pick(*values) for values in zip(first, *others, strict=True)]
    return treedef.unflatten(picked)


def _combine_nodes(trees: Sequence[Any], none_or_leaf: Callable[[Any], bool]) -> Any:
    """Slow path: merge trees whose structures differ where some hold `None`."""
    present = [t for t in trees if t is not None]
    if len(present) <= 1:
        return present[0] if present else None
    first = present[0]
    if none_or_leaf(first):
        return first
    children, treedef = jax.tree_util.tree_flatten(first, is_leaf=lambda x: x is not first)
    if jax.tree_util.treedef_is_leaf(treedef):
        return first
    columns = [children]
    for other in present[1:]:
        other_children, other_def = jax.tree_util.tree_flatten(
            other, is_leaf=lambda x, other=other: x is not other
        )
        if other_def != treedef:
            raise ValueError(
                "combine: the trees disagree on structure beyond `None` placeholders: "
                f"{treedef} against {other_def}."
            )
        columns.append(other_children)
    return treedef.unflatten(
        [_combine_nodes(column, none_or_leaf) for column in zip(*columns, strict=True)]
    )


def _divergence_message(prefix: PyTreeDef, tree: Any) -> str:
    """Say where a prefix filter spec stops matching `tree`."""
    spec = prefix.unflatten([_Placeholder()] * prefix.num_leaves)
    where, detail = _find_divergence(spec, tree, ())
    location = "".join(_key_text(k) for k in where) or "the top level"
    return (
        f"filter_spec does not match the pytree at {location}: {detail}. A prefix filter "
        "spec must have the pytree's structure down to each of its filters."
    )


class _Placeholder:
    """Stands for one filter of a prefix spec while comparing structures."""


def _find_divergence(spec: Any, tree: Any, path: tuple) -> tuple[tuple, str]:
    if isinstance(spec, _Placeholder):
        return path, "no difference found"
    spec_children, spec_def = jax.tree_util.tree_flatten_with_path(
        spec, is_leaf=lambda x: x is not spec
    )
    tree_children, tree_def = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: x is not tree
    )
    if type(spec) is not type(tree):
        return path, f"the spec has a {type(spec).__name__}, the pytree a {type(tree).__name__}"
    spec_keys = [k for k, _ in spec_children]
    tree_keys = [k for k, _ in tree_children]
    if spec_keys != tree_keys:
        shown = [_key_text(k[0]) for k in spec_keys], [_key_text(k[0]) for k in tree_keys]
        return path, f"the spec has children {shown[0]}, the pytree {shown[1]}"
    if _node_data(spec_def) != _node_data(tree_def):
        return path, f"the {type(spec).__name__} nodes differ in their static data"
    for (key, s), (_, t) in zip(spec_children, tree_children, strict=True):
        where, detail = _find_divergence(s, t, (*path, key[0]))
        if detail != "no difference found":
            return where, detail
    return path, "no difference found"


def _node_data(treedef: PyTreeDef) -> Any:
    try:
        return treedef.node_data()
    except AttributeError:
        return None


def _key_text(key: Any) -> str:
    return path_text((key,))
