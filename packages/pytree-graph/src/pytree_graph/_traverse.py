"""Walking a live object graph: its `GraphDef`, its Variables and arrays, shared objects.

`GraphWalk` makes the records (`_records`) of a graph; a `WalkObserver` (the lift
cache's `Checks`) may watch a walk, to learn what a later call must check unchanged.
`iter_graph` and `find_duplicates` are the public walks.
"""

from collections.abc import Iterator
from typing import Any, Protocol

import jax

from pytree_filter import SHAPED_TYPES, Path, path_keys, path_text
from pytree_module import Dict, List, Module
from pytree_module.extend import flat_form, is_pytree_class

from ._graphdef import GraphDef
from ._records import (
    DICT,
    LEAF,
    LIST,
    MODULE,
    OBJECT,
    PYTREE,
    SHARED,
    STATIC,
    TUPLE,
    VARIABLE,
    DictRecord,
    LeafRecord,
    ListRecord,
    ModuleRecord,
    ObjectRecord,
    PytreeRecord,
    SharedRecord,
    StaticRecord,
    TupleRecord,
    VariableRecord,
)
from ._static import Static
from ._variables import Variable

# Static values common enough to skip asking JAX whether they are pytrees.
_PLAIN_STATICS = frozenset({bool, int, float, complex, str, bytes})


def _stops(value: Any) -> bool:
    """Where a generic pytree flatten must stop: at graph nodes, which keep identity."""
    return isinstance(value, Module | Variable)


class WalkObserver(Protocol):
    """What a `GraphWalk` tells an observer as it goes (the lift cache's `Checks`).

    `depth` is 0 for what sits at the top of the walked tree, outside any object.
    """

    cacheable: bool  # set to False by the walk when it meets what no check can watch

    def variable(self, variable: Variable, index: int, position: int, depth: int) -> None:
        """A Variable, first met: object `index`, leaf `position`."""

    def module(self, module: Module, index: int, depth: int) -> None:
        """A Module (pytree or not), first met: object `index`."""

    def array(self, position: int, depth: int) -> None:
        """An array (or shape struct): leaf `position`."""

    def container(self, container: Any, depth: int) -> None:
        """A list or dict (mutable without telling anyone), or a `pytree_module.List`
        or `Dict` (whose changes bump the mutation count)."""


