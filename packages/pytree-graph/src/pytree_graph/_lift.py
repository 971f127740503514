"""A lifted call: a call's arguments walked once, their structure and their values now,
and the write-back of what a transform changed in them (`LiftedCall.apply`).

A walk of the arguments is summed up in a `LiftPlan`: how to read the values of a call
with the same objects again (which Variables to read, which arrays stay the same). The
lift cache (`_lift_cache`) keeps plans from call to call; a transform that walks its
arguments once makes one for that call only. Either way a `LiftedCall` is what comes out.

Values come in two orders. The API (`values`, `leaves`, `objects`, `paths`) is always in
the graphdef's leaf order. A plan reads values fastest in its own order (Variables, then
arrays): `jit_inputs()` gives them so, with a static `Reordered` that `Inside` reads to
put them back in leaf order, so a jitted call pays for no reordering.
"""

from operator import attrgetter, itemgetter
from typing import Any

import jax

from pytree_module.extend import current_trace_token

from ._graphdef import Builder, GraphDef, check_writable
from ._outcome import Outcome, StructureChanged
from ._traverse import GraphWalk
from ._variables import Variable, wrote_values

_get_variable_flat = attrgetter("_pg_flat")
_first = itemgetter(0)


def value_of(leaf: Any) -> Any:
    """The dynamic value of a state leaf: a Variable's value, or the array itself."""
    return leaf._pg_flat[0][0] if isinstance(leaf, Variable) else leaf


class Reordered:
    """A graphdef, with the order its leaves' values come in when not in leaf order.

    A plan passes a jitted function the values in the order it reads them (Variables
    first, arrays after); `Inside` puts them in leaf order while tracing, which costs
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


def in_leaf_order(structure: "GraphDef | Reordered", values: list[Any]) -> tuple[GraphDef, list]:
    """The graphdef of `jit_inputs()`'s structure, and `values` in its leaf order."""
    if type(structure) is Reordered:
        return structure.graphdef, [values[i] for i in structure.order]
    return structure, values


class LiftPlan:
    """How to read the leaves and objects of a call again, from a walk of its arguments.

    The objects at the top of the call (its roots) are not held: each call gives them
    (a cached plan must not keep them alive), with the arrays at the top. The rest is
    held: the Variables below the roots, whose values are read anew each call, and the
    other arrays, which stay the same while the objects holding them do.

    Arguments:
        walk: the walk of the arguments (`graphdef` its result).
        variables: leaf positions of the Variables below the roots.
        root_variables: `(root number, leaf position)` of the Variables among the roots.
        top_arrays: leaf positions of the arrays at the top (given each call).
        inner_arrays: leaf positions of the other arrays.
        root_objects: `(root number, object index)` of the roots.
    """

    __slots__ = (
        "graphdef",
        "inner_arrays",
        "objects",
        "order",
        "root_objects",
        "root_variables",
        "structure",
        "variables",
    )

    def __init__(
        self,
        walk: GraphWalk,
        graphdef: GraphDef,
        variables: list[int],
        root_variables: list[tuple[int, int]],
        top_arrays: list[int],
        inner_arrays: list[int],
        root_objects: list[tuple[int, int]],
    ):
        self.graphdef = graphdef
        leaves = walk.leaves
        self.variables = [leaves[p] for p in variables]
        self.root_variables = [number for number, _ in root_variables]
        self.inner_arrays = [leaves[p] for p in inner_arrays]
        # Values are read from one list: Variables below the roots, root Variables, arrays
        # at the top, then the other arrays; `order` picks each leaf's place in it.
        read = [*variables, *(p for _, p in root_variables), *top_arrays, *inner_arrays]
        order = [0] * len(leaves)
        for index, position in enumerate(read):
            order[position] = index
        self.order = tuple(order)
        in_order = read == sorted(read)
        self.structure: GraphDef | Reordered = (
            graphdef if in_order else Reordered(graphdef, self.order)
        )
        objects = list(walk.objects)
        for _, index in root_objects:
            objects[index] = None  # given by each call
        self.objects = objects
        self.root_objects = root_objects

    @classmethod
    def of_walk(cls, walk: GraphWalk, graphdef: GraphDef) -> "LiftPlan":
        """The plan of a walk with no roots given apart: it holds every object."""
        variables = [p for p, leaf in enumerate(walk.leaves) if isinstance(leaf, Variable)]
        arrays = [p for p, leaf in enumerate(walk.leaves) if not isinstance(leaf, Variable)]
        return cls(walk, graphdef, variables, [], [], arrays, [])


