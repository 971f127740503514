"""The graph API: `split`, `merge`, `state`, `update`, `pop`, `graphdef`, `clone`."""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import SHAPED_TYPES, path_text
from pytree_module import Module
from pytree_module.extend import is_frozen_class

from ._aliases import leaf_aliases
from ._graphdef import GraphDef, GraphState, build, check_writable
from ._lift import LiftedCall, value_of
from ._lift_cache import lift_cache
from ._pure_values import _as_state_path, _flatten_plain, checked_pure_dict
from ._refs import VariableIndex, VariableValue, update_refs
from ._state import Path, State, _partition
from ._traverse import GraphWalk, check_graph
from ._tree_mode import is_tree_mode, tree_lift
from ._variables import Variable


def _lift(node: Any, function: str, graph: bool | None = True) -> LiftedCall:
    """The graphdef, paths and leaves of `node` (a cached walk when it was seen before),
    or, in tree mode (`graph` False, or None under `set_graph_mode(False)`), of `node`
    walked as a pytree."""
    if graph is not True and is_tree_mode(graph):
        lifted = tree_lift(node, function)
    else:
        lifted = lift_cache.find(node)
        check_graph(lifted.graphdef, node, function)
    if lifted.paths and lifted.paths[0] == () and not isinstance(node, Variable):
        raise TypeError(
            f"Expected an object graph (a Module, a Variable, or a list, dict or tuple "
            f"holding Modules, Variables or arrays), got a {type(node).__name__} on its "
            "own: a State needs a key for each leaf. Wrap it, e.g. `split([array])`."
        )
    return lifted


def _states(lifted: LiftedCall, filters: tuple[Any, ...], exhaustive: bool) -> Any:
    return states_of(lifted.paths, lifted.leaves, filters, exhaustive)


def states_of(
    paths: tuple[Path, ...], leaves: list[Any], filters: tuple[Any, ...], exhaustive: bool
) -> tuple[Any, ...]:
    """The States of a graph's leaves (at `paths`), one per filter (one with no filter).

    A lone Variable (split on its own: its one path is `()`, which no State can key) is
    its own state, as in Flax NNX: the filter it matches gets the Variable, the others
    an empty State.
    """
    if paths == ((),):
        if not filters:
            return (leaves[0],)
        parts = _partition({(): leaves[0]}, filters, exhaustive)
        return tuple(leaves[0] if part else State() for part in parts[:-1])
    if not filters:
        return (State._of_flat(paths, leaves),)
    flat = dict(zip(paths, leaves, strict=True))
    parts = _partition(flat, filters, exhaustive)
    return tuple(State.from_flat_path(part) for part in parts[:-1])


def split(node: Any, *filters: Any, graph: bool | None = None) -> tuple[Any, ...]:
    """Split an object graph into its structure and its state.

    Shared Modules and Variables appear once in the State (at the first path that reaches
    them) and are shared again by `merge`. The State holds the graph's own Variables (not
    copies), so `state.w.value = ...` writes to `node` too; a State made by `jax.tree.map`
    or returned from a JAX transform holds new ones.

    Arguments:
        node: a Module (or a list, dict or tuple of them).
        *filters: optional filters (Variable types such as `Param`, `...`, filter
            objects, predicates on the leaf) to split the state into several States. A
            leaf goes to the first filter it matches, and every Variable and array must
            match one: end with `...` to collect the rest.
        graph: `False` for tree mode: `node` is taken as the pytree it is, and a Variable
            reached by two paths raises a ValueError naming both (a Module reached twice
            is taken as two copies); `pytree=False` objects are refused. `None` (the
            default) reads `set_graph_mode`; `True` is graph mode, sharing kept.

    Returns:
        `(graphdef, state)`, or `(graphdef, state_1, ..., state_n)` with n filters.
        A Variable split on its own is its own state, as in Flax NNX (`merge` and
        `update` take it back): with filters, the one it matches gets the Variable,
        the others an empty State.

    Raises:
        TypeError: `node` is a single value (a number, a string, an array...).
        ValueError: a Variable or array matches no filter, or `...` is not the last
            filter; in tree mode, a Variable reached twice or a `pytree=False` object.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import BatchStat, Param, merge, split
        >>> class Norm(Module):
        ...     def __init__(self):
        ...         self.scale = Param(jnp.ones(2))
        ...         self.mean = BatchStat(jnp.zeros(2))
        >>> graphdef, params, stats = split(Norm(), Param, BatchStat)
        >>> list(params), list(stats)
        (['scale'], ['mean'])
        >>> type(merge(graphdef, params, stats)).__name__
        'Norm'
    """
    lifted = _lift(node, "split", graph)
    return (lifted.graphdef, *_states(lifted, filters, exhaustive=True))


