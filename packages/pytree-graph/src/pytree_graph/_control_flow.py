"""Control flow over object graphs: `cond`, `switch`, `fori_loop`, `while_loop`, `scan`.

Each takes the same arguments as its `jax.lax` counterpart, but the operands, carries and
scanned values may hold Modules and Variables (shared ones included). Variables written
inside are written back to the caller's objects afterwards. Their structure must stay
the same inside (only values change): a loop carry cannot grow an attribute. Python
numbers in a loop carry are part of its state, as in `jax.lax`: they become arrays.

Each lifts its operands, carry or scanned values (`lift_once`), rebuilds them inside
(`Inside`), and ends with `LiftedCall.apply`. The branches, and scan over `xs`, describe
their writes with `Inside.finish`; a loop's carry is checked and passed from step to step
by `_carried` instead, and written back once, after the loop (`_write_back`).

`scan` without `init` is Flax NNX's form (`_GraphScan`): the arguments are lifted as one
graph, each leaf gets a role from `in_axes` (carried, scanned over an axis, or the same
every step), and a step's arguments after the call (the carry argument replaced by the
carry returned) must have the structure they came in with.
"""

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import path_text
from pytree_module import Module
from pytree_transforms.extend import BindsAsMethod

from ._aliases import check_one_spec, lift_recording_aliases, show_argument_path
from ._boundary import Call, Inside
from ._carry import Carry, check_carried_types, numbers_as_arrays, show_axis
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._graphdef import Builder, GraphDef, build
from ._lift import LiftedCall, lift_once, value_of
from ._outcome import StructureChanged, ValuesChanged
from ._records import NONE_RECORD
from ._static import static_key
from ._transform_metadata import TransformMetadata
from ._traverse import GraphWalk
from ._tree_transforms import (
    finish_branches,
    loop_init,
    loop_result,
    simple_branches,
    simple_loop_body,
    simple_loop_cond,
    simple_scan,
)
from ._variables import Variable
from ._vmap import StateAxes, argument_leaves, check_output_items, place_axis, spec_at


def _branch(
    fun: Callable[..., Any], lifted: LiftedCall, transform: str, outcomes: list[Any]
) -> Callable[..., Any]:
    def run(values: list[Any]) -> Any:
        inside = Inside(lifted.graphdef, values)
        # Branches must agree on their outcome, so none lists which Variables it wrote. A
        # branch may change the structure (e.g. put new Variables in place of the old), as
        # in Flax NNX, when every branch makes the same change.
        result = inside.finish(
            fun(*inside.tree), structure="branch", transform=transform, track=False
        )
        outcomes.append(result[0])
        return result

    return run


def _run_branches(
    transform: str,
    funs: Sequence[Callable[..., Any]],
    lifted: LiftedCall,
    run: Callable[[list[Callable[..., Any]]], Any],
) -> Any:
    """`run(branches)` (a `lax.cond` or `lax.switch` call) on the branch functions, the
    result written back; branches that change the operands' structure differently are
    refused with an error that says so (where JAX's would compare two output types)."""
    outcomes: list[Any] = []
    try:
        result = run([_branch(f, lifted, transform, outcomes) for f in funs])
    except TypeError:
        if len(outcomes) == len(funs) and any(o != outcomes[0] for o in outcomes):
            shown = ", ".join(
                f"{i}: {'changed it' if type(o) is StructureChanged else 'kept it'}"
                for i, o in enumerate(outcomes)
            )
            raise ValueError(
                f"{transform}: the branches left the operands with different structures "
                f"(branch {shown}; or changed it in different ways). A branch may add, "
                "remove or replace attributes, submodules or Variables only if every "
                "branch makes the same change: make it in each branch, or outside "
                f"{transform}."
            ) from None
        raise
    return _finish(lifted, result)


def _finish(lifted: LiftedCall, result: tuple) -> Any:
    outcome, values = result
    return lifted.apply(outcome, values)


def cond(
    pred: Any,
    true_fun: Callable[..., Any],
    false_fun: Callable[..., Any],
    *operands: Any,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """`jax.lax.cond` whose operands may hold Modules and Variables.

    Both branches get the operands (rebuilt, sharing kept) and must return outputs of the
    same structure; Variables either writes are written back to the caller's objects. A
    branch may change the operands' structure (new Variables in place of the old, a new
    attribute) if the other makes the same change, as in Flax NNX; the new structure is
    then written back.

    Arguments:
        pred: a boolean scalar.
        true_fun: called with the operands when `pred` is true.
        false_fun: called with the operands otherwise.
        *operands: the arguments of both branches.
        graph: `False` for tree mode: the JAX function over the operands as pytrees; only
            Variable values are written back, and a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back values only.
            `None` reads `set_graph_updates`.

    Returns:
        The output of the branch taken.

    Raises:
        ValueError: the branches leave the operands with different structures.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Variable, cond
        >>> count = Variable(jnp.array(0))
        >>> def increment(c):
        ...     c.value += 1
        >>> cond(jnp.array(True), increment, lambda c: None, count)
        >>> int(count.value)
        1
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if not (graph and graph_updates):
        (on_true, on_false), operands, variables = simple_branches(
            "cond", graph, [true_fun, false_fun], operands
        )
        return finish_branches(graph, variables, jax.lax.cond(pred, on_true, on_false, *operands))
    lifted = lift_once(operands)
    return _run_branches(
        "cond",
        [true_fun, false_fun],
        lifted,
        lambda branches: jax.lax.cond(pred, *branches, lifted.values),
    )


def switch(
    index: Any,
    branches: Sequence[Callable[..., Any]],
    *operands: Any,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """`jax.lax.switch` whose operands may hold Modules and Variables.

    Arguments:
        index: an integer scalar choosing the branch (clamped to the valid range).
        branches: the functions, each called with the operands; their outputs must have
            the same structure, and a change to the operands' structure (as `cond`
            allows) must be the same in every branch.
        *operands: the arguments of the branches.
        graph: `False` for tree mode: the JAX function over the operands as pytrees; only
            Variable values are written back, and a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back values only.
            `None` reads `set_graph_updates`.

    Returns:
        The output of the branch taken; Variables it wrote are written back.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Variable, switch
        >>> v = Variable(jnp.array(10.0))
        >>> def double(v):
        ...     v.value *= 2
        >>> def halve(v):
        ...     v.value /= 2
        >>> switch(jnp.array(1), [double, halve], v)
        >>> float(v.value)
        5.0
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if not (graph and graph_updates):
        pure, operands, variables = simple_branches("switch", graph, list(branches), operands)
        return finish_branches(graph, variables, jax.lax.switch(index, pure, *operands))
    lifted = lift_once(operands)
    return _run_branches(
        "switch", branches, lifted, lambda funs: jax.lax.switch(index, funs, lifted.values)
    )


