"""An object graph as a plain pytree, and back: `to_tree`/`from_tree` (sharing kept), and
`flatten`/`unflatten` (the graphdef with a flat list of `(path, leaf)` pairs)."""

from collections.abc import Hashable, Mapping
from typing import Any

import jax
from jax.tree_util import GetAttrKey

from pytree_filter import Path, path_keys, path_text
from pytree_module import Module

from ._argument_specs import FilterSpecs
from ._flat_state import FlatState
from ._graphdef import GraphDef, build, merge
from ._lift import value_of
from ._split_merge import _lift, split
from ._state import State
from ._traverse import iter_graph
from ._update_context import merge_context, split_context
from ._variables import Variable


def _is_graph_node(value: Any) -> bool:
    return isinstance(value, Module | Variable)


class NodeState:
    """What `to_tree` puts in place of each Module or Variable: its part of the State.

    A pytree whose only child is a `State` (whose leaves are the arrays); the graphdef of
    all the graph nodes `to_tree` was given, and this node's place among them, are static
    data. A node met again (shared) has an empty State: its Variables are held where it
    was first met.

    Attributes:
        graphdef: the `GraphDef` of the graph nodes of the whole `to_tree` call.
        index: which of those nodes this is.
        state: its `State` (for a Variable, the Variable itself).
    """

    __slots__ = ("graphdef", "index", "state")

    def __init__(self, graphdef: GraphDef, index: int, state: Any):
        self.graphdef = graphdef
        self.index = index
        self.state = state

    def __repr__(self) -> str:
        return f"NodeState(index={self.index}, state={self.state!r})"


jax.tree_util.register_pytree_with_keys(
    NodeState,
    lambda n: (((GetAttrKey("state"), n.state),), (n.graphdef, n.index)),
    lambda aux, children: NodeState(aux[0], aux[1], children[0]),
    lambda n: ((n.state,), (n.graphdef, n.index)),
)


def _prefix_is_leaf(value: Any) -> bool:
    return value is None or _is_graph_node(value) or isinstance(value, FilterSpecs)


def _leaf_prefixes(prefix: Any, tree: Any) -> list[Any]:
    """The prefix of each leaf of `tree` (Modules and Variables being leaves), `prefix`
    being a prefix of `tree`'s structure (as `in_axes` is of a function's arguments)."""
    prefix_leaves, prefix_def = jax.tree_util.tree_flatten(prefix, is_leaf=_prefix_is_leaf)
    try:
        subtrees = prefix_def.flatten_up_to(tree)
    except ValueError as error:
        raise ValueError(
            f"to_tree: prefix= must be a prefix of the tree's structure (one entry for each "
            f"argument, or for a whole part of the tree): {error}"
        ) from None
    result: list[Any] = []
    for leaf_prefix, subtree in zip(prefix_leaves, subtrees, strict=True):
        count = len(jax.tree_util.tree_leaves(subtree, is_leaf=_is_graph_node))
        result.extend([leaf_prefix] * count)
    return result


def _check_consistent_aliasing(keyed: list[tuple[Any, Any]], prefixes: list[Any]) -> None:
    """Refuse a Variable reached under two different prefixes (e.g. a Module passed twice
    with two `in_axes`): it has one value, which cannot follow both."""
    seen: dict[int, tuple[Variable, list[tuple[Path, Any]]]] = {}
    for (key_path, leaf), leaf_prefix in zip(keyed, prefixes, strict=True):
        if not _is_graph_node(leaf):
            continue
        base = tuple(path_keys(key_path))
        for path, value in iter_graph(leaf):
            if not isinstance(value, Variable):
                continue
            if isinstance(leaf_prefix, FilterSpecs):
                value_prefix = leaf_prefix.spec_of(path, value, "to_tree")
            else:
                value_prefix = leaf_prefix
            entry = seen.setdefault(id(value), (value, []))
            entry[1].append(((*base, *path), value_prefix))
    messages = []
    for variable, found in seen.values():
        first = found[0][1]
        if any(not _same_prefix(first, other) for _, other in found[1:]):
            lines = "\n".join(f"  {path_text(path)}: {p!r}" for path, p in found)
            messages.append(f"Node: {type(variable).__name__}\n{lines}")
    if messages:
        raise ValueError(
            "Inconsistent aliasing detected. The following nodes have different prefixes:\n"
            + "\n".join(messages)
            + "\nA shared Variable has one value, so every place that reaches it needs the "
            "same prefix: give them the same one, or pass the object once."
        )


