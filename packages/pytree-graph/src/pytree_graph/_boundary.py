"""Carrying object graphs into a JAX transform, and what changed inside back out.

Every graph transform runs in three steps:

1. Outside, `Lifted(tree)` walks the call's arguments once: their `GraphDef` is the
   static part of the call, the values of their Variables and arrays the dynamic part.
2. Inside the transform (traced), `Inside(graphdef, values)` builds new objects from
   them; the user's function runs on those; `inside.finish(out)` then describes what
   came out (the output, and how the arguments' graph changed) as a static outcome
   (`_outcome`) plus the dynamic values that description needs.
3. Outside again, `lifted.apply(outcome, values)` writes the changes to the caller's
   objects and builds the output, with the caller's objects wherever the output refers
   to objects that came in. Every graph transform ends with this one call.

Most calls change only Variable values, if anything: the outcome then lists the leaf
positions written, and applying it is one assignment per written Variable. When the
structure changed (new attributes, swapped submodules, new metadata) the outcome
describes the whole graph, and the caller's objects are updated to match it.
"""

import functools
import types
from typing import Any

import jax

from pytree_module import Module, Partial

from ._graphdef import Builder, GraphDef, check_writable
from ._outcome import NOTHING_CHANGED, Outcome, StructureChanged, ValuesChanged
from ._records import LEAF, NONE_RECORD
from ._traverse import GraphWalk
from ._variables import Variable


def value_of(leaf: Any) -> Any:
    """The dynamic value of a state leaf: a Variable's value, or the array itself."""
    return leaf._pg_flat[0][0] if isinstance(leaf, Variable) else leaf


class Lifted:
    """A call's arguments, walked once: their structure and their current values.

    Attributes:
        graphdef: the structure of the whole argument tree (sharing across arguments
            included).
        paths: the path of each leaf in the argument tree.
        values: the value of each Variable and array, in the graphdef's leaf order.
        leaves: the live Variables and arrays themselves.
        objects: the live Modules, Variables and objects, by graphdef index.

    A `Lifted` made from a cached walk (see `_lift_cache`) computes `values`, `leaves`
    and `objects` only when asked: a jitted call needs none of them in graphdef order.
    """

    __slots__ = ("_leaves", "_objects", "_source", "_values", "graphdef", "paths")

    def __init__(self, tree: Any):
        walk = GraphWalk()
        self._take(walk, walk.graphdef(tree))

    @classmethod
    def of_walk(cls, walk: GraphWalk, graphdef: GraphDef) -> "Lifted":
        """The `Lifted` of a tree `walk` has just walked (`graphdef` being its result)."""
        lifted = cls.__new__(cls)
        lifted._take(walk, graphdef)
        return lifted

    @classmethod
    def of_source(cls, graphdef: GraphDef, paths: tuple, source: Any) -> "Lifted":
        """A `Lifted` whose leaves and objects `source` gives (a `_lift_cache` source:
        `values()`, `leaves()`, `objects()`, and `reordered`/`value_source` for a jit)."""
        lifted = cls.__new__(cls)
        lifted.graphdef = graphdef
        lifted.paths = paths
        lifted._values = lifted._leaves = lifted._objects = None
        lifted._source = source
        return lifted

    def _take(self, walk: GraphWalk, graphdef: GraphDef) -> None:
        self.graphdef = graphdef
        self.paths = graphdef.paths
        self._leaves = walk.leaves
        self._objects = walk.objects
        self._values = list(map(value_of, walk.leaves))
        self._source = None

    @property
    def values(self) -> list[Any]:
        if self._values is None:
            self._values = self._source.values()
        return self._values

    @property
    def leaves(self) -> list[Any]:
        if self._leaves is None:
            self._leaves = self._source.leaves()
        return self._leaves

    @property
    def objects(self) -> list[Any]:
        if self._objects is None:
            self._objects = self._source.objects()
        return self._objects

    def jit_inputs(self) -> tuple[Any, list[Any]]:
        """`(static, dynamic)` arguments for a jitted function that calls `Inside`."""
        if self._source is not None:
            return self._source.jit_inputs()
        return self.graphdef, self.values

    def lifted(self) -> "Lifted":
        """This (as `_lift_cache` sources have a `lifted()` too)."""
        return self

    def write_all(self, values: list[Any]) -> Any:
        """Give every Variable and array of the caller's graph its value from `values`
        (in leaf order), updating objects in place; return the rebuilt argument tree."""
        builder = Builder(values, [None] * len(self.objects), reuse=dict(enumerate(self.objects)))
        return builder.visit(self.graphdef.root)

    def apply(self, outcome: Outcome, values: list[Any]) -> Any:
        """Write `outcome`'s changes into the caller's objects; return the output.

        Arguments:
            outcome: from `Inside.finish`, run on this call's values.
            values: the values `finish` returned with it (as the transform gives them
                back: new arrays, or tracers of an enclosing transform).
        """
        if type(outcome) is StructureChanged:
            reuse = {
                index: self.objects[origin]
                for index, origin in enumerate(outcome.origins)
                if origin >= 0
            }
            builder = Builder(values, [None] * outcome.num_objects, reuse=reuse)
            builder.visit(outcome.args)
            return builder.visit(outcome.out)
        if outcome.carries_all:
            written, out_values = values[: outcome.num_leaves], values[outcome.num_leaves :]
            if outcome.rewrite:
                self.write_all(written)
            else:
                self._set_values(outcome.changed, [written[p] for p in outcome.changed])
        else:
            count = len(outcome.changed)
            self._set_values(outcome.changed, values[:count])
            out_values = values[count:]
        if outcome.out is None:
            return out_values[0] if outcome.out_is_leaf else None
        positions = [None] * outcome.num_leaves + list(out_values)
        objects = self.objects + [None] * (outcome.num_objects - len(self.objects))
        return Builder(positions, objects).visit(outcome.out)

    def _set_values(self, positions: tuple[int, ...], values: list[Any]) -> None:
        """Give the Variables at leaf `positions` their new `values`."""
        leaves = self.leaves if positions else ()
        for position, value in zip(positions, values, strict=True):
            variable = leaves[position]
            check_writable(variable)
            _set_value(variable, ((value,), variable._pg_flat[1]))


