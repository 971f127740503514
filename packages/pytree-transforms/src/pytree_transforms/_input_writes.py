"""Writes to a transform's inputs inside the function: carried out through the output, or
refused.

A filtered transform calls the function on copies of its inputs (rebuilt from their leaves
inside the trace), and only what the function returns comes back. A write to an input made
there (`model.count.value += 1`, `optimizer.update(model, grads)`, a BatchNorm statistic, a
Dropout's random stream advancing, a Module attribute assigned, a list appended to) changes
the copy alone, and would be lost without a word. So each transform checks, once per trace,
after the function returns: the inputs are flattened again and compared with what was passed
in (the same leaves, by identity, and the same structure). A written object that the output
holds reaches the caller through the output: that is the functional recipe (return the model,
use the returned one). Any other write is refused with an error that names it and the fix.

Nothing here knows about Variables: a Variable is a pytree node whose child is its value, so
a write to it is a changed leaf like any other. The check costs one flatten of the inputs and
one comparison per trace; a compiled function's calls never run it.
"""

import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import path_text

from ._arguments import named_arguments

_flatten_one_level = jax.tree_util.default_registry.flatten_one_level

# What each transform's error suggests instead: the graph transform that writes updates back.
_GRAPH_TRANSFORMS = {
    "filter_jit": "pytree_graph.jit",
    "filter_grad": "pytree_graph.grad",
    "filter_value_and_grad": "pytree_graph.value_and_grad",
    "filter_vmap": "pytree_graph.vmap",
    "filter_eval_shape": "pytree_graph.eval_shape",
    "filter_checkpoint": "pytree_graph.remat",
    "filter_make_jaxpr": "pytree_graph.make_jaxpr",
    "filter_pmap": "pytree_graph.pmap",
}

# Transforms whose function returns `(value, aux)` with `has_aux=True`: what they return
# otherwise cannot hold a model, so a written object comes back as the auxiliary output.
_AUX_TRANSFORMS = {
    "filter_grad",
    "filter_value_and_grad",
    "filter_vjp",
    "filter_jacfwd",
    "filter_jacrev",
    "filter_hessian",
}


class InputRecord:
    """The inputs of one call of the function, as they were passed in (see `record_inputs`)."""

    __slots__ = ("leaves", "tree", "treedef")

    def __init__(self, tree: Any):
        self.tree = tree
        self.leaves, self.treedef = jax.tree.flatten(tree)


def record_inputs(fun: Any, args: tuple, kwargs: dict) -> InputRecord:
    """Record the inputs of a call `fun(*args, **kwargs)` about to be made inside a trace.

    Arguments:
        fun: the function as it is called (a Module or bound method is an input too);
            None where the transform did not copy it.
        args: the positional arguments the function gets (the transform's copies).
        kwargs: the keyword arguments it gets.

    Returns:
        What `check_input_writes` compares with after the call.
    """
    return InputRecord((fun, args, kwargs))


def check_input_writes(
    record: InputRecord, output: Any, transform: str, named_after: Callable[..., Any]
) -> None:
    """Refuse a write to the recorded inputs that the output does not carry to the caller.

    Arguments:
        record: the inputs before the call, from `record_inputs`.
        output: what the function returned.
        transform: the transform's name, for the message.
        named_after: the user's function, whose parameters name the arguments in the
            message.

    Raises:
        ValueError: naming each written place and the fix.
    """
    leaves, treedef = jax.tree.flatten(record.tree)
    if treedef == record.treedef and all(
        a is b for a, b in zip(leaves, record.leaves, strict=True)
    ):
        return
    written: list[tuple[tuple, Any]] = []
    _find_writes(record.tree, record.treedef, iter(record.leaves), (), None, written)
    if not written:
        return
    returned = _nodes_in(output)
    lost: dict[int, tuple] = {}  # one object shared by several paths is named once
    for path, owner in written:
        if id(owner) not in returned:
            lost.setdefault(id(owner), path)
    if lost:
        raise ValueError(_message(transform, named_after, record.tree, list(lost.values())))


def checking_writes(
    fun: Callable[..., Any], transform: str, copied: int | None = None
) -> Callable[..., Any]:
    """`fun`, checking for lost writes to its arguments after each call (`check_input_writes`).

    For transforms that call the function on copies of its arguments inside a trace (each
    call of the result runs once per trace).

    Arguments:
        fun: the user's function.
        transform: the transform's name, for the message.
        copied: how many leading positional arguments are the transform's copies; None when
            all arguments, keyword arguments included, are. The others are the caller's own
            objects: a write to them is carried out (or refused by the trace-level guard).
    """

    @functools.wraps(fun)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if copied is None:
            inputs = record_inputs(None, args, kwargs)
        else:
            inputs = record_inputs(None, args[:copied], {})
        result = fun(*args, **kwargs)
        check_input_writes(inputs, result, transform, fun)
        return result

    return checked


