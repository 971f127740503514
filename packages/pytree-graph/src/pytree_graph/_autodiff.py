"""`grad` and `value_and_grad` for functions of object graphs."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from pytree_filter import to_predicate
from pytree_transforms.extend import BindsAsMethod

from ._aliases import lift_recording_aliases
from ._boundary import Call, Inside
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._tangents import Differentiated
from ._tree_transforms import Wrapped, simple_grad
from ._variables import Param


class DiffState:
    """What to differentiate in one argument of `grad` or `value_and_grad` (or, in
    `custom_vjp`'s `nondiff_argnums`, which Variables of a Module argument are
    differentiable): the argument's position and a filter of its Variables.

    Give it in `argnums`, alone or in a tuple with ints: plain ints use the `wrt=`
    filter (by default `Param`), each DiffState its own, so two arguments can be
    differentiated with respect to different parts.

    Arguments:
        argnum: the positional argument (an int; negative counts from the end).
        filter: a filter of its Variables: a Variable type, `...`, a filter object such
            as `PathContains("head")` (which sees the path within the argument), or a
            predicate on the leaf.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_filter import PathContains
        >>> from pytree_module import Module
        >>> from pytree_graph import DiffState, Param, grad
        >>> class Net(Module):
        ...     def __init__(self):
        ...         self.body = Param(jnp.array(1.0))
        ...         self.head = Param(jnp.array(2.0))
        >>> grads = grad(lambda m: m.body.value * m.head.value,
        ...              argnums=DiffState(0, PathContains("head")))(Net())
        >>> list(grads), float(grads["head"].value)
        (['head'], 1.0)
    """

    __slots__ = ("_predicate", "argnum", "filter")

    def __init__(self, argnum: int, filter: Any):
        if not isinstance(argnum, int) or isinstance(argnum, bool):
            raise TypeError(
                f"DiffState: argnum must be the int position of an argument, got {argnum!r}."
            )
        self.argnum = argnum
        self.filter = filter
        self._predicate = to_predicate(filter)

    def __eq__(self, other: object) -> bool:
        return type(other) is DiffState and (self.argnum, self.filter) == (
            other.argnum,
            other.filter,
        )

    def __hash__(self) -> int:
        return hash((self.argnum, self.filter))

    def __repr__(self) -> str:
        return f"DiffState({self.argnum}, {_name(self.filter)})"


def parse_argnums(transform: str, option: str, argnums: Any, default: Any) -> tuple:
    """`(single, entries)`: whether `argnums` named one argument, and for each argument
    `(argnum, selector)` (see `_tangents.Selector`), a DiffState's filter or `default`.

    Raises:
        TypeError: an entry is neither an int nor a DiffState, or none is given.
        ValueError: two entries name the same argument.
    """
    single = isinstance(argnums, int | DiffState)
    items = (argnums,) if single else tuple(argnums) if isinstance(argnums, list | tuple) else None
    if not items or not all(
        isinstance(a, DiffState) or (isinstance(a, int) and not isinstance(a, bool)) for a in items
    ):
        raise TypeError(
            f"{transform}: {option} must be an int, a DiffState, or a non-empty tuple of "
            f"them, got {argnums!r}."
        )
    entries = []
    for item in items:
        if isinstance(item, DiffState):
            entries.append((item.argnum, (item._predicate, repr(item))))
        else:
            entries.append((item, default))
    check_distinct(transform, option, [a for a, _ in entries])
    return single, tuple(entries)


def check_distinct(transform: str, option: str, argnums: list[int]) -> None:
    """Refuse an argument named twice in `argnums` (after negative ones are resolved)."""
    seen = set()
    for argnum in argnums:
        if argnum in seen:
            raise ValueError(
                f"{transform}: {option} names argument {argnum} twice. Name each argument "
                "once, with one filter (a DiffState, or an int for the default)."
            )
        seen.add(argnum)


def argnums_in_call(transform: str, option: str, argnums: list[int], num_args: int) -> list:
    """`argnums` as positions in a call with `num_args` positional arguments.

    Raises:
        ValueError: an argnum is out of range, or two name the same argument.
    """
    for argnum in argnums:
        if not -num_args <= argnum < num_args:
            raise ValueError(
                f"{transform}: {option} names argument {argnum}, out of range for a call "
                f"with {num_args} positional argument(s)."
            )
    resolved = [a % num_args for a in argnums]
    check_distinct(transform, option, resolved)
    return resolved


class _GraphValueAndGrad(BindsAsMethod):
    """The function `value_and_grad` (and, dropping the value, `grad`) returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        argnums: Any,
        has_aux: bool,
        wrt: Any,
        transform: str,
        grad_kwargs: dict[str, Any],
    ):
        self._call = call = Call(fun)
        self._single, self._entries = parse_argnums(
            transform, "argnums", argnums, (to_predicate(wrt), f"wrt={_name(wrt)}")
        )
        given = argnums if isinstance(argnums, tuple | list) else (argnums,)
        if wrt is not Param and any(isinstance(a, DiffState) for a in given):
            raise ValueError(
                f"{transform}: argnums holds a DiffState and wrt={_name(wrt)} is given too: "
                "say what to differentiate in one place. Give each argument its filter "
                "with DiffState(argnum, filter) (plain int argnums use Param), or use int "
                "argnums with wrt=."
            )
        uses_wrt = not all(isinstance(a, DiffState) for a in given)
        self._option = f"argnums={argnums!r}" + (f" (with wrt={_name(wrt)})" if uses_wrt else "")
        self._has_aux = has_aux
        self._transform = transform

        def pure(diff: list[Any], other: list[Any], graphdef: Any, selected: tuple) -> Any:
            diff_values, other_values = iter(diff), iter(other)
            values = [next(diff_values if s else other_values) for s in selected]
            inside = Inside(graphdef, values)
            out = call.run(inside.tree)
            if has_aux:
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise TypeError(
                        f"{transform}(has_aux=True): the function must return a pair "
                        f"(value, aux), got {type(out).__name__}."
                    )
                value, aux = out
            else:
                value, aux = out, None
            outcome, out_values = inside.finish(aux)
            return value, (value, outcome, out_values)

        self._grad = jax.grad(pure, has_aux=True, **grad_kwargs)
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        argnums = argnums_in_call(
            self._transform, "argnums", [a for a, _ in self._entries], len(args)
        )
        selectors = dict(zip(argnums, (s for _, s in self._entries), strict=True))
        differentiated = Differentiated(self._transform, self._call, args, selectors)
        lifted, walk = lift_recording_aliases(self._call.tree(args, kwargs))
        selected = differentiated.select(lifted, walk, self._option)
        diff = [v for v, s in zip(lifted.values, selected, strict=True) if s]
        other = [v for v, s in zip(lifted.values, selected, strict=True) if not s]
        grads, (value, outcome, out_values) = self._grad(diff, other, lifted.graphdef, selected)
        aux = lifted.apply(outcome, out_values)
        by_argument = differentiated.gradients(lifted, selected, grads)
        results = tuple(by_argument[k] for k in argnums)
        gradient = results[0] if self._single else results
        return ((value, aux) if self._has_aux else value), gradient