class LiftedCall:
    """A call's arguments, lifted: their structure, their values now, and the write-back.

    `LiftCache.find` (or `pytree_graph.extend.lift`) makes one, from a cached walk or a
    new one. A transform passes `graphdef` and `values` (or, for a jitted function,
    `jit_inputs()`) in; outside again, `apply` writes what changed inside back to the
    caller's objects.

    Arguments:
        plan: how to read the call's values and objects.
        roots: the Modules and Variables at the top of the call, as the plan numbers them.
        arrays: the arrays at the top of the call, in the plan's order.
        variable_values: the Variables' values, where already read (`read_variable_values`).
        inputs: the values in the plan's order, where already made (`LastCall.inputs`).

    Attributes:
        graphdef: the structure of the whole argument tree (sharing across arguments
            included).
        paths: the path of each leaf in the argument tree.
        values: the value of each Variable and array, in the graphdef's leaf order.
        leaves: the live Variables and arrays themselves, in leaf order.
        objects: the live Modules, Variables and objects, by graphdef index.

    `values`, `leaves` and `objects` are computed when first asked for: a jitted call
    needs only `jit_inputs()`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param
        >>> from pytree_graph.extend import lift
        >>> w = Param(jnp.array(1.0))
        >>> lifted = lift({"w": w, "x": jnp.array(2.0)})
        >>> lifted.paths, [float(v) for v in lifted.values], lifted.leaves[0] is w
        ((('w',), ('x',)), [1.0, 2.0], True)
    """

    __slots__ = ("_arrays", "_inputs", "_leaves", "_objects", "_plan", "_roots", "_values")

    def __init__(
        self,
        plan: LiftPlan,
        roots: list[Any],
        arrays: list[Any],
        variable_values: list[Any] | None = None,
        *,
        inputs: list[Any] | None = None,
    ):
        self._plan = plan
        self._roots = roots
        self._arrays = arrays
        # The values in the plan's order (written for speed: it runs on every jitted call).
        # `variable_values`: what `read_variable_values` gave, where the caller kept it;
        # `inputs`: the whole list, where the caller has made it.
        if inputs is None:
            if variable_values is None:
                variable_values = read_variable_values(plan, roots)
            inputs = [*variable_values, *arrays, *plan.inner_arrays]
        self._inputs = inputs
        self._values: list[Any] | None = None
        self._leaves: list[Any] | None = None
        self._objects: list[Any] | None = None

    @property
    def graphdef(self) -> GraphDef:
        return self._plan.graphdef

    @property
    def paths(self) -> tuple:
        return self._plan.graphdef.paths

    @property
    def values(self) -> list[Any]:
        if self._values is None:
            self._values = self._reorder(self._inputs)
        return self._values

    @property
    def leaves(self) -> list[Any]:
        if self._leaves is None:
            plan = self._plan
            read = [*plan.variables, *(self._roots[n] for n in plan.root_variables)]
            self._leaves = self._reorder(read + self._arrays + plan.inner_arrays)
        return self._leaves

    @property
    def objects(self) -> list[Any]:
        if self._objects is None:
            objects = list(self._plan.objects)
            for number, index in self._plan.root_objects:
                objects[index] = self._roots[number]
            self._objects = objects
        return self._objects

    def jit_inputs(self) -> tuple["GraphDef | Reordered", list[Any]]:
        """`(structure, values)` for a jitted function that builds an `Inside` from them:
        the values in the order they are read fastest, which `structure` records."""
        return self._plan.structure, self._inputs

    def input_positions(self) -> list[int]:
        """The leaf position of each value `jit_inputs()` gives (to name it in errors)."""
        positions = [0] * len(self._inputs)
        for position, index in enumerate(self._plan.order):
            positions[index] = position
        return positions

    def _reorder(self, read: list[Any]) -> list[Any]:
        """Items in the plan's order, put in leaf order."""
        plan = self._plan
        if plan.structure is plan.graphdef:  # read in leaf order already
            return read
        return list(map(read.__getitem__, plan.order))

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
                self._write_all(written)
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

    def _write_all(self, values: list[Any]) -> None:
        """Give every Variable and array of the caller's graph its value from `values`
        (in leaf order), updating objects in place."""
        objects = self.objects
        Builder(values, [None] * len(objects), reuse=dict(enumerate(objects))).visit(
            self.graphdef.root
        )

    def _set_values(self, positions: tuple[int, ...], values: list[Any]) -> None:
        """Give the Variables at leaf `positions` their new `values`."""
        if not positions:
            return
        # Written for speed: it runs for every Variable a training step writes. The plan
        # holds the Variables below the roots (`order` gives their place among them), so
        # the list of all leaves is made only for a Variable among the roots; and
        # `check_writable` runs only where the token differs from the current trace's.
        plan = self._plan
        held, order = plan.variables, plan.order
        count = len(held)
        leaves = None
        current = current_trace_token()
        try:
            for position, value in zip(positions, values, strict=True):
                index = order[position]
                if index < count:
                    variable = held[index]
                else:
                    if leaves is None:
                        leaves = self.leaves
                    variable = leaves[position]
                if variable._pg_trace is not current:
                    check_writable(variable)
                variable._pg_flat[0][0] = value
        finally:
            wrote_values()


def read_variable_values(plan: LiftPlan, roots: list[Any]) -> list[Any]:
    """The values of the plan's Variables (those below the roots, then the roots'), in the
    order a `LiftedCall` passes them."""
    values = list(map(_first, map(_first, map(_get_variable_flat, plan.variables))))
    if plan.root_variables:
        values += [roots[n]._pg_flat[0][0] for n in plan.root_variables]
    return values


def lift_walked(walk: GraphWalk, graphdef: GraphDef) -> LiftedCall:
    """The lifted call of a tree `walk` has just walked (`graphdef` its result)."""
    return LiftedCall(LiftPlan.of_walk(walk, graphdef), [], [])


def lift_once(tree: Any) -> LiftedCall:
    """The lifted call of `tree`, walked now and not cached (for transforms whose
    arguments are usually new objects, made inside an enclosing trace)."""
    walk = GraphWalk()
    return lift_walked(walk, walk.graphdef(tree))
