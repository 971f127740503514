"""`custom_vjp` for functions of object graphs: a backward rule whose cotangents for
Modules are States."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_transforms.extend import BindsAsMethod

from ._aliases import lift_recording_aliases
from ._autodiff import DiffState, parse_argnums, resolve_argnums
from ._boundary import Call, Inside, holds_graph_nodes
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._lift import lift_once
from ._tangents import Differentiated, zeros_for
from ._tree_transforms import SimpleCustomVjp, refuse_state_prefixes


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
            bwd: called as `bwd(*nondiff_args, residuals, out_cotangent)` (the
                arguments named by ints in `nondiff_argnums` first, as `jax.custom_vjp`
                passes them); returns a tuple with one cotangent per other positional
                argument, in order: a `State` for an argument holding Modules (of the
                Variables differentiated in it; any left out, or None, are zero), for
                any other its own structure.
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
        argnums = resolve_argnums(
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
        name = self.__name__

        def inside_of(diff: list[Any], other: list[Any]) -> Inside:
            diff_values, other_values = iter(diff), iter(other)
            return Inside(graphdef, [next(diff_values if s else other_values) for s in selected])

        def finish(inside: Inside, out: Any, rule: str) -> Any:
            if holds_graph_nodes(out):
                raise TypeError(
                    f"custom_vjp: {rule} returned a Module or Variable as output; the output "
                    "of a custom_vjp function must be arrays (change the objects passed in "
                    "place instead: the changes are written back)."
                )
            outcome, values = inside.finish(None, structure="fixed", transform="custom_vjp")
            return outcome, values, out

        @jax.custom_vjp
        def primal(diff: list[Any], other: list[Any]) -> Any:
            inside = inside_of(diff, other)
            return finish(inside, call.run(inside.tree), name)

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
            kept = lift_once(([call_args[k] for k in nondiff], residuals))
            return finish(inside, out, "fwd"), (kept.graphdef, kept.values, other)

        def backward(saved: Any, cotangent: Any) -> Any:
            kept_graphdef, kept_values, other = saved
            nondiff_args, residuals = Inside(kept_graphdef, kept_values).tree
            # The cotangents of the Variables written inside are dropped: written values
            # are not differentiated through.
            _, _, out_cotangent = cotangent
            result = bwd(*nondiff_args, residuals, out_cotangent)
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
        outcome, values, out = primal(diff, other)
        lifted.apply(outcome, values)
        return out


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
    Modules); `bwd(residuals, g)` returns one cotangent per differentiated positional
    argument: for an argument holding Modules a `State` of its Variables' cotangents,
    as `grad` returns (it may leave Variables out, or be None: zeros), for any other its
    own structure. By default every floating-point Variable of a Module argument is
    differentiated; `nondiff_argnums` narrows that. Variables written by the function
    (or by `fwd`, when differentiated) are written back to the caller's objects; their
    new values are not differentiated through. The output must be arrays.

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
        ...     model, x = residuals
        ...     dw = model.w.replace(value=jnp.clip(g * x, -1.0, 1.0))
        ...     return {"w": dw}, jnp.clip(g * model.w.value, -1.0, 1.0)
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
