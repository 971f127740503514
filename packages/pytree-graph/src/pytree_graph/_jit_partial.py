"""`jit_partial` and `cached_partial`: a jitted step with its Modules bound once.

A training step takes the same model and optimizer on every call, and new data. Bound
once, their graph is walked once: each call then hands one list of their Variables'
values to one `jax.jit` function (JAX's C++ dispatch flattens it), and writes the new
values straight back into the same Variables. The list is the one the last call left
(its outputs, in reading order) while no Variable value was written since
(`_variables.value_writes`); else it is read from the Variables again (a C-level read
per Variable, no walk). Reading 200 Variables costs little in itself, but right after a
step has run, little of it is in the CPU's caches, and the list is what the step made.

What is checked on every call, so that an answer is never stale:

- the mutation count (`pytree_module.extend.mutations`): every structural write (an
  attribute set or deleted, a submodule swapped, a static flag changed by `model.eval()`,
  a Variable replaced, given new metadata or initialized again) bumps it. When it moved,
  the checks of the lift cache (`_lift_cache.CachedWalk`: one identity test per object)
  tell whether the bound objects were among those changed; if so, they are walked again,
  and a new structure compiles anew, as with `pytree_graph.jit`;
- the plain lists and dicts inside the bound objects (which change without bumping the
  count), item by item (`pytree_module.List`s and `Dict`s bump it, and are checked with
  the objects);
- the `value_writes` stamp: one comparison tells whether the list the last call left is
  still what the Variables hold;
- that the call runs in the JAX trace the bound Variables belong to: one test per trace
  they were made in (usually one), or, while the mutation count has not moved since
  those tests passed (a Variable's trace changes only with a structural write), one
  identity test of the current trace against the trace they passed in;
- that the per-step arguments are arrays of types seen before, with no keywords (else
  they are split into arrays and statics, as `jit` does).

A write to a Variable's value is no structural change: the next call reads the values
again.
"""

import functools
import inspect
from collections import deque
from collections.abc import Callable
from itertools import repeat
from operator import setitem
from typing import Any

import jax

from pytree_filter import SHAPED_TYPES
from pytree_module import Module
from pytree_module.extend import current_trace_token, mutations
from pytree_transforms.extend import BindsAsMethod, TraceHistory

from ._boundary import Call, Inside
from ._error_names import rename_in_error
from ._errors import check_callable
from ._eval_shape import eval_shape
from ._graph_mode import resolve_modes
from ._graphdef import Builder, GraphDef, check_writable
from ._jit import (
    Lowered,
    Traced,
    _constrain,
    _GraphJit,
    _is_sharding,
    _Shardings,
    return_donated,
)
from ._lift import LiftedCall, LiftPlan, Reordered
from ._lift_cache import CHECK_HITS, CachedWalk, Checks, _check_hit
from ._outcome import Outcome, ValuesChanged
from ._retrace_signature import graph_signature
from ._static import Static
from ._static_args import (
    NOT_GIVEN,
    StaticArguments,
    donated_arguments,
    static_arguments,
    with_static_entries,
)
from ._traverse import GraphWalk
from ._tree_transforms import SimpleJit, SimplePartial
from ._variables import Variable, value_writes, wrote_values

_consume = deque(maxlen=0).extend  # runs an iterator to its end, keeping nothing
_GRAPH_NODES = (Module, Variable)
# Exact types of the per-step arguments seen to be arrays: a call whose positional
# arguments are all of these (and no keywords) passes them to the program as they are.
_array_types: set[type] = set()


class _Layout:
    """The static first argument of the jitted function: the bound objects' structure,
    and which of their values come in the donated list (None: none do).

    A pytree with no leaves, equal by value (built once per walk of the bound objects,
    so a call compares it by identity).
    """

    __slots__ = ("_hash", "donated_positions", "mask", "structure")

    def __init__(
        self,
        structure: GraphDef | Reordered,
        mask: tuple[bool, ...] | None,
        donated_positions: tuple[int, ...] = (),
    ):
        self.structure = structure
        self.mask = mask
        self.donated_positions = donated_positions  # follows from the two others
        self._hash = hash((structure, mask))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is _Layout
            and self._hash == other._hash
            and self.mask == other.mask
            and self.structure == other.structure
        )

    def values(self, donated: list[Any], kept: list[Any]) -> list[Any]:
        """The bound values in the order the structure reads them."""
        if self.mask is None:
            return kept
        donated_values, kept_values = iter(donated), iter(kept)
        return [next(donated_values if d else kept_values) for d in self.mask]


