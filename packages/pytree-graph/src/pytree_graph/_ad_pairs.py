"""`vjp` and `jvp` for functions of object graphs: (co)tangents of Modules as States."""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import is_inexact_array_like

from ._aliases import lift_recording_aliases
from ._boundary import Call, Inside, holds_graph_nodes
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._lift import LiftedCall
from ._tangents import Differentiated
from ._tree_transforms import simple_jvp, simple_vjp

_WHAT_IS_DIFFERENTIATED = (
    "Every floating-point Variable and array of every positional argument is "
    "differentiated (integer ones, such as counters, are not); keyword arguments are not."
)


def _prepare(transform: str, fun: Any, primals: tuple) -> tuple:
    """The call, what it differentiates, its lifted arguments and which leaves are
    differentiated."""
    check_callable(fun, transform)
    call = Call(fun)
    differentiated = Differentiated(transform, call, primals, dict.fromkeys(range(len(primals))))
    lifted, walk = lift_recording_aliases(call.tree(primals, {}))
    selected = differentiated.select(lifted, walk, "the primals")
    return call, differentiated, lifted, selected


def _pure(
    transform: str, call: Call, lifted: LiftedCall, selected: tuple, has_aux: bool
) -> Callable[[list[Any]], Any]:
    """The function of the differentiated values: `(value, (outcome, values))`, the
    second part for `lifted.apply` (the written Variables, then `aux`)."""
    other = [v for v, s in zip(lifted.values, selected, strict=True) if not s]
    graphdef = lifted.graphdef

    def pure(diff: list[Any]) -> Any:
        diff_values, other_values = iter(diff), iter(other)
        inside = Inside(graphdef, [next(diff_values if s else other_values) for s in selected])
        out = call.run(inside.tree)
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    f"{transform}(has_aux=True): the function must return a pair "
                    f"(out, aux), got {type(out).__name__}."
                )
            value, aux = out
        else:
            value, aux = out, None
        if holds_graph_nodes(value):
            raise TypeError(
                f"{transform}: the function's output holds a Module or Variable; the "
                "differentiated output must be arrays. Return Variables' values, or "
                "return the objects as aux with has_aux=True."
            )
        return value, inside.finish(aux)

    return pure