def _carried(
    lifted: LiftedCall,
    value: Any,
    transform: str,
    what: str,
    before: list[Any] | None = None,
    objects: list[Any] | None = None,
) -> list[Any]:
    """The values of a loop carry, checking it kept the structure it came in with.

    Not `Inside.finish`: a loop step's output is the next step's input, not a change to
    write back. `finish` describes the arguments after the call and, apart, the output
    (sharing the arguments' objects), and its outcome is known only once traced; a loop
    carry must be the values alone, in the initial carry's leaf order, from the first
    step. The caller's objects are written once, after the loop (`_write_back`).

    `objects`, where given, are the objects the step was given (by graphdef index): the
    carry returned must hold those very objects, as Flax NNX requires (a new Variable in
    place of one would leave the caller's holding the old one).
    """
    walk = GraphWalk(record_shared=objects is not None)
    graphdef = walk.graphdef(numbers_as_arrays(value))
    if graphdef != lifted.graphdef:
        raise ValueError(
            f"{transform}: {what} must return a carry of the same structure as the initial "
            f"one, with the same sharing (got {graphdef!r}, expected {lifted.graphdef!r}). "
            "Only the values of its Variables and arrays may change in the loop: make "
            "structural changes before or after it."
        )
    if objects is not None:
        for index, (now, given) in enumerate(zip(walk.objects, objects, strict=True)):
            if now is not given:
                place = path_text(walk.shared_paths[index][0], root="the top level of the carry")
                raise ValueError(
                    f"{transform}: {what} returned another {type(now).__name__} at {place} "
                    f"than the one it was given: Variable and Module identity must be "
                    "preserved across iterations. Write values in place (`v.value = ...`) "
                    "instead of putting new Variables or Modules in the carry, or make the "
                    "new object before or after the loop."
                )
    after = list(map(value_of, walk.leaves))
    if before is not None:
        where = lambda p: path_text(lifted.paths[p], root="the top level of the carry")  # noqa: E731
        check_carried_types(before, after, where, transform, what)
    return after


def _loop_body(
    body_fun: Callable[..., Any], lifted: LiftedCall, transform: str
) -> Callable[..., Any]:
    def body(*call: Any) -> list[Any]:
        *index, values = call
        inside = Inside(lifted.graphdef, values)
        out = body_fun(*index, inside.tree)
        return _carried(lifted, out, transform, "body_fun", values, inside.objects)

    return body


def _write_back(lifted: LiftedCall, values: list[Any], transform: str) -> Any:
    """Give the caller's objects a loop's final carry `values`; return the final carry.

    The values are those of a carry of the initial structure: rebuilt from them, `finish`
    describes that carry as the output of a function returning its arguments, and
    `apply` writes every value back and returns the carry made of the caller's objects.
    """
    inside = Inside(lifted.graphdef, values)
    outcome, values = inside.finish(
        inside.tree, structure="fixed", transform=transform, track=False
    )
    return lifted.apply(outcome, values)


def fori_loop(
    lower: Any,
    upper: Any,
    body_fun: Callable[[Any, Any], Any],
    init_val: Any,
    *,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **kwargs: Any,
) -> Any:
    """`jax.lax.fori_loop` whose carry may hold Modules and Variables.

    The caller's objects in `init_val` hold the final values afterwards, and are what is
    returned (arrays in the carry come back new).

    Arguments:
        lower: the first index.
        upper: the index after the last.
        body_fun: `body_fun(i, val) -> val`, returning the carry with the same structure.
        init_val: the initial carry. Python numbers in it are carried as arrays, as
            `jax.lax` does (`fori_loop(0, 3, lambda i, c: c + 1, 0)` returns an array).
        graph: `False` for tree mode: the JAX function over the carry as pytrees; only
            Variable values are written back, and a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back values only.
            `None` reads `set_graph_updates`.
            In both, the body must return the Variables it was given, in place
            ("Variable identity must be preserved across iterations").
        **kwargs: passed on to `jax.lax.fori_loop` (e.g. `unroll`).

    Returns:
        The final carry.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Variable, fori_loop
        >>> class Accumulator(Module):
        ...     def __init__(self):
        ...         self.total = Variable(jnp.array(0))
        >>> acc = Accumulator()
        >>> def body(i, a):
        ...     a.total.value += i
        ...     return a
        >>> fori_loop(0, 5, body, acc) is acc, int(acc.total.value)
        (True, 10)
    """
    for name, bound in (("lower", lower), ("upper", upper)):
        dtype = getattr(bound, "dtype", None)
        integer = (
            isinstance(bound, int) and not isinstance(bound, bool)
            if dtype is None
            else np.issubdtype(dtype, np.integer) and np.ndim(bound) == 0
        )
        if not integer:
            raise TypeError(
                f"fori_loop: `{name}` must be an integer scalar (a Python int or an integer "
                f"array of shape ()), got {type(bound).__name__} {bound!r:.60}. The loop "
                "runs i = lower, ..., upper - 1: fori_loop(0, n, body_fun, init_val)."
            )
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if not (graph and graph_updates):
        init = loop_init("fori_loop", graph, init_val)
        body = simple_loop_body("fori_loop", graph, body_fun, with_index=True)
        return loop_result(graph, init, jax.lax.fori_loop(lower, upper, body, init, **kwargs))
    lifted = lift_once(numbers_as_arrays(init_val))
    body = _loop_body(body_fun, lifted, "fori_loop")
    final = jax.lax.fori_loop(lower, upper, body, lifted.values, **kwargs)
    return _write_back(lifted, final, "fori_loop")