class GraphWalk:
    """One depth-first walk of a graph, in a fixed order (attributes by name, items by
    position), giving every Module and Variable an index at its first visit.

    Attributes:
        leaves: the live Variables and arrays, in order (each shared one once).
        paths: the path of each leaf, at its first visit.
        shared_paths: when `record_shared`, every path of each Module or Variable,
            by index.
        order: when `record_order`, `(path, value)` of every node and leaf, post-order.
    """

    def __init__(
        self,
        record_shared: bool = False,
        record_order: bool = False,
        checks: WalkObserver | None = None,
    ):
        self.leaves: list[Any] = []
        self.paths: list[Path] = []
        self.index: dict[int, int] = {}
        self.objects: list[Any] = []  # holds every indexed object, so ids stay unique
        # Pytree Modules being walked, with the number of `pytree=False` objects entered
        # when each was opened: a way back to one of them is a cycle.
        self.open: dict[int, int] = {}
        self.objects_entered = 0
        # Lists and dicts being walked, likewise: a way back to one of them that enters no
        # `pytree=False` object on the way is a cycle no walk can get out of.
        self.open_containers: dict[int, int] = {}
        self.early: set[int] = set()  # pytree Modules that merge must make before children
        self.shared_paths: dict[int, list[Path]] | None = {} if record_shared else None
        self.order: list[tuple[Path, Any]] | None = [] if record_order else None
        # When set, told of every object, leaf and mutable container met.
        self.checks = checks
        self.depth = 0

    def graphdef(self, node: Any) -> GraphDef:
        """Walk `node` and return its `GraphDef`."""
        root = self.visit(node, ())
        return GraphDef(root, tuple(self.paths), len(self.objects))

    def _seen(self, value: Any, path: Path) -> int | None:
        found = self.index.get(id(value))
        if found is not None and self.shared_paths is not None:
            self.shared_paths[found].append(path)
        return found

    def _new_index(self, value: Any, path: Path) -> int:
        i = self.index[id(value)] = len(self.objects)
        self.objects.append(value)
        if self.shared_paths is not None:
            self.shared_paths[i] = [path]
        return i

    def _leaf(self, value: Any, path: Path) -> int:
        self.leaves.append(value)
        self.paths.append(path)
        if self.order is not None:
            self.order.append((path, value))
        return len(self.leaves) - 1

    def visit(self, value: Any, path: Path) -> tuple:
        """The record of `value`, found at `path`."""
        if isinstance(value, Variable):
            found = self._seen(value, path)
            if found is not None:
                return SharedRecord(SHARED, found)
            i = self._new_index(value, path)
            position = self._leaf(value, path)
            if self.checks is not None:
                self.checks.variable(value, i, position, self.depth)
            return VariableRecord(VARIABLE, value._pg_flat[1], i, position)
        if isinstance(value, Module):
            return self._module(value, path)
        # Arrays are state; so are shape structs (pytree_module's array types include them),
        # so that `eval_shape` results split too.
        if isinstance(value, SHAPED_TYPES):
            position = self._leaf(value, path)
            if self.checks is not None:
                self.checks.array(position, self.depth)
            return LeafRecord(LEAF, position)
        kind = type(value)
        if kind is list or kind is List:
            index = -1
            if kind is List:
                index = self._container_index(value, path)
                if index < -1:
                    return SharedRecord(SHARED, -2 - index)
            if self.checks is not None:
                self.checks.container(value, self.depth)
            before = self._open_container(value, path)
            children = tuple(self.visit(v, (*path, i)) for i, v in enumerate(value))
            self._close_container(value, before)
            return ListRecord(LIST, children, kind, index)
        if kind is tuple:
            return TupleRecord(TUPLE, tuple(self.visit(v, (*path, i)) for i, v in enumerate(value)))
        if kind is dict or kind is Dict:
            index = -1
            if kind is Dict:
                index = self._container_index(value, path)
                if index < -1:
                    return SharedRecord(SHARED, -2 - index)
            if self.checks is not None:
                self.checks.container(value, self.depth)
            before = self._open_container(value, path)
            keys = tuple(value)
            children = tuple(self.visit(value[k], (*path, k)) for k in keys)
            self._close_container(value, before)
            return DictRecord(DICT, keys, children, kind, index)
        if value is None or kind in _PLAIN_STATICS:
            return StaticRecord(STATIC, Static(value))
        return self._other(value, path)

    def _container_index(self, container: Any, path: Path) -> int:
        """The index of a `List` or `Dict` met for the first time (they are objects of
        the graph, shared where they are held twice, as Flax NNX's); `-2 - index` when
        it was met before. One being walked (met again through a `pytree=False` object
        below it) is walked again by value, -1: it is not built yet to be shared."""
        if id(container) in self.open_containers:
            return -1
        found = self._seen(container, path)
        if found is not None:
            return -2 - found
        return self._new_index(container, path)

    def _open_container(self, container: Any, path: Path) -> int | None:
        """Mark a list or dict as being walked; refuse it if it is being walked already
        with no object entered since: a cycle of containers (and pytree Modules), which
        has no object to stop at. Returns what to restore when it is closed."""
        key = id(container)
        opened_at = self.open_containers.get(key)
        if opened_at is not None and opened_at >= self.objects_entered:
            kind = type(container).__name__
            raise ValueError(
                f"The object graph has a cycle through the {kind} at {path_text(path)}: it "
                "holds itself, through lists, tuples, dicts or pytree Modules only. Graph "
                f"functions copy a {kind} by value (it has no identity in a GraphDef), so "
                "they would follow such a cycle forever. Make the cycle go through an "
                "object of a `pytree=False` Module class (e.g. hold the list in one): graph "
                "functions handle cycles through those."
            )
        self.open_containers[key] = self.objects_entered
        return opened_at

    def _close_container(self, container: Any, before: int | None) -> None:
        if before is None:
            del self.open_containers[id(container)]
        else:
            self.open_containers[id(container)] = before

    def _module(self, module: Module, path: Path) -> tuple:
        found = self._seen(module, path)
        if found is not None:
            opened_at = self.open.get(id(module))
            if opened_at is not None and opened_at < self.objects_entered:
                # A cycle back to a pytree Module through a `pytree=False` object: JAX never
                # recurses into that object, and merge makes this Module before its children.
                self.early.add(found)
            elif opened_at is not None:
                raise ValueError(
                    f"The object graph has a cycle through {type(module).__name__} at "
                    f"{path_text(path)}, a pytree Module: pytree Modules must form a tree "
                    "(JAX flattens them recursively). Declare one class on the cycle with "
                    f"`pytree=False` (e.g. `class {type(module).__name__}(Module, "
                    "pytree=False)`): graph functions handle cycles through those."
                )
            return SharedRecord(SHARED, found)
        i = self._new_index(module, path)
        cls = type(module)
        if self.checks is not None:
            self.checks.module(module, i, self.depth)
        self.depth += 1
        flat = flat_form(module) if is_pytree_class(cls) else None
        # A pytree Module still in its `__init__` has no structure yet: its attributes
        # so far are walked as those of a `pytree=False` object (e.g. by `split_rngs`
        # above a transformed `__init__`).
        if flat is not None and flat[1] is not None:
            self.open[id(module)] = self.objects_entered
            children, entry = flat
            records = tuple(
                self.visit(child, (*path, key))
                for key, child in zip(entry.layout.data_keys, children, strict=True)
            )
            del self.open[id(module)]
            record: tuple = ModuleRecord(MODULE, entry, i, records, i in self.early)
        else:
            self.objects_entered += 1
            attributes = sorted(vars(module).items())
            record = ObjectRecord(
                OBJECT,
                cls,
                i,
                tuple((name, self.visit(v, (*path, name))) for name, v in attributes),
            )
            self.objects_entered -= 1
        self.depth -= 1
        if self.order is not None:
            self.order.append((path, module))
        return record

    def _other(self, value: Any, path: Path) -> tuple:
        keyed, treedef = jax.tree_util.tree_flatten_with_path(value, is_leaf=_stops)
        if treedef.num_nodes == 1 and treedef.num_leaves == 1 and keyed[0][1] is value:
            try:
                hash(value)
            except TypeError:
                raise TypeError(
                    f"The value at {path_text(path)} ({type(value).__name__}) is kept in the "
                    "GraphDef, which must be hashable, but it is not. Store it as an array "
                    "or in a Variable, or make it hashable (a tuple instead of a list, a "
                    "frozen dataclass)."
                ) from None
            return StaticRecord(STATIC, Static(value))
        if self.checks is not None:
            # Other pytree nodes may be mutable in ways no check can see cheaply.
            self.checks.cacheable = False
        children = tuple(self.visit(leaf, (*path, *path_keys(p))) for p, leaf in keyed)
        return PytreeRecord(PYTREE, treedef, children)


