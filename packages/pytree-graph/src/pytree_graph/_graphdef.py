"""`GraphDef`: the static structure of an object graph, and rebuilding a graph from it."""

import copy
import operator
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import jax

from pytree_module import Module, TraceContextError
from pytree_module._module import mutations
from pytree_module._trace import current_trace_token, same_trace

from ._variables import Variable

# Record tags. A graph is described by nested tuples of records; each begins with a tag.
MODULE = 0  # (MODULE, entry, index, children, early): a pytree Module, rebuilt by its entry
OBJECT = 1  # (OBJECT, cls, index, ((name, record), ...)): a `pytree=False` Module
SHARED = 2  # (SHARED, index): an object met before on another path
VARIABLE = 3  # (VARIABLE, kind, index, position): a Variable; its value is leaf `position`
LEAF = 4  # (LEAF, position): an array, leaf `position` of the state
STATIC = 5  # (STATIC, Static(value)): any other value, kept as it is (see `_static`)
LIST = 6  # (LIST, children)
TUPLE = 7  # (TUPLE, children)
DICT = 8  # (DICT, keys, children)
PYTREE = 9  # (PYTREE, treedef, children): any other registered pytree node

_set_trace = Module._pm_trace.__set__  # type: ignore[attr-defined]
_set_flat = Module._pm_flat.__set__  # type: ignore[attr-defined]
_set_variable = Variable._pg_flat.__set__  # type: ignore[attr-defined]


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

    __slots__ = ("_hash", "_unflatten", "num_leaves", "num_objects", "paths", "root")

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
        from ._split_merge import merge

        return merge(self, *states)


jax.tree_util.register_pytree_node(GraphDef, lambda g: ((), g), lambda g, _: g)


_CONTAINER_NAMES = {LIST: "list", TUPLE: "tuple", DICT: "dict", STATIC: "static value"}


def _describe(record: tuple) -> str:
    tag = record[0]
    if tag == MODULE:
        return record[1].layout.cls.__name__
    if tag == OBJECT:
        return record[1].__name__
    if tag == PYTREE:
        return f"pytree {record[1]}"
    return _CONTAINER_NAMES.get(tag, "Variable")


def build(graphdef: GraphDef, values: Sequence[Any], copy: bool = False) -> Any:
    """Build the graph `graphdef` describes, taking its leaves from `values` (in order).

    A value for a Variable may be a Variable, placed as it is (or a copy of it, with
    `copy`), or a bare value, put in a new Variable of the graphdef's type and metadata.
    """
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
        tag = record[0]
        if tag == VARIABLE:
            positions.append(record[3])
        elif tag == MODULE:
            if record[4]:
                return None
            stack.extend(record[3])
        elif tag in (LIST, TUPLE):
            stack.extend(record[1])
        elif tag == DICT:
            stack.extend(record[2])
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
    token = obj._trace if isinstance(obj, Variable) else obj._pm_trace
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
    ):
        self.values = values
        self.objects = objects
        self.copy = copy
        self.reuse = reuse or {}

    def visit(self, record: tuple) -> Any:
        """The object (or value) `record` describes."""
        tag = record[0]
        if tag == VARIABLE:
            return self._variable(*record[1:])
        if tag == MODULE:
            _, entry, index, children, early = record
            if early or index in self.reuse:
                return self._module_in_place(entry, index, children)
            module = entry(tuple(map(self.visit, children)))
            self.objects[index] = module
            return module
        if tag == LEAF:
            return self.values[record[1]]
        if tag == SHARED:
            return self.objects[record[1]]
        if tag == STATIC:
            return record[1].value
        if tag == LIST:
            return list(map(self.visit, record[1]))
        if tag == TUPLE:
            return tuple(map(self.visit, record[1]))
        if tag == DICT:
            return dict(zip(record[1], map(self.visit, record[2]), strict=True))
        if tag == PYTREE:
            return record[1].unflatten(list(map(self.visit, record[2])))
        return self._object(*record[1:])

    def _variable(self, kind: Any, index: int, position: int) -> Variable:
        value = self.values[position]
        existing = self.reuse.get(index)
        if existing is not None:
            check_writable(existing)
            mutations.count += 1
            if isinstance(value, Variable):
                value = value.value
            _set_variable(existing, ((value,), kind))
            variable = existing
        elif isinstance(value, Variable):
            variable = value.copy() if self.copy else value
        else:
            variable = kind((value,))
        self.objects[index] = variable
        return variable

    def _object(self, cls: type, index: int, attributes: tuple) -> Any:
        # A `pytree=False` object is made (or emptied) first, so that objects below it
        # can refer back to it (cycles).
        obj = self.reuse.get(index)
        if obj is None:
            obj = object.__new__(cls)
            _set_trace(obj, current_trace_token())
        else:
            check_writable(obj)
            mutations.count += 1
            vars(obj).clear()
        self.objects[index] = obj
        for name, child in attributes:
            object.__setattr__(obj, name, self.visit(child))
        return obj

    def _module_in_place(self, entry: Any, index: int, records: tuple) -> Module:
        # A pytree Module reached again through a `pytree=False` object below it (a
        # cycle), or one of the caller's Modules being updated: it exists before its
        # children are built, and gets its attributes after, as its treedef entry would
        # have given them.
        layout = entry.layout
        module = self.reuse.get(index)
        if module is None:
            module = object.__new__(layout.cls)
            _set_trace(module, current_trace_token())
        else:
            check_writable(module)
            mutations.count += 1
        self.objects[index] = module
        children = tuple(map(self.visit, records))
        attributes = module.__dict__
        attributes.clear()
        attributes.update(zip(layout.data_keys, children, strict=True))
        for key, value, unhashable in zip(
            layout.static_keys, entry.statics, layout.unhashable, strict=True
        ):
            attributes[key] = copy.copy(value) if unhashable else value
        _set_flat(module, (children, entry))
        return module
