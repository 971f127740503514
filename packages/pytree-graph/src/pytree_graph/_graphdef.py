"""`GraphDef` (the static structure of an object graph), and rebuilding a graph from it:
`Builder`, `build`, and `merge`, which checks States against a graphdef and builds."""

import operator
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from itertools import repeat
from operator import itemgetter
from types import GenericAlias
from typing import Any

import jax

from pytree_module import Module, TraceContextError
from pytree_module.extend import (
    blank_instance,
    is_pytree_class,
    rebuild_into,
    same_trace,
    touch,
    trace_of,
)

from ._records import DICT, LEAF, LIST, MODULE, OBJECT, PYTREE, SHARED, STATIC, TUPLE, VARIABLE
from ._records import describe as _describe
from ._state import Path, State
from ._state import _flatten as _state_flatten
from ._state import _flatten_with_keys as _state_flatten_with_keys
from ._state import _unflatten as _state_unflatten
from ._variables import Variable, wrote_values


class GraphDef:
    """The static structure of an object graph: everything but its Variables and arrays.

    `split` returns it with the State; `merge(graphdef, state)` (or `graphdef.merge(state)`)
    builds a new graph of the same structure. It records the classes, static attributes,
    Variable types and metadata, and which objects are shared, so sharing (and cycles
    through `pytree=False` objects) come back. It is hashable and compares by value, and
    it is a pytree with no leaves, so it can be passed to `jax.jit` as an ordinary
    argument: equal graphdefs hit the same compiled function.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, split
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> graphdef, state = split(Linear())
        >>> graphdef == split(Linear())[0], graphdef.num_leaves
        (True, 1)
        >>> type(graphdef.merge(state).w).__name__
        'Param'
    """

    __slots__ = ("_hash", "_is_tree", "_unflatten", "num_leaves", "num_objects", "paths", "root")

    # `GraphDef[MyModel]` in annotations, as Flax NNX users write them.
    __class_getitem__ = classmethod(GenericAlias)

    def __init__(self, root: tuple, paths: tuple[tuple[Any, ...], ...], num_objects: int) -> None:
        self.root = root
        self.paths = paths
        self.num_leaves = len(paths)
        self.num_objects = num_objects
        self._hash: int | None = None
        # How `build` can rebuild this graph with one C++ unflatten: None (not tried
        # yet), False (it cannot: sharing, cycles, `pytree=False` objects...), or
        # `(treedef, Variable positions)`.
        self._unflatten: Any = None
        # Whether tree mode (`graph=False`) sees this graph as graph mode does: no object
        # shared, no `pytree=False` object (None: not found out yet).
        self._is_tree: bool | None = None

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self.root, self.paths))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, GraphDef):
            return NotImplemented
        return hash(self) == hash(other) and self.root == other.root and self.paths == other.paths

    def __repr__(self) -> str:
        return f"GraphDef({_describe(self.root)}, leaves={self.num_leaves})"

    def merge(self, *states: Any) -> Any:
        """Build a new graph from this structure and the given States (see `merge`)."""
        return merge(self, *states)

    def apply(self, *states: Any) -> Any:
        """`call((self, *states))`: a method of the graph these States fill, called as a
        pure function returning `(out, (graphdef, new_state))` (see `call`)."""
        return PURE_CALL[0]((self, *states))


jax.tree_util.register_static(GraphDef)


