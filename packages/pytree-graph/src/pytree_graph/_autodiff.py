"""`grad` and `value_and_grad` for functions of object graphs."""

import functools
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax

from pytree_filter import is_inexact_array_like, path_text, to_predicate
from pytree_transforms.extend import BindsAsMethod

from ._aliases import check_one_spec, lift_recording_aliases
from ._boundary import Call, Inside, holds_modules
from ._errors import check_callable
from ._lift import LiftedCall, value_of
from ._records import DICT, LEAF, LIST, PYTREE, TUPLE, VARIABLE
from ._state import State
from ._variables import Param, Variable


class _GraphValueAndGrad(BindsAsMethod):
    """The function `value_and_grad` (and, dropping the value, `grad`) returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        argnums: int | Sequence[int],
        has_aux: bool,
        wrt: Any,
        transform: str,
        grad_kwargs: dict[str, Any],
    ):
        self._call = call = Call(fun)
        self._single = isinstance(argnums, int)
        self._argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        if not all(isinstance(a, int) for a in self._argnums) or not self._argnums:
            raise TypeError(
                f"{transform}: argnums must be an int or a non-empty sequence of ints, got "
                f"{argnums!r}."
            )
        self._has_aux = has_aux
        self._wrt = to_predicate(wrt)
        self._wrt_spec = wrt
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
        for argnum in self._argnums:
            if not -len(args) <= argnum < len(args):
                raise ValueError(
                    f"{self._transform}: argnums={argnum} is out of range for a call with "
                    f"{len(args)} positional argument(s)."
                )
        argnums = tuple(a % len(args) for a in self._argnums)
        lifted, walk = lift_recording_aliases(self._call.tree(args, kwargs))
        graph_args = {k: holds_modules(args[k]) for k in argnums}
        selected = tuple(map(partial(self._selects, graph_args), lifted.paths, lifted.leaves))
        check_one_spec(
            self._transform,
            f"argnums={self._argnums if not self._single else self._argnums[0]} (with "
            f"wrt={_name(self._wrt_spec)})",
            self._call,
            walk,
            partial(self._selects, graph_args),
            "Its gradient through one argument would leave out its use through the other. "
            "Differentiate every argument that holds it (e.g. argnums=(0, 1); its gradient "
            "comes with the first), or pass separate objects (e.g. "
            "`pytree_graph.clone(model)`).",
            show_spec=_show_differentiated,
        )
        diff = [v for v, s in zip(lifted.values, selected, strict=True) if s]
        other = [v for v, s in zip(lifted.values, selected, strict=True) if not s]
        grads, (value, outcome, out_values) = self._grad(diff, other, lifted.graphdef, selected)
        aux = lifted.apply(outcome, out_values)
        by_position = dict(zip((p for p, s in enumerate(selected) if s), grads, strict=True))
        results = tuple(self._gradient_of(lifted, k, graph_args[k], by_position) for k in argnums)
        gradient = results[0] if self._single else results
        return ((value, aux) if self._has_aux else value), gradient

    def _selects(self, graph_args: dict[int, bool], path: tuple, leaf: Any) -> bool:
        """Whether the leaf at `path` (of the lifted tree) is differentiated there.

        Python floats count as floating-point values: `jax.grad` makes them arrays.
        """
        argument, relative = self._call.split_path(path)
        if argument not in graph_args:
            return False
        value = value_of(leaf)
        if not graph_args[argument]:
            return is_inexact_array_like(value)
        if not self._wrt(relative, leaf):
            return False
        if not is_inexact_array_like(value):
            kind = type(leaf).__name__
            raise TypeError(
                f"{self._transform}: the {kind} at {path_text(relative)} of argument "
                f"{argument} matches wrt={_name(self._wrt_spec)} but holds "
                f"{_describe(value)}, which has no gradient (only floating-point values "
                "do). Narrow `wrt=` to leave it out, e.g. `wrt=Param` with the integer "
                "state in another Variable type."
            )
        return True

    def _gradient_of(
        self,
        lifted: LiftedCall,
        argument: int,
        is_graph: bool,
        by_position: dict[int, Any],
    ) -> Any:
        """The gradient for one argument: a State for one holding Modules, else its shape."""
        split = self._call.split_path
        if is_graph:
            flat = {}
            for position, grad in by_position.items():
                arg, relative = split(lifted.paths[position])
                if arg == argument:
                    leaf = lifted.leaves[position]
                    flat[relative] = (
                        leaf._pg_flat[1]((grad,)) if isinstance(leaf, Variable) else grad
                    )
            return State.from_flat_path(flat)
        return _rebuild(self._call.argument_record(lifted.graphdef, argument), by_position)


def _rebuild(record: tuple, grads: dict[int, Any]) -> Any:
    """A gradient shaped like the argument `record` describes (Variables holding their
    gradient), with None where nothing was differentiated."""
    tag = record.tag
    if tag == LEAF:
        return grads.get(record.position)
    if tag == VARIABLE:
        grad = grads.get(record.position)
        return None if grad is None else record.kind((grad,))
    if tag == LIST:
        return [_rebuild(r, grads) for r in record.children]
    if tag == TUPLE:
        return tuple(_rebuild(r, grads) for r in record.children)
    if tag == DICT:
        return {k: _rebuild(r, grads) for k, r in zip(record.keys, record.children, strict=True)}
    if tag == PYTREE:
        return record.treedef.unflatten([_rebuild(r, grads) for r in record.children])
    return None


def _show_differentiated(selected: bool) -> str:
    return "differentiated" if selected else "not differentiated"


def _name(spec: Any) -> str:
    return "..." if spec is ... else getattr(spec, "__name__", repr(spec))


def _describe(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return f"{dtype} values" if dtype is not None else f"a {type(value).__name__}"


_ARGUMENTS_DOC = """
    Arguments:
        fun: the function, returning a scalar (or `(scalar, aux)` with `has_aux`).
        argnums: which positional argument(s) to differentiate (an int or a tuple).
        has_aux: whether `fun` returns `(value, aux)`; `aux` may hold any objects,
            Modules and Variables included.
        wrt: filter of what to differentiate in arguments holding Modules: a Variable
            type (default `Param`), `...`, a filter object (e.g. `PathContains`, which
            sees paths), or a predicate `f(leaf) -> bool`.
            Other arguments (arrays, dicts of arrays, States, Variables) have every
            floating-point array and Variable differentiated, and their gradient has
            their shape (Variables holding gradients, None for the rest).
        **grad_kwargs: passed on to `jax.grad` (e.g. `holomorphic`).