def unpack(node: Any, *filters: Any, graph: bool | None = None) -> Any:
    """`split`, with the graphdef carried in each State: `GraphState`s for `merge`.

    Arguments:
        node: a Module (or a list, dict or tuple of them).
        *filters: optional filters, as `split` takes them (every Variable and array must
            match one).
        graph: `False` for tree mode (see `split`); `None` reads `set_graph_mode`.

    Returns:
        One `GraphState` with no filter or one filter; a tuple of them with two or more.

    Raises:
        TypeError, ValueError: as `split`; TypeError for a lone Variable.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import BatchStat, Param, merge, unpack
        >>> class Norm(Module):
        ...     def __init__(self):
        ...         self.scale = Param(jnp.ones(2))
        ...         self.mean = BatchStat(jnp.zeros(2))
        >>> params, stats = unpack(Norm(), Param, BatchStat)
        >>> list(params), list(stats)
        (['scale'], ['mean'])
        >>> type(merge(params, stats)).__name__
        'Norm'
    """
    if isinstance(node, Variable):
        raise TypeError(
            f"unpack: a lone {type(node).__name__} has no State to carry the graphdef in "
            "(its state is the Variable itself). Use `split(variable)`, or unpack a "
            "container holding it (`unpack([variable])`)."
        )
    graphdef, *states = split(node, *filters, graph=graph)
    if len(states) == 1:
        return GraphState(graphdef, states[0])
    return tuple(GraphState(graphdef, part) for part in states)


def state(node: Any, *filters: Any, graph: bool | None = None) -> Any:
    """The state of an object graph (as `split` gives it), without the structure.

    Arguments:
        node: a Module (or a list, dict or tuple of them).
        *filters: optional filters; unlike `split`, leaves matching none are left out.
        graph: `False` for tree mode (see `split`); `None` reads `set_graph_mode`.

    Returns:
        A `State`, or a tuple of States with several filters.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, state
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        ...         self.count = 0
        >>> state(Linear()).to_pure_dict()["w"].tolist()
        [1.0, 1.0]
    """
    states = _states(_lift(node, "state", graph), filters, exhaustive=False)
    return states[0] if len(states) == 1 else states


def graphdef(node: Any, *, graph: bool | None = None) -> GraphDef:
    """The `GraphDef` of an object graph (as `split` gives it), without the state.

    Arguments:
        node: a Module, a Variable, or a list, tuple or dict holding them.
        graph: `False` for tree mode (see `split`); `None` reads `set_graph_mode`.

    Returns:
        The `GraphDef`.

    Raises:
        TypeError: `node` is a single value (a number, a string, an array...).

    Examples:
        >>> from pytree_module import Module
        >>> from pytree_graph import graphdef
        >>> class Empty(Module):
        ...     pass
        >>> graphdef(Empty()) == graphdef(Empty())
        True
    """
    if graph is not True and is_tree_mode(graph):
        return tree_lift(node, "graphdef").graphdef
    result = lift_cache.find(node).graphdef
    check_graph(result, node, "graphdef")
    return result


