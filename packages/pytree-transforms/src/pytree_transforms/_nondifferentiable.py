"""`nondifferentiable` and `nondifferentiable_backward`: identities that refuse autodiff.

They mark values that must not be differentiated (an integer-valued index computed in
floats, a solver's internal state), so that a derivative reaching them fails at trace time
with a message naming them, instead of silently being wrong.

`nondifferentiable` is a `jax.custom_jvp` whose rule raises: any tangent, so forward and
reverse mode alike, is refused. `nondifferentiable_backward` must let forward mode through
and refuse only the transpose that reverse mode adds, which no `custom_jvp`/`custom_vjp`
can express, so it is a primitive: its JVP is itself applied to the tangent, and the
transpose of that raises.
"""

import functools
from typing import Any

import jax
import jax.extend.core
from jax.interpreters import ad, batching, mlir

from pytree_filter import is_array


def _check_name(name: Any, msg: Any, function: str) -> None:
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"{function}(name=...) must be a str (what the value is, for the error message) "
            f'or None, got {type(name).__name__} {name!r:.60}; e.g. name="the step size".'
        )
    if msg is not None and not isinstance(msg, str):
        raise TypeError(
            f"{function}(msg=...) must be a str (the whole error message) or None, got "
            f"{type(msg).__name__} {msg!r:.60}; format values into the text first, e.g. "
            'msg=f"the step size {h} cannot be differentiated".'
        )


def _with_arrays(fun: Any, x: Any) -> Any:
    """Apply `fun` to the array leaves of `x`, keeping every other leaf as it is."""
    return jax.tree.map(lambda leaf: fun(leaf) if is_array(leaf) else leaf, x)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _refuse_tangents(message: str, x: Any) -> Any:
    return x


@_refuse_tangents.defjvp
def _refuse_tangents_jvp(message: str, primals: Any, tangents: Any) -> Any:
    raise RuntimeError(message)


def nondifferentiable(x: Any, *, name: str | None = None, msg: str | None = None) -> Any:
    """The identity, which raises if it is differentiated, in forward or reverse mode.

    Arguments:
        x: any pytree; its arrays are marked, its other leaves returned as they are.
        name: what `x` is, for the error message.
        msg: the whole error message, in place of the one made from `name`.

    Returns:
        `x`, unchanged.

    Raises:
        RuntimeError: at trace time, when a JVP (`jax.jvp`, `jax.grad`, `filter_grad`, ...)
            carries a tangent through `x`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import nondifferentiable
        >>> nondifferentiable({"step": jnp.array(3.0), "label": "train"})
        {'label': 'train', 'step': Array(3., dtype=float32, weak_type=True)}
        >>> jax.grad(lambda x: nondifferentiable(x, name="the step size") ** 2)(1.0)
        Traceback (most recent call last):
        ...
        RuntimeError: the step size cannot be differentiated, ...
        >>> jax.grad(lambda x: nondifferentiable(x, msg="use the adjoint instead") ** 2)(1.0)
        Traceback (most recent call last):
        ...
        RuntimeError: use the adjoint instead...
    """
    _check_name(name, msg, "nondifferentiable")
    message = msg
    if message is None:
        message = (
            f"{name or 'A value marked `nondifferentiable`'} cannot be differentiated, but a "
            "derivative (forward or reverse mode) reached it. Keep it out of what is "
            "differentiated: pass it in an argument that `filter_grad`/`jax.grad` does not "
            "differentiate, or apply `jax.lax.stop_gradient` to its input."
        )
    return _with_arrays(functools.partial(_refuse_tangents, message), x)


def _identity(x: Any, *, message: str) -> Any:
    return x


def _impl(x: Any, *, message: str) -> Any:
    # Binding makes a Python scalar one of JAX's own scalar types (subclasses of `float`,
    # `int`, `complex`, which JAX keeps internal); the identity gives back a Python scalar,
    # as `lambda x: x` does under `jax.jvp`.
    if type(x) is not bool:
        for scalar in (float, int, complex):
            if isinstance(x, scalar) and type(x) is not scalar:
                return scalar(x)
    return x


_nondifferentiable_backward_p = jax.extend.core.Primitive("nondifferentiable_backward")
_nondifferentiable_backward_p.def_impl(_impl)
_nondifferentiable_backward_p.def_abstract_eval(_identity)
mlir.register_lowering(
    _nondifferentiable_backward_p, mlir.lower_fun(_identity, multiple_results=False)
)


def _jvp(primals: Any, tangents: Any, *, message: str) -> tuple[Any, Any]:
    # The tangent goes through the primitive too: it is what reverse mode transposes.
    ((x,), (t,)) = primals, tangents
    bind = functools.partial(_nondifferentiable_backward_p.bind, message=message)
    return bind(x), bind(t)


def _transpose(cotangent: Any, x: Any, *, message: str) -> list[Any]:
    # A symbolic zero means no derivative flows back through here: nothing to refuse.
    if type(cotangent) is ad.Zero:
        return [cotangent]
    raise RuntimeError(message)


def _batch(args: Any, dims: Any, *, message: str) -> tuple[Any, Any]:
    return _nondifferentiable_backward_p.bind(args[0], message=message), dims[0]


ad.primitive_jvps[_nondifferentiable_backward_p] = _jvp
ad.primitive_transposes[_nondifferentiable_backward_p] = _transpose
batching.primitive_batchers[_nondifferentiable_backward_p] = _batch


def nondifferentiable_backward(x: Any, *, name: str | None = None, msg: str | None = None) -> Any:
    """The identity, which raises if it is differentiated in reverse mode.

    Forward mode (`jax.jvp`, `jax.jacfwd`) passes tangents through it unchanged; reverse
    mode (`jax.grad`, `jax.vjp`, `filter_grad`) fails where a cotangent reaches it.

    Arguments:
        x: any pytree; its arrays are marked, its other leaves returned as they are.
        name: what `x` is, for the error message.
        msg: the whole error message, in place of the one made from `name`.

    Returns:
        `x`, unchanged.

    Raises:
        RuntimeError: at trace time, when reverse mode carries a nonzero cotangent back
            through `x`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import nondifferentiable_backward
        >>> square = lambda x: nondifferentiable_backward(x, name="the input") ** 2
        >>> jax.jvp(square, (3.0,), (1.0,))
        (Array(9., dtype=float32, weak_type=True), Array(6., dtype=float32, weak_type=True))
        >>> jax.grad(square)(3.0)
        Traceback (most recent call last):
        ...
        RuntimeError: the input cannot be differentiated in reverse mode ...
    """
    _check_name(name, msg, "nondifferentiable_backward")
    message = msg
    if message is None:
        message = (
            f"{name or 'A value marked `nondifferentiable_backward`'} cannot be "
            "differentiated in reverse mode (`jax.grad`, `jax.vjp`, `filter_grad`), but a "
            "cotangent reached it. Differentiate in forward mode (`jax.jvp`, `jax.jacfwd`) "
            "instead, or apply `jax.lax.stop_gradient` to its input."
        )
    bind = functools.partial(_nondifferentiable_backward_p.bind, message=message)
    return _with_arrays(bind, x)