def _name(spec: Any) -> str:
    return "..." if spec is ... else getattr(spec, "__name__", repr(spec))


_ARGUMENTS_DOC = """
    Arguments:
        fun: the function, returning a scalar (or `(scalar, aux)` with `has_aux`).
        argnums: which positional argument(s) to differentiate: an int, a
            `DiffState(argnum, filter)` (that argument, with its own filter instead of
            `wrt`), or a tuple of them.
        has_aux: whether `fun` returns `(value, aux)`; `aux` may hold any objects,
            Modules and Variables included.
        wrt: filter of what to differentiate in arguments holding Modules (those given
            as ints in `argnums`; not with a DiffState, which says it): a Variable
            type (default `Param`), `...`, a filter object (e.g. `PathContains`, which
            sees paths), or a predicate `f(leaf) -> bool`.
            Other arguments (arrays, dicts of arrays, States, Variables) have every
            floating-point array and Variable differentiated, and their gradient has
            their shape (Variables holding gradients, None for the rest).
        graph: `False` for tree mode: `jax.grad` over the arguments as pytrees. The
            gradient of a Module is Module-shaped (the same class, each Variable holding
            the gradient of its value), every leaf of the differentiated arguments is
            differentiated (so they must all be floating point, as for `jax.grad`;
            `wrt=` and `DiffState` are refused), Variable values written inside are
            written back, and a Variable met twice is refused. `None` reads
            `set_graph_mode`.
        graph_updates: `False` keeps graph mode's sharing, with gradients and write-back
            as in tree mode. `None` reads `set_graph_updates`.
        **grad_kwargs: passed on to `jax.grad` (e.g. `holomorphic`).
"""


