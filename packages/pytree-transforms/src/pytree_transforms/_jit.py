"""`filter_jit` and the wrapper it returns: `jax.jit` for functions of any pytrees.

A call is dispatched in one place, `JitWrapper.__call__`:

- **the fast path**, for wrappers with the default options (arrays traced, everything else
  static, no donation or shardings): the leaf types decide what is traced, so the call is
  matched to the last call's `Plan` by a C-level flatten and a comparison of leaf types;
- **the general path** (`JitWrapper._call_general`), for every other wrapper, and for a call
  of the fast path that may hold a shared object: flatten with the filters' mask, find shared
  objects, and find the plan of that structure.

Either way the call ends at the plan's `jax.jit` (`_jit_plan.py`). Ahead-of-time stages are in
`_jit_stages.py`, and the naming of the user's leaves in errors in `_jit_diagnose.py`.
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import flatten_with_mask, is_array
from pytree_module import Module

from ._arguments import ArgumentSpecs, TracedLeafNames
from ._donation import check_donate, kept_leaves
from ._error_if import check_failure_in
from ._errors import check_callable, check_pytree_objects, present_as, present_like
from ._input_writes import check_input_writes, record_inputs
from ._jit_diagnose import diagnose_inputs, traced_leaf_names
from ._jit_plan import Plan
from ._jit_stages import Lowered
from ._method import BindsAsMethod, is_pytree_leaf, method_as_pytree
from ._outputs import PackedOutput, pack_output, unpack_output
from ._retraces import Signature, TraceHistory
from ._sharing import Sharing, find_sharing, has_repeats, selected_once
from ._static_key import KeyedStatics
from ._wrapper_cache import WrapperCache

# `jax.jit` options that depend on how the arguments are passed in.
_SHARDINGS = {"in_shardings", "out_shardings"}
# How many values of a plan's static leaves get a `jax.jit` of their own (`Plan.bound`);
# calls with others pass them as `jax.jit`'s static argument.
_MAX_BOUND = 8


def filter_jit(
    fun: Callable[..., Any] | None = None,
    *,
    donate: str = "none",
    default: Any = is_array,
    fn: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    out: Any = is_array,
    **jitkwargs: Any,
) -> Any:
    """`jax.jit` for functions of any pytrees: arrays are traced, everything else is static.

    Every array leaf of the arguments (and of `fun` itself, which may be a Module, a bound
    method or any callable pytree) is traced; every other leaf is held static, so it must be
    hashable, and a change in it retraces (`explain_retraces()` logs what changed on each
    retrace, by argument path). Non-array outputs (strings, functions, Modules'
    static parts) are returned as they are. Calls never block: they return as soon as the
    computation is dispatched, like `jax.jit`.

    Wrapping again reuses the compilations: `filter_jit(f)` made twice around the same
    function with equal options is the same wrapper. A callable pytree used as `fun` (a
    Module, its method, `filter_grad(model)`) is an input like the arguments: its structure,
    not the instance, keys the compilations, so `filter_jit(model)(x)` on the new model
    after each update traces once.

    Arguments:
        fun: the function to compile. Omit it to get a decorator with these options.
        donate: `"none"`, `"all"` (donate every traced input buffer), `"all-except-first"`
            (all but those of the first argument), `"warn"` (as `"all"`) or
            `"warn-except-first"` (as `"all-except-first"`). A buffer that cannot be reused
            is not an error: JAX warns "Some donated buffers were not usable".
        default: the filter deciding what is traced in every argument without an override:
            `True`/`False`, a leaf predicate, or a prefix pytree of those.
        fn: the filter for `fun` itself (defaults to `default`).
        args: per-positional-argument overrides: a tuple of filters, one per argument.
        kwargs: per-parameter overrides, by parameter name; they apply whether the argument
            is passed by keyword or by position.
        out: the filter of the output: selected leaves come back as arrays, the rest as they
            were returned (they must not be tracers).
        **jitkwargs: passed on to `jax.jit`.

    Returns:
        The compiled function. Its `.lower(*args, **kwargs)` lowers ahead of time. It
        compares (and hashes) equal to another made around an equal function with equal
        options.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jit
        >>> @filter_jit
        ... def scale(x, factor, name):
        ...     return x * factor, name.upper()
        >>> scale(jnp.ones(2), 3, "done")
        (Array([3., 3.], dtype=float32), 'DONE')
        >>> @filter_jit(args=(True,))
        ... def traced(x):
        ...     return x + 1
        >>> traced(1)
        Array(2, dtype=int32, weak_type=True)
    """
    options = dict(donate=donate, default=default, fn=fn, args=args, kwargs=kwargs, out=out)
    if fun is None:
        return lambda f: filter_jit(f, **options, **jitkwargs)
    check_callable(fun, "filter_jit")
    check_donate("filter_jit", donate)
    for name in ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames"):
        if name in jitkwargs:
            raise TypeError(
                f"filter_jit does not take {name}: non-array arguments are static already; "
                "choose what is traced with `args=`/`kwargs=`/`default=`, and donation with "
                "`donate=`."
            )

    function = method_as_pytree(fun)

    def compilations() -> _Compilations:
        fn_spec = default if fn is None else fn
        specs = ArgumentSpecs("filter_jit", function, default, fn_spec, args, kwargs)
        return _Compilations(specs, TraceHistory("filter_jit", fun))

    # Keyword arguments have no order: `filter_jit(f, a=1, b=2)` is `filter_jit(f, b=2, a=1)`.
    options_key = (options, sorted(jitkwargs.items()))
    if _is_leaf(function):
        # A plain function is fixed: the wrapper is kept whole, keyed by the function.
        return _WRAPPERS.get(
            (fun, *options_key),
            lambda: JitWrapper(function, compilations(), out, donate, jitkwargs, True),
        )
    # A callable pytree (a Module, its method, a transform of one) is an input like the
    # arguments: its arrays are traced and its structure keys the compilations. So a new
    # instance of the same structure (the model after an update) gets a wrapper of its own,
    # which shares the compilations of every earlier one instead of tracing again.
    try:
        structure: Any = _Structure(type(function), jax.tree.structure(function))
    except (TypeError, ValueError):  # a node whose flatten refuses: let the call say why
        structure = fun
    shared = _WRAPPERS.get((structure, *options_key), compilations)
    return JitWrapper(function, shared, out, donate, jitkwargs, False)


class JitWrapper(BindsAsMethod):
    """The callable that `filter_jit` returns.

    It keeps an interned `Plan` per input structure (each with its `jax.jit`) and the last
    plan used; every call checks that a plan fits its own inputs before using it, so what is
    kept is only ever added to or replaced whole, and calls from several threads are safe.
    The plans are those of its `_Compilations`, shared with the wrappers of other callable
    pytrees of the same structure and options (see `filter_jit`). Two wrappers compare equal
    when they share their compilations and their functions compare equal.
    """

    def __init__(
        self,
        fun: Callable[..., Any],
        compilations: "_Compilations",
        out: Any,
        donate: str,
        jitkwargs: dict[str, Any],
        fixed_function: bool,
    ):
        self._fun = fun
        self._compilations = compilations
        specs = compilations.specs
        # A plain function (a leaf, not a pytree) is the same on every call: the flattened
        # call holds a placeholder for it, so it need not be hashable, and `traced` puts it
        # back. A callable pytree (a Module, a bound method) is flattened with the call.
        self._fun_in_call = _THE_FUNCTION if fixed_function else fun
        self._specs = specs
        self._out = out
        self._donate = donate
        self._jitkwargs = jitkwargs
        # With the default options the leaf types alone decide what is traced: the fast path
        # of `__call__` applies.
        self._by_types = (
            specs.trivial
            and specs.default is is_array
            and out is is_array
            and donate == "none"
            and not _SHARDINGS & set(jitkwargs)
        )
        self._plans = compilations.plans
        # The plan the latest wrapper of these compilations went to: a wrapper made for a
        # new instance tries it first, so its first call takes the fast path too.
        self._last: Plan | None = compilations.latest
        self._previous: Plan | None = compilations.latest
        functools.update_wrapper(self, fun, updated=())

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is JitWrapper
            and self._compilations is other._compilations
            and (self._fun is other._fun or self._fun == other._fun)
        )

    def __hash__(self) -> int:
        return id(self._compilations)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._by_types:
            return self._call_general(args, kwargs)
        # The fast path. The leaf types decide what is traced, so a call is matched to the
        # last call's plan by flattening along that plan's treedef (`flatten_up_to` checks
        # node types, keys and static node data in one C call) and comparing leaf types;
        # only a call of a new structure computes a mask. The traced arrays then go to the
        # plan's `jax.jit` as one flat tuple, which JAX flattens and checks much faster than
        # the Modules they came from, so the Python flatten here costs little more than the
        # one `jax.jit` would make.
        tree = (self._fun_in_call, args, kwargs)
        plan = self._last
        leaves = None
        if plan is not None:
            # A bare try costs nothing here; `contextlib.suppress` would add a context
            # manager to every call.
            try:  # noqa: SIM105
                leaves = plan.treedef.flatten_up_to(tree)
            except (TypeError, ValueError):  # another structure
                pass
        if leaves is None or plan.types != list(map(type, leaves)):
            leaves, treedef = jax.tree.flatten(tree)
            plan = self._plan_by_types(args, leaves, treedef, list(map(type, leaves)))
            # Trying the last plan first pays only while calls keep one structure: a failed
            # `flatten_up_to` raises an error whose message prints the whole tree. So it is
            # tried again only once two calls in a row had the same plan.
            self._last = plan if plan is self._previous else None
            self._previous = self._compilations.latest = plan
        dynamic = plan.get_dynamic(leaves)
        check = plan.repeat_check
        if check is not None and check(dynamic):
            # Flattening in Python is also what lets every call be checked for shared
            # objects: one array stands at two places where one object could be reached
            # twice (the plan knows where, from its treedef). The general path passes each
            # shared object once.
            return self._call_general(args, kwargs)
        try:
            if plan.fixed:
                out = plan.jitted(dynamic)
            else:
                static = plan.get_static(leaves)
                bound = plan.bound
                jitted = None if bound is None else bound.get(static)
                if jitted is not None:
                    out = jitted(dynamic)
                elif bound is not None and len(bound) < _MAX_BOUND:
                    # New static leaves (the usual case: a Module's activation function, a
                    # name): a `jax.jit` with them bound, as for `Plan.fixed`, so that JAX
                    # hashes and compares no static argument on the calls that follow.
                    jitted = bound[static] = plan.bind(static)
                    out = jitted(dynamic)
                else:
                    # `Plan.static_arg`, inlined.
                    out = plan.jitted(KeyedStatics(static) if plan.keyed else static, dynamic)
        except Exception as error:
            _raise_explained(error, tree, leaves, plan, plan.get_static(leaves))
            raise
        # `unpack_output`, inlined: one Python call fewer on every call.
        if type(out) is PackedOutput:
            return out.static.rebuild(out.dynamic)
        return out

    def _call_general(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call of any options: split by the filters, shared objects passed once."""
        tree, leaves, plan, static = self._split(args, kwargs)
        try:
            out = plan.jitted(*self._arguments(plan, leaves, static))
        except Exception as error:
            _raise_explained(error, tree, leaves, plan, static)
            raise
        return unpack_output(out)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking the same arguments.
        """
        plan, arguments = self._split_arguments(args, kwargs)
        key, _ = _stage(plan, arguments)
        return Lowered(plan.jitted.lower(*arguments), self._stage_arguments, key)

    def _stage_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple:
        """The key and arguments of a compiled stage for one call (see `_jit_stages`)."""
        return _stage(*self._split_arguments(args, kwargs))

    def _plan_by_types(
        self, args: tuple[Any, ...], leaves: list[Any], treedef: PyTreeDef, types: list[type]
    ) -> Plan:
        """The plan of a call of the fast path, whose mask follows from the leaf types."""
        mask = [is_array(x) for x in leaves]
        static_types = tuple(t for t, traced in zip(types, mask, strict=True) if not traced)
        plan = self._plan(treedef, mask, static_types, args, types)
        check_pytree_objects(plan.get_static(leaves), "filter_jit")
        return plan

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        """Flatten one call and split its leaves: `(tree, leaves, plan, static)`.

        Where an object is reached by several paths of the call (a tied weight, a Module
        passed twice), `leaves` are the unique ones and the plan's structure a `Sharing`:
        the function sees one object at all its places, and it is traced once.
        """
        spec = self._specs.default if self._specs.trivial else self._specs.tree(args, kwargs)
        tree = (self._fun_in_call, args, kwargs)
        leaves, mask, treedef = flatten_with_mask(tree, spec)
        structure: PyTreeDef | Sharing = treedef
        traced = [x for x, m in zip(leaves, mask, strict=True) if m]
        if has_repeats(traced):  # the cheap test; the walk only where it may find something
            sharing = find_sharing(tree, treedef)
            if sharing is not None:
                mask = selected_once(sharing, tree, mask, "traced")
                leaves = sharing.dedupe(leaves)
                structure = sharing
        static = tuple(x for x, traced in zip(leaves, mask, strict=True) if not traced)
        plan = self._plan(structure, mask, tuple(map(type, static)), args)
        if static:
            check_pytree_objects(static, "filter_jit")
        return tree, leaves, plan, static

    def _arguments(self, plan: Plan, leaves: list[Any], static: tuple[Any, ...]) -> tuple:
        """The arguments of `plan.jitted` for one call's leaves."""
        dynamic = plan.get_dynamic(leaves)
        if plan.fixed:
            return (dynamic,)
        static_arg = plan.static_arg(static)
        if self._donate == "none":
            return static_arg, dynamic
        aliases, kept, donated = plan.donation(dynamic)
        return (static_arg, aliases), kept, donated

    def _split_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Plan, tuple]:
        """The plan of one call and the arguments of its `jax.jit` (the `split` of the
        ahead-of-time stages)."""
        _, leaves, plan, static = self._split(args, kwargs)
        return plan, self._arguments(plan, leaves, static)

    def _plan(
        self,
        treedef: PyTreeDef | Sharing,
        mask: list[Any],
        static_types: tuple[type, ...],
        args: tuple[Any, ...],
        types: list[type] | None = None,
    ) -> Plan:
        """The interned plan of this structure (made, with its `jax.jit`, on first use)."""
        plans = self._plans.setdefault(treedef, [])
        for plan in plans:
            if plan.mask == mask and plan.static_types == static_types:
                return plan
        full = treedef.treedef if isinstance(treedef, Sharing) else treedef
        kept = kept_leaves(self._donate, full, bool(args))
        if kept and isinstance(treedef, Sharing):
            kept = sum(1 for i in treedef.unique if i < kept)
        fixed = self._donate == "none" and all(t is _TheFunction for t in static_types)
        plan = Plan(treedef, mask, types, static_types, kept, fixed)
        if self._by_types and not fixed and not plan.keyed:
            plan.bound = {}
        plan.jitted = self._jit(plan)
        plans.append(plan)
        return plan

    def _jit(self, plan: Plan) -> Any:
        """The `jax.jit` of calls of `plan`'s structure.

        It takes the static argument (see `Plan.static_arg`) and then the traced leaves:
        one tuple, or with donation `(static_arg, aliases)`, the kept leaves and the donated
        ones (see `Plan.donation`).
        """
        out, donating = self._out, self._donate != "none"
        # What `traced` holds lives as long as the plan, which wrappers of other instances
        # share: a callable pytree comes in with the call, so only a plain function is held.
        the_function = self._fun if self._fun_in_call is _THE_FUNCTION else None
        history = self._compilations.history

        def traced(static_arg: Any, *dynamic: tuple[Any, ...]) -> Any:
            if donating:
                static_arg, aliases = static_arg
                leaves = plan.undo_donation(aliases, *dynamic)
            else:
                (leaves,) = dynamic
            fun, args, kwargs = plan.treedef.unflatten(plan.merge(leaves, plan.statics(static_arg)))
            inputs = record_inputs(fun, args, kwargs)
            tracing = history.record(_signature(fun, args, kwargs))
            if fun is _THE_FUNCTION:
                fun = the_function
            with tracing:
                result = fun(*args, **kwargs)
            check_input_writes(inputs, result, "filter_jit", fun)
            return pack_output(result, out, "filter_jit")

        # JAX keeps the signature in a cache entry keyed weakly by `traced`: what it holds
        # must not lead back to `traced` (this wrapper, the plan, its `jax.jit`), or the
        # entry would keep the wrapper and its function alive for good.
        names = functools.partial(traced_leaf_names, the_function, plan.treedef, tuple(plan.mask))
        present_as(traced, self._fun, TracedLeafNames(names))
        bound_signature = TracedLeafNames(names, static=False)
        jitkwargs = self._jitkwargs

        def bind(static_arg: Any) -> Any:
            """The `jax.jit` of calls with these static leaves: it takes the traced ones."""

            def traced_bound(*dynamic: tuple[Any, ...]) -> Any:
                return traced(static_arg, *dynamic)

            present_like(traced_bound, traced, bound_signature)
            return jax.jit(traced_bound, **jitkwargs)

        if plan.fixed:
            return bind((_THE_FUNCTION,) * len(plan.static_types))
        if plan.bound is not None:
            plan.bind = bind
        donate_argnums = (2,) if donating else ()
        return jax.jit(traced, static_argnums=0, donate_argnums=donate_argnums, **self._jitkwargs)