def _same_prefix(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # an array-like prefix with no single truth value
        return False


def to_tree(tree: Any, *, prefix: Any = None, ctxtag: Hashable | None = None) -> Any:
    """An object graph as a plain pytree, for code that only speaks pytrees.

    Every Module and Variable in `tree` is replaced by a `NodeState` (a pytree holding its
    State); everything else stays as it is, so the result has the same outer structure
    (`in_axes`-style prefixes still fit it). All graph nodes are split together: a Module
    or Variable reachable from several places (even from different items of `tree`) is
    held once, so flattening the result gives each shared array once, and `from_tree`
    shares it again. Cycles (through `pytree=False` Modules) are kept the same way.

    The States hold the graph's own Variables (as `split` gives them); anything JAX
    returns holds new ones.

    Arguments:
        tree: any pytree holding Modules and Variables (a Module on its own too).
        prefix: optional, a prefix of `tree`'s structure (as `vmap`'s `in_axes` is of its
            arguments: an axis, `None`, or a `StateAxes`, per argument or part). When
            given, every Variable must be reached under one prefix: a Variable shared by
            two parts of `tree` with different prefixes raises, naming its paths and
            prefixes (Flax NNX's "Inconsistent aliasing detected").
        ctxtag: the tag of an open `update_context`: the split is a step of it (the
            outer split, or the inner split after an inner merge), as Flax NNX's
            `to_tree(..., ctxtag=)`; `from_tree(..., ctxtag=, is_inner=)` is the merge.

    Returns:
        The same pytree with a `NodeState` in place of each Module and Variable.

    Raises:
        ValueError: `prefix` is not a prefix of `tree`, or a Variable is reached under
            two different prefixes.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, from_tree, to_tree
        >>> class Tied(Module):
        ...     def __init__(self):
        ...         self.encoder = Param(jnp.ones(2))
        ...         self.decoder = self.encoder
        >>> tree = to_tree(Tied())
        >>> len(jax.tree.leaves(tree))  # the shared Param once
        1
        >>> model = from_tree(jax.jit(lambda t: jax.tree.map(lambda x: x * 3, t))(tree))
        >>> model.encoder is model.decoder, model.decoder.value.tolist()
        (True, [3.0, 3.0])
    """
    if prefix is not None:
        keyed, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_graph_node)
        _check_consistent_aliasing(keyed, _leaf_prefixes(prefix, tree))
        leaves = [leaf for _, leaf in keyed]
    else:
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_graph_node)
    positions = [i for i, leaf in enumerate(leaves) if _is_graph_node(leaf)]
    if not positions:
        return tree
    nodes = [leaves[i] for i in positions]
    if ctxtag is None:
        graphdef, state = split(nodes)
    else:
        with split_context(ctxtag) as ctx:
            graphdef, state = ctx.split(nodes)
    for index, position in enumerate(positions):
        leaves[position] = NodeState(graphdef, index, state[index] if index in state else State())
    return treedef.unflatten(leaves)


def _is_node_state(value: Any) -> bool:
    return isinstance(value, NodeState)


