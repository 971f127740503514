"""Iterating over the Modules of a graph, and mapping a function over all its nodes."""

from collections.abc import Callable, Iterator
from typing import Any

import jax

from pytree_filter import SHAPED_TYPES, Path, path_keys, path_text
from pytree_module import Dict, List, Module
from pytree_module.extend import blank_instance, flat_form, is_pytree_class

from ._traverse import GraphWalk, _stops, check_graph
from ._traverse import iter_graph as graph_order
from ._tree_mode import cycle_error, duplicate_error, is_tree_mode, not_pytree_error, tree_order
from ._variables import Variable


def iter_graph(node: Any, *, graph: bool | None = None) -> Iterator[tuple[Path, Any]]:
    """Iterate over every Module, Variable and array of a graph, each shared one once.

    Children come before their parents (post-order), so the root comes last; attributes
    in name order, items in position order.

    Arguments:
        node: a Module (or any pytree or `pytree=False` object graph).
        graph: `False` for tree mode (see `pytree_graph.split`): a Module held twice is
            yielded twice (with what it holds), a Variable reached twice or a
            `pytree=False` object raises a ValueError; `None` reads `set_graph_mode`.

    Returns:
        An iterator of `(path, value)` pairs, paths being tuples of keys.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, iter_graph
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> [(path, type(value).__name__) for path, value in iter_graph(Linear())]
        [(('w',), 'Param'), ((), 'Linear')]
    """
    if graph is not True and is_tree_mode(graph):
        return iter(tree_order(node, "iter_graph")[1])
    return graph_order(node)


def iter_modules(node: Any, *, graph: bool | None = None) -> Iterator[tuple[Path, Module]]:
    """Iterate over every Module of a graph, `node` included, each shared one once.

    The order is `iter_graph`'s: children before their parents, so the root comes last.

    Arguments:
        node: a Module (or a list, tuple or dict holding Modules).
        graph: `False` for tree mode (see `pytree_graph.split`): a Module held twice is
            yielded twice, a Variable reached twice raises; `None` reads `set_graph_mode`.

    Returns:
        An iterator of `(path, module)` pairs, paths being tuples of keys.

    Raises:
        TypeError: `node` is a single value (a number, a string, an array...).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, iter_modules
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> class MLP(Module):
        ...     def __init__(self):
        ...         self.layers = [Linear(), Linear()]
        >>> [(path, type(m).__name__) for path, m in iter_modules(MLP())]
        [(('layers', 0), 'Linear'), (('layers', 1), 'Linear'), ((), 'MLP')]
    """
    if graph is not True and is_tree_mode(graph):
        graphdef, order = tree_order(node, "iter_modules")
        check_graph(graphdef, node, "iter_modules")
    else:
        walk = GraphWalk(record_order=True)
        check_graph(walk.graphdef(node), node, "iter_modules")
        assert walk.order is not None
        order = walk.order
    return ((path, value) for path, value in order if isinstance(value, Module))


def _entries(node: Any) -> list[tuple[Any, Any]]:
    """The `(key, value)` of a node's own attributes or items, in `iter_graph`'s order."""
    if isinstance(node, Module):
        if is_pytree_class(type(node)):
            children, entry = flat_form(node)
            return list(zip(entry.layout.data_keys, children, strict=True))
        return sorted(vars(node).items())
    if type(node) in (dict, Dict):
        return list(node.items())
    if type(node) in (list, tuple, List):
        return list(enumerate(node))
    shown = repr(node)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise TypeError(
        "iter_children expects a Module (or a list, tuple or dict) as `node`, got "
        f"{shown}, of type {type(node).__name__}."
    )


def iter_children(node: Any, *, graph: bool | None = None) -> Iterator[tuple[Any, Module]]:
    """Iterate over the Modules that are direct attributes (or items) of `node`.

    Unlike `iter_modules` it does not go further down; a Module held by two attributes
    is yielded under each. Modules inside a list or dict attribute are not direct
    children (the list is): reach them with `iter_modules`.

    Arguments:
        node: a Module (or a list, tuple or dict).
        graph: `False` for tree mode, which refuses a `pytree=False` `node`; `None`
            reads `set_graph_mode`.

    Returns:
        An iterator of `(key, module)` pairs: the attribute name (or item key) and the
        Module.

    Raises:
        TypeError: `node` is not a Module, list, tuple or dict.
        ValueError: in tree mode, `node` is a `pytree=False` object.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, iter_children
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> class Block(Module):
        ...     def __init__(self):
        ...         self.first = Linear()
        ...         self.second = Linear()
        ...         self.scale = Param(jnp.ones(()))
        >>> [(key, type(m).__name__) for key, m in iter_children(Block())]
        [('first', 'Linear'), ('second', 'Linear')]
    """
    if (
        isinstance(node, Module)
        and not is_pytree_class(type(node))
        and graph is not True
        and is_tree_mode(graph)
    ):
        raise not_pytree_error(node, (), "iter_children")
    entries = _entries(node)
    return ((key, value) for key, value in entries if isinstance(value, Module))