def clone(
    node: Any, *, variables: bool = True, arrays: bool = False, graph: bool | None = None
) -> Any:
    """A copy of an object graph with new Modules and the same sharing.

    By default the Variables are new too, holding the same JAX arrays (they are
    immutable, so that is safe and costs nothing); NumPy arrays (in Variables or as
    attributes) are copied, so that changing the copy's in place leaves the original's
    as it was.

    Arguments:
        node: a Module, a Variable, or a list, tuple or dict holding them.
        variables: False to keep `node`'s Variables in the copy (new Modules only, so
            training either trains both).
        arrays: also copy the JAX arrays into new buffers, so the copy can be donated
            (`jax.jit(..., donate_argnums=...)`) while the original lives on.
        graph: `False` for tree mode (see `split`): a Module held twice comes back as two
            copies; `None` reads `set_graph_mode`.

    Returns:
        The copy.

    Raises:
        TypeError: `node` is a single value (a number, an array...), not an object graph.
        ValueError: `arrays=True` with `variables=False` (the Variables would hold the
            new buffers, and so would the original).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, clone
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> model = Linear()
        >>> copy = clone(model)
        >>> copy.w is model.w, copy.w.value is model.w.value
        (False, True)
        >>> clone(model, arrays=True).w.value is model.w.value
        False
        >>> clone(model, variables=False).w is model.w
        True
    """
    if arrays and not variables:
        raise ValueError(
            "clone: arrays=True copies the arrays into the copy's own Variables, so it "
            "needs variables=True (the default); with variables=False the copy shares "
            "`node`'s Variables and so their arrays."
        )
    if graph is not True and is_tree_mode(graph):
        lifted = tree_lift(node, "clone")
    else:
        lifted = lift_cache.find(node)
        check_graph(lifted.graphdef, node, "clone")
    if not variables:
        return build(lifted.graphdef, lifted.leaves)
    copy = _copy_all_buffers if arrays else _copy_buffer
    # Bare values: `build` puts each in a new Variable of the graphdef's type and metadata.
    return build(lifted.graphdef, [copy(value_of(leaf)) for leaf in lifted.leaves])