"""


def value_and_grad(
    fun: Callable[..., Any] | None = None,
    *,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    wrt: Any = Param,
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
    if fun is None:
        return functools.partial(
            value_and_grad, argnums=argnums, has_aux=has_aux, wrt=wrt, **grad_kwargs
        )
    check_callable(fun, "value_and_grad")
    return _GraphValueAndGrad(fun, argnums, has_aux, wrt, "value_and_grad", grad_kwargs)


def grad(
    fun: Callable[..., Any] | None = None,
    *,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    wrt: Any = Param,
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
    if fun is None:
        return functools.partial(grad, argnums=argnums, has_aux=has_aux, wrt=wrt, **grad_kwargs)
    check_callable(fun, "grad")
    inner = _GraphValueAndGrad(fun, argnums, has_aux, wrt, "grad", grad_kwargs)

    @functools.wraps(fun)
    def gradient(*args: Any, **kwargs: Any) -> Any:
        value, grads = inner(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return _Bound(gradient)


class _Bound(BindsAsMethod):
    """A plain function that binds like a method as a class attribute."""

    __slots__ = ("__dict__", "_fun")

    def __init__(self, fun: Callable[..., Any]):
        self._fun = fun
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fun(*args, **kwargs)


for _function in (grad, value_and_grad):
    _function.__doc__ = _function.__doc__.replace("{arguments}", _ARGUMENTS_DOC.strip("\n"))