def while_loop(
    cond_fun: Callable[[Any], Any],
    body_fun: Callable[[Any], Any],
    init_val: Any,
    *,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """`jax.lax.while_loop` whose carry may hold Modules and Variables.

    Arguments:
        cond_fun: `cond_fun(val) -> bool scalar`; it must not change the carry.
        body_fun: `body_fun(val) -> val`, returning the carry with the same structure.
        init_val: the initial carry. Python numbers in it are carried as arrays, as
            `jax.lax` does (`fori_loop(0, 3, lambda i, c: c + 1, 0)` returns an array).
        graph: `False` for tree mode: the JAX function over the carry as pytrees; only
            Variable values are written back, and a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back values only.
            `None` reads `set_graph_updates`.
            In both, the body must return the Variables it was given, in place.

    Returns:
        The final carry (the caller's objects, holding the final values).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Variable, while_loop
        >>> v = Variable(jnp.array(1))
        >>> def double(v):
        ...     v.value *= 2
        ...     return v
        >>> _ = while_loop(lambda v: v.value < 100, double, v)
        >>> int(v.value)
        128
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if not (graph and graph_updates):
        init = loop_init("while_loop", graph, init_val)
        body = simple_loop_body("while_loop", graph, body_fun, with_index=False)
        final = jax.lax.while_loop(simple_loop_cond(graph, cond_fun), body, init)
        return loop_result(graph, init, final)
    lifted = lift_once(numbers_as_arrays(init_val))

    def condition(values: list[Any]) -> Any:
        inside = Inside(lifted.graphdef, values)
        result = cond_fun(inside.tree)
        after = _carried(lifted, inside.tree, "while_loop", "cond_fun")
        if any(a is not b for a, b in zip(after, values, strict=True)):
            raise ValueError(
                "while_loop: cond_fun changed a value of the carry; only body_fun may "
                "change it (cond_fun's changes would be lost)."
            )
        return result

    body = _loop_body(body_fun, lifted, "while_loop")
    final = jax.lax.while_loop(condition, body, lifted.values)
    return _write_back(lifted, final, "while_loop")


_NO_INIT: Any = object()  # `scan` called without `init`: the form with `in_axes`


def scan(
    f: Callable[..., Any] | None = None,
    init: Any = _NO_INIT,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    *,
    in_axes: Any = _NO_INIT,
    out_axes: Any = _NO_INIT,
    transform_metadata: Mapping[str, Any] | None = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **kwargs: Any,
) -> Any:
    """`jax.lax.scan` for Modules and Variables, in two forms: `jax.lax.scan`'s and Flax
    NNX's.

    **With `init`** (`scan(f, init, xs)`, as `jax.lax.scan`) it runs the loop:
    `f(carry, x) -> (carry, y)`, the carry (e.g. a model updated step by step) keeping
    its structure, and `xs` may hold Modules whose Variables have a leading axis (e.g. a
    stack of layers), each step getting the Module with one slice of every Variable.

    **Without `init`** (`scan(f, in_axes=..., out_axes=...)`, or as a decorator) it
    returns the scanned function, called with the arguments of one step, as `nnx.scan`:
    `in_axes` gives each positional argument a role: `Carry` (the loop's carry, at most
    one), an int (scanned over that axis, one slice per step), `None` (the same every
    step) or a `StateAxes` (a role per filter, e.g. `StateAxes({BatchStat: Carry,
    ...: 0})` for layers whose running statistics are carried). `out_axes` says what
    the function returns: `Carry` (the next carry), an int (an output stacked along
    that axis), or a tuple of them, one per output (`(Carry, 0)`: a pair `(carry, y)`).
    The defaults, `(Carry, 0)` both, give `f(carry, x) -> (carry, y)`.

    In both forms Variables written inside are written back: the carry's final values,
    and, for scanned objects, every step's values stacked. The structure of what comes
    in must not change inside, but for Variables added where `in_axes` gives them an
    axis (`sow` in each step, under `StateAxes({Intermediate: 0, ...: Carry})`): each
    step's are stacked along it and the caller's object gets them, as in Flax NNX. A
    `Carry` output must hold the very Modules and Variables of the `Carry` argument (write
    values in place; a new object there raises, as in NNX). A broadcast (`None`)
    argument is the same for every step: each step reads the values it came in with, as
    Flax NNX's graph mode gives them (so a broadcast RNG stream gives every step the
    same key: recurrent dropout's one mask). A Variable of it that the function writes
    gets the value the last step wrote (the stream's count moves on once, so the next
    call draws new keys), where NNX's graph mode drops the write. To have each step see
    the previous step's write, make it `Carry` (or a `StateAxes` entry `Carry`).

    The scanned function (without `init`) keeps its traces: called again with arguments
    of a structure, shapes and dtypes it has seen, it reuses the step JAX traced, so the
    function's Python runs once per structure (as `nnx.scan`), however many calls.

    The two forms are told apart by `init` alone: `scan(f, init, xs)` and
    `scan(f, init=...)` are `jax.lax.scan`'s (`init` may be `None`, for no carry);
    `scan(f)`, `scan(f, in_axes=...)` and `scan(in_axes=...)` return a scanned function.
    Giving both `init` and `in_axes`/`out_axes`/`transform_metadata`, or `xs` without
    `init`, raises `TypeError`.

    Arguments:
        f: `f(carry, x) -> (carry, y)` with `init`; otherwise the function of one step,
            whose arguments and output `in_axes` and `out_axes` describe. Omit it (and
            `init`) to get a decorator.
        init: the initial carry (Python numbers in it are carried as arrays).
        xs: what to scan over, along the leading axis of every array and Variable.
        length: the number of steps, when nothing is scanned over.
        reverse: scan from the end.
        unroll: how many steps to unroll in the compiled loop.
        in_axes: (without `init`) one role for every positional argument, or a tuple
            with one per argument. Default `(Carry, 0)`.
        out_axes: (without `init`) what the function returns: `Carry`, an int, a
            `StateAxes` of ints (for an output holding Variables), or a tuple of those.
            Default `(Carry, 0)`.
        transform_metadata: (without `init`) `{PARTITION_NAME: name}`: the scanned
            Variables' `sharding` metadata names the scanned axis `name` (as `vmap` with
            the same option makes it), which is taken out inside the function and put
            back after; Variables it returns get it at their `out_axes`.
        graph: `False` for tree mode, as Flax NNX's: `jax.lax.scan` over the arguments
            as pytrees (`in_axes`/`out_axes` take pytree prefixes; `StateAxes` refused).
            The carry's Variables must come back in the carry output (Variable identity
            preserved across iterations); scanned Variables written inside come back
            stacked; broadcast (`None`) arguments are carried through the loop, so their
            Variables' last values are written back; a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, then as tree mode. `None`
            reads `set_graph_updates`.
        **kwargs: passed on to `jax.lax.scan`.

    Returns:
        With `init`, `(carry, ys)`: the final carry (the caller's objects, updated) and
        the stacked outputs. Without, the scanned function (or a decorator).

    Raises:
        TypeError: an ambiguous call (see above), or axes that are not roles.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> import pytree_graph as pg
        >>> class Layer(Module):
        ...     def __init__(self, w):
        ...         self.w = pg.Param(w)
        ...     def __call__(self, x):
        ...         return x * self.w.value
        >>> stack = Layer(jnp.array([1.0, 2.0, 3.0]))  # three layers, stacked
        >>> y, _ = pg.scan(lambda x, layer: (layer(x), None), jnp.array(1.0), stack)
        >>> float(y)
        6.0

        The same loop, written as Flax NNX writes it:

        >>> @pg.scan(in_axes=(pg.Carry, 0), out_axes=pg.Carry)
        ... def forward(x, layer):
        ...     return layer(x)
        >>> float(forward(jnp.array(1.0), stack))
        6.0
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    simple = not (graph and graph_updates)
    nnx_form = {"in_axes": in_axes, "out_axes": out_axes}
    given = [name for name, value in nnx_form.items() if value is not _NO_INIT]
    if transform_metadata is not None:
        given.append("transform_metadata")
    if init is not _NO_INIT:
        if given:
            raise TypeError(
                f"scan: got both `init` (the jax.lax.scan form, `scan(f, init, xs)`, which "
                f"runs the loop) and {', '.join(f'`{n}`' for n in given)} (the form that "
                "returns a scanned function). Use one: `scan(f, init, xs)`, or "
                "`scan(f, in_axes=(Carry, 0), out_axes=(Carry, 0))(init, xs)`."
            )
        if f is None:
            raise TypeError("scan: `f` is missing: `scan(f, init, xs)`.")
        if simple:
            options = dict(length=length, reverse=reverse, unroll=unroll, **kwargs)
            return simple_scan(f, graph, (Carry, 0), (Carry, 0), options)(init, xs)
        return _scan_carry_and_xs(f, init, xs, length, reverse, unroll, **kwargs)
    if xs is not None:
        raise TypeError(
            "scan: got `xs` but no `init`. The jax.lax.scan form takes both, "
            "`scan(f, init, xs)` (`init=None` for no carry); the form with `in_axes` "
            "takes neither: `scan(f, in_axes=...)(carry, xs)`."
        )
    options = {
        "in_axes": (Carry, 0) if in_axes is _NO_INIT else in_axes,
        "out_axes": (Carry, 0) if out_axes is _NO_INIT else out_axes,
        "transform_metadata": transform_metadata,
        "length": length,
        "reverse": reverse,
        "unroll": unroll,
        **kwargs,
    }
    if f is None:
        return functools.partial(scan, graph=graph, graph_updates=graph_updates, **options)
    check_callable(f, "scan")
    if simple:
        if transform_metadata:
            raise ValueError(
                "scan: transform_metadata= names the scanned axis in the Variables' "
                "metadata, which graph=False and graph_updates=False do not write back. "
                "Pass graph=True and graph_updates=True to use it."
            )
        jax_options = {k: options[k] for k in options if k not in _NNX_OPTIONS}
        return simple_scan(f, graph, options["in_axes"], options["out_axes"], jax_options)
    return _GraphScan(f, **options)


_NNX_OPTIONS = ("in_axes", "out_axes", "transform_metadata")


def _scan_carry_and_xs(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    length: int | None,
    reverse: bool,
    unroll: int | bool,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """`scan(f, init, xs)`: the `jax.lax.scan` form."""
    carry_lifted = lift_once(numbers_as_arrays(init))
    xs_lifted = lift_once(xs)
    both = {id(o) for o in carry_lifted.objects} & {id(o) for o in xs_lifted.objects}
    if both:
        raise ValueError(
            "scan: the same Module or Variable is both in the carry and in xs. An object "
            "is either carried from step to step or scanned over, slice by slice: keep "
            "it in one of them."
        )

    def body(carry_values: list[Any], x_values: list[Any]) -> Any:
        carry_inside = Inside(carry_lifted.graphdef, carry_values)
        x_inside = Inside(xs_lifted.graphdef, x_values)
        out = f(carry_inside.tree, x_inside.tree)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(f"scan: f must return a pair (carry, y), got {type(out).__name__}.")
        carry, y = out
        new_carry = _carried(carry_lifted, carry, "scan", "f", carry_values)
        x_outcome, x_after = x_inside.finish(None, structure="fixed", transform="scan")
        # Only what was written is stacked out of the loop.
        written = x_after if x_outcome.rewrite else [x_after[p] for p in x_outcome.changed]
        # `y` is walked on its own, not as `x_inside.finish`'s output: each step's `y` is
        # stacked into new objects, even where it holds a slice of xs's (which `apply`
        # would give back as the caller's xs objects, holding every step's values).
        walk = GraphWalk()
        y_graphdef = walk.graphdef(y)
        y_values = list(map(value_of, walk.leaves))
        return new_carry, (written, y_values, (x_outcome, y_graphdef))

    final, (written, y_values, static) = jax.lax.scan(
        body,
        carry_lifted.values,
        xs_lifted.values,
        length=length,
        reverse=reverse,
        unroll=unroll,
        **kwargs,
    )
    x_outcome, y_graphdef = static
    if not x_outcome.rewrite:
        full = list(xs_lifted.values)
        for position, value in zip(x_outcome.changed, written, strict=True):
            full[position] = value
        written = full
    xs_lifted.apply(x_outcome, written)
    carry = _write_back(carry_lifted, final, "scan")
    return carry, build(y_graphdef, y_values)


def _check_role(spec: Any, where: str, output: bool) -> None:
    if spec is Carry or (isinstance(spec, int) and not isinstance(spec, bool)):
        return
    if spec is None and not output:
        return
    if spec is None:
        # ValueError with NNX's opening words: a valid role in the wrong place.
        raise ValueError(
            f"scan: Cannot broadcast output state: {where} is None, but each step gives its "
            "own output. Stack it along an axis (an int), or make it the carry (Carry)."
        )
    if isinstance(spec, StateAxes):
        for _, axis in spec.items():
            if output and (axis is None or axis is Carry):
                raise ValueError(
                    f"scan: Cannot broadcast output state. Got StateAxes: {where} is "
                    f"{spec!r}, but an output's StateAxes takes ints only (the axis each of "
                    "its Variables is stacked along)."
                )
        return
    raise TypeError(
        f"scan: {where} must be Carry, an int, None (in_axes only) or a StateAxes, got {spec!r}."
    )


def _check_roles(axes: Any, option: str, output: bool) -> Any:
    """`in_axes` or `out_axes` of `scan`: one role, or a tuple with one per item."""
    if isinstance(axes, list):
        axes = tuple(axes)
    items = axes if isinstance(axes, tuple) else (axes,)
    for i, spec in enumerate(items):
        _check_role(spec, f"{option}[{i}]" if isinstance(axes, tuple) else option, output)
    if sum(spec is Carry for spec in items) > 1:
        raise ValueError(
            f"scan: Found multiple Carry definitions: {option} has Carry more than once "
            f"({axes!r}); a loop has one carry: make it a tuple of what is carried."
        )
    return axes


def _carry_index(axes: Any) -> int | None:
    """The position of `Carry` in `in_axes` or `out_axes` (0 when it is all of it)."""
    if axes is Carry:
        return 0
    if isinstance(axes, tuple) and Carry in axes:
        return axes.index(Carry)
    return None


_STRUCTURE_CHANGED = (
    "scan: after a step, the arguments (with the Carry argument replaced by the carry "
    "returned) do not have the structure they came in with: the function returned a carry "
    "of another structure than the Carry argument, or changed the structure of an argument "
    "(removed or replaced an attribute or submodule, or changed a Variable's metadata). "
    "Return the carry as it came in, with new values only, and make structural changes "
    "outside the loop. (Adding Variables is fine where in_axes gives them an axis, e.g. "
    "`sow` under StateAxes({Intermediate: 0, ...: Carry}): each step's are stacked.)"
)


@dataclasses.dataclass(frozen=True, slots=True)
class _Added:
    """Objects a step of `scan` added to its arguments (a static pytree): the arguments'
    structure after the step, the leaf position after it of each leaf that came in
    (`old_at`), the positions of the new leaves (`created`) and the axis each is stacked
    along, and, for each object after, the index of the object it was (-1 for new)."""

    graphdef: GraphDef
    old_at: tuple[int, ...]
    created: tuple[int, ...]
    axes: tuple[int, ...]
    origins: tuple[int, ...]

    def apply(self, lifted: LiftedCall, values: list[Any], created: list[Any]) -> None:
        """Give the caller's objects the structure after the loop: `values` for the leaves
        that came in (in their leaf order), `created` (stacked at axis 0) for the new."""
        leaves: list[Any] = [None] * self.graphdef.num_leaves
        for position, at in enumerate(self.old_at):
            leaves[at] = values[position]
        for at, axis, value in zip(self.created, self.axes, created, strict=True):
            leaves[at] = jax.tree.map(lambda x, axis=axis: place_axis(x, axis), value)
        outcome = StructureChanged(
            args=self.graphdef.root,
            out=NONE_RECORD,
            origins=self.origins,
            num_objects=self.graphdef.num_objects,
        )
        lifted.apply(outcome, leaves)


def _check_same_objects(walk: GraphWalk, inside: Inside, tree: Any, call: Call) -> None:
    """Refuse a step of `scan` whose carry holds other Modules or Variables than those it
    was given (of the same structure), as Flax NNX does: the caller's objects are the
    ones the loop writes to, so a new one in their place would be dropped."""
    for index, (now, given) in enumerate(zip(walk.objects, inside.objects, strict=True)):
        if now is not given:
            shared = GraphWalk(record_shared=True)
            shared.graphdef(tree)
            place = show_argument_path(call, shared.shared_paths[index][0])
            raise ValueError(
                f"scan: Carry references must be the same between iterations: the function "
                f"returned another {type(now).__name__} at {place} than the one it was given. "
                "Write values in place (`v.value = ...`) instead of putting new Variables or "
                "Modules in the carry, or make the new object before or after the loop."
            )


def _added_objects(
    paths: tuple,
    inside: Inside,
    tree: Any,
    walked: tuple[GraphWalk, GraphDef],
    role_of: Callable[[tuple, Any], Any],
    metadata: TransformMetadata | None,
    call: Call,
) -> tuple[GraphWalk, "_Added"]:
    """The walk of the arguments after a step that changed their structure, and what it
    added; refuse any change but new leaves (and objects) given an axis by in_axes."""
    walk, graphdef = walked
    old_positions = {path: position for position, path in enumerate(paths)}
    old_at: list[int | None] = [None] * len(paths)
    created = []
    for at, path in enumerate(walk.paths):
        position = old_positions.get(path)
        if position is None:
            created.append(at)
        else:
            old_at[position] = at
    built = {id(obj) for obj in inside.objects}
    if None in old_at or sum(id(obj) in built for obj in walk.objects) != len(built):
        raise ValueError(_STRUCTURE_CHANGED)
    axes = []
    for at in created:
        path, leaf = walk.paths[at], walk.leaves[at]
        axis = role_of(path, leaf)
        if axis is None or axis is Carry:
            raise ValueError(
                f"scan: the function added the {type(leaf).__name__} at "
                f"{show_argument_path(call, path)}, whose role in in_axes is "
                f"{'Carry' if axis is Carry else 'None (broadcast)'}; a loop can add only what "
                "it stacks, one value per step. Give it an axis (e.g. StateAxes({Intermediate: "
                "0, ...: Carry}) for `sow`), or create it outside the loop."
            )
        axes.append(axis)
    if metadata is not None:
        for at, axis in zip(created, axes, strict=True):
            if isinstance(walk.leaves[at], Variable):
                metadata.add_axis(walk.leaves[at], axis)
        walk = GraphWalk()
        graphdef = walk.graphdef(tree)
    index_of = {id(obj): i for i, obj in enumerate(inside.objects)}
    origins = tuple(index_of.get(id(obj), -1) for obj in walk.objects)
    return walk, _Added(graphdef, tuple(old_at), tuple(created), tuple(axes), origins)


def _passes_as_carry(value: Any) -> bool:
    """Whether a broadcast value can go into `scan`'s loop as (an unchanged part of) its
    carry: arrays, or a pytree of them (e.g. `sow`'s tuple of records)."""
    return all(isinstance(leaf, jax.Array | np.ndarray) for leaf in jax.tree.leaves(value))


def _step_key(graphdef: GraphDef, roles: list[Any], fixed: dict[int, Any]) -> Any:
    """What a step of `scan` is traced for: the arguments' structure, each leaf's role,
    and the broadcast values that are not arrays (by `static_key`); None when one of
    those cannot be hashed (the step is then traced anew each call)."""
    key = (graphdef, tuple(roles), tuple((p, static_key(v)) for p, v in fixed.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Steps:
    """The step functions a scanned function has traced, by `_step_key`: the most recent
    few (a function is usually called with one structure), so that JAX, which keeps a
    trace per function object, finds the one it traced for this structure."""

    __slots__ = ("_entries",)
    _LIMIT = 8

    def __init__(self):
        self._entries: dict[Any, tuple[Callable[..., Any], tuple[int, ...]]] = {}

    def get(self, key: Any, default: Any) -> Any:
        return default if key is None else self._entries.get(key, default)

    def put(self, key: Any, entry: tuple[Callable[..., Any], tuple[int, ...]]) -> None:
        if key is None:
            return
        self._entries.pop(key, None)
        self._entries[key] = entry
        if len(self._entries) > self._LIMIT:
            del self._entries[next(iter(self._entries))]


class _BroadcastWritten(Exception):
    """Raised out of a traced step of `scan` that wrote broadcast leaves not yet given a
    slot for their last write: the loop is traced again with one for each."""

    def __init__(self, positions: list[int]):
        super().__init__(positions)
        self.positions = positions


@dataclasses.dataclass(frozen=True, slots=True)
class _StepInfo:
    """What a traced step of `scan` found out (a static pytree, returned by the loop):
    the positions of the carried leaves that change and of the scanned leaves it wrote,
    the structure of its stacked output and the axis of each of its values, and the
    objects it added to the arguments, if any."""

    carried_changed: tuple[int, ...]
    written: tuple[int, ...]
    y_graphdef: GraphDef
    y_axes: tuple
    added: _Added | None


jax.tree_util.register_static(_StepInfo)


def _with_argument(call: Call, tree: tuple, index: int, value: Any) -> tuple:
    """A call's tree (see `Call.tree`) with positional argument `index` replaced."""
    at = 1 if call.lift_fun else 0
    args = list(tree[at])
    args[index] = value
    return (*tree[:at], tuple(args), *tree[at + 1 :])


class _GraphScan(BindsAsMethod):
    """The function `scan` returns without `init`: one step's function, scanned."""

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        transform_metadata: Mapping[str, Any] | None,
        **scan_kwargs: Any,
    ):
        self._call = Call(fun)
        self._in_axes = _check_roles(in_axes, "in_axes", output=False)
        self._out_axes = _check_roles(out_axes, "out_axes", output=True)
        self._carry_in = _carry_index(self._in_axes)
        self._carry_out = _carry_index(self._out_axes)
        if (self._carry_in is None) != (self._carry_out is None):
            raise ValueError(
                "scan: If one of in_axes or out_axes has Carry, the other must also have "
                "Carry: the argument carried in is the output carried out, step after step (got "
                f"in_axes={self._show(self._in_axes)}, out_axes={self._show(self._out_axes)})."
            )
        self._metadata = (
            None if transform_metadata is None else TransformMetadata(transform_metadata, "scan")
        )
        self._scan_kwargs = scan_kwargs
        self._steps = _Steps()
        functools.update_wrapper(self, fun, updated=())

    @staticmethod
    def _show(axes: Any) -> str:
        if isinstance(axes, tuple):
            return "(" + ", ".join(map(show_axis, axes)) + ("," if len(axes) == 1 else "") + ")"
        return show_axis(axes)

    def _role_of_argument(self, argument: Any) -> Any:
        if argument is None:
            return None  # the function itself is the same every step
        if isinstance(self._in_axes, tuple):
            return self._in_axes[argument]
        return self._in_axes

    def _positional(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """`args` with the keyword arguments bound to their positions (each argument's role
        is given by position in `in_axes`), as Flax NNX does."""
        try:
            bound = inspect.signature(self.__wrapped__).bind(*args, **kwargs)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"scan: keyword argument(s) {sorted(kwargs)} could not be bound to positions "
                f"of {getattr(self.__wrapped__, '__name__', 'the function')} ({error}); pass "
                "every argument positionally, each with its role in in_axes."
            ) from None
        if bound.kwargs:
            raise TypeError(
                f"scan: keyword-only argument(s) {sorted(bound.kwargs)} have no position, so "
                "no role in in_axes; make them positional parameters of the function."
            )
        return bound.args

    def _check_arguments(self, args: tuple) -> None:
        if self._in_axes is Carry and len(args) != 1:
            raise ValueError(
                "scan: When in_axes=Carry, the function must take exactly one argument (the "
                f"carry), but it was called with {len(args)}. Give each its role: "
                "in_axes=(Carry, 0, ...)."
            )
        if isinstance(self._in_axes, tuple) and len(self._in_axes) != len(args):
            raise ValueError(
                f"scan: in_axes has {len(self._in_axes)} entries but the function was "
                f"called with {len(args)} positional argument(s); give one role each."
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args = self._positional(args, kwargs)
        self._check_arguments(args)
        call, carry_in = self._call, self._carry_in
        if carry_in is not None:
            args = (*args[:carry_in], numbers_as_arrays(args[carry_in]), *args[carry_in + 1 :])
        lifted, walk = lift_recording_aliases(call.tree(args, {}))

        def role_of(path: tuple, leaf: Any) -> Any:
            argument, relative = call.split_path(path)
            spec = self._role_of_argument(argument)
            return spec.axis_of(relative, leaf, "scan") if isinstance(spec, StateAxes) else spec

        check_one_spec(
            "scan",
            "in_axes",
            call,
            walk,
            role_of,
            "Give the arguments that share it the same role, or pass separate objects.",
            show_spec=show_axis,
        )
        roles = list(map(role_of, lifted.paths, lifted.leaves))
        carried = [p for p, role in enumerate(roles) if role is Carry]
        scanned = [p for p, role in enumerate(roles) if role is not None and role is not Carry]
        if not scanned and self._scan_kwargs.get("length") is None:
            raise ValueError(
                "scan: nothing is scanned over (no argument has an int in in_axes, or it "
                "holds no arrays), so the number of steps is unknown: pass `length=`."
            )
        values = lifted.values
        xs = [values[p] if roles[p] == 0 else jnp.moveaxis(values[p], roles[p], 0) for p in scanned]
        # Broadcast values go in through the carry, returned as they came (JAX makes such
        # a carry a constant of the loop), so that a step's function depends on the call's
        # structure only and JAX reuses its trace on the next call of that structure.
        # Values that are not arrays (a Python number in a Variable) stay in the function,
        # and in the key it is kept under.
        broadcast = [p for p, role in enumerate(roles) if role is None]
        passed: list[int] = []
        fixed: dict[int, Any] = {}
        for p in broadcast:  # each value's leaves looked at once
            if _passes_as_carry(values[p]):
                passed.append(p)
            else:
                fixed[p] = values[p]
        key = _step_key(lifted.graphdef, roles, fixed)
        # Broadcast leaves the function writes get a slot in the carry for the last step's
        # write; which ones is known only once a step is traced, so the loop is traced again
        # with those slots when the first trace finds a write (never when nothing is written).
        body, kept = self._steps.get(key, (None, ()))
        while True:
            if body is None:
                positions = (carried, scanned, kept, passed)
                body = self._body(lifted.graphdef, roles, positions, fixed, role_of)
            init = [values[p] for p in (*carried, *kept, *passed)]
            try:
                final, (written, y_values, created, info) = jax.lax.scan(
                    body, init, xs, **self._scan_kwargs
                )
            except _BroadcastWritten as found:
                body, kept = None, tuple(sorted({*kept, *found.positions}))
                continue
            break
        self._steps.put(key, (body, kept))
        final = final[: len(carried) + len(kept)]
        full = list(values)
        for position, value in zip(carried + list(kept), final, strict=True):
            full[position] = value
        for position, value in zip(info.written, written, strict=True):
            full[position] = place_axis(value, roles[position])
        changed = info.carried_changed + kept + info.written
        if info.added is not None:
            # Objects were added (e.g. `sow` in every step): the caller's graph takes the
            # new structure, with every value, the new Variables' stacked at their axes.
            info.added.apply(lifted, full, created)
            changed = ()
        carry = self._write_back(lifted, full, changed, args)
        ys = build(
            info.y_graphdef,
            [place_axis(v, axis) for v, axis in zip(y_values, info.y_axes, strict=True)],
        )
        if self._out_axes is Carry:
            return carry
        if self._carry_out is not None:
            return tuple(carry if i == self._carry_out else y for i, y in enumerate(ys))
        return ys

    def _write_back(
        self, lifted: LiftedCall, values: list[Any], changed: tuple[int, ...], args: tuple
    ) -> Any:
        """Give the caller's objects the loop's final `values` (those at `changed`
        positions are new); return the final carry, made of the caller's objects."""
        call, carry_in, leaves = self._call, self._carry_in, lifted.leaves
        if any(
            not isinstance(leaves[p], Variable) and call.split_path(lifted.paths[p])[0] != carry_in
            for p in changed
        ):
            # An array attribute was replaced: write every leaf, as the other loops do.
            tree = _write_back(lifted, values, "scan")
            return None if carry_in is None else tree[-2][carry_in]
        variables = tuple(p for p in changed if isinstance(leaves[p], Variable))
        lifted.apply(ValuesChanged(changed=variables), [values[p] for p in variables])
        if carry_in is None:
            return None
        if isinstance(args[carry_in], Module | Variable):
            return args[carry_in]  # its Variables hold the final values now
        # Arrays (and objects) in a container: the caller's objects, with new arrays.
        objects = lifted.objects
        builder = Builder(values, list(objects), reuse=dict(enumerate(objects)))
        return builder.visit(call.argument_record(lifted.graphdef, carry_in))

    def _split_output(self, out: Any) -> tuple[Any, Any]:
        """`(carry, ys)` of what one step returned (`ys` with None at the carry's place)."""
        out_axes = self._out_axes
        if out_axes is Carry:
            return out, None
        if isinstance(out_axes, tuple):
            check_output_items(out_axes, out, "scan")
            carry = None if self._carry_out is None else out[self._carry_out]
            ys = tuple(None if i == self._carry_out else y for i, y in enumerate(out))
            return carry, ys
        return None, out

    def _body(
        self,
        graphdef: GraphDef,
        roles: list[Any],
        positions: tuple[list[int], list[int], tuple[int, ...], list[int]],
        fixed: dict[int, Any],
        role_of: Callable[[tuple, Any], Any],
    ) -> Callable[..., Any]:
        """One step of the loop, for arguments of structure `graphdef` whose leaves have
        `roles`: `positions` are those carried, scanned, broadcast and written (`kept`,
        each with a carry slot for its last write), and broadcast and passed in the carry;
        `fixed` the broadcast values that are not arrays. It refers to no call's values,
        so it serves every call of that structure."""
        call, metadata, carry_in = self._call, self._metadata, self._carry_in
        carried, scanned, kept, passed = positions
        broadcast = [p for p, role in enumerate(roles) if role is None]
        paths = graphdef.paths
        num_carried, num_kept = len(carried), len(kept)

        def where(position: int) -> str:
            return show_argument_path(call, paths[position])

        def body(carry_values: list[Any], x_values: list[Any]) -> Any:
            # The carry: the carried values, the slots for the last writes of `kept`
            # broadcast leaves (written, never read), then the broadcast values passed.
            values: list[Any] = [None] * len(roles)
            for position, value in fixed.items():
                values[position] = value
            for position, value in zip(carried, carry_values[:num_carried], strict=True):
                values[position] = value
            passed_values = carry_values[num_carried + num_kept :]
            for position, value in zip(passed, passed_values, strict=True):
                values[position] = value
            for position, value in zip(scanned, x_values, strict=True):
                values[position] = value
            inside = Inside(graphdef, values)
            # Inside, a scanned Variable's `sharding` metadata names its axes without the
            # scanned one (as its slice has them); it is named again after the step.
            marked = []
            if metadata is not None:
                leaves = argument_leaves(inside)
                for position in scanned:
                    if isinstance(leaves[position], Variable):
                        metadata.remove_axis(leaves[position], roles[position], where(position))
                        marked.append((leaves[position], roles[position]))
            out = call.run(inside.tree)
            for leaf, axis in marked:
                metadata.add_axis(leaf, axis)
            carry, ys = self._split_output(out)
            tree = inside.tree
            if carry_in is not None:
                tree = _with_argument(call, tree, carry_in, numbers_as_arrays(carry))
            walk = GraphWalk()
            added = None
            after_graphdef = walk.graphdef(tree)
            if after_graphdef != graphdef:
                walk, added = _added_objects(
                    paths, inside, tree, (walk, after_graphdef), role_of, metadata, call
                )
            elif carry_in is not None:
                _check_same_objects(walk, inside, tree, call)
            after = list(map(value_of, walk.leaves))
            created: list[Any] = []
            if added is not None:
                created = [after[i] for i in added.created]
                after = [after[i] for i in added.old_at]
            check_carried_types(
                [values[p] for p in carried],
                [after[p] for p in carried],
                lambda i: where(carried[i]),
                "scan",
                "the function",
            )
            found = [p for p in broadcast if p not in kept and after[p] is not values[p]]
            if found:
                raise _BroadcastWritten(found)
            check_carried_types(
                [values[p] for p in kept],
                [after[p] for p in kept],
                lambda i: where(kept[i]),
                "scan",
                "the function (writing a broadcast argument)",
            )
            written = tuple(p for p in scanned if after[p] is not values[p])
            y_walk = GraphWalk()
            y_graphdef = y_walk.graphdef(ys)
            y_axes = tuple(
                spec_at(self._out_axes, path, leaf, "scan")
                for path, leaf in zip(y_walk.paths, y_walk.leaves, strict=True)
            )
            if metadata is not None:
                own = {id(obj) for obj in walk.objects}
                for leaf, axis in zip(y_walk.leaves, y_axes, strict=True):
                    if isinstance(leaf, Variable) and id(leaf) not in own:
                        metadata.add_axis(leaf, axis)
                y_graphdef = GraphWalk().graphdef(ys)
            y_values = list(map(value_of, y_walk.leaves))
            carried_changed = tuple(p for p in carried if after[p] is not values[p])
            info = _StepInfo(carried_changed, written, y_graphdef, y_axes, added)
            last_writes = [after[p] for p in kept]
            return [after[p] for p in carried] + last_writes + list(passed_values), (
                [after[p] for p in written],
                y_values,
                created,
                info,
            )

        return body