class GraphState(MutableMapping):
    """A `State` with the `GraphDef` it belongs to: what `unpack` returns.

    Read and written as its State (`gs["linear"]`, `gs.linear.w`, `len(gs)`), and a
    pytree with the State's leaves (the graphdef is static), so `jax.tree.map`, `jax.jit`
    and optax take it as they take a State. `merge(gs)` (or `merge(gs_1, gs_2, ...)`)
    builds the graph without a graphdef passed on the side.

    Arguments:
        graphdef: the `GraphDef`.
        state: the `State` (a ValueError otherwise).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, merge, unpack
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> gs = unpack(Linear())
        >>> gs.graphdef.num_leaves, list(gs), gs.w.value.tolist()
        (1, ['w'], [1.0, 1.0])
        >>> type(merge(gs)).__name__
        'Linear'
    """

    __slots__ = ("_graphdef", "_state")

    def __init__(self, graphdef: GraphDef, state: State) -> None:
        if not isinstance(graphdef, GraphDef):
            raise TypeError(f"GraphState takes a GraphDef first, got a {type(graphdef).__name__}.")
        if not isinstance(state, State):
            raise ValueError(f"Expected a State object, got {type(state).__name__}")
        object.__setattr__(self, "_graphdef", graphdef)
        object.__setattr__(self, "_state", state)

    @property
    def graphdef(self) -> GraphDef:
        """The `GraphDef` this state fills."""
        return self._graphdef

    @property
    def state(self) -> State:
        """The `State` itself."""
        return self._state

    def __getattr__(self, name: str) -> Any:
        # Only for names the GraphState itself lacks; its own slots unset (half-built,
        # while copying) must not recurse into `self._state`.
        if name in ("_graphdef", "_state") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self._state, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return GraphState, (self._graphdef, self._state)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._state, name, value)

    def __getitem__(self, key: Any) -> Any:
        return self._state[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._state[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._state[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def __contains__(self, key: object) -> bool:
        return key in self._state

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GraphState):
            return NotImplemented
        return self._graphdef == other._graphdef and self._state == other._state

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GraphState({self._graphdef!r}, {self._state!r})"


def _graph_state_children(gs: GraphState) -> tuple[tuple[Any, ...], Any]:
    children, keys = _state_flatten(gs._state)
    return children, (gs._graphdef, keys)


def _graph_state_children_with_keys(gs: GraphState) -> tuple[tuple[Any, ...], Any]:
    children, keys = _state_flatten_with_keys(gs._state)
    return children, (gs._graphdef, keys)


def _graph_state_rebuild(aux: Any, children: Any) -> GraphState:
    graphdef, keys = aux
    return GraphState(graphdef, _state_unflatten(keys, children))


jax.tree_util.register_pytree_with_keys(
    GraphState, _graph_state_children_with_keys, _graph_state_rebuild, _graph_state_children
)


def _graph_states(first: GraphState, rest: tuple[Any, ...]) -> tuple[GraphDef, tuple[State, ...]]:
    """The graphdef and States of `merge(graph_state, *graph_states)`."""
    graphdef = first._graphdef
    for other in rest:
        if not isinstance(other, GraphState):
            raise ValueError(
                f"merge: after a GraphState, every state must be a GraphState too (from the "
                f"same `unpack`), got {type(other).__name__}. Expected GraphState object."
            )
        if other._graphdef != graphdef:
            raise ValueError(
                "merge: GraphDef must be the same for all GraphState objects; these come "
                "from different `unpack` calls (or graphs). Merge each graph's own."
            )
    return graphdef, (first._state, *(other._state for other in rest))


# `GraphDef.apply` is `call`, which splits graphs and so lives in a module above this one
# (`_pure_call`); that module puts it here when it is imported (the package's
# `__init__` imports it), so that imports point one way.
PURE_CALL: list[Callable[[tuple[Any, ...]], Any]] = []


def build(
    graphdef: GraphDef, values: Sequence[Any], copy: bool = False, recreate_variables: bool = True
) -> Any:
    """Build the graph `graphdef` describes, taking its leaves from `values` (in order).

    A value for a Variable may be a Variable, placed as it is (or a copy of it, with
    `copy`), or a bare value, put in a new Variable of the graphdef's type and metadata
    (or placed bare, without `recreate_variables`).
    """
    if not recreate_variables:
        return Builder(values, [None] * graphdef.num_objects, copy=copy, recreate=False).visit(
            graphdef.root
        )
    fast = graphdef._unflatten
    if fast:
        treedef, positions = fast
        if _all_variables(values, positions):
            if copy:
                values = [v.copy() if isinstance(v, Variable) else v for v in values]
            return treedef.unflatten(values)
    objects: list[Any] = [None] * graphdef.num_objects
    result = Builder(values, objects, copy=copy).visit(graphdef.root)
    if fast is None and not copy:
        graphdef._unflatten = _unflatten_form(graphdef, result, values)
    return result


def merge(graphdef: Any, *states: Any, copy: bool = False, recreate_variables: bool = True) -> Any:
    """Build a new object graph from a `GraphDef` and States (the inverse of `split`).

    Arguments:
        graphdef: from `split` or `graphdef`; or a `GraphState` from `unpack` (then every
            state after it is a GraphState of the same graphdef).
        *states: States (or nested dicts) that together hold exactly the paths the
            graphdef needs. Their Variables are placed in the new graph as they are
            (their type and metadata win); bare values get new Variables of the type and
            metadata recorded in the graphdef.
        copy: put copies of the States' Variables in the graph instead, so that the new
            graph shares no Variable with the States (or the graph they came from).
        recreate_variables: with False, a bare value in a Variable's place is placed as
            it is (no new Variable), as Flax NNX's `merge(..., recreate_variables=False)`.

    Returns:
        The new graph: new Modules, shared where the original was.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, merge, split
        >>> class Tied(Module):
        ...     def __init__(self):
        ...         self.encoder = Param(jnp.ones(2))
        ...         self.decoder = self.encoder
        >>> model = merge(*split(Tied()))
        >>> model.encoder is model.decoder
        True
    """
    if isinstance(graphdef, GraphState):
        graphdef, states = _graph_states(graphdef, states)
    elif not isinstance(graphdef, GraphDef):
        raise TypeError(
            f"merge expects a GraphDef first (from `split`), or GraphStates (from `unpack`), "
            f"got {type(graphdef).__name__}. Call it as `merge(graphdef, state, ...)`."
        )
    return build(graphdef, merge_leaves(graphdef, states, "merge"), copy, recreate_variables)


def merge_leaves(graphdef: GraphDef, states: tuple[Any, ...], function: str) -> list[Any]:
    """The leaves of `states` in `graphdef`'s order, checked to be exactly its paths."""
    if graphdef.paths == ((),):
        return [_lone_leaf(states, function)]
    if len(states) == 1 and isinstance(states[0], State):
        flat_form = states[0]._flat_form()
        if flat_form is not None and flat_form[0] is graphdef.paths:
            # The State `split` made with this very graphdef: its leaves are in order.
            return flat_form[1]
    flat: dict[Path, Any] = {}
    for part in states:
        if not isinstance(part, Mapping):
            raise TypeError(
                f"{function} expects States after the GraphDef, got {type(part).__name__}."
            )
        flat.update(part.flat_state() if isinstance(part, State) else State(part).flat_state())
    missing = [path for path in graphdef.paths if path not in flat]
    if missing or len(flat) != graphdef.num_leaves:
        expected = set(graphdef.paths)
        extra = [path for path in flat if path not in expected]
        raise ValueError(
            f"{function}: the States do not match the GraphDef. "
            + (f"Missing paths: {missing}. " if missing else "")
            + (f"Paths the GraphDef does not have: {extra}. " if extra else "")
            + "Pass every State that `split` returned for this graphdef, and no others."
        )
    return [flat[path] for path in graphdef.paths]


def _lone_leaf(states: tuple[Any, ...], function: str) -> Any:
    """The state of a lone Variable's graphdef: the one Variable (or value) among
    `states`, the others being empty States (as `split(variable, *filters)` gives)."""
    given = [part for part in states if not (isinstance(part, Mapping) and not part)]
    if len(given) != 1 or isinstance(given[0], Mapping):
        raise ValueError(
            f"{function}: this GraphDef is of a lone Variable (split on its own), so its "
            "state is that Variable: pass exactly one Variable (and empty States), got "
            f"{[type(part).__name__ for part in states]}."
        )
    return given[0]


def _all_variables(values: Sequence[Any], positions: tuple[int, ...]) -> bool:
    if len(positions) < 2:
        return all(isinstance(values[p], Variable) for p in positions)
    return all(map(isinstance, itemgetter(*positions)(values), repeat(Variable)))


def _unflatten_form(graphdef: GraphDef, result: Any, values: Sequence[Any]) -> Any:
    """`(treedef, Variable positions)` if JAX's unflatten, with Variables as leaves,
    rebuilds the graph exactly (it is a tree of pytree Modules and containers whose
    leaves are the graphdef's leaves, in order); else False."""
    positions = _variable_positions(graphdef.root)
    if positions is None or not _all_variables(values, positions):
        return None if positions is not None else False
    leaves, treedef = jax.tree_util.tree_flatten(result, is_leaf=_is_variable)
    if len(leaves) != len(values) or not all(map(operator.is_, leaves, values)):
        return False
    return treedef, positions


def _variable_positions(record: tuple) -> tuple[int, ...] | None:
    """The leaf positions of Variables, or None if the records share or cycle."""
    positions: list[int] = []
    stack = [record]
    while stack:
        record = stack.pop()
        tag = record.tag
        if tag == VARIABLE:
            positions.append(record.position)
        elif tag == MODULE:
            if record.early:
                return None
            stack.extend(record.children)
        elif tag in (LIST, TUPLE, DICT):
            stack.extend(record.children)
        elif tag in (SHARED, OBJECT, PYTREE):
            return None
    return tuple(sorted(positions))


def _is_variable(value: Any) -> bool:
    return isinstance(value, Variable)


def check_writable(obj: Any) -> None:
    """Refuse to write a transform's changes into an object of another JAX trace.

    That happens when the object was captured (not passed) by a function that is itself
    being transformed: the new values are tracers of that function's trace.
    """
    token = obj._pg_trace if isinstance(obj, Variable) else trace_of(obj)
    if not same_trace(token):
        raise TraceContextError(
            f"Cannot write the changes made inside a pytree_graph transform back to a "
            f"{type(obj).__name__} created outside the enclosing JAX transform: it was "
            "captured by the function being transformed, not passed to it, so its new "
            "values would leak tracers. Pass the object as an argument of the enclosing "
            "transform too (e.g. `jit(lambda model, x: ...)(model, x)`)."
        )


class Builder:
    """Builds the objects records describe, taking leaves from `values` by position.

    `objects` receives each object at its index. Where `reuse` maps an index to an
    existing object, that object is updated in place to match the record instead (its
    attributes, or its value and metadata): this is how transforms write a graph's new
    structure back to the caller's objects.
    """

    def __init__(
        self,
        values: Sequence[Any],
        objects: list[Any],
        copy: bool = False,
        reuse: dict[int, Any] | None = None,
        recreate: bool = True,
    ):
        self.values = values
        self.objects = objects
        self.copy = copy
        self.reuse = reuse or {}
        self.recreate = recreate

    def visit(self, record: tuple) -> Any:
        """The object (or value) `record` describes."""
        tag = record.tag
        if tag == VARIABLE:
            return self._variable(record.kind, record.index, record.position)
        if tag == MODULE:
            if record.early or record.index in self.reuse:
                return self._module_in_place(record.entry, record.index, record.children)
            module = record.entry(tuple(map(self.visit, record.children)))
            self.objects[record.index] = module
            return module
        if tag == LEAF:
            return self.values[record.position]
        if tag == SHARED:
            return self.objects[record.index]
        if tag == STATIC:
            return record.static.value
        if tag == LIST:
            if record.index >= 0:
                return self._container(record, list(map(self.visit, record.children)))
            return record.cls(map(self.visit, record.children))
        if tag == TUPLE:
            return tuple(map(self.visit, record.children))
        if tag == DICT:
            if record.index >= 0:
                items = list(zip(record.keys, map(self.visit, record.children), strict=True))
                return self._container(record, items)
            return record.cls(zip(record.keys, map(self.visit, record.children), strict=True))
        if tag == PYTREE:
            return record.treedef.unflatten(list(map(self.visit, record.children)))
        return self._object(record.cls, record.index, record.attributes)

    def _container(self, record: Any, items: list[Any]) -> Any:
        """A `List` or `Dict` (an object of the graph) holding `items`: the caller's own,
        refilled in place, when it is being updated; else a new one."""
        container = self.reuse.get(record.index)
        if container is None:
            container = record.cls(items)
        else:
            if record.tag == LIST:
                container[:] = items
            else:
                container.clear()
                container.update(items)
        self.objects[record.index] = container
        return container

    def _variable(self, kind: Any, index: int, position: int) -> Variable:
        value = self.values[position]
        existing = self.reuse.get(index)
        if existing is not None:
            check_writable(existing)
            if isinstance(value, Variable):
                value = value.value
            kind.rewrite(existing, value)
            touch()
            wrote_values()
            variable = existing
        elif isinstance(value, Variable):
            variable = value.copy() if self.copy else value
        elif not self.recreate:
            self.objects[index] = value
            return value
        else:
            variable = kind.build(value)
        self.objects[index] = variable
        return variable

    def _object(self, cls: type, index: int, attributes: tuple) -> Any:
        # A `pytree=False` object is made (or emptied) first, so that objects below it
        # can refer back to it (cycles).
        obj = self.reuse.get(index)
        if obj is None:
            if is_pytree_class(cls):
                raise TypeError(
                    f"merge: the {cls.__name__} in this GraphDef was split while its "
                    "`__init__` was running, before its structure was settled, so no copy "
                    "of it can be built. Split it after `__init__` returns, or update the "
                    "object itself (`update(obj, state)`)."
                )
            obj = blank_instance(cls)
        else:
            check_writable(obj)
            vars(obj).clear()
        self.objects[index] = obj
        for name, child in attributes:
            object.__setattr__(obj, name, self.visit(child))
        if index in self.reuse:
            touch()
        return obj

    def _module_in_place(self, entry: Any, index: int, records: tuple) -> Module:
        # A pytree Module reached again through a `pytree=False` object below it (a
        # cycle), or one of the caller's Modules being updated: it exists before its
        # children are built, and gets its attributes after, as its treedef entry would
        # have given them.
        module = self.reuse.get(index)
        if module is None:
            module = blank_instance(entry.layout.cls)
        else:
            check_writable(module)
        self.objects[index] = module
        rebuild_into(module, entry, tuple(map(self.visit, records)))
        return module