def _stage(plan: Plan, arguments: tuple) -> tuple[tuple[Plan, Any], tuple]:
    """A call's key for the compiled stages, the plan and its static argument, and the
    arguments of the compiled program, which takes no static argument."""
    # A plan with fixed statics takes no static argument at all (see `Plan.fixed`).
    if plan.fixed:
        return (plan, None), arguments
    return (plan, arguments[0]), arguments[1:]


class _Compilations:
    """What the `filter_jit` wrappers of one function, or of callable pytrees of one
    structure, share: the resolved argument specs, the plans by input structure (each with
    its `jax.jit`) and the latest plan used. It holds no callable pytree, so keeping it
    (in `_WRAPPERS`) keeps no instance's arrays alive."""

    __slots__ = ("__weakref__", "history", "latest", "plans", "specs")

    def __init__(self, specs: ArgumentSpecs, history: TraceHistory):
        self.specs = specs
        # The traces of these compilations, to say why one more was needed (`_retraces`).
        self.history = history
        self.plans: dict[PyTreeDef | Sharing, list[Plan]] = {}
        self.latest: Plan | None = None


def _signature(fun: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Signature:
    """What a trace of `filter_jit` depends on, by argument path (see `_retraces`): the
    leaves of the call as the traced function gets them, tracers and statics."""
    signature = Signature()
    if fun is not _THE_FUNCTION:
        signature.pytree("fun", fun)
    for i, arg in enumerate(args):
        signature.pytree(f"args[{i}]", arg)
    for name, value in kwargs.items():
        signature.pytree(f"kwargs[{name!r}]", value)
    return signature


class _Structure:
    """The key of a callable pytree's compilations: its type and treedef (the static parts
    compared as Modules' treedefs compare them), never its arrays."""

    __slots__ = ("kind", "treedef")

    def __init__(self, kind: type, treedef: PyTreeDef):
        self.kind = kind
        self.treedef = treedef

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is _Structure and self.kind is other.kind and self.treedef == other.treedef
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.treedef))