def from_tree(tree: Any, *, ctxtag: Hashable | None = None, is_inner: bool | None = None) -> Any:
    """Rebuild the object graph `to_tree` turned into a pytree.

    Each `NodeState` becomes a Module or Variable again, shared where the original was
    (a node met twice is the same object twice). The graph's Variables are new objects
    (copies of those in the States), so changing the result leaves `tree` as it was.

    Arguments:
        tree: the pytree `to_tree` returned (or one made from it by JAX, e.g. by
            `jax.tree.map` or as the output of `jax.jit`), whole.
        ctxtag: the tag of an open `update_context`: the merge is a step of it, as
            Flax NNX's `from_tree(..., ctxtag=, is_inner=)`.
        is_inner: with `ctxtag`, True for the merge inside the transform, False for
            the one outside, which updates and returns the objects `to_tree` split.

    Returns:
        The same pytree with each `NodeState` replaced by its Module or Variable.

    Raises:
        ValueError: `tree` holds `NodeState`s of several `to_tree` calls, or not all of
            those of one call; with `ctxtag`, as `merge_context` raises.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, from_tree, to_tree
        >>> shared = Param(jnp.zeros(2))
        >>> pair = from_tree(to_tree({"a": shared, "b": shared}))
        >>> pair["a"] is pair["b"], pair["a"] is shared
        (True, False)
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_node_state)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, NodeState)]
    if not positions:
        return tree
    graphdef = leaves[positions[0]].graphdef
    count = len(graphdef.root.children)
    states: dict[int, State] = {}
    for position in positions:
        node = leaves[position]
        if node.graphdef != graphdef or node.index in states:
            raise ValueError(
                "from_tree: the tree holds NodeStates made by different `to_tree` calls. "
                "Call `from_tree` on each result of `to_tree` on its own, or call "
                "`to_tree` once on everything (e.g. `to_tree((model, optimizer))`)."
            )
        states[node.index] = node.state
    missing = sorted(set(range(count)) - set(states))
    if missing:
        raise ValueError(
            f"from_tree: the tree holds {len(states)} of the {count} NodeStates that "
            f"`to_tree` made (missing: {missing}). Pass the whole tree `to_tree` returned: "
            "shared Variables are held by one NodeState only."
        )
    if ctxtag is None:
        nodes = merge(graphdef, State(states), copy=True)
    else:
        with merge_context(ctxtag, inner=is_inner) as ctx:
            nodes = ctx.merge(graphdef, State(states))
    for position in positions:
        leaves[position] = nodes[leaves[position].index]
    return treedef.unflatten(leaves)


def flatten(
    node: Any, *, with_paths: bool = True, graph: bool | None = None
) -> tuple[GraphDef, Any]:
    """The graphdef of an object graph and its leaves as a flat list.

    The same as `split(node)` with the State flat: the leaves come in the graphdef's
    order, each shared Variable once, and are the graph's own Variables (or arrays).

    Arguments:
        node: a Module (or a list, dict or tuple of them).
        with_paths: return `(path, leaf)` pairs (a `FlatState`); with False, a list of
            the bare values (each Variable's `.value`, or the array).
        graph: `False` for tree mode (see `split`); `None` reads `set_graph_mode`.

    Returns:
        `(graphdef, flat_state)`, or `(graphdef, values)` with `with_paths=False`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, flatten, unflatten
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        ...         self.b = Param(jnp.zeros(2))
        >>> graphdef, flat = flatten(Linear())
        >>> [path for path, _ in flat]
        [('b',), ('w',)]
        >>> graphdef, values = flatten(Linear(), with_paths=False)
        >>> unflatten(graphdef, [v + 1 for v in values]).w.value.tolist()
        [2.0, 2.0]
    """
    lifted = _lift(node, "flatten", graph)
    if not with_paths:
        return lifted.graphdef, [value_of(leaf) for leaf in lifted.leaves]
    return lifted.graphdef, FlatState(lifted.graphdef.paths, lifted.leaves)


def unflatten(graphdef: GraphDef, flat_state: Any, *, copy: bool = False) -> Any:
    """Build an object graph from a graphdef and its leaves (the inverse of `flatten`).

    Arguments:
        graphdef: from `flatten` (or `split`).
        flat_state: a `FlatState` (its paths must be the graphdef's), a list of values
            in the graphdef's leaf order (as `flatten(..., with_paths=False)` gives), or
            a `State`. Variables in it are placed in the graph as they are; bare values
            get new Variables of the graphdef's types and metadata.
        copy: place copies of the Variables instead, so the new graph shares none.

    Returns:
        The new graph.

    Raises:
        TypeError: `graphdef` is not a GraphDef, or `flat_state` is none of the above.
        ValueError: the paths or the number of values do not match the graphdef.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, flatten, unflatten
        >>> graphdef, flat = flatten([Param(jnp.ones(2))])
        >>> unflatten(graphdef, flat)[0] is flat[0][1]
        True
    """
    if not isinstance(graphdef, GraphDef):
        raise TypeError(
            f"unflatten expects a GraphDef first (from `flatten`), got "
            f"{type(graphdef).__name__}. Call it as `unflatten(graphdef, flat_state)`."
        )
    if isinstance(flat_state, FlatState):
        if flat_state.paths == graphdef.paths:
            return build(graphdef, flat_state.leaves, copy=copy)
        return merge(graphdef, flat_state.to_nested_state(), copy=copy)
    if isinstance(flat_state, Mapping):
        return merge(graphdef, flat_state, copy=copy)
    if isinstance(flat_state, list | tuple):
        if len(flat_state) != graphdef.num_leaves:
            raise ValueError(
                f"unflatten: {len(flat_state)} values for a graphdef of "
                f"{graphdef.num_leaves} leaves. Pass the values `flatten(node, "
                "with_paths=False)` returned, in their order."
            )
        return build(graphdef, flat_state, copy=copy)
    raise TypeError(
        f"unflatten expects a FlatState, a list of values or a State as `flat_state`, got "
        f"a {type(flat_state).__name__}."
    )