def vjp(
    fun: Callable[..., Any] | None = None,
    *primals: Any,
    has_aux: bool = False,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """`jax.vjp` for functions of Modules and Variables: cotangents of Modules as States.

    `fun` runs once, now: Variables it writes (batch statistics, counters) are written
    back to the caller's objects then, and calling `vjp_fn` runs only the backward pass,
    writing nothing. {what}

    As Flax NNX's, it is also a decorator: `vjp(f)` (no primals) is the function
    `g(*primals)` that returns `vjp(f, *primals)`, and `vjp(has_aux=True)` (no function)
    decorates a function so.

    Arguments:
        fun: the function; it returns arrays (or `(out, aux)` with `has_aux`, where
            `aux` may hold anything, Modules included). Omit it to get a decorator.
        *primals: its positional arguments. Omit them to get the function of them.
        has_aux: whether `fun` returns `(out, aux)`.
        graph: `False` for tree mode: `jax.vjp` over the primals as pytrees; a Module's
            cotangent is Module-shaped (every floating-point leaf differentiated), Variable
            values written inside are written back, and a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, then as tree mode. `None` reads
            `set_graph_updates`.

    Returns:
        `(out, vjp_fn)`, or `(out, vjp_fn, aux)` (without primals: the function of
        them, without `fun`: a decorator). `vjp_fn(cotangent)` takes a cotangent
        with the structure of `out` (None for a zero one) and returns a tuple with one
        cotangent per primal: for a primal holding Modules a `State` of its
        differentiated Variables (as `grad` returns), for any other its own structure
        (None where nothing is differentiated).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, vjp
        >>> class Scale(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(3.0))
        >>> out, vjp_fn = vjp(lambda m, x: m.w.value * x, Scale(), jnp.array(2.0))
        >>> grads, x_grad = vjp_fn(jnp.array(1.0))
        >>> float(out), float(grads["w"].value), float(x_grad)
        (6.0, 2.0, 3.0)
        >>> @vjp(has_aux=True)
        ... def scaled(m, x):
        ...     return m.w.value * x, "aux"
        >>> out, vjp_fn, aux = scaled(Scale(), jnp.array(2.0))
        >>> float(out), aux
        (6.0, 'aux')
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        if primals:
            raise TypeError(
                "vjp: primals were given but no function: call vjp(f, *primals), or "
                "vjp(f)(*primals)."
            )
        return functools.partial(vjp, has_aux=has_aux, graph=graph, graph_updates=graph_updates)
    check_callable(fun, "vjp")
    if not primals:
        return _of_primals(vjp, fun, has_aux, graph, graph_updates)
    if not (graph and graph_updates):
        return simple_vjp(fun, graph, primals, has_aux)
    call, differentiated, lifted, selected = _prepare("vjp", fun, primals)
    diff = [v for v, s in zip(lifted.values, selected, strict=True) if s]
    value, pullback, (outcome, out_values) = jax.vjp(
        _pure("vjp", call, lifted, selected, has_aux), diff, has_aux=True
    )
    aux = lifted.apply(outcome, out_values)
    out_leaves, out_def = jax.tree.flatten(value)

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        given, given_def = jax.tree.flatten(cotangent, is_leaf=_is_none)
        if given_def != out_def:
            raise ValueError(
                "vjp: the cotangent must have the structure of the function's output, "
                f"{out_def} (None for a zero leaf), got {given_def}."
            )
        checked = [
            _cotangent(i, c, o) for i, (c, o) in enumerate(zip(given, out_leaves, strict=True))
        ]
        (grads,) = pullback(out_def.unflatten(checked))
        by_argument = differentiated.gradients(lifted, selected, grads)
        return tuple(by_argument[k] for k in range(len(primals)))

    return (value, vjp_fn, aux) if has_aux else (value, vjp_fn)


def _of_primals(
    transform: Callable[..., Any],
    fun: Callable[..., Any],
    has_aux: bool,
    graph: bool,
    graph_updates: bool,
) -> Callable[..., Any]:
    """`transform` (`vjp` or `jvp`) of `fun`, as the function of the remaining arguments."""

    def of_primals(*args: Any) -> Any:
        if not args:
            raise TypeError(
                f"{transform.__name__}({getattr(fun, '__name__', 'f')}) takes the "
                + (
                    "primals: call it as g(*primals)."
                    if transform is vjp
                    else "primals and tangents: call it as g(primals, tangents)."
                )
            )
        return transform(fun, *args, has_aux=has_aux, graph=graph, graph_updates=graph_updates)

    functools.update_wrapper(of_primals, fun, updated=())
    return of_primals


def _is_none(x: Any) -> bool:
    return x is None


def _cotangent(i: int, given: Any, out: Any) -> Any:
    """The cotangent of output leaf `i`, checked: zeros for None (float0 for an integer
    output, which has no cotangent)."""
    if not is_inexact_array_like(out):
        return np.zeros(np.shape(out), dtype=jax.dtypes.float0)
    if given is None:
        return jnp.zeros_like(out)
    if np.shape(given) != np.shape(out):
        raise ValueError(
            f"vjp: the cotangent's leaf {i} has shape {np.shape(given)}, but the output's has "
            f"shape {np.shape(out)}: a cotangent has the output's shape."
        )
    return jnp.asarray(given, dtype=jnp.result_type(out))


def jvp(
    fun: Callable[..., Any] | None = None,
    primals: tuple[Any, ...] | None = None,
    tangents: tuple[Any, ...] | None = None,
    *,
    has_aux: bool = False,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """`jax.jvp` for functions of Modules and Variables: tangents of Modules as States.

    {what} The tangent of a primal holding Modules is a `State` of some of its
    floating-point Variables (as `grad` returns, e.g. made with `jax.tree.map`
    from `pytree_graph.state(model, Param)`); the Variables it leaves out get a zero
    tangent. Variables `fun` writes are written back to the caller's objects.

    As Flax NNX's, it is also a decorator: `jvp(f)` (no primals and tangents) is the
    function `g(primals, tangents)` that returns `jvp(f, primals, tangents)`, and
    `jvp(has_aux=True)` (no function) decorates a function so.

    Arguments:
        fun: the function; it returns arrays (or `(out, aux)` with `has_aux`). Omit it
            to get a decorator.
        primals: its positional arguments, a tuple (omitted with `tangents`: the
            function of both).
        tangents: one per primal: a State for a primal holding Modules; for any other,
            its own structure with a tangent for each floating-point array (Variables
            holding theirs) and None for a zero one. None stands for a whole zero tangent.
        has_aux: whether `fun` returns `(out, aux)`.
        graph: `False` for tree mode: `jax.jvp` over the primals as pytrees; a Module's
            tangent is Module-shaped (every floating-point leaf differentiated), Variable
            values written inside are written back, and a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, then as tree mode. `None` reads
            `set_graph_updates`.

    Returns:
        `(out, tangent_out)`, or `(out, tangent_out, aux)` (without primals and
        tangents: the function of them; without `fun`: a decorator).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, jvp, state
        >>> class Scale(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(3.0))
        >>> model = Scale()
        >>> dw = jax.tree.map(jnp.ones_like, state(model, Param))
        >>> out, tangent = jvp(lambda m, x: m.w.value * x, (model, jnp.array(2.0)), (dw, None))
        >>> float(out), float(tangent)
        (6.0, 2.0)
        >>> scaled = jvp(lambda m, x: m.w.value * x)
        >>> float(scaled((model, jnp.array(2.0)), (dw, None))[1])
        2.0
    """
    if fun is None:
        if primals is not None or tangents is not None:
            raise TypeError(
                "jvp: primals and tangents were given but no function: call "
                "jvp(f, primals, tangents), or jvp(f)(primals, tangents)."
            )
        graph, graph_updates = resolve_modes(graph, graph_updates)
        return functools.partial(jvp, has_aux=has_aux, graph=graph, graph_updates=graph_updates)
    check_callable(fun, "jvp")
    if primals is None and tangents is None:
        graph, graph_updates = resolve_modes(graph, graph_updates)
        return _of_primals(jvp, fun, has_aux, graph, graph_updates)
    if primals is None or tangents is None:
        missing = "primals" if primals is None else "tangents"
        raise TypeError(
            f"jvp: {missing} missing: give both, jvp(f, primals, tangents), or neither, "
            "jvp(f), for the function `g(primals, tangents)`."
        )
    if not isinstance(primals, tuple | list) or not isinstance(tangents, tuple | list):
        raise TypeError(
            "jvp expects `primals` and `tangents` as tuples, one entry per positional "
            f"argument, e.g. jvp(f, (model, x), (dmodel, dx)); got {type(primals).__name__} "
            f"and {type(tangents).__name__}."
        )
    if len(primals) != len(tangents):
        raise ValueError(
            f"jvp: {len(primals)} primal(s) but {len(tangents)} tangent(s); give one tangent "
            "per primal (None for a zero one)."
        )
    primals = tuple(primals)
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if not (graph and graph_updates):
        return simple_jvp(fun, graph, primals, tuple(tangents), has_aux)
    call, differentiated, lifted, selected = _prepare("jvp", fun, primals)
    diff = [v for v, s in zip(lifted.values, selected, strict=True) if s]
    diff_tangents = differentiated.tangents(lifted, selected, dict(enumerate(tangents)), "tangents")
    value, tangent_out, (outcome, out_values) = jax.jvp(
        _pure("jvp", call, lifted, selected, has_aux), (diff,), (diff_tangents,), has_aux=True
    )
    aux = lifted.apply(outcome, out_values)
    return (value, tangent_out, aux) if has_aux else (value, tangent_out)


vjp.__doc__ = vjp.__doc__.replace("{what}", _WHAT_IS_DIFFERENTIATED)
jvp.__doc__ = jvp.__doc__.replace("{what}", _WHAT_IS_DIFFERENTIATED)
