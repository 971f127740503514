"""The inside of a graph transform: `Call` (how the user's function is called) and
`Inside` (its objects, rebuilt from the values a transform passes in, and what changed).

Every graph transform runs in four steps:

1. Outside, `lift(call.tree(args, kwargs))` walks the call's arguments (or reuses an
   earlier walk): a `LiftedCall` (`_lift`), whose `GraphDef` is the static part of the
   call and the values of its Variables and arrays the dynamic part.
2. Inside the transform (traced), `Inside(graphdef, values)` builds new objects from
   them, and the user's function runs on those.
3. `inside.finish(out)` then describes what came out (the output, and how the
   arguments' graph changed) as a static outcome (`_outcome`) plus the dynamic values
   that description needs.
4. Outside again, `lifted.apply(outcome, values)` writes the changes to the caller's
   objects and builds the output, with the caller's objects wherever the output refers
   to objects that came in. Every graph transform ends with this one call.

Most calls change only Variable values, if anything: the outcome then lists the leaf
positions written, and applying it is one assignment per written Variable. When the
structure changed (new attributes, swapped submodules, new metadata) the outcome
describes the whole graph, and the caller's objects are updated to match it.
"""

import functools
import types
from collections.abc import Callable
from typing import Any

import jax

from pytree_module import Dict, List, Module, Partial, TraceContextError
from pytree_module.extend import same_trace, trace_of

from ._graphdef import Builder, GraphDef
from ._lift import Reordered, in_leaf_order, value_of
from ._outcome import NOTHING_CHANGED, Outcome, StructureChanged, ValuesChanged
from ._records import LEAF, NONE_RECORD
from ._traverse import GraphWalk
from ._variables import Variable


class Inside:
    """The objects a transformed function works on, built inside the transform.

    Arguments:
        graphdef: the `LiftedCall`'s `graphdef`, or the structure its `jit_inputs()`
            gives.
        values: the values that go with it (tracers, inside a transform): the
            `LiftedCall`'s `values`, in leaf order, or those `jit_inputs()` gives,
            which are put in leaf order here.
        prepare: a function `prepare(graphdef, values) -> values`, given the values in
            leaf order before the objects are built from them (e.g. to constrain each
            value's sharding, chosen by its path).

    Attributes:
        tree: the rebuilt argument tree: new Modules and Variables, shared as outside.
        after: once `finish` has run, the walk it made of the arguments and the output
            (its `paths` give the path of each leaf, `returned` the position of each
            value `finish` returned).
    """

    __slots__ = ("after", "graphdef", "objects", "tree", "values")

    def __init__(
        self,
        graphdef: GraphDef | Reordered,
        values: list[Any],
        prepare: Callable[[GraphDef, list[Any]], list[Any]] | None = None,
    ):
        graphdef, values = in_leaf_order(graphdef, values)
        if prepare is not None:
            values = prepare(graphdef, values)
        self.graphdef = graphdef
        self.values = values
        self.objects: list[Any] = [None] * graphdef.num_objects
        self.tree = Builder(values, self.objects).visit(graphdef.root)
        self.after: _After | None = None

    def finish(
        self,
        out: Any,
        *,
        structure: str = "may_change",
        transform: str = "",
        track: bool = True,
    ) -> tuple[Outcome, list[Any]]:
        """Describe what the function changed and returned: `(outcome, values)`, for
        `LiftedCall.apply` outside.

        Arguments:
            out: what the function returned (it may hold objects that came in, or new
                ones).
            structure: `"may_change"`: the arguments may change structure (jit, remat,
                grad); `"fixed"`: they must not (vmap, loops, shard_map), and the
                values are every argument leaf's (a transform maps them all);
                `"branch"` (cond, switch): as `"fixed"` while the structure is the same,
                else the whole graph after the call, as `"may_change"` describes it; or
                `"new_objects"`: describe the whole graph after the call as new
                objects, which `apply` builds without touching the caller's (as
                `eval_shape` does, whose values are shapes).
            transform: the transform's name, for the error of a `"fixed"` structure.
            track: (`"fixed"`) list the Variables written; without it (for branches,
                which must agree on their outcome) the outcome says to write back all.

        Raises:
            ValueError: (`"fixed"`) the function changed the structure of its arguments.
        """
        after = self.after = _After(self, out)
        everything = range(len(after.leaves))
        if structure == "fixed" or (structure == "branch" and after.same):
            if not after.same:
                raise ValueError(
                    f"{transform}: the function changed the structure of the objects passed "
                    "to it (added, removed or replaced an attribute or submodule, or changed "
                    f"a Variable's type or metadata). Inside {transform} only the values of "
                    "Variables and arrays may change: make structural changes outside it, "
                    "or inside `pytree_graph.jit`."
                )
            outcome = ValuesChanged(
                changed=tuple(after.changed) if track else (),
                out=after.out_record,
                num_leaves=after.num_leaves,
                num_objects=after.num_objects,
                carries_all=True,
                rewrite=after.arrays_replaced or not track,
            )
            after.returned = everything
            return outcome, after.values + after.out_values
        if after.same and not after.arrays_replaced and structure == "may_change":
            changed = tuple(after.changed)
            new_values = [after.values[p] for p in changed]
            out_record = after.out_record
            if out_record.tag == LEAF and out_record.position == after.num_leaves:
                # The common case, a single array out: nothing to rebuild outside.
                outcome = (
                    NOTHING_CHANGED
                    if not changed
                    else ValuesChanged(changed=changed, out_is_leaf=True)
                )
            elif out_record == NONE_RECORD:
                outcome = ValuesChanged(changed=changed)
            else:
                outcome = ValuesChanged(
                    changed=changed,
                    out=out_record,
                    num_leaves=after.num_leaves,
                    num_objects=after.num_objects,
                )
            after.returned = [*changed, *everything[after.num_leaves :]]
            return outcome, new_values + after.out_values
        if structure == "new_objects":
            origins = (-1,) * after.num_objects
        else:
            # (also a branch that changed the structure: the other branches must give the
            # same outcome, which `cond` / `switch` check)
            index_of = {id(obj): i for i, obj in enumerate(self.objects)}
            origins = tuple(index_of.get(id(obj), -1) for obj in after.objects)
        outcome = StructureChanged(
            args=after.args_record,
            out=after.out_record,
            origins=origins,
            num_objects=after.num_objects,
        )
        after.returned = everything
        return outcome, after.values + after.out_values


