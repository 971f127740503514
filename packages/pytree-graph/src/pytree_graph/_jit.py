"""`jit`: `jax.jit` for functions of object graphs, writing changes back to the caller."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec, Sharding

from pytree_module import Module
from pytree_module.extend import flat_form, is_pytree_class
from pytree_transforms.extend import BindsAsMethod, TraceHistory

from ._aliases import check_one_spec, lift_recording_aliases
from ._argument_specs import NO_ENTRY, PerArgumentSpecs, SpecTable, leaves_of
from ._boundary import Call, Inside
from ._error_names import rename_in_error
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._graphdef import GraphDef
from ._initialise import Initialiser, initialising, without_self
from ._lift import LiftedCall, Reordered
from ._lift_cache import LastCall, lift_cache
from ._outcome import NOTHING_CHANGED, Outcome, ValuesChanged
from ._retrace_signature import graph_signature, static_signature
from ._static_args import NOT_GIVEN, donated_arguments, static_arguments, with_static_entries
from ._tree_transforms import SimpleJit
from ._variables import Variable

# How many structures a graph `jit` keeps a plain-call `jax.jit` for.
_MAX_STRUCTURES = 64


class _GraphJit(BindsAsMethod):
    """The function `jit` returns."""

    def __init__(self, fun: Callable[..., Any], jit_kwargs: dict[str, Any]):
        self._fun = fun
        self._call = call = Call(fun)
        self._jit_kwargs = dict(jit_kwargs)
        self._initialise = Initialiser(fun, "jit", self._constructor)
        static_args = self._static = static_arguments(
            fun,
            jit_kwargs.pop("static_argnums", None),
            jit_kwargs.pop("static_argnames", None),
            "jit",
        )
        self._donate = donated_arguments(
            fun,
            jit_kwargs.pop("donate_argnums", NOT_GIVEN),
            jit_kwargs.pop("donate_argnames", None),
            "jit",
            static_args,
        )
        in_shardings = with_static_entries(
            jit_kwargs.pop("in_shardings", None), static_args and static_args.positions
        )
        out_shardings = jit_kwargs.pop("out_shardings", None)
        layout = (
            None
            if in_shardings is None and out_shardings is None
            else _Shardings(call, in_shardings, out_shardings)
        )

        # The traces of this function, to say why one more was needed (recorded by each
        # trace, never by a cached call).
        history = TraceHistory("pytree_graph.jit", fun)

        def run(inside: Inside, statics: tuple | None) -> Any:
            signature = graph_signature(
                inside.graphdef,
                inside.values,
                call.lift_fun,
                static_signature(static_args, statics),
            )
            with history.record(signature):
                if statics is None:
                    return call.run(inside.tree)
                # The static arguments go back where the lifted tree holds `None` for them.
                static_args.check(statics)  # once per trace: a Module given static is refused
                *fun_part, args, kwargs = inside.tree
                return call.run((*fun_part, *static_args.insert(args, kwargs, statics)))

        def pure(graphdef: GraphDef | Reordered, values: list[Any], statics: Any = None) -> Any:
            if layout is None:
                inside = Inside(graphdef, values)
                return inside.finish(run(inside, statics))
            inside = layout.enter(graphdef, values)
            outcome, out_values = inside.finish(run(inside, statics))
            return outcome, layout.outputs(inside, outcome, out_values)

        def pure_donating(
            graphdef: GraphDef,
            donated: list[Any],
            kept: list[Any],
            mask: tuple,
            statics: Any = None,
        ):
            donated_values, kept_values = iter(donated), iter(kept)
            values = [next(donated_values if d else kept_values) for d in mask]
            inside = Inside(graphdef, values) if layout is None else layout.enter(graphdef, values)
            outcome, out_values = inside.finish(run(inside, statics))
            # A donated Variable the function did not write still needs a live value.
            donated = tuple(p for p, d in enumerate(mask) if d)
            outcome, out_values = return_donated(inside, outcome, out_values, donated)
            if layout is None:
                return outcome, out_values
            return outcome, layout.outputs(inside, outcome, out_values)

        # The statics, where there are any, come last: a static argument of `jax.jit`.
        self._jitted = jax.jit(pure, static_argnums=() if static_args is None else 2, **jit_kwargs)
        # A plain call (no statics, nothing donated) goes to a `jax.jit` of `pure` with the
        # structure bound, one per structure: JAX then has no static part to hash and
        # compare on every call (a microsecond a call). The last one used is tried first.
        self._jit_for_structure = lambda structure: jax.jit(
            functools.partial(pure, structure), **jit_kwargs
        )
        self._by_structure: dict[Any, Any] = {}
        self._last: tuple[Any, Any] = (None, None)
        # The last plain call's arguments and jitted function, to match the next call to.
        self._hot: tuple[LastCall, Any] | None = None
        self._jitted_donating = jax.jit(
            pure_donating,
            static_argnums=3 if static_args is None else (3, 4),
            donate_argnums=1,
            **jit_kwargs,
        )
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The same objects as the last call, unchanged: its inputs are read straight away.
        hot = self._hot
        if hot is not None and not kwargs:
            last_call, jitted = hot
            inputs = last_call.inputs(args)
            if inputs is not None:
                try:
                    outcome, values = jitted(inputs)
                except Exception as error:
                    self._rename_in_error(error, last_call.lifted(args, inputs), None)
                    raise
                if outcome is NOTHING_CHANGED:
                    return values[0]
                return last_call.lifted(args, inputs).apply(outcome, values)
        # A pytree Module still in its `__init__` has no layout yet (checked inline: hot path).
        if (
            args
            and isinstance(args[0], Module)
            and flat_form(args[0])[1] is None
            and is_pytree_class(type(args[0]))
        ):
            return self._initialise(self, args[0], args[1:], kwargs)
        if self._static is not None:
            return self._call_with_statics(args, kwargs)
        last_call = None
        if kwargs or self._call.lift_fun:
            lifted = lift_cache.find(self._call.tree(args, kwargs))
        else:
            lifted, last_call = lift_cache.find_args(args)
        if not self._donate:
            structure, values = lifted.jit_inputs()
            last = self._last
            jitted = last[1] if last[0] is structure else self._jit_of(structure)
            # One tuple: a thread never sees half of it.
            self._hot = None if last_call is None else (last_call, jitted)
            try:
                outcome, values = jitted(values)
            except Exception as error:
                self._rename_in_error(error, lifted, None)
                raise
            if outcome is NOTHING_CHANGED:  # the usual forward pass: one array out, no writes
                return values[0]
            return lifted.apply(outcome, values)
        inputs = self._donating_inputs(lifted)
        try:
            outcome, values = self._jitted_donating(*inputs)
        except Exception as error:
            self._rename_in_error(error, lifted, inputs[3])
            raise
        return lifted.apply(outcome, values)

    def _cache_size(self) -> int:
        """How many programs JAX keeps compiled for this function (as `jax.jit`'s)."""
        jitted = [self._jitted, self._jitted_donating, *self._by_structure.values()]
        return sum(j._cache_size() for j in jitted)

    def _jit_of(self, structure: GraphDef | Reordered) -> Any:
        """The `jax.jit` of plain calls of this structure (made on first use)."""
        jitted = self._by_structure.get(structure)
        if jitted is None:
            if len(self._by_structure) >= _MAX_STRUCTURES:
                # Structures seen long ago: JAX's own cache still holds what they compiled
                # only as long as their `jax.jit` lives, as the static-argument form would.
                self._by_structure.pop(next(iter(self._by_structure)), None)
            jitted = self._jit_for_structure(structure)
            self._by_structure[structure] = jitted
        self._last = (structure, jitted)  # one tuple: a thread never sees half of it
        return jitted

    def _call_with_statics(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A call of a jit with static arguments: they are passed to `jax.jit` apart."""
        lifted, jitted, inputs = self._stage(args, kwargs)
        try:
            outcome, values = jitted(*inputs)
        except Exception as error:
            self._explain_statics(error, inputs[-1])
            self._rename_in_error(error, lifted, inputs[3] if self._donate else None)
            raise
        return lifted.apply(outcome, values)

    def _explain_statics(self, error: Exception, statics: tuple) -> None:
        """Name the static argument an error of `jax.jit` (it hashes them) is about."""
        if isinstance(error, TypeError | ValueError):
            try:
                self._static.check(statics)
            except ValueError as named:
                raise named from error

    def _donating_inputs(self, lifted: LiftedCall) -> tuple[GraphDef, list, list, tuple]:
        """The arguments of the donating jitted function: `(graphdef, donated, kept, mask)`."""
        split = self._call.split_path
        mask = tuple(split(path)[0] in self._donate for path in lifted.paths)
        donated = [v for v, d in zip(lifted.values, mask, strict=True) if d]
        kept = [v for v, d in zip(lifted.values, mask, strict=True) if not d]
        return lifted.graphdef, donated, kept, mask

    def trace(self, *args: Any, **kwargs: Any) -> "Traced":
        """Trace for these arguments, ahead of time (as `jax.jit(f).trace`).

        Returns:
            A `Traced`: its `.jaxpr`, and `.lower()` to go on.
        """
        lifted, jitted, inputs = self._stage(args, kwargs)
        try:
            traced = jitted.trace(*inputs)
        except Exception as error:
            if self._static is not None:
                self._explain_statics(error, inputs[-1])
            self._rename_in_error(error, lifted, inputs[3] if self._donate else None)
            raise
        return Traced(traced, self._compiled_caller(inputs))

    def lower(self, *args: Any, **kwargs: Any) -> "Lowered":
        """Trace and lower for these arguments, for ahead-of-time compilation (as
        `jax.jit(f).lower`).

        Returns:
            A `Lowered`: `.as_text()` shows the program, and `.compile()` gives a function
            that takes the same arguments (arrays of the same shapes, objects of the same
            structure) and writes back to them as the jitted function does.

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_graph import Param, jit
            >>> w = Param(jnp.ones(2))
            >>> def scale(w, x):
            ...     w.value = w.value * x
            ...     return w.value.sum()
            >>> compiled = jit(scale).lower(w, jnp.array(3.0)).compile()
            >>> float(compiled(w, jnp.array(3.0))), w.value.tolist()
            (6.0, [3.0, 3.0])
        """
        lifted, jitted, inputs = self._stage(args, kwargs)
        try:
            lowered = jitted.lower(*inputs)
        except Exception as error:
            if self._static is not None:
                self._explain_statics(error, inputs[-1])
            self._rename_in_error(error, lifted, inputs[3] if self._donate else None)
            raise
        return Lowered(lowered, self._compiled_caller(inputs))

    def _stage(self, args: tuple, kwargs: dict[str, Any]) -> tuple[LiftedCall, Any, tuple]:
        """A call's lifted arguments, the jitted function it runs, and that one's inputs."""
        if initialising(args):
            raise TypeError(
                "A jitted `__init__` cannot be lowered ahead of time: lower a function "
                "that builds the object instead, `jit(lambda *a: Model(*a)).lower(...)`."
            )
        statics = None
        if self._static is not None:
            args, kwargs, statics = self._static.split(args, kwargs)
        lifted = lift_cache.find(self._call.tree(args, kwargs))
        if self._donate:
            jitted, inputs = self._jitted_donating, self._donating_inputs(lifted)
        else:
            jitted, inputs = self._jitted, lifted.jit_inputs()
        if statics is not None:
            inputs = (*inputs, statics)
        return lifted, jitted, inputs

    def _compiled_caller(self, staged: tuple) -> Callable[..., Any]:
        """How a `Compiled` of a call with the jitted function's inputs `staged` runs a
        call: lift the arguments, check they have the structure (and statics) it was
        compiled for, run it, write back."""
        key = self._compiled_key(staged)

        def call(compiled: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
            lifted, _, inputs = self._stage(args, kwargs)
            if self._compiled_key(inputs) != key:
                raise ValueError(
                    f"This compiled {self._fun.__name__!r} was lowered for arguments of "
                    "another structure (objects, static attributes, Variable types or "
                    "metadata, or non-array or static arguments differ). Lower it again "
                    "for these arguments, or call the jitted function, which compiles as "
                    "needed."
                )
            # The donating function's mask and the static arguments are static arguments
            # of `jax.jit`: not passed to the program.
            outcome, values = compiled(*inputs[: 3 if self._donate else 2])
            return lifted.apply(outcome, values)

        return call

    def _compiled_key(self, inputs: tuple) -> Any:
        """What must be equal for a compiled program to take a call: the structure,
        which values are donated, and the static arguments."""
        if self._donate:
            return (inputs[0], *inputs[3:])
        return (inputs[0], *inputs[2:])

    def _constructor(self, construct: Callable[..., Any], class_name: str) -> "_GraphJit":
        """`construct` (see `Initialiser`) compiled with this jit's options."""
        for option in _NOT_FOR_INIT:
            if option in self._jit_kwargs:
                raise TypeError(
                    f"pytree_graph.jit on {class_name}.__init__ does not take `{option}`: "
                    "compile a function that builds the object instead, "
                    f"`jit(lambda *a: {class_name}(*a), {option}=...)`."
                )
        names = ("static_argnums", "donate_argnums")
        return _GraphJit(construct, without_self("jit", class_name, self._jit_kwargs, names))

    def _rename_in_error(self, error: Exception, lifted: LiftedCall, mask: tuple | None) -> None:
        """Name the user's function and values in an error raised while tracing."""
        if mask is not None:
            lists = {
                "donated": [p for p, d in enumerate(mask) if d],
                "kept": [p for p, d in enumerate(mask) if not d],
            }
        else:
            lists = {"values": lifted.input_positions()}
        rename_in_error(error, self._call, self._fun, lifted.paths, lists)


class Traced:
    """A graph jit traced for one structure of its arguments (`jit(f).trace(...)`).

    The `jax.stages.Traced` it wraps is `.traced`.
    """

    def __init__(self, traced: Any, call: Callable[[Any, tuple, dict], Any]):
        self.traced = traced
        self._call = call

    @property
    def jaxpr(self) -> Any:
        """The traced program (its inputs are the structure's values, in the order the
        jitted function takes them)."""
        return self.traced.jaxpr

    def lower(self) -> "Lowered":
        """Lower the traced program: a `Lowered`."""
        return Lowered(self.traced.lower(), self._call)


class Lowered:
    """A graph jit lowered for one structure of its arguments (`jit(f).lower(...)`).

    The `jax.stages.Lowered` it wraps is `.lowered`.
    """

    def __init__(self, lowered: Any, call: Callable[[Any, tuple, dict], Any]):
        self.lowered = lowered
        self._call = call

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The lowered program as text (as `jax.stages.Lowered.as_text`)."""
        return self.lowered.as_text(*args, **kwargs)

    def compiler_ir(self, *args: Any, **kwargs: Any) -> Any:
        """The lowered program as a compiler IR object (as `jax.stages.Lowered.compiler_ir`)."""
        return self.lowered.compiler_ir(*args, **kwargs)

    def cost_analysis(self) -> Any:
        """The estimated cost of the program (as `jax.stages.Lowered.cost_analysis`)."""
        return self.lowered.cost_analysis()

    def compile(self, compiler_options: dict[str, Any] | None = None) -> "Compiled":
        """Compile ahead of time.

        Arguments:
            compiler_options: XLA options for this compilation, as for
                `jax.stages.Lowered.compile`.

        Returns:
            A `Compiled`: call it as the jitted function, with arguments of the lowered
            structure; it writes the changes back in the same way.
        """
        return Compiled(self.lowered.compile(compiler_options=compiler_options), self._call)


class Compiled:
    """A graph jit compiled ahead of time: call it with arguments of the lowered structure.

    The `jax.stages.Compiled` it wraps is `.compiled`.
    """

    def __init__(self, compiled: Any, call: Callable[[Any, tuple, dict], Any]):
        self.compiled = compiled
        self._call = call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(self.compiled, args, kwargs)

    def as_text(self) -> str:
        """The compiled program as text."""
        return self.compiled.as_text()

    def cost_analysis(self) -> Any:
        """The compiled program's cost estimate (as `jax.stages.Compiled.cost_analysis`)."""
        return self.compiled.cost_analysis()

    def memory_analysis(self) -> Any:
        """The compiled program's memory use (as `jax.stages.Compiled.memory_analysis`)."""
        return self.compiled.memory_analysis()


def return_donated(
    inside: Inside, outcome: Outcome, values: list[Any], donated: tuple[int, ...]
) -> tuple[Outcome, list[Any]]:
    """The outcome and values of a call (traced), with the Variables at the `donated` leaf
    positions written back even where the function left them unchanged: XLA may have given
    their donated buffers to outputs, so each gets back its value, which the compiled
    program passes through without a copy."""
    if not donated or type(outcome) is not ValuesChanged or outcome.carries_all:
        return outcome, values  # nothing donated, or the whole graph is written back already
    after = inside.after
    assert after is not None
    # Donated arrays held outside Variables are the caller's to lose, as with `jax.jit`.
    donated = [p for p in donated if isinstance(after.leaves[p], Variable)]
    written = set(outcome.changed)
    if written.issuperset(donated):
        return outcome, values
    changed = tuple(sorted(written.union(donated)))
    out_values = values[len(outcome.changed) :]
    values = [after.values[p] for p in changed] + out_values
    return dataclasses.replace(outcome, changed=changed), values


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **jit_kwargs: Any,
) -> Any:
    """`jax.jit` for functions of Modules and Variables, with sharing and updates kept.

    The arguments are walked as one object graph: Modules and Variables shared between
    them (a model and an optimizer holding it, tied weights) are shared inside too.
    Whatever the function changes is written back to the caller's objects when it
    returns: Variable values, and also new attributes, replaced submodules and changed
    metadata. Objects the function returns are the caller's own where they came in.

    The compiled function is reused while the arguments keep their structure (classes,
    static attributes, Variable types and metadata, shapes and dtypes of arrays): new
    values do not retrace, a new structure does (`pytree_transforms.explain_retraces()`
    logs what changed on each retrace, by argument path). Arguments that are not arrays,
    Modules or Variables are static, as with `filter_jit`. Mutating an object the function closes
    over (instead of taking it as an argument) raises `TraceContextError`.

    `static_argnums` and `static_argnames` make whole arguments static as `jax.jit` does:
    each is hashed and compared with `==` (a new value traces anew), numbers and names
    are inferred from each other through `fun`'s signature, and an unhashable value, or a
    Module or Variable, raises a `ValueError` naming the argument (as `jax.jit` does).

    Shardings (`in_shardings`, `out_shardings`) are given as for `jax.jit`, except that an
    argument holding Modules or Variables takes either one sharding for all its arrays or
    a sharding per Variable: the State that `get_named_sharding(argument, mesh)` gives,
    or a `StateSharding({filter: sharding})` (as Flax NNX's). Inside, each value is laid
    out so (`jax.lax.with_sharding_constraint`), and the Variables the function writes are
    laid out as they came in, so parameters updated by an optimizer keep their layout from
    step to step. `None` leaves a value's layout to the compiler.

    Arguments:
        fun: the function. Omit it to get a decorator.
        **jit_kwargs: passed on to `jax.jit` (e.g. `donate_argnums` or `donate_argnames`,
            which donate every array and Variable value of those arguments;
            `static_argnums`, `static_argnames`, see above), except `in_shardings`: one
            sharding, or a tuple with one per positional argument (each a sharding, a
            State of them, a `StateSharding`, or a pytree prefix of the argument), also
            laying out the Variables written; and `out_shardings`: the same for the
            output, or one `StateSharding` for all of it (its new arrays and Variables;
            objects that came in keep their `in_shardings`).
        graph: `False` for tree mode: `jax.jit` over the arguments as pytrees (every
            option of `jax.jit` taken as it takes it); only the
            values (and metadata) of Variables are written back, and a Variable met twice
            is refused. `None` (default) reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing but writes back only Variable
            values, never structure (as tree mode). `None` reads `set_graph_updates`.

    Returns:
        The compiled function. As a class attribute it binds like a method.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, Variable, jit
        >>> class Counter(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        ...         self.count = Variable(jnp.array(0))
        ...     def __call__(self, x):
        ...         self.count.value += 1
        ...         return x * self.w.value
        >>> model = Counter()
        >>> step = jit(lambda m, x: m(x))
        >>> step(model, jnp.ones(2)).tolist(), int(model.count.value)
        ([1.0, 1.0], 1)
        >>> _ = step(model, jnp.ones(2)); int(model.count.value)
        2
        >>> tile = jit(lambda m, reps: jnp.tile(m.w.value, reps), static_argnames="reps")
        >>> tile(model, (2,)).tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        return functools.partial(jit, graph=graph, graph_updates=graph_updates, **jit_kwargs)
    check_callable(fun, "jit")
    if not (graph and graph_updates):
        return SimpleJit(fun, graph, jit_kwargs)
    return _GraphJit(fun, jit_kwargs)


# Options a jitted `__init__` refuses: a sharding for each argument and output of the
# function that builds the object, which a separate `jit` of that function takes.
_NOT_FOR_INIT = ("in_shardings", "out_shardings")


def _is_sharding(value: Any) -> bool:
    return value is None or isinstance(value, Sharding | PartitionSpec)


_SHARDING = (
    "a jax.sharding.Sharding (such as a NamedSharding), a PartitionSpec (under "
    "`jax.set_mesh`), or None (laid out by the compiler)"
)


def _unconstrained(leaf: Any) -> None:
    return None


def _constrain(value: Any, sharding: Any) -> Any:
    if sharding is None or sharding is NO_ENTRY:
        return value
    return jax.lax.with_sharding_constraint(value, sharding)


class _Shardings:
    """A graph jit's `in_shardings` and `out_shardings`, as constraints on traced values.

    They are resolved to one sharding per value while tracing, from the values' paths, so
    a compiled call costs nothing more.
    """

    __slots__ = ("call", "given", "returned")

    def __init__(self, call: Call, in_shardings: Any, out_shardings: Any):
        self.call = call
        self.given = (
            None
            if in_shardings is None
            else PerArgumentSpecs(
                "pytree_graph.jit", "in_shardings", in_shardings, _is_sharding, _SHARDING
            )
        )
        self.returned = (
            None
            if out_shardings is None
            else SpecTable(out_shardings, _is_sharding, "out_shardings", _SHARDING)
        )

    def enter(self, graphdef: GraphDef | Reordered, values: list[Any]) -> Inside:
        """The inside of a call given these values, laid out as `in_shardings` say (and an
        object shared by two arguments refused if they lay it out in two ways)."""
        inside = Inside(graphdef, values, prepare=self.inputs)
        self.check_shared(inside)
        return inside

    def inputs(self, graphdef: GraphDef, values: list[Any]) -> list[Any]:
        """The values the function gets (in leaf order), laid out as `in_shardings` say."""
        if self.given is None:
            return values
        num_args = self.call.num_args(graphdef)
        leaves = leaves_of(graphdef, values) if self.given.by_filter else None
        shardings = self.given.for_leaves(
            self.call, graphdef.paths, leaves, num_args, of_function=_unconstrained
        )
        return list(map(_constrain, values, shardings))

    def check_shared(self, inside: Inside) -> None:
        """Refuse `in_shardings` that lay out an object shared by two arguments in two
        ways (checked while tracing, so a compiled call costs nothing more)."""
        if self.given is None:
            return
        call, given = self.call, self.given
        num_args = call.num_args(inside.graphdef)

        def sharding_at(path: tuple, leaf: Any) -> Any:
            return given.for_leaves(call, [path], [leaf], num_args, _unconstrained)[0]

        _, walk = lift_recording_aliases(inside.tree)
        check_one_spec(
            "pytree_graph.jit",
            "in_shardings",
            call,
            walk,
            sharding_at,
            "Give it the same sharding wherever it is reached, or pass separate objects.",
        )

    def outputs(self, inside: Inside, outcome: Outcome, values: list[Any]) -> list[Any]:
        """The values the call returns (written Variables, then the output's), laid out."""
        after = inside.after
        # The Variables written, by leaf position; or the whole graph, described again.
        changed = type(outcome) is ValuesChanged
        positions = outcome.changed if changed else range(after.num_leaves)
        written = [after.paths[position] for position in positions]
        values = list(values)
        if self.given is not None:
            num_args = self.call.num_args(inside.graphdef)
            leaves = [after.leaves[p] for p in positions] if self.given.by_filter else None
            shardings = self.given.for_leaves(
                self.call, written, leaves, num_args, of_function=_unconstrained, strict=False
            )
            values[: len(written)] = map(_constrain, values[: len(written)], shardings)
        if self.returned is not None:
            out_paths = after.paths[after.num_leaves :]
            out_leaves = after.leaves[after.num_leaves :]
            for i, (path, leaf) in enumerate(zip(out_paths, out_leaves, strict=True)):
                at = len(written) + i
                values[at] = _constrain(values[at], self.returned.find(path[1:], leaf))
        return values