def check_graph(graphdef: GraphDef, node: Any, function: str) -> None:
    """Refuse a `node` that is a single value (a number, a string, None, an array): a
    graph function needs objects to walk.

    Raises:
        TypeError: naming `function` and what `node` is.
    """
    if graphdef.root.tag in (STATIC, LEAF):
        shown = repr(node)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TypeError(
            f"{function} expects an object graph as its first argument `node`: a Module, "
            f"a Variable, or a list, tuple or dict holding them (or arrays); got {shown}, "
            f"a single value of type {type(node).__name__}. Pass the object that holds it."
        )


def iter_graph(node: Any) -> Iterator[tuple[Path, Any]]:
    """`(path, value)` of every Module, Variable and array of `node`, each shared one once,
    children first (graph mode; the public `pytree_graph.iter_graph` also has tree mode)."""
    walk = GraphWalk(record_order=True)
    walk.graphdef(node)
    assert walk.order is not None
    return iter(walk.order)


def find_duplicates(node: Any) -> list[list[Path]]:
    """The Modules and Variables reachable by more than one path, as lists of their paths.

    An empty list means the graph is a tree: JAX transforms would not lose any sharing.

    Arguments:
        node: a Module (or any pytree or `pytree=False` object graph).

    Returns:
        One list of paths per shared object, in the order they are first met.

    Raises:
        TypeError: `node` is a single value (a number, a string, an array...).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import find_duplicates
        >>> class Shared(Module):
        ...     def __init__(self):
        ...         self.x = jnp.array(1.0)
        >>> class Parent(Module):
        ...     def __init__(self):
        ...         self.left = Shared()
        ...         self.right = self.left
        >>> find_duplicates(Parent())
        [[('left',), ('right',)]]
    """
    walk = GraphWalk(record_shared=True)
    check_graph(walk.graphdef(node), node, "find_duplicates")
    assert walk.shared_paths is not None
    return [paths for paths in walk.shared_paths.values() if len(paths) > 1]