class _After:
    """The arguments' graph and the output, walked after the function ran."""

    __slots__ = (
        "args_record",
        "arrays_replaced",
        "changed",
        "leaves",
        "num_leaves",
        "num_objects",
        "objects",
        "out_record",
        "out_values",
        "paths",
        "returned",
        "same",
        "values",
    )

    def __init__(self, inside: Inside, out: Any):
        walk = GraphWalk()
        self.args_record = walk.visit(inside.tree, ())
        self.num_leaves = len(walk.leaves)
        self.values = list(map(value_of, walk.leaves))
        objects = walk.objects
        # Same structure, and the very objects that were built for the call.
        self.same = (
            self.args_record == inside.graphdef.root
            and len(objects) == len(inside.objects)
            and all(a is b for a, b in zip(objects, inside.objects, strict=True))
        )
        self.changed: list[int] = []
        self.arrays_replaced = False
        if self.same:
            for position, (leaf, now, given) in enumerate(
                zip(walk.leaves, self.values, inside.values, strict=True)
            ):
                if now is not given:
                    if isinstance(leaf, Variable):
                        self.changed.append(position)
                    else:
                        self.arrays_replaced = True
        num_objects = len(objects)
        self.out_record = walk.visit(out, ("<output>",))
        for obj in walk.objects[num_objects:]:
            _check_made_here(obj)
        self.out_values = list(map(value_of, walk.leaves[self.num_leaves :]))
        self.paths = walk.paths  # the arguments' leaves, then the output's
        self.leaves = walk.leaves  # the Variables and arrays at those paths
        self.objects = walk.objects
        self.num_objects = len(walk.objects)
        # Set by `Inside.finish`: the position (in `paths`) of each value it returned, in
        # order (a derivative rule maps the cotangents of those values back to paths).
        self.returned: range | list[int] = range(0)