class _StepStatics:
    """The non-array parts of a call's per-step arguments (static, as in `jit`): for each
    argument, its treedef, which leaves are arrays, and the other leaves.

    A pytree with no leaves, equal by value.
    """

    __slots__ = ("_hash", "args", "kwargs")

    def __init__(self, args: tuple, kwargs: tuple):
        self.args = args
        self.kwargs = kwargs
        self._hash = hash((args, kwargs))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is _StepStatics
            and self._hash == other._hash
            and self.args == other.args
            and self.kwargs == other.kwargs
        )

    def rebuild(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """The per-step arguments, from the arrays of each (traced, inside)."""
        return (
            tuple(map(_merge, self.args, args)),
            {name: _merge(spec, kwargs[name]) for name, spec in self.kwargs},
        )


jax.tree_util.register_static(_Layout)
jax.tree_util.register_static(_StepStatics)


def _plain_arrays(args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether the per-step arguments are positional arrays of types seen before: passed
    to the program as they are, with no statics."""
    return not kwargs and all(map(_array_types.__contains__, map(type, args)))


def _merge(spec: tuple, arrays: list[Any]) -> Any:
    treedef, mask, statics = spec
    arrays_left, statics_left = iter(arrays), iter(statics)
    leaves = [next(arrays_left) if m else next(statics_left).value for m in mask]
    return treedef.unflatten(leaves)


def _split_argument(value: Any, name: str, function: str) -> tuple[list[Any], tuple]:
    """One per-step argument: its arrays (traced), and the spec of the rest (static)."""
    leaves, treedef = jax.tree_util.tree_flatten(
        value, is_leaf=lambda x: isinstance(x, _GRAPH_NODES)
    )
    arrays, mask, statics = [], [], []
    for leaf in leaves:
        if isinstance(leaf, _GRAPH_NODES):
            raise TypeError(
                f"jit_partial({function}): the per-step argument {name} holds a "
                f"{type(leaf).__name__}. Modules and Variables must be bound (passed to "
                "`jit_partial` after the function), so that their changes are written "
                "back; or call the function through `pytree_graph.jit`."
            )
        if isinstance(leaf, SHAPED_TYPES):
            arrays.append(leaf)
            mask.append(True)
        else:
            try:
                statics.append(Static(leaf))
                hash(statics[-1])
            except TypeError:
                raise TypeError(
                    f"jit_partial({function}): the per-step argument {name} holds a "
                    f"{type(leaf).__name__}, which is static (not an array) and so must be "
                    "hashable. Pass it as an array, or make it hashable (a tuple instead "
                    "of a list)."
                ) from None
            mask.append(False)
    if len(arrays) == 1 and not statics and treedef.num_nodes == 1:
        _array_types.add(type(value))  # a plain array: passed as it is from now on
    return arrays, (treedef, tuple(mask), tuple(statics))


_WHOLE = jax.tree_util.tree_structure(0)  # a pytree of one leaf: a static argument


def _static_argument(static: StaticArguments, value: Any, at: int | str) -> tuple[list, tuple]:
    """A static per-step argument (at position or name `at`): no arrays, and the spec of
    one static leaf, the whole value (hashed and compared as `jax.jit`'s statics)."""
    static.check_value(at, value)
    return [], (_WHOLE, (False,), (Static(value),))


def bound_static_arguments(
    fun: Callable[..., Any], num_bound: int, argnums: Any, argnames: Any
) -> StaticArguments | None:
    """`jit_partial`'s static arguments (numbered as `fun`'s positional arguments, the
    bound ones first), refusing a bound one: it is a Module or Variable, which a call
    lifts and writes back.

    Raises:
        TypeError: a bound argument named static, or an option of the wrong type.
        ValueError: a position or name `fun` does not have.
    """
    static = static_arguments(fun, argnums, argnames, "jit_partial")
    if static is None:
        return None
    names = list(inspect.signature(fun).parameters)[:num_bound] if num_bound else []
    bound = [p for p in static.positions if p < num_bound] + [n for n in static.names if n in names]
    if bound:
        raise TypeError(
            f"jit_partial({static.fun_name}, ...): argument {bound[0]!r} is bound, so it "
            "cannot be static: bound arguments are Modules and Variables, lifted and "
            "written back on every call. Name only per-step arguments in static_argnums "
            f"/ static_argnames (positions from {num_bound} on, the bound ones first)."
        )
    return static


class _Binding:
    """The bound objects, walked once: what a call reads, checks and writes.

    Arguments:
        call: how the function is called (the function is lifted too if it holds graph
            nodes).
        bound: the bound arguments.
        donate: positions of the function's arguments whose values are donated.
    """

    __slots__ = (
        "array_backed",
        "cached",
        "cells",
        "cells_of",
        "donated",
        "epoch",
        "guards",
        "inner",
        "kept",
        "last_outcome",
        "last_writer",
        "layout",
        "next_donated",
        "next_kept",
        "plan",
        "roots",
        "same_containers",
        "stamp",
        "trace",
        "tree",
        "writers",
    )

    def __init__(self, call: Call, bound: tuple, donate: frozenset[int]):
        self.roots = [call.fun, *bound] if call.lift_fun else list(bound)
        self.tree = tree = call.tree(bound, {})
        checks = Checks(self.roots)
        walk = GraphWalk(checks=checks)
        graphdef = walk.graphdef(tree)
        # A graph holding other pytree nodes (whose changes no check sees) is walked on
        # every call instead.
        self.cached = CachedWalk(walk, checks, graphdef) if checks.cacheable else None
        plan = self.plan = (
            self.cached.plan if self.cached is not None else LiftPlan.of_walk(walk, graphdef)
        )
        variables = plan.variables + [self.roots[n] for n in plan.root_variables]
        self.inner = plan.inner_arrays
        positions = self.positions(len(variables))
        mask = tuple(call.split_path(graphdef.paths[p])[0] in donate for p in positions)
        if any(mask):
            self.donated = [v for v, d in zip(variables, mask, strict=True) if d]
            self.kept = [v for v, d in zip(variables, mask, strict=True) if not d]
            donated_positions = tuple(p for p, d in zip(positions, mask, strict=True) if d)
            self.layout = _Layout(
                plan.structure, mask + (False,) * len(self.inner), donated_positions
            )
        else:
            self.donated, self.kept = [], variables
            self.layout = _Layout(plan.structure, None)
        # Array-backed Variables (their value list is a `RefCell`) can be written by
        # plain `jax.jit` straight into their refs, which draws no `value_writes` stamp:
        # their values are read anew for each call, never kept from the last.
        self.array_backed = any(type(v._pg_flat[0]) is not list for v in variables)
        # One Variable of each JAX trace the Variables were made in, to check the call's.
        self.guards = list({id(v._pg_trace): v for v in variables}.values())
        # What the last full check saw (`JitPartial._checked_call`): the mutation count
        # and the JAX trace. While both are the same, the objects are as walked and the
        # guards pass, and only the plain lists and dicts need comparing.
        self.epoch: int | None = None
        self.trace: Any = None
        cached = self.cached
        self.same_containers = cached.same_containers if cached and cached.containers else None
        self.writers: dict[Outcome, tuple | None] = {}
        self.last_outcome: Outcome | None = None
        self.last_writer: tuple | None = None
        # The values the Variables hold after the last write back, in the lists' order,
        # and the `value_writes` stamp it left: valid while the stamp is unchanged.
        self.next_kept: list[Any] = []
        self.next_donated: list[Any] = []
        self.stamp: int | None = None
        # The value lists (`Variable._pg_flat[0]`) of the Variables the last call wrote,
        # and the writer they were read for: valid with `stamp` (a list is replaced only
        # by a write that draws a stamp or bumps the mutation count).
        self.cells: list[list[Any]] = []
        self.cells_of: tuple | None = None

    def values(self) -> tuple[list[Any], list[Any], int]:
        """The values to call with, `(donated, kept, stamp)`, in the lists' order, and the
        `value_writes` stamp when they were taken."""
        stamp = value_writes.last
        if self.stamp == stamp:
            return self.next_donated, self.next_kept, stamp
        # (A comprehension reads the values faster than chained `map`s of getters.)
        kept = [v._pg_flat[0][0] for v in self.kept]
        if self.inner:
            kept += self.inner
        donated = [v._pg_flat[0][0] for v in self.donated] if self.donated else []
        return donated, kept, stamp

    def fresh(self) -> bool:
        """Whether the bound objects are as they were when walked."""
        if self.cached is None or not self.cached.unchanged(self.roots):
            return False
        if CHECK_HITS:
            _check_hit(self.tree, self.lifted())
        return True

    def positions(self, count: int | None = None) -> list[int]:
        """The leaf position of each value read (of the first `count`), in reading order."""
        order = self.plan.order
        positions = [0] * len(order)
        for position, index in enumerate(order):
            positions[index] = position
        return positions if count is None else positions[:count]

    def lifted(self) -> LiftedCall:
        """The bound objects as a lifted call, with their values now (the general path)."""
        return LiftedCall(self.plan, self.roots, [])

    def write_back(
        self,
        outcome: Outcome,
        values: list[Any],
        called_with: tuple[list[Any], list[Any], int],
    ) -> Any:
        """Write a call's outcome into the bound objects; return the output (`values`:
        the values the call returned; `called_with`: what `values()` gave the call)."""
        donated, kept, taken = called_with
        # The value lists of the last call's Variables are theirs still if no write drew
        # a stamp since (`taken` is then the stamp that call left).
        quick = self.stamp == taken
        self.stamp = None
        writer = self.last_writer if outcome is self.last_outcome else self.writer(outcome)
        if writer is None:
            return self.lifted().apply(outcome, values)
        variables, objects, next_donated, next_kept = writer
        if quick and writer is self.cells_of:
            cells = self.cells
        else:
            cells = [v._pg_flat[0] for v in variables]
        # Each value into its Variable's list, in C: no Python loop, no object made. The
        # values run on past the Variables (the output's follow), and `map` stops at the
        # shortest.
        _consume(map(setitem, cells, repeat(0), values))
        stamp = wrote_values()
        # Kept only if no other write drew a stamp since the values were taken (another
        # thread's, during the call): the stamps are drawn in order, one per write.
        if next_kept is not None and stamp == taken + 1 and not self.array_backed:
            self.next_donated = next_donated(values, donated) if self.donated else []
            self.next_kept = next_kept(values, kept)
            self.cells, self.cells_of = cells, writer
            self.stamp = stamp
        if objects is None:
            return values[len(variables)] if outcome.out_is_leaf else None
        positions = [None] * outcome.num_leaves + values[len(variables) :]
        return Builder(positions, list(objects)).visit(outcome.out)  # it fills new ones in

    def writer(self, outcome: Outcome) -> tuple | None:
        """How to write back a call's outcome: `(variables, objects, next_donated,
        next_kept)`, or None where `LiftedCall.apply` must (a new structure)."""
        writer = self.writers.get(outcome, False)
        if writer is False:
            writer = None
            if type(outcome) is ValuesChanged and not outcome.carries_all:
                lifted = self.lifted()
                variables = [lifted.leaves[p] for p in outcome.changed]
                objects = None
                if outcome.out is not None:
                    objects = lifted.objects + [None] * (outcome.num_objects - len(lifted.objects))
                # Where each Variable's value comes from after the write: its output, or
                # (not written) what the call was given.
                output = {id(v): i for i, v in enumerate(variables)}
                next_donated = _next_values([output.get(id(v)) for v in self.donated])
                kept_sources = [output.get(id(v)) for v in self.kept]
                next_kept = _next_values(kept_sources + [None] * len(self.inner))
                writer = (variables, objects, next_donated, next_kept)
            self.writers[outcome] = writer
        self.last_outcome, self.last_writer = outcome, writer
        return writer


def _next_values(sources: list[int | None]) -> Callable[[list[Any], list[Any]], list]:
    """How to make a list of values after a write back, from the call's outputs and the
    list it was given: `sources` says, for each item, which output holds its new value
    (None: the item is unchanged)."""
    if not sources:
        return lambda outputs, given: []
    if sources == list(range(len(sources))):  # the usual case: every value written, in order
        count = len(sources)
        return lambda outputs, given: outputs[:count]
    return lambda outputs, given: [
        given[i] if source is None else outputs[source] for i, source in enumerate(sources)
    ]


class JitPartial(BindsAsMethod):
    """The function `jit_partial` returns: call it with the per-step arguments.

    As a class attribute it binds like a method (as `jax.jit`'s functions and Flax NNX's
    `jit_partial` do): `obj.step(x)` calls it with `obj` as the first per-step argument.
    """

    def __init__(self, fun: Callable[..., Any], bound: tuple, jit_kwargs: dict[str, Any]):
        name = getattr(fun, "__name__", type(fun).__name__)
        for i, value in enumerate(bound):
            if not isinstance(value, _GRAPH_NODES):
                raise TypeError(
                    f"jit_partial({name}, ...): bound argument {i} (of type "
                    f"{type(value).__name__}) is not a Module or Variable. Bind the graph "
                    "arguments (a model, an optimizer) and pass arrays and other values "
                    "on each call: `step = jit_partial(f, model, optimizer); step(x, y)`."
                )
        self._signature = _signature(fun)
        if self._signature is not None:
            try:
                self._signature.bind_partial(*bound)
            except TypeError as error:
                raise TypeError(
                    f"jit_partial({name}, ...): {len(bound)} arguments were bound, but "
                    f"{name}{self._signature} does not take them: {error}."
                ) from None
        self._fun = fun
        self._name = name
        self._bound = bound
        self._call = call = Call(fun)
        num_bound = len(bound)
        self._static = static = bound_static_arguments(
            fun,
            num_bound,
            jit_kwargs.pop("static_argnums", None),
            jit_kwargs.pop("static_argnames", None),
        )
        donate = donated_arguments(
            fun,
            jit_kwargs.pop("donate_argnums", NOT_GIVEN),
            jit_kwargs.pop("donate_argnames", None),
            "jit_partial",
            static,
        )
        # Bound arguments are positional: their Variables' values are donated by position.
        self._donate = frozenset(d for d in donate if type(d) is int)
        shardings, step_shardings = _split_shardings(
            call,
            num_bound,
            with_static_entries(jit_kwargs.pop("in_shardings", None), static and static.positions),
            jit_kwargs.pop("out_shardings", None),
        )
        # The jitted function's arguments: layout, donated, kept, statics, per-step ones.
        donate_argnums = ((1,) if any(d < num_bound for d in self._donate) else ()) + tuple(
            sorted(4 + d - num_bound for d in self._donate if d >= num_bound)
        )

        # The traces of this function, to say why one more was needed (recorded by each
        # trace, never by a cached call).
        history = TraceHistory("pytree_graph.jit_partial", fun)

        def pure(
            layout: _Layout, donated: list, kept: list, statics: Any, *args: Any, **kwargs: Any
        ) -> Any:
            values = layout.values(donated, kept)
            if shardings is None:
                inside = Inside(layout.structure, values)
            else:
                inside = shardings.enter(layout.structure, values)
            if statics is not None:
                args, kwargs = statics.rebuild(args, kwargs)
            if step_shardings is not None:
                args = _lay_out_step(step_shardings, args, num_bound)
            signature = graph_signature(inside.graphdef, inside.values, call.lift_fun)
            for i, arg in enumerate(args):
                signature.pytree(f"args[{num_bound + i}]", arg)
            for name, value in kwargs.items():
                signature.pytree(f"kwargs[{name!r}]", value)
            tree = inside.tree
            with history.record(signature):
                if call.lift_fun:
                    out = tree[0](*tree[1], *args, **kwargs)
                else:
                    out = call.fun(*tree[0], *args, **kwargs)
            outcome, values = inside.finish(out)
            outcome, values = return_donated(inside, outcome, values, layout.donated_positions)
            if shardings is not None:
                values = shardings.outputs(inside, outcome, values)
            return outcome, list(values)  # a list: a call passes on a slice of it

        # Per-step arguments passed by keyword are donated by name (their arrays' lists).
        donate_argnames = tuple(sorted(d for d in donate if type(d) is str))
        self._jitted = jax.jit(
            pure, donate_argnums=donate_argnums, donate_argnames=donate_argnames, **jit_kwargs
        )
        self._binding = _Binding(call, bound, self._donate)
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        binding = self._binding
        stamp = binding.stamp
        # The usual call: nothing changed since the last one, which left the values to
        # pass on. (`stamp` is None, never equal, when the values must be read again.)
        if (
            stamp == value_writes.last
            and binding.epoch == mutations.count
            and binding.trace is current_trace_token()
            and (binding.same_containers is None or binding.same_containers())
            and _plain_arrays(args, kwargs)
            and self._static is None
        ):
            called_with = donated, kept, _ = binding.next_donated, binding.next_kept, stamp
            try:
                outcome, values = self._jitted(binding.layout, donated, kept, None, *args)
            except Exception as error:
                self._explain(error, binding, args, kwargs)
                raise
            return binding.write_back(outcome, values, called_with)
        return self._checked_call(args, kwargs)

    def _checked_call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A call after a change, or with per-step arguments other than plain arrays:
        check the bound objects (walk them again if they changed), read their values."""
        epoch = mutations.count  # (read first: a change during the checks is seen later)
        binding = self._binding
        if not binding.fresh():
            binding = self._binding = _Binding(self._call, self._bound, self._donate)
        trace = current_trace_token()
        for variable in binding.guards:
            check_writable(variable)
        if binding.cached is not None and not CHECK_HITS:
            binding.epoch, binding.trace = epoch, trace
        step_args, step_kwargs, statics = args, kwargs, None
        if self._static is not None or not _plain_arrays(args, kwargs):
            step_args, step_kwargs, statics = self._split_step(args, kwargs)
        called_with = donated, kept, _ = binding.values()
        try:
            outcome, values = self._jitted(
                binding.layout, donated, kept, statics, *step_args, **step_kwargs
            )
        except Exception as error:
            self._explain(error, binding, args, kwargs)
            raise
        return binding.write_back(outcome, values, called_with)

    def _split_step(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict, Any]:
        """The per-step arguments as lists of their arrays, and their static rest (None,
        and the arguments as they are, where they are all plain arrays: the form later
        calls take without splitting, so that the first call compiles the same program)."""
        static = self._static
        num_bound = len(self._bound)
        arg_arrays, arg_specs = [], []
        for i, arg in enumerate(args):
            if static is not None and num_bound + i in static.positions:
                arrays, spec = _static_argument(static, arg, num_bound + i)
            else:
                arrays, spec = _split_argument(arg, f"args[{i}]", self._name)
            arg_arrays.append(arrays)
            arg_specs.append(spec)
        kwarg_arrays, kwarg_specs = {}, []
        for name in sorted(kwargs):
            if static is not None and name in static.names:
                kwarg_arrays[name], spec = _static_argument(static, kwargs[name], name)
            else:
                kwarg_arrays[name], spec = _split_argument(kwargs[name], repr(name), self._name)
            kwarg_specs.append((name, spec))
        if static is None and _plain_arrays(args, kwargs):
            return args, kwargs, None
        return tuple(arg_arrays), kwarg_arrays, _StepStatics(tuple(arg_specs), tuple(kwarg_specs))

    def _explain(
        self, error: Exception, binding: _Binding, args: tuple, kwargs: dict[str, Any]
    ) -> None:
        """Make an error raised while tracing name the user's function and arguments."""
        if isinstance(error, TypeError) and self._signature is not None:
            try:
                self._signature.bind(*self._bound, *args, **kwargs)
            except TypeError as wrong:
                count = len(self._bound)
                names = list(self._signature.parameters)[:count]
                raise TypeError(
                    f"{self._name}{self._signature}: {count} argument(s) are bound by "
                    f"jit_partial ({', '.join(names)}), and the call passed {len(args)} "
                    f"positional and {len(kwargs)} keyword argument(s) after them: {wrong}."
                ) from error
        positions = binding.positions()
        mask = binding.layout.mask
        if mask is None:
            lists = {"kept": positions}
        else:
            lists = {
                "donated": [p for p, d in zip(positions, mask, strict=False) if d],
                "kept": [p for p, d in zip(positions, mask, strict=False) if not d],
            }
        rename_in_error(error, self._call, self._fun, binding.plan.graphdef.paths, lists)

    def _stage(self, args: tuple, kwargs: dict[str, Any]) -> tuple[_Binding, tuple, dict, tuple]:
        """The inputs of the jitted function for a call (ahead of time), and what
        `_Binding.values` gave."""
        binding = self._binding
        if not binding.fresh():
            binding = self._binding = _Binding(self._call, self._bound, self._donate)
        step_args, step_kwargs, statics = self._split_step(args, kwargs)
        called_with = donated, kept, _ = binding.values()
        inputs = (binding.layout, donated, kept, statics, *step_args)
        return binding, inputs, step_kwargs, called_with

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The output of a call with these per-step arguments, with shapes and dtypes
        only: nothing is computed and the bound objects are left as they are (as
        `pytree_graph.eval_shape` of the function with all its arguments).

        Returns:
            The output, each array a `jax.ShapeDtypeStruct` (Modules and Variables in it
            are new objects holding them).

        Raises:
            TypeError: a per-step argument holds a Module or Variable.

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_graph import Param, jit_partial
            >>> w = Param(jnp.ones((2, 3)))
            >>> apply = jit_partial(lambda w, x: x @ w.value, w)
            >>> apply.eval_shape(jnp.ones((5, 2)))
            ShapeDtypeStruct(shape=(5, 3), dtype=float32)
        """
        self._split_step(args, kwargs)  # refuses Modules and Variables, as a call does
        return eval_shape(self._fun, *self._bound, *args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Trace for these per-step arguments, ahead of time (as `jax.jit(f).trace`).

        Returns:
            A `Traced`: its `.jaxpr`, and `.lower()` to go on.
        """
        binding, inputs, step_kwargs, _ = self._stage(args, kwargs)
        try:
            traced = self._jitted.trace(*inputs, **step_kwargs)
        except Exception as error:
            self._explain(error, binding, args, kwargs)
            raise
        return Traced(traced, self._compiled_caller(inputs))

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace and lower for these per-step arguments, ahead of time (as
        `jax.jit(f).lower`).

        Returns:
            A `Lowered`: `.as_text()` shows the program; `.compile()` gives a function
            that takes per-step arguments of the same shapes and writes back to the
            bound objects, as this function does.
        """
        binding, inputs, step_kwargs, _ = self._stage(args, kwargs)
        try:
            lowered = self._jitted.lower(*inputs, **step_kwargs)
        except Exception as error:
            self._explain(error, binding, args, kwargs)
            raise
        return Lowered(lowered, self._compiled_caller(inputs))

    def _compiled_caller(self, staged: tuple) -> Callable[..., Any]:
        """How a `Compiled` runs a call: check the bound objects and the per-step
        statics are those it was lowered for, run it, write back."""
        layout, statics = staged[0], staged[3]

        def call(compiled: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
            binding, inputs, step_kwargs, called_with = self._stage(args, kwargs)
            if inputs[0] != layout or inputs[3] != statics:
                raise ValueError(
                    f"This compiled {self._name!r} was lowered for bound objects of another "
                    "structure, or other non-array per-step arguments. Lower it again, or "
                    "call the `jit_partial` function, which compiles as needed."
                )
            for variable in binding.guards:
                check_writable(variable)
            return binding.write_back(*compiled(*inputs, **step_kwargs), called_with)

        return call


def _split_shardings(
    call: Call, num_bound: int, in_shardings: Any, out_shardings: Any
) -> tuple[_Shardings | None, Any]:
    """`in_shardings` and `out_shardings` as the bound objects' (laid out as by
    `pytree_graph.jit`) and the per-step arguments' (a tuple with one entry per argument,
    or one sharding for all; None: not given)."""
    if isinstance(in_shardings, tuple | list):
        bound, step = tuple(in_shardings[:num_bound]), tuple(in_shardings[num_bound:])
    else:
        bound = step = in_shardings
    if bound is None and out_shardings is None:
        return None, step
    return _Shardings(call, bound, out_shardings), step


def _lay_out_step(shardings: Any, args: tuple, num_bound: int) -> tuple:
    """The per-step arguments (traced), each laid out as its entry of `in_shardings`
    says: a sharding for all its arrays, or a pytree prefix of it with one per part."""
    if not isinstance(shardings, tuple):
        shardings = (shardings,) * len(args)
    if len(shardings) > len(args):
        raise ValueError(
            f"jit_partial: in_shardings has {num_bound + len(shardings)} entries, "
            f"{num_bound} for the bound arguments and {len(shardings)} for per-step ones, "
            f"but the call passed {len(args)} per-step positional argument(s). Give one "
            "entry per positional argument of the function (None where any layout goes)."
        )
    laid_out = list(args)
    for i, (spec, arg) in enumerate(zip(shardings, args, strict=False)):
        try:
            laid_out[i] = jax.tree.map(
                lambda sharding, part: jax.tree.map(lambda a: _constrain(a, sharding), part),
                spec,
                arg,
                is_leaf=_is_sharding,
            )
        except ValueError as error:
            raise ValueError(
                f"jit_partial: in_shardings[{num_bound + i}] (for per-step argument {i}) "
                f"must be a sharding or a pytree prefix of the argument: {error}"
            ) from None
    return tuple(laid_out)


def _signature(fun: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def jit_partial(
    fun: Callable[..., Any],
    *partial_args: Any,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **jit_kwargs: Any,
) -> Any:
    """`pytree_graph.jit` of `fun` with its first arguments bound: a training step that
    takes the model and optimizer once, and only the data on each call.

    The bound objects are walked once. Each call reads their Variables' values straight
    into the compiled program and writes the new values straight back into the same
    Variables, with no walk of the graph: as fast as `jax.jit` on a dict of the same
    arrays. It still sees every change made outside between calls: a new value set into
    a Variable is read by the next call, and a structural change (an attribute added,
    a submodule swapped, a static flag changed by `model.eval()`, a Variable replaced)
    makes the next call walk the objects again (and compile again if their structure
    is new). Shared Variables (tied weights, a model held by its optimizer) are passed
    once. Results, and writes back, are those of `pytree_graph.jit(fun)` called with all
    the arguments. With `pytree_transforms.explain_retraces()` on, each compilation after
    the first logs what changed, by argument path, the bound ones first.

    Arguments:
        fun: the function, taking the bound arguments first.
        *partial_args: the Modules and Variables to bind (each a Module or Variable).
        **jit_kwargs: as for `pytree_graph.jit` (passed on to `jax.jit`).
            `donate_argnums` numbers `fun`'s positional arguments, the bound ones first:
            donating a bound argument donates its Variables' values (the new ones are
            written back), donating a later one donates that per-step argument
            (`donate_argnames` names them). `static_argnums` (numbered so too) and
            `static_argnames` make per-step arguments static (hashed, compared with `==`);
            a bound one cannot be.
            `in_shardings` too: one sharding for everything, or a tuple with an entry per
            positional argument, the bound ones first (for a bound object: a sharding, a
            State of them, a `StateSharding` or a pytree prefix, as in `pytree_graph.jit`,
            also laying out the Variables written; for a per-step argument: a sharding or
            a pytree prefix of it). `out_shardings` lays out the output.
        graph: `False` for tree mode: `pytree_graph.jit(fun, graph=False)` with the first
            arguments bound, passed as pytrees on every call (no fast path: each call
            flattens them and checks them for a Variable met twice). `None` reads
            `set_graph_mode`.
        graph_updates: `False`: as `graph=False`, with graph mode's sharing kept. `None`
            reads `set_graph_updates`.

    Returns:
        The compiled function of the remaining arguments. Its `.lower(*args)` and
        `.trace(*args)` stage it ahead of time.

    Raises:
        TypeError: a bound argument is not a Module or Variable, `fun` does not take
            that many arguments, a per-step argument holds a Module or Variable, a bound
            argument is named static, or a static one is not hashable.
        ValueError: `static_*` or `donate_*` name an argument `fun` does not have.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, jit_partial
        >>> class Scale(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(1.0))
        >>> def step(model, x):
        ...     model.w.value = model.w.value + x
        ...     return model.w.value * 2
        >>> model = Scale()
        >>> train = jit_partial(step, model)
        >>> float(train(jnp.array(1.0))), float(model.w.value)
        (4.0, 2.0)
        >>> model.w.value = jnp.array(10.0)  # read by the next call
        >>> float(train(jnp.array(1.0)))
        22.0
    """
    check_callable(fun, "jit_partial")
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if not (graph and graph_updates):
        # A bound argument named static is refused here too (checked, not kept).
        bound_static_arguments(
            fun,
            len(partial_args),
            jit_kwargs.get("static_argnums"),
            jit_kwargs.get("static_argnames"),
        )
        return SimplePartial(SimpleJit(fun, graph, jit_kwargs), partial_args)
    return JitPartial(fun, partial_args, dict(jit_kwargs))


def cached_partial(f: Callable[..., Any], *cached_args: Any) -> Any:
    """Bind the first arguments of a `pytree_graph.jit` function: the same as
    `jit_partial` of the function it compiles, with its options.

    Arguments:
        f: a function compiled with `pytree_graph.jit`.
        *cached_args: the Modules and Variables to bind, as for `jit_partial`.

    Returns:
        The compiled function of the remaining arguments (a `jit_partial` function; for a
        `jit` made with `graph=False` or `graph_updates=False`, that `jit` with the
        arguments bound).

    Raises:
        TypeError: `f` is not a `pytree_graph.jit` function, or as `jit_partial`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Variable, cached_partial, jit
        >>> count = Variable(jnp.array(0))
        >>> @jit
        ... def tick(count, by):
        ...     count.value += by
        >>> step = cached_partial(tick, count)
        >>> step(jnp.array(2)); step(jnp.array(3)); int(count.value)
        5
    """
    if isinstance(f, SimpleJit):  # a tree-mode (or graph_updates=False) jit
        return SimplePartial(f, cached_args)
    if not isinstance(f, _GraphJit):
        raise TypeError(
            f"cached_partial takes a function compiled with `pytree_graph.jit`, not a "
            f"{type(f).__name__}. Bind the arguments of a plain function with "
            "`jit_partial(f, model, ...)`; other graph transforms reuse their walks "
            "already, so `functools.partial` serves for them."
        )
    return JitPartial(f._fun, cached_args, dict(f._jit_kwargs))