_set_value = Variable._pg_flat.__set__  # type: ignore[attr-defined]


class Reordered:
    """A graphdef, with the order its leaves come in when they are not in leaf order.

    A cached lift passes values in the order it reads them (Variables first, arrays
    after); the jitted function puts them in leaf order while tracing, which costs
    nothing per call. It is a pytree with no leaves, equal by value like a graphdef.

    Attributes:
        graphdef: the graphdef.
        order: for each leaf position, the index of its value in the values passed.
    """

    __slots__ = ("_hash", "graphdef", "order")

    def __init__(self, graphdef: GraphDef, order: tuple[int, ...]):
        self.graphdef = graphdef
        self.order = order
        self._hash = hash((graphdef, order))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is Reordered
            and self._hash == other._hash
            and self.order == other.order
            and self.graphdef == other.graphdef
        )


jax.tree_util.register_static(Reordered)


def in_leaf_order(graphdef: "GraphDef | Reordered", values: list[Any]) -> tuple[GraphDef, list]:
    """The graphdef itself, and `values` in its leaf order (a `Reordered` one's put back)."""
    if type(graphdef) is Reordered:
        return graphdef.graphdef, [values[i] for i in graphdef.order]
    return graphdef, values


class Inside:
    """The objects a transformed function works on, built inside the transform.

    Arguments:
        graphdef: the `Lifted` graphdef.
        values: the values (tracers, inside a transform) in its leaf order.

    Attributes:
        tree: the rebuilt argument tree: new Modules and Variables, shared as outside.
        after: once `finish` has run, the walk it made of the arguments and the output
            (its `paths` give the path of each value it returned).
    """

    __slots__ = ("after", "graphdef", "objects", "tree", "values")

    def __init__(self, graphdef: "GraphDef | Reordered", values: list[Any]):
        graphdef, values = in_leaf_order(graphdef, values)
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
        `Lifted.apply` outside.

        Arguments:
            out: what the function returned (it may hold objects that came in, or new
                ones).
            structure: `"may_change"`: the arguments may change structure (jit, remat,
                grad); `"fixed"`: they must not (vmap, branches, shard_map), and the
                values are every argument leaf's (a transform maps them all); or
                `"describe"`: describe the whole graph even if only values changed.
            transform: the transform's name, for the error of a `"fixed"` structure.
            track: (`"fixed"`) list the Variables written; without it (for branches,
                which must agree on their outcome) the outcome says to write back all.

        Raises:
            ValueError: (`"fixed"`) the function changed the structure of its arguments.
        """
        after = self.after = _After(self, out)
        if structure == "fixed":
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
            return outcome, after.values + after.out_values
        if after.same and not after.arrays_replaced and structure != "describe":
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
            return outcome, new_values + after.out_values
        index_of = {id(obj): i for i, obj in enumerate(self.objects)}
        outcome = StructureChanged(
            args=after.args_record,
            out=after.out_record,
            origins=tuple(index_of.get(id(obj), -1) for obj in after.objects),
            num_objects=after.num_objects,
        )
        return outcome, after.values + after.out_values


class _After:
    """The arguments' graph and the output, walked after the function ran."""

    __slots__ = (
        "args_record",
        "arrays_replaced",
        "changed",
        "num_leaves",
        "num_objects",
        "objects",
        "out_record",
        "out_values",
        "paths",
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
        self.out_record = walk.visit(out, ("<output>",))
        self.out_values = list(map(value_of, walk.leaves[self.num_leaves :]))
        self.paths = walk.paths  # the arguments' leaves, then the output's
        self.objects = walk.objects
        self.num_objects = len(walk.objects)


def holds_graph_nodes(value: Any) -> bool:
    """Whether `value` is, or holds, a Module or Variable (so a transform must lift it)."""
    return any(
        isinstance(leaf, Module | Variable)
        for leaf in jax.tree_util.tree_leaves(value, is_leaf=_stops)
    )


def holds_modules(value: Any) -> bool:
    """Whether `value` is, or holds, a Module."""
    return any(
        isinstance(leaf, Module) for leaf in jax.tree_util.tree_leaves(value, is_leaf=_stops)
    )


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
