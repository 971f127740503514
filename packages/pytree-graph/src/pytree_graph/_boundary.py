"""Carrying object graphs into a JAX transform, and what changed inside back out.

Every graph transform runs in three steps:

1. Outside, `Lifted(tree)` walks the call's arguments once: their `GraphDef` is the
   static part of the call, the values of their Variables and arrays the dynamic part.
2. Inside the transform (traced), `Inside(graphdef, values)` builds new objects from
   them; the user's function runs on those; `inside.outcome(out)` then describes what
   came out (the output, and how the arguments' graph changed) as a static `Outcome`
   plus the dynamic values that description needs.
3. Outside again, `lifted.apply(outcome, values)` writes the changes to the caller's
   objects and builds the output, with the caller's objects wherever the output refers
   to objects that came in.

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

from ._graphdef import LEAF, STATIC, Builder, GraphDef, check_writable
from ._static import Static
from ._traverse import GraphWalk
from ._variables import Variable

# Outcome forms.
VALUES = 0  # only Variable values changed (or nothing did)
STRUCTURE = 1  # the graph's structure changed: everything is described again


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

    def build_output(self, outcome: "Outcome", out_values: list[Any]) -> Any:
        """The output an outcome describes, with the caller's objects where it refers to
        objects that came in."""
        if outcome.out is None:
            return out_values[0] if outcome.out_is_leaf else None
        positions = [None] * outcome.first_out + list(out_values)
        objects = self.objects + [None] * (outcome.num_objects - len(self.objects))
        return Builder(positions, objects).visit(outcome.out)

    def write_changes(self, outcome: "Outcome", values: list[Any]) -> None:
        """Write back what a `fixed_outcome` says changed, from every leaf's new value."""
        if outcome.rewrite:
            self.write_all(values)
            return
        leaves = self.leaves
        for position in outcome.changed:
            variable = leaves[position]
            check_writable(variable)
            _set_value(variable, ((values[position],), variable._pg_flat[1]))

    def apply(self, outcome: "Outcome", values: list[Any]) -> Any:
        """Write `outcome`'s changes into the caller's objects; return the output."""
        if outcome.form == VALUES:
            leaves = self.leaves if outcome.changed else ()
            for position, value in zip(outcome.changed, values, strict=False):
                variable = leaves[position]
                check_writable(variable)
                _set_value(variable, ((value,), variable._pg_flat[1]))
            return self.build_output(outcome, values[len(outcome.changed) :])
        reuse = {
            index: self.objects[origin]
            for index, origin in enumerate(outcome.origins)
            if origin >= 0
        }
        builder = Builder(values, [None] * outcome.num_objects, reuse=reuse)
        builder.visit(outcome.args)
        return builder.visit(outcome.out)


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