class _TheFunction:
    """The placeholder of a plain function in a flattened call (see `JitWrapper`)."""

    def __repr__(self) -> str:
        return "<the function>"


_THE_FUNCTION = _TheFunction()


def _is_leaf(fun: Any) -> bool:
    """Whether `fun` is a plain function, fixed for the wrapper's life, rather than a
    callable pytree that comes into each call. Looks one level down only: it runs on
    every `filter_jit(...)`."""
    if is_pytree_leaf(fun):
        # A `pytree=False` Module is a leaf too, but it stays in the call to be refused
        # there (with a pointer to pytree_graph).
        return not isinstance(fun, Module)
    # A transform of a plain function (`filter_grad(loss)`) is as fixed as the function.
    return isinstance(fun, BindsAsMethod) and not jax.tree.leaves(fun)


# The wrappers made so far, so that wrapping the same function again with equal options
# reuses its wrapper and compilations (see `WrapperCache`).
_WRAPPERS = WrapperCache()


def forget_wrappers() -> None:
    """Forget the wrappers made so far (see `clear_caches`)."""
    _WRAPPERS.clear()


def _raise_explained(
    error: Exception, tree: Any, leaves: list[Any], plan: Plan, static: Any
) -> None:
    """Raise a clearer error than `error`, raised by a compiled call, where there is one.

    A failed `error_if` check becomes its `RuntimeCheckError`; a `TypeError`/`ValueError`
    from JAX's argument checks, an error naming the input at fault (`diagnose_inputs`).
    Returns where there is nothing to add, and the caller re-raises `error`.
    """
    failure = check_failure_in(error)
    if failure is not None:
        raise failure from None
    if isinstance(error, (TypeError, ValueError)):
        diagnose_inputs(tree, leaves, plan, static)