class _Mapper:
    """One `recursive_map`: results by object id, so shared objects map once."""

    def __init__(self, fn: Callable[[Path, Any], Any], tree: bool = False):
        self.fn = fn
        self.results: dict[int, Any] = {}
        self.open: set[int] = set()
        # Tree mode: where each Variable and open Module was met, to name both places
        # when one is met again.
        self.tree = tree
        self.paths: dict[int, Path] = {}

    def _tree_check(self, value: Any, path: Path) -> None:
        key = id(value)
        if isinstance(value, Variable):
            if key in self.paths:
                raise duplicate_error(value, self.paths[key], path, "recursive_map")
            self.paths[key] = path
        elif key in self.open:
            raise cycle_error(value, self.paths[key], path, "recursive_map")
        elif not is_pytree_class(type(value)):
            raise not_pytree_error(value, path, "recursive_map")
        else:
            self.paths[key] = path

    def visit(self, value: Any, path: Path) -> Any:
        if isinstance(value, Module | Variable):
            key = id(value)
            if self.tree:
                # As a pytree: a Module met twice is mapped twice, into two results.
                self._tree_check(value, path)
                self.open.add(key)
                new = value if isinstance(value, Variable) else self._module(value, path)
                self.open.discard(key)
                return self.fn(path, new)
            if key in self.results:
                return self.results[key]
            if key in self.open:
                raise ValueError(
                    f"recursive_map found a cycle: the {type(value).__name__} at "
                    f"{path_text(path)} is also one of the objects holding it. `fn` must "
                    "get each object after its children's results, which a cycle makes "
                    "impossible. Walk such graphs with `iter_graph` instead."
                )
            self.open.add(key)
            new = value if isinstance(value, Variable) else self._module(value, path)
            result = self.results[key] = self.fn(path, new)
            self.open.discard(key)
            return result
        kind = type(value)
        if kind in (list, tuple, List, dict, Dict):
            key = id(value)
            if key in self.open:
                raise ValueError(
                    f"recursive_map found a cycle: the {kind.__name__} at {path_text(path)} "
                    "holds itself. `fn` must get each value after its children's results, "
                    "which a cycle makes impossible. Walk such graphs with `iter_graph` "
                    "instead."
                )
            self.open.add(key)
            if kind in (dict, Dict):
                new = kind((k, self.visit(v, (*path, k))) for k, v in value.items())
            else:
                new = kind(self.visit(v, (*path, i)) for i, v in enumerate(value))
            self.open.discard(key)
        elif isinstance(value, SHAPED_TYPES):
            new = value
        else:
            keyed, treedef = jax.tree_util.tree_flatten_with_path(value, is_leaf=_stops)
            if treedef.num_nodes == 1 and treedef.num_leaves == 1 and keyed[0][1] is value:
                new = value
            else:
                new = treedef.unflatten(
                    [self.visit(leaf, (*path, *path_keys(p))) for p, leaf in keyed]
                )
        return self.fn(path, new)

    def _module(self, module: Module, path: Path) -> Module:
        if is_pytree_class(type(module)):
            children, entry = flat_form(module)
            return entry(
                tuple(
                    self.visit(child, (*path, name))
                    for name, child in zip(entry.layout.data_keys, children, strict=True)
                )
            )
        new = blank_instance(type(module))
        for name, child in sorted(vars(module).items()):
            object.__setattr__(new, name, self.visit(child, (*path, name)))
        return new


def recursive_map(
    fn: Callable[[Path, Any], Any], node: Any, /, *, graph: bool | None = None
) -> Any:
    """A new graph made by calling `fn(path, value)` on every node of `node`, bottom-up.

    Every Module, Variable, array, container and other value is passed to `fn` once its
    children have been replaced by `fn`'s results, so `fn` sees a new Module already
    holding the new children; what `fn` returns takes the node's place. The root's path
    is `()`, and `fn`'s result for it is returned. A shared Module or Variable is mapped
    once and its result shared, so the new graph keeps the sharing of `node`. Modules
    are new objects; Variables are passed to `fn` as they are, so unless `fn` replaces
    them (`variable.replace(...)`, `variable.copy()`) the new graph holds the same
    Variables as `node`. `node` itself is not changed.

    Arguments:
        fn: called as `fn(path, value)`; returns the value to use instead.
        node: a Module (or any pytree or `pytree=False` object graph).
        graph: `False` for tree mode: a Module held twice is mapped twice (two results),
            a Variable reached twice or a `pytree=False` object raises; `None` reads
            `set_graph_mode`.

    Returns:
        `fn`'s result for the root.

    Raises:
        TypeError: `fn` is not callable.
        ValueError: the graph has a cycle (an object reachable from itself); in tree
            mode, a Variable reached twice or a `pytree=False` object.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, Variable, recursive_map
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        >>> def double(path, value):
        ...     return value.replace(value.value * 2) if isinstance(value, Variable) else value
        >>> model = Linear()
        >>> recursive_map(double, model).w.value, model.w.value
        (Array([2., 2.], dtype=float32), Array([1., 1.], dtype=float32))
    """
    if not callable(fn):
        raise TypeError(
            f"recursive_map expects a function `fn(path, value)` as its first argument, "
            f"got a {type(fn).__name__}. The graph comes second: `recursive_map(fn, node)`."
        )
    return _Mapper(fn, tree=graph is not True and is_tree_mode(graph)).visit(node, ())
