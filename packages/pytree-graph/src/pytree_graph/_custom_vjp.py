"""`custom_vjp` for functions of object graphs: a backward rule whose cotangents for
Modules are States, and which gets the cotangents of the arguments' values after the call
(`inputs_g`) with the output's, as Flax NNX's."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_transforms.extend import BindsAsMethod

from ._aliases import lift_recording_aliases
from ._autodiff import DiffState, argnums_in_call, parse_argnums
from ._boundary import Call, Inside
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._lift import lift_once
from ._state import State
from ._tangents import Differentiated, rebuild_with, zeros_for
from ._tree_transforms import SimpleCustomVjp, refuse_state_prefixes
from ._variables import Variable


class _GraphCustomVjp(BindsAsMethod):
    """The function `custom_vjp` returns; `defvjp` gives it its rules."""

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: tuple):
        self._call = Call(fun)
        self._fwd: Callable[..., Any] | None = None
        self._bwd: Callable[..., Any] | None = None
        if isinstance(nondiff_argnums, int | DiffState):
            nondiff_argnums = (nondiff_argnums,)
        _, entries = (
            parse_argnums("custom_vjp", "nondiff_argnums", nondiff_argnums, None)
            if nondiff_argnums
            else (False, ())
        )
        # An int: not differentiated; a DiffState: differentiated where its filter says.
        self._entries = tuple(
            (argnum, selector, isinstance(item, DiffState))
            for (argnum, selector), item in zip(entries, nondiff_argnums, strict=True)
        )
        self._option = f"nondiff_argnums={nondiff_argnums!r}"
        functools.update_wrapper(self, fun, updated=())

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """Give the function its forward and backward rules.

        Arguments:
            fwd: called with the function's arguments, returns `(out, residuals)`;
                residuals may hold anything, Modules included.
            bwd: called as `bwd(*nondiff_args, residuals, (inputs_g, out_g))` (the
                arguments named by ints in `nondiff_argnums` first, as `jax.custom_vjp`
                passes them). `out_g` is the output's cotangent, shaped as the output
                (None where it holds a Module); `inputs_g` has one entry per other
                positional argument: the cotangent of its values after the call (for
                an argument holding Modules a `State` of all its Variables, zeros
                where nothing later used them). It returns a tuple with one cotangent
                per such argument, in order: a `State` for an argument holding Modules
                (of the Variables differentiated in it; any left out, or None, are
                zero; `inputs_g`'s entry may be returned as it is, or changed in
                place), for any other its own structure.
        """
        check_callable(fwd, "custom_vjp.defvjp (fwd)")
        check_callable(bwd, "custom_vjp.defvjp (bwd)")
        self._fwd, self._bwd = fwd, bwd

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fwd, bwd = self._fwd, self._bwd
        if fwd is None or bwd is None:
            raise TypeError(
                f"custom_vjp: {self.__name__} has no rules yet; give them with "
                f"`{self.__name__}.defvjp(fwd, bwd)` before calling it."
            )
        call = self._call
        argnums = argnums_in_call(
            "custom_vjp", "nondiff_argnums", [a for a, _, _ in self._entries], len(args)
        )
        nondiff = [
            k
            for k, (_, _, is_diff_state) in zip(argnums, self._entries, strict=True)
            if not is_diff_state
        ]
        selectors = {k: None for k in range(len(args)) if k not in nondiff}
        for k, (_, selector, is_diff_state) in zip(argnums, self._entries, strict=True):
            if is_diff_state:
                selectors[k] = selector
        differentiated = Differentiated("custom_vjp", call, args, selectors)
        lifted, walk = lift_recording_aliases(call.tree(args, kwargs))
        selected = differentiated.select(lifted, walk, self._option)
        graphdef = lifted.graphdef
        diff_args = tuple(selectors)
        # The walk `fwd`'s objects and output made after it ran: `backward` reads from it
        # which value each cotangent is for.
        forward_after: list[Any] = []

        def inside_of(diff: list[Any], other: list[Any]) -> Inside:
            diff_values, other_values = iter(diff), iter(other)
            return Inside(graphdef, [next(diff_values if s else other_values) for s in selected])

        # The arguments' values after the call are outputs too (written back outside, as
        # every graph transform writes back), so a later use of a Variable the function
        # wrote reaches `bwd` as its cotangent in `inputs_g`, as in Flax NNX.
        @jax.custom_vjp
        def primal(diff: list[Any], other: list[Any]) -> Any:
            inside = inside_of(diff, other)
            return inside.finish(call.run(inside.tree), transform="custom_vjp")

        def forward(diff: list[Any], other: list[Any]) -> Any:
            inside = inside_of(diff, other)
            call_args, call_kwargs = inside.tree[-2:]
            result = fwd(*call_args, **call_kwargs)
            if not (isinstance(result, tuple) and len(result) == 2):
                raise TypeError(
                    f"custom_vjp: fwd must return a pair (out, residuals), got "
                    f"{type(result).__name__}."
                )
            out, residuals = result
            finished = inside.finish(out, transform="custom_vjp")
            forward_after[:] = [inside.after]
            kept = lift_once(([call_args[k] for k in nondiff], residuals))
            return finished, (kept.graphdef, kept.values, other)

        def backward(saved: Any, cotangent: Any) -> Any:
            kept_graphdef, kept_values, other = saved
            nondiff_args, residuals = Inside(kept_graphdef, kept_values).tree
            _, values_g = cotangent
            inputs_g, out_g = _split_cotangents(
                call, forward_after[0], differentiated, diff_args, values_g
            )
            result = bwd(*nondiff_args, residuals, (inputs_g, out_g))
            if not isinstance(result, tuple | list) or len(result) != len(diff_args):
                raise ValueError(
                    f"custom_vjp: bwd must return a tuple with one cotangent per "
                    f"differentiated positional argument ({len(diff_args)}: arguments "
                    f"{list(diff_args)}), got {_count(result)}."
                )
            given = dict(zip(diff_args, result, strict=True))
            diff_cotangents = differentiated.tangents(
                lifted, selected, given, "bwd's output", strict=False
            )
            return diff_cotangents, zeros_for(other)

        primal.defvjp(forward, backward)
        diff = [v for v, s in zip(lifted.values, selected, strict=True) if s]
        other = [v for v, s in zip(lifted.values, selected, strict=True) if not s]
        outcome, values = primal(diff, other)
        return lifted.apply(outcome, values)


def _split_cotangents(
    call: Call,
    after: Any,
    differentiated: Differentiated,
    diff_args: tuple[int, ...],
    values_g: list[Any],
) -> tuple[tuple, Any]:
    """`(inputs_g, out_g)` for `bwd`, from the cotangents of the values `Inside.finish`
    returned (walked as `after`): per differentiated argument, the cotangent of its leaves
    after the call (a State of all its Variables for an argument holding Modules, zeros
    for those not returned; else its own structure, with Variables holding theirs), and
    the output's cotangent in the output's structure."""
    by_position = dict(zip(after.returned, values_g, strict=True))
    num_leaves = after.num_leaves
    flat: dict[int, dict[tuple, Any]] = {k: {} for k in diff_args}
    variables: dict[int, Any] = {}
    for position in range(num_leaves):
        argument, relative = call.split_path(after.paths[position])
        if argument not in flat:
            continue
        leaf = after.leaves[position]
        grad = by_position.get(position)
        if grad is None:
            (grad,) = zeros_for([after.values[position]])
        if isinstance(leaf, Variable):
            variables[position] = grad
            grad = leaf._pg_flat[1]((grad,))
        flat[argument][relative] = grad
    args_record = after.args_record.children[1 if call.lift_fun else 0]
    inputs_g = tuple(
        State.from_flat_path(flat[k])
        if differentiated.graph_args[k]
        else rebuild_with(args_record.children[k], variables)
        for k in diff_args
    )
    out_positions = {p: g for p, g in by_position.items() if p >= num_leaves}
    out_g = rebuild_with(after.out_record, out_positions)
    return inputs_g, out_g


def _count(result: Any) -> str:
    if isinstance(result, tuple | list):
        return f"a {type(result).__name__} of {len(result)}"
    return f"a {type(result).__name__}"


def custom_vjp(
    fun: Callable[..., Any] | None = None,
    *,
    nondiff_argnums: tuple = (),
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """`jax.custom_vjp` for functions of Modules and Variables.

    Decorate the function, then give it its rules with `f.defvjp(fwd, bwd)`. `fwd` takes
    the function's arguments and returns `(out, residuals)` (residuals may hold
    Modules); `bwd(residuals, (inputs_g, out_g))` gets the output's cotangent `out_g` and,
    in `inputs_g`, one cotangent per differentiated positional argument for its values
    after the call (a `State` of all its Variables for an argument holding Modules), as
    Flax NNX's does. It returns one cotangent per differentiated positional argument: for
    an argument holding Modules a `State` of its Variables' cotangents, as `grad` returns
    (it may leave Variables out, or be None: zeros; `inputs_g`'s entry changed in place
    will do), for any other its own structure. By default every floating-point Variable
    of a Module argument is differentiated; `nondiff_argnums` narrows that. What the
    function (or `fwd`, when differentiated) changes in its arguments is written back to
    the caller's objects, structure included; a later use of a Variable it wrote sends
    that use's cotangent to `bwd` in `inputs_g`. The output may hold the Modules passed
    in (the caller's objects come back, shared as they were).

    Arguments:
        fun: the function. Omit it to get a decorator.
        nondiff_argnums: ints, for positional arguments not differentiated (passed
            to `bwd` before the residuals, as `jax.custom_vjp` does), and
            `DiffState(argnum, filter)`s, for Module arguments of which only the
            Variables `filter` selects are differentiated (as in `grad`).
        graph: `False` for tree mode, as Flax NNX's: `jax.custom_vjp` over the arguments
            as pytrees; `bwd` returns Module-shaped cotangents, and may declare a keyword
            parameter `updates_g` to get the cotangents of the Variables the function
            wrote; `DiffState` is refused; a Variable met twice is refused. `None` reads
            `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, then as tree mode (without
            `updates_g`). `None` reads `set_graph_updates`.

    Returns:
        The function, with a `defvjp(fwd, bwd)` method.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, custom_vjp, grad
        >>> class Scale(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(3.0))
        >>> @custom_vjp
        ... def apply(model, x):
        ...     return model.w.value * x
        >>> def apply_fwd(model, x):
        ...     return apply(model, x), (model, x)
        >>> def apply_bwd(residuals, g):  # gradients clipped to [-1, 1]
        ...     inputs_g, out_g = g
        ...     model, x = residuals
        ...     dw = model.w.replace(value=jnp.clip(out_g * x, -1.0, 1.0))
        ...     return {"w": dw}, jnp.clip(out_g * model.w.value, -1.0, 1.0)
        >>> apply.defvjp(apply_fwd, apply_bwd)
        >>> float(grad(apply)(Scale(), 5.0)["w"].value)
        1.0
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        return functools.partial(
            custom_vjp, nondiff_argnums=nondiff_argnums, graph=graph, graph_updates=graph_updates
        )
    check_callable(fun, "custom_vjp")
    if not (graph and graph_updates):
        if isinstance(nondiff_argnums, int):
            nondiff_argnums = (nondiff_argnums,)
        refuse_state_prefixes(nondiff_argnums, "nondiff_argnums", "custom_vjp", (DiffState,))
        return SimpleCustomVjp(fun, graph, tuple(nondiff_argnums))
    return _GraphCustomVjp(fun, nondiff_argnums)