jax.tree_util.register_pytree_node(Reordered, lambda r: ((), r), lambda r, _: r)


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
        after: once `outcome` has run, the walk it made of the arguments and the output
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

    def outcome(self, out: Any, full: bool = False) -> tuple["Outcome", list[Any]]:
        """Describe what the function changed and returned: `(outcome, values)`.

        Arguments:
            out: what the function returned (it may hold objects that came in, or new
                ones).
            full: describe the whole graph (form `STRUCTURE`) even if only values changed.
        """
        after = self.after = _After(self, out)
        if after.same and not after.arrays_replaced and not full:
            changed = tuple(after.changed)
            new_values = [after.values[p] for p in changed]
            out_record = after.out_record
            if out_record[0] == LEAF and out_record[1] == after.num_leaves:
                # The common case, a single array out: nothing to rebuild outside.
                outcome = (
                    _ONLY_AN_ARRAY
                    if not changed
                    else Outcome(VALUES, changed=changed, out_is_leaf=True)
                )
            elif out_record == _NONE:
                outcome = Outcome(VALUES, changed=changed)
            else:
                outcome = Outcome(
                    VALUES,
                    changed=changed,
                    out=out_record,
                    first_out=after.num_leaves,
                    num_objects=after.num_objects,
                )
            return outcome, new_values + after.out_values
        index_of = {id(obj): i for i, obj in enumerate(self.objects)}
        origins = tuple(index_of.get(id(obj), -1) for obj in after.objects)
        outcome = Outcome(
            STRUCTURE,
            args=after.args_record,
            out=after.out_record,
            origins=origins,
            num_objects=after.num_objects,
        )
        return outcome, after.values + after.out_values

    def fixed_outcome(
        self, out: Any, transform: str, track: bool = True
    ) -> tuple[list[Any], "Outcome", list[Any]]:
        """For transforms whose inputs must keep their structure (vmap, loops, branches).

        Arguments:
            out: what the function returned.
            transform: the transform's name, for the error.
            track: list the Variables written in the outcome; without it (for branches,
                which must agree on their outcome) the outcome says to write back all.

        Returns:
            `(values, outcome, out_values)`: the value of every argument leaf after the
            call, in the original order; the outcome (form `VALUES`, the output's record);
            the output's own values.

        Raises:
            ValueError: the function changed the structure of its arguments.
        """
        after = _After(self, out)
        if not after.same:
            raise ValueError(
                f"{transform}: the function changed the structure of the objects passed to "
                "it (added, removed or replaced an attribute or submodule, or changed a "
                f"Variable's type or metadata). Inside {transform} only the values of "
                "Variables and arrays may change: make structural changes outside it, or "
                "inside `pytree_graph.jit`."
            )
        outcome = Outcome(
            VALUES,
            changed=tuple(after.changed) if track else (),
            rewrite=after.arrays_replaced or not track,
            out=after.out_record,
            first_out=after.num_leaves,
            num_objects=after.num_objects,
        )
        return after.values, outcome, after.out_values


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


_NONE = (STATIC, Static(None))


class Outcome:
    """What a transformed function did, in static form: it leaves the transform as
    the structure of its output (a pytree with no leaves), so compiled functions keep it.

    Attributes:
        form: `VALUES` or `STRUCTURE`.
        changed: (`VALUES`) leaf positions of the Variables written.
        out: the record of the output (`None` for `None` or a single array).
        out_is_leaf: (`VALUES`) whether the output is a single array.
        first_out: (`VALUES`) the first leaf position of the output's own leaves.
        rewrite: (`VALUES`, from `fixed_outcome`) write every leaf back, not only the
            Variables in `changed`.
        args: (`STRUCTURE`) the record of the arguments after the call.
        origins: (`STRUCTURE`) for each object index, the index it came in with, or -1.
        num_objects: how many objects the records number.
    """

    __slots__ = (
        "args",
        "changed",
        "first_out",
        "form",
        "num_objects",
        "origins",
        "out",
        "out_is_leaf",
        "rewrite",
    )

    def __init__(
        self,
        form: int,
        *,
        changed: tuple[int, ...] = (),
        out: tuple | None = None,
        out_is_leaf: bool = False,
        first_out: int = 0,
        args: tuple | None = None,
        origins: tuple[int, ...] = (),
        num_objects: int = 0,
        rewrite: bool = False,
    ):
        self.rewrite = rewrite
        self.form = form
        self.changed = changed
        self.out = out
        self.out_is_leaf = out_is_leaf
        self.first_out = first_out
        self.args = args
        self.origins = origins
        self.num_objects = num_objects

    def _key(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Outcome) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


jax.tree_util.register_pytree_node(Outcome, lambda o: ((), o), lambda o, _: o)

# Nothing changed, and the output is one array: the caller returns it as it is.
_ONLY_AN_ARRAY = Outcome(VALUES, out_is_leaf=True)


def only_an_array(outcome: Outcome) -> bool:
    """Whether an outcome needs no work outside: no change, one array out."""
    return outcome is _ONLY_AN_ARRAY


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
        return graphdef.root[1][1 if self.lift_fun else 0]

    def num_args(self, graphdef: GraphDef) -> int:
        """How many positional arguments the call a lifted tree's graphdef describes has."""
        return len(self._args_record(graphdef)[1])

    def argument_record(self, graphdef: GraphDef, argument: int) -> tuple:
        """The record of positional argument `argument` in a lifted tree's graphdef."""
        return self._args_record(graphdef)[1][argument]