def _check_made_here(obj: Any) -> None:
    """Refuse an object of the output that is neither an argument nor made inside the
    transform: one the function captured from outside. Returning it would hand back a
    copy made of the transform's values (or leak its tracers), not the object itself.

    Raises:
        TraceContextError: with Flax NNX's words, naming the object's type.
    """
    if isinstance(obj, Variable):
        token = obj._pg_trace
    elif isinstance(obj, Module):
        token = trace_of(obj)
    else:
        return
    if not same_trace(token):
        kind = type(obj).__name__
        raise TraceContextError(
            "Trying to extract graph node from different trace level: the output holds a "
            f"{kind} made outside the transform and captured by the function, not passed "
            f"to it, so the {kind} returned could only be a copy of it. Pass it to the "
            "function as an argument (it then comes back as the caller's object), or "
            "return a new object made inside."
        )


def holds_graph_nodes(value: Any) -> bool:
    """Whether `value` is, or holds, a Module or Variable (so a transform must lift it)."""
    return any(
        isinstance(leaf, Module | Variable)
        for leaf in jax.tree_util.tree_leaves(value, is_leaf=_stops)
    )


def holds_modules(value: Any) -> bool:
    """Whether `value` is, or holds, a Module or a `Dict`/`List` container: objects of
    a graph (NNX's `nnx.Dict` and `nnx.List` are Modules), whose gradient is a `State`."""
    return any(
        isinstance(leaf, _GRAPH_OBJECTS)
        for leaf in jax.tree_util.tree_leaves(value, is_leaf=_stops_at_graph_objects)
    )


_GRAPH_OBJECTS = (Module, Dict, List)


def _stops_at_graph_objects(value: Any) -> bool:
    return isinstance(value, (*_GRAPH_OBJECTS, Variable))


def _stops(value: Any) -> bool:
    return isinstance(value, Module | Variable)


class Call:
    """How a transformed function is called: the tree a transform lifts, and back.

    The function itself is lifted with the arguments when it holds Modules or
    Variables (a Module, a bound method of one), so that its state is an input too.
    """

    __slots__ = ("fun", "lift_fun")

    def __init__(self, fun: Any):
        if type(fun) is functools.partial and holds_graph_nodes((fun.args, fun.keywords)):
            # e.g. a transformed method, bound to its Module: lift what it is bound to
            fun = Partial(fun.func, *fun.args, **fun.keywords)
        elif type(fun) is types.MethodType and holds_graph_nodes(fun.__self__):
            # e.g. `model.__call__`: Python binds special methods itself, not as pytrees
            fun = Partial(fun.__func__, fun.__self__)
        self.fun = fun
        self.lift_fun = holds_graph_nodes(fun)

    def tree(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """The tree to lift for a call with `args` and `kwargs`."""
        return (self.fun, args, kwargs) if self.lift_fun else (args, kwargs)

    def run(self, tree: tuple) -> Any:
        """Call the function on a (rebuilt) tree from `tree`."""
        if self.lift_fun:
            fun, args, kwargs = tree
            return fun(*args, **kwargs)
        args, kwargs = tree
        return self.fun(*args, **kwargs)

    def split_path(self, path: tuple) -> tuple[Any, tuple]:
        """Which argument a leaf path of the tree is in, and the path within it.

        The argument is an int (positional), a str (keyword), or None (the function
        itself).
        """
        # The tree is `(args, kwargs)`, or `(fun, args, kwargs)`: either way the argument's
        # index or name comes second.
        if self.lift_fun and path[0] == 0:
            return None, path[1:]
        return path[1], path[2:]

    def _args_record(self, graphdef: GraphDef) -> tuple:
        """The record of the positional arguments' tuple in a lifted tree's graphdef."""
        return graphdef.root.children[1 if self.lift_fun else 0]

    def num_args(self, graphdef: GraphDef) -> int:
        """How many positional arguments the call a lifted tree's graphdef describes has."""
        return len(self._args_record(graphdef).children)

    def argument_record(self, graphdef: GraphDef, argument: int) -> tuple:
        """The record of positional argument `argument` in a lifted tree's graphdef."""
        return self._args_record(graphdef).children[argument]