def _copy_buffer(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value


def _copy_all_buffers(value: Any) -> Any:
    """`value` with every NumPy and JAX array in it copied (new buffers)."""
    return jax.tree.map(
        lambda x: jnp.copy(x) if isinstance(x, jax.Array) else _copy_buffer(x), value
    )


def _child(obj: Any, key: Any) -> Any:
    if isinstance(obj, Module) or (isinstance(key, str) and not isinstance(obj, Mapping)):
        return getattr(obj, key)
    return obj[key]


def _locate(node: Any, path: Path) -> tuple[Any, Any]:
    """The object holding the leaf at `path`, and the leaf itself."""
    parent = node
    for depth, key in enumerate(path):
        try:
            child = _child(parent, key)
        except (AttributeError, KeyError, IndexError, TypeError):
            raise ValueError(
                f"update: the graph has nothing at {path_text(path[: depth + 1])}, a path "
                "of the State. Use a State taken from this graph (or one of the same "
                "structure)."
            ) from None
        if depth < len(path) - 1:
            parent = child
    return parent, child


def _can_assign(parent: Any, key: Any) -> bool:
    if isinstance(parent, Module):
        # A frozen Module refuses assignment after __init__: find out before writing anything.
        return not is_frozen_class(type(parent))
    return isinstance(parent, list | dict) or (
        isinstance(key, str) and not isinstance(parent, tuple)
    )


def _assign(parent: Any, key: Any, value: Any) -> None:
    if isinstance(parent, Module) or not isinstance(parent, list | dict):
        setattr(parent, key, value)
    else:
        parent[key] = value


def _is_pure_dict(source: Any) -> bool:
    """Whether `source` is plain nested dicts of values keyed by path (not a tree holding
    Variables, Modules or sequences in the places of the graph's own)."""
    if type(source) is not dict:
        return False
    stack = [source]
    while stack:
        for value in stack.pop().values():
            if type(value) is dict:
                stack.append(value)
            elif isinstance(
                value, Variable | Module | VariableValue | VariableIndex | list | tuple | State
            ):
                return False
    return True


def _every_path(node: Any) -> dict[Path, Any]:
    """`{path: leaf}` of a graph's Variables and arrays, by every path that reaches them
    (a shared one under each of its paths, not only its first)."""
    walk = GraphWalk(record_shared=True)
    check_graph(walk.graphdef(node), node, "update")
    aliases = leaf_aliases(walk)
    return {
        path: leaf
        for position, (first, leaf) in enumerate(zip(walk.paths, walk.leaves, strict=True))
        for path in aliases.get(position, (first,))
    }


def update(node: Any, *states: Any) -> None:
    """Write States (or a deref'd tree) back into a live graph, in place.

    Each Variable at a State's path gets the State's value (and its metadata, when the
    State holds a Variable); an array attribute or item is replaced. Every path is
    checked before anything is written, so a State that does not fit changes nothing.

    One plain nested dict of values keyed by path (as `to_pure_dict` gives, or a part
    of one) sets the values it names: each path must reach a Variable or array of `node`
    (a shared one by any of its paths) and each value have its shape and dtype, all
    checked before anything is written. A path that reaches a static value (an int in
    a dict, a string attribute of a Module) sets it too, as Flax NNX's `update`, unless
    its holder cannot change (a tuple, a frozen Module) or the new value is an array.

    When `node` is any pytree holding Variables and the source is none of these (a tree
    from `deref`, a tree of Variables, or of values in the Variables' places), each
    Variable of `node` takes the value at its place in the source.

    Arguments:
        node: the live graph (or pytree of Variables) to write into; or a lone
            Variable, with the Variable `split(variable)` gave as its state (`None` or
            an empty State, as `grad` gives at the second place of a shared Variable,
            writes nothing).
        *states: States from `split`/`state`, or one pure dict, or one source tree (see
            above).

    Raises:
        ValueError: a path of a State or pure dict that `node` lacks, a value of
            another shape or dtype, or a place that cannot change (an array in a
            tuple or frozen Module); nothing is written then.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, split, update
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> model = Linear()
        >>> graphdef, state = split(model)
        >>> state.w.value = state.w.value * 3
        >>> update(model, state)
        >>> model.w.value.tolist()
        [3.0, 3.0]
        >>> update(model, {"w": jnp.zeros(2)})
        >>> model.w.value.tolist()
        [0.0, 0.0]
    """
    if not states:
        raise TypeError("update needs at least one State (or source tree) to write.")
    states = tuple(s._state if isinstance(s, GraphState) else s for s in states)
    if isinstance(node, Variable):
        if any(isinstance(s, Variable) for s in states):
            _update_lone_variable(node, states)
            return
        if all(s is None or (isinstance(s, State) and not s) for s in states):
            # What `grad` gives at the second path of a shared Variable (its gradient is
            # at the first): `jax.tree.map(update, model, grads, ...)` skips it, as NNX.
            return
    if not all(isinstance(s, State) for s in states):
        if len(states) != 1:
            raise TypeError(
                "update: pass States (from split/state), or exactly one source tree "
                "(from deref, or of Variables or values)."
            )
        if not _is_pure_dict(states[0]):
            update_refs(node, states[0], where="update")
            return
        every = _every_path(node)
        pure, static_writes = _static_writes(node, states[0], every)
        values = checked_pure_dict(every, pure, "update", partial=True)
        states = (State.from_flat_path(values),)
    else:
        static_writes = []
    writes = []
    for part in states:
        for path, leaf in part.flat_state().items():
            if not path:
                continue
            parent, current = _locate(node, path)
            if not isinstance(current, Variable) and not _can_assign(parent, path[-1]):
                frozen = " (a frozen Module)" if isinstance(parent, Module) else ""
                raise ValueError(
                    f"update: the array at {path_text(path)} is inside a "
                    f"{type(parent).__name__}{frozen}, which cannot be changed in place. "
                    "Hold it in a Variable, a list or a dict instead, or build a new graph "
                    "with `merge`."
                )
            writes.append((parent, path, current, leaf))
    for parent, path, current, leaf in writes:
        if isinstance(current, Variable):
            value = leaf.value if isinstance(leaf, Variable) else leaf
            if isinstance(leaf, Variable) and leaf._pg_flat[1] is not current._pg_flat[1]:
                for name, meta in leaf.metadata.items():
                    setattr(current, name, meta)
            current.value = value
        else:
            _assign(parent, path[-1], leaf.value if isinstance(leaf, Variable) else leaf)
    for parent, key, value in static_writes:
        _assign(parent, key, value)


def _static_writes(
    node: Any, pure_dict: Mapping[Any, Any], known: Mapping[Path, Any]
) -> tuple[State, list[tuple[Any, Any, Any]]]:
    """A pure dict's entries for Variables and arrays (as a State, to check), and the
    `(parent, key, value)` writes of those that reach a static value of `node` (an int
    in a dict, a string attribute): as Flax NNX's `update`, these are set too."""
    flat: dict[Path, Any] = {}
    _flatten_plain(pure_dict, (), flat)
    keep: dict[Path, Any] = {}
    writes = []
    for path, value in flat.items():
        if _as_state_path(path, known) in known:
            keep[path] = value
            continue
        try:
            parent, current = _locate(node, path)
        except ValueError:
            keep[path] = value  # the check names the path the graph lacks
            continue
        if isinstance(current, (Variable, Module, list, dict, tuple, *SHAPED_TYPES)):
            keep[path] = value
            continue
        if isinstance(value, SHAPED_TYPES) or not _can_assign(parent, path[-1]):
            frozen = " (a frozen Module)" if isinstance(parent, Module) else ""
            raise ValueError(
                f"update: {path_text(path)} holds the static value {current!r} in a "
                f"{type(parent).__name__}{frozen}, which "
                + (
                    "cannot take an array in its place (that changes the graph's "
                    "structure): hold it in a Variable."
                    if isinstance(value, SHAPED_TYPES)
                    else "cannot be changed in place. Build a new graph with `merge`."
                )
            )
        writes.append((parent, path[-1], value))
    return State.from_flat_path(keep), writes


def _update_lone_variable(node: Variable, states: tuple[Any, ...]) -> None:
    """`update` of a Variable split on its own: its state is one Variable (the others,
    from filters that matched nothing, are empty States)."""
    given = [s for s in states if not (isinstance(s, State) and not s)]
    if len(given) != 1:
        raise ValueError(
            f"update: a lone {type(node).__name__} takes exactly one Variable (its state "
            "from `split`) and empty States, got "
            f"{[type(s).__name__ for s in states]}."
        )
    source = given[0]
    check_writable(node)
    if source._pg_flat[1] is not node._pg_flat[1]:
        for name, meta in source.metadata.items():
            setattr(node, name, meta)
    node.value = source.value


def pop(node: Any, *filters: Any) -> Any:
    """Remove the Variables (and plain arrays) matching the filters from a graph, and
    return them.

    Every reference to a removed Variable is deleted (as an attribute or a dict entry); a
    plain array held as data (not in a Variable) is removed from the path the filter
    matched, as in Flax NNX.

    Arguments:
        node: a Module (or a list, dict or tuple of them).
        *filters: one or more filters; leaves matching none stay in the graph.

    Returns:
        A State of the removed Variables, or a tuple of States with several filters.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Intermediate, Param, pop
        >>> class Layer(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        ...         self.y_mean = Intermediate(jnp.array(0.5))
        >>> layer = Layer()
        >>> list(pop(layer, Intermediate)), hasattr(layer, "y_mean")
        (['y_mean'], False)
    """
    if not filters:
        raise TypeError("pop needs at least one filter saying which Variables to remove.")
    walk = GraphWalk(record_shared=True)
    check_graph(walk.graphdef(node), node, "pop")
    flat = dict(zip(walk.paths, walk.leaves, strict=True))
    parts = _partition(flat, filters, exhaustive=False)
    assert walk.shared_paths is not None
    deletions = []
    for part in parts[:-1]:
        for found, leaf in part.items():
            # A Variable goes from every place that holds it; a plain array (which has no
            # identity in the graph, as in Flax NNX) only from the path the filter matched.
            i = walk.index.get(id(leaf))
            for path in [found] if i is None else walk.shared_paths[i]:
                parent, _ = _locate(node, path)
                if not isinstance(parent, Module | dict):
                    what = type(leaf).__name__ if i is not None else "array"
                    raise ValueError(
                        f"pop: the {what} at {path_text(path)} is inside a "
                        f"{type(parent).__name__}, whose items cannot be removed one by one. "
                        "Keep what you pop in Module attributes or dicts."
                    )
                deletions.append((parent, path[-1]))
    for parent, key in deletions:
        if isinstance(parent, Module):
            delattr(parent, key)
        else:
            del parent[key]
    states = tuple(State.from_flat_path(part) for part in parts[:-1])
    return states[0] if len(states) == 1 else states
