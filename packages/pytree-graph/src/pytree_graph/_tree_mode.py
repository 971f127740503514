"""Tree mode (`graph=False`) for the graph functions: a graph walked as the pytree it is.

Tree mode is Flax NNX's: a Variable reached by two paths is refused (a pytree cannot say
that two leaves are one object), naming both paths; a `pytree=False` object (which JAX
does not flatten) is refused; a Module reached twice is walked twice, so that what comes
back holds two copies, as `jax.tree` would make. What tree mode returns is what graph mode
returns for a graph without sharing (the same `GraphDef` and States), so `merge`,
`unflatten` and the transforms take it as they are.

Graph mode stays the default and pays nothing for this: each function reads `graph` once,
and only `graph=False` (or `set_graph_mode(False)`) takes the walk below.
"""

from typing import Any

from pytree_filter import Path, path_text
from pytree_module import Module
from pytree_module.extend import is_pytree_class

from ._graph_mode import set_graph_mode
from ._lift import LiftedCall, lift_walked
from ._lift_cache import lift_cache
from ._records import MODULE, OBJECT, SHARED
from ._traverse import GraphWalk, check_graph
from ._variables import Variable


def is_tree_mode(graph: bool | None) -> bool:
    """Whether `graph` (a function's `graph=` argument) asks for tree mode."""
    if graph is None:
        return not set_graph_mode.current_value()
    if graph is True:
        return False
    if graph is False:
        return True
    raise TypeError(f"graph= takes True, False or None; got {graph!r}.")


def _suggestion(function: str) -> str:
    return (
        "Consider the following options:\n\n"
        "1. Remove the duplicates and guarantee a tree structure.\n"
        f"2. Enable graph mode by passing graph=True to {function} e.g.\n\n"
        f"  pytree_graph.{function}(..., graph=True)"
    )


def duplicate_error(value: Any, first: Path, second: Path, function: str) -> ValueError:
    """The error for a Variable reached twice in tree mode (Flax NNX's text, our paths)."""
    return ValueError(
        f"Duplicate {type(value).__name__}\nfound at paths:\n\n"
        f"  - {path_text(first)}\n"
        f"  - {path_text(second)}\n\n"
        "Tree mode (graph=False) does not support shared references. " + _suggestion(function)
    )


def not_pytree_error(module: Any, path: Path, function: str) -> ValueError:
    """The error for a `pytree=False` object met in tree mode."""
    return ValueError(
        f"Cannot use '{function}' with graph=False on a '{type(module).__name__}' instance "
        f"that has pytree=False. Found at path: {path_text(path)}. Module classes with "
        "pytree=False are not JAX pytrees and cannot be used in tree-mode. Declare the "
        "class without pytree=False, or pass graph=True to "
        f"{function} (e.g. `pytree_graph.{function}(..., graph=True)`)."
    )


def cycle_error(value: Any, first: Path, second: Path, function: str) -> ValueError:
    return ValueError(
        f"Cycle detected for {type(value).__name__}\nfound at paths:\n\n"
        f"  - {path_text(first)}\n"
        f"  - {path_text(second)}\n\n"
        "Cycles are not supported with graph=False. " + _suggestion(function)
    )


class TreeWalk(GraphWalk):
    """A `GraphWalk` of a graph taken as a pytree: Variables met twice and `pytree=False`
    objects are refused, and a Module met twice is a new object each time."""

    def __init__(self, function: str, record_order: bool = False):
        super().__init__(record_order=record_order)
        self.function = function
        self.first_paths: dict[int, Path] = {}
        self.module_paths: dict[int, Path] = {}

    def _seen(self, value: Any, path: Path) -> int | None:
        key = id(value)
        if isinstance(value, Variable):
            first = self.first_paths.get(key)
            if first is not None:
                raise duplicate_error(value, first, path, self.function)
            self.first_paths[key] = path
            return None
        if not isinstance(value, Module):
            # A `List` or `Dict`: copied by value, as `jax.tree` copies it.
            return None
        # A Module: walked again, unless it is one of those being walked (a cycle).
        if key in self.open:
            raise cycle_error(value, self.module_paths[key], path, self.function)
        if not is_pytree_class(type(value)):
            raise not_pytree_error(value, path, self.function)
        self.module_paths[key] = path
        return None

    def _new_index(self, value: Any, path: Path) -> int:
        # A Module met again gets a new index: `index` keeps the last, which nothing reads
        # in tree mode (`_seen` answers from its own records).
        i = len(self.objects)
        self.index[id(value)] = i
        self.objects.append(value)
        return i

    def _module(self, module: Module, path: Path) -> tuple:
        record = super()._module(module, path)
        self.module_paths.pop(id(module), None)
        return record


def _tree_shaped(root: tuple) -> bool:
    """Whether a graphdef has no shared object and no `pytree=False` object: then tree
    mode's walk would give the same graphdef, paths and leaves as graph mode's."""
    stack = [root]
    while stack:
        record = stack.pop()
        tag = record.tag
        if tag in (SHARED, OBJECT) or (tag == MODULE and record.early):
            return False
        children = getattr(record, "children", None)
        if children is not None:
            stack.extend(children)
    return True


def tree_lift(node: Any, function: str) -> LiftedCall:
    """`node`'s graphdef, paths and leaves, walked as a pytree (see `TreeWalk`).

    A graph with no sharing and no `pytree=False` object is the same in both modes, so
    it is read through the lift cache (which keeps its walk from call to call); only a
    graph that tree mode must copy from or refuse is walked again."""
    lifted = lift_cache.find(node)
    graphdef = lifted.graphdef
    is_tree = graphdef._is_tree
    if is_tree is None:
        is_tree = graphdef._is_tree = _tree_shaped(graphdef.root)
    if is_tree:
        check_graph(graphdef, node, function)
        return lifted
    walk = TreeWalk(function)
    graphdef = walk.graphdef(node)
    check_graph(graphdef, node, function)
    return lift_walked(walk, graphdef)


def tree_order(node: Any, function: str) -> tuple[Any, list[tuple[Path, Any]]]:
    """The graphdef of `node` walked as a pytree, and `(path, value)` of every Module,
    Variable and array in it, post-order (a Module met twice is listed twice)."""
    walk = TreeWalk(function, record_order=True)
    graphdef = walk.graphdef(node)
    assert walk.order is not None
    return graphdef, walk.order