def value_and_grad(
    fun: Callable[..., Any] | None = None,
    *,
    argnums: int | DiffState | Sequence[int | DiffState] = 0,
    has_aux: bool = False,
    wrt: Any = Param,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **grad_kwargs: Any,
) -> Any:
    """`jax.value_and_grad` for functions of Modules and Variables.

    As `grad`, returning the function's value with the gradients.
    {arguments}
    Returns:
        A function returning `(value, grads)`, or `((value, aux), grads)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, value_and_grad
        >>> class Scale(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(3.0))
        >>> loss, grads = value_and_grad(lambda m, x: m.w.value * x)(Scale(), 2.0)
        >>> float(loss), float(grads["w"].value)
        (6.0, 2.0)
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        return functools.partial(
            value_and_grad,
            argnums=argnums,
            has_aux=has_aux,
            wrt=wrt,
            graph=graph,
            graph_updates=graph_updates,
            **grad_kwargs,
        )
    check_callable(fun, "value_and_grad")
    if not (graph and graph_updates):
        _check_tree_wrt("value_and_grad", wrt)
        return simple_grad(
            fun, graph, "value_and_grad", argnums, has_aux, True, grad_kwargs, (DiffState,)
        )
    return _GraphValueAndGrad(fun, argnums, has_aux, wrt, "value_and_grad", grad_kwargs)


def grad(
    fun: Callable[..., Any] | None = None,
    *,
    argnums: int | DiffState | Sequence[int | DiffState] = 0,
    has_aux: bool = False,
    wrt: Any = Param,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **grad_kwargs: Any,
) -> Any:
    """`jax.grad` for functions of Modules and Variables: gradients as a `State`.

    For an argument holding Modules, the gradient is a `State` of the
    Variables `wrt` selects (by default every `Param`), each a Variable of the same type
    and metadata holding its gradient, at its path in the argument (a shared Variable
    once). It goes straight into an optax update. Variables written inside (batch
    statistics, counters) are written back to the caller's objects, as `jit` does.
    {arguments}
    Returns:
        A function returning the gradient (a tuple of them for a tuple `argnums`), or
        `(grads, aux)` with `has_aux`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import BatchStat, Param, grad
        >>> class Affine(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(2.0))
        ...         self.shift = BatchStat(jnp.array(1.0))
        ...     def __call__(self, x):
        ...         return self.w.value * x + self.shift.value
        >>> grads = grad(lambda m, x: m(x))(Affine(), 3.0)
        >>> list(grads), float(grads["w"].value)
        (['w'], 3.0)
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        return functools.partial(
            grad,
            argnums=argnums,
            has_aux=has_aux,
            wrt=wrt,
            graph=graph,
            graph_updates=graph_updates,
            **grad_kwargs,
        )
    check_callable(fun, "grad")
    if not (graph and graph_updates):
        _check_tree_wrt("grad", wrt)
        return simple_grad(fun, graph, "grad", argnums, has_aux, False, grad_kwargs, (DiffState,))
    inner = _GraphValueAndGrad(fun, argnums, has_aux, wrt, "grad", grad_kwargs)

    @functools.wraps(fun)
    def gradient(*args: Any, **kwargs: Any) -> Any:
        value, grads = inner(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return Wrapped(gradient)


def _check_tree_wrt(transform: str, wrt: Any) -> None:
    if wrt is not Param:
        raise ValueError(
            f"{transform}: wrt={_name(wrt)} selects Variables of an object graph; with "
            "graph=False or graph_updates=False every leaf of the differentiated arguments "
            "is differentiated (as jax.grad does). Pass graph=True and graph_updates=True to "
            "use wrt=, or pass only what to differentiate (e.g. `pytree_graph.state(model, "
            "filter)`) as the argument."
        )


for _function in (grad, value_and_grad):
    _function.__doc__ = _function.__doc__.replace("{arguments}", _ARGUMENTS_DOC.strip("\n"))