def _find_writes(
    node: Any,
    treedef: PyTreeDef,
    leaves: Iterator[Any],
    path: tuple,
    owner: Any,
    written: list[tuple[tuple, Any]],
) -> None:
    """Compare `node` now with its structure and leaves before the call (`treedef`,
    `leaves`), adding `(path, owner)` to `written` for each changed place: the path where
    a leaf or a node's structure differs, and the object written there (the innermost
    mutable object on the path: a Module, a Variable, a list; not a tuple)."""
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # a leaf before the call
        if node is not next(leaves):
            written.append((path, owner))
        return
    if _is_mutable(node):
        owner = node
    one_level = jax.tree.structure(node, is_leaf=lambda x: x is not node)
    children = treedef.children()
    if one_level.node_data() != treedef.node_data() or one_level.num_leaves != len(children):
        for _ in range(treedef.num_leaves):
            next(leaves)
        # An attribute added, removed or made static, a container grown: the node itself
        # is named.
        written.append(((*path, _STRUCTURE), owner))
        return
    keyed = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
    for (key, child), child_def in zip(keyed, children, strict=True):
        _find_writes(child, child_def, leaves, path + key, owner, written)


class _Structure:
    """The last key of a written path whose node changed structure (not one leaf)."""


_STRUCTURE = _Structure()


def _is_mutable(node: Any) -> bool:
    # Tuples (namedtuples included) cannot be written; `None` is an empty node.
    return node is not None and not isinstance(node, tuple)


def _nodes_in(output: Any) -> set[int]:
    """The ids of every object of `output` that is a pytree node (all it holds, at any depth)."""
    found: set[int] = set()
    # Every node stays alive until the walk ends: a node's flatten may make its children
    # afresh, and a freed temporary's id could be taken by the next one.
    kept: list[Any] = []
    stack = [output]
    while stack:
        node = stack.pop()
        flat = _flatten_one_level(node)
        if flat is None or id(node) in found:
            continue
        found.add(id(node))
        kept.append(node)
        stack.extend(flat[0])
    return found


def _message(transform: str, fun: Callable[..., Any], tree: Any, lost: list[tuple]) -> str:
    named = named_arguments(fun, tree)
    _, args, kwargs = tree
    by_place: dict[tuple, str] = {(0,): "self"}
    by_place.update({(1, i): named[1 + i][0] for i in range(len(args))})
    by_place.update({(2, k): named[1 + len(args) + n][0] for n, k in enumerate(sorted(kwargs))})
    places: list[str] = []
    arguments: list[str] = []
    for path in lost:
        structure = path[-1] is _STRUCTURE
        path = path[:-1] if structure else path
        keys = [getattr(k, "idx", getattr(k, "key", None)) for k in path[:2]]
        if keys[0] == 0:  # inside the function: a Module, or a bound method's Module
            name, rest = "self", path[1:]
            if rest and getattr(rest[0], "name", None) == "__self__":
                rest = rest[1:]
        else:
            name, rest = by_place.get(tuple(keys), "an input"), path[2:]
        text = f"`{name}{path_text(rest, root='')}`"
        if structure:
            text += " (an attribute assigned or removed, or a container changed)"
        if text not in places:
            places.append(text)
        if f"`{name}`" not in arguments:
            arguments.append(f"`{name}`")
    shown = ", ".join(places[:4]) + (f" and {len(places) - 4} more" if len(places) > 4 else "")
    what = " and ".join(arguments)
    inputs = f"its input {what}" if len(arguments) == 1 else f"its inputs {what}"
    ones = "one" if len(arguments) == 1 else "ones"
    graph = _GRAPH_TRANSFORMS.get(transform)
    use_graph = (
        f"use `{graph}`, which writes Variable and attribute updates back to the caller's "
        "objects, or "
        if graph is not None
        else ""
    )
    if transform in _AUX_TRANSFORMS:
        returned = (
            f"return {what} from the function as its auxiliary output (`has_aux=True`, "
            f"`return value, {arguments[0].strip('`')}`) and use the returned {ones}"
        )
    else:
        returned = (
            f"return {what} from the function and use the returned {ones} "
            f"(`out, {arguments[0].strip('`')} = f(...)`)"
        )
    return (
        f"{transform}: the function wrote to {shown}, part of {inputs}, and the "
        f"write would be lost: {transform} calls the function on copies of its inputs, and "
        f"only what it returns comes back, so the caller's objects never see the change. "
        f"Either {use_graph}{returned}. (Writes to objects the function creates itself, "
        "or returns, are fine.)"
    )
