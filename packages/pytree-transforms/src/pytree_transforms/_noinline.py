"""`noinline`: a function compiled once, as its own XLA program, however many places call it.

A call of a `noinline` function is one primitive, `noinline`, whose parameter is the
function's jaxpr (traced once per static part and input shapes, then cached). It lowers to a
host callback that runs the jaxpr's own compiled executable, so the caller's XLA program
holds a call, not the body: XLA cannot inline it, and however many call sites there are the
body is traced and compiled once. (A call between functions of one XLA program does not do
this: XLA inlines the called function, or, told not to, compiles a copy of it for every
call site, so the caller's compile time still grows with the number of calls.)

The transforms map a jaxpr to a jaxpr and bind the primitive again, so their results are
`noinline` calls too: `jax.jvp` binds the primal call and a second one for the tangents
(linear in them), which `jax.grad` transposes into a third; `jax.vmap` binds the batched
jaxpr. Each transformed jaxpr is cached on the jaxpr it came from, so every call site of
one function shares it.
"""

import functools
from collections.abc import Callable
from typing import Any

from jax.extend.core import ClosedJaxpr, Primitive
from jax.interpreters import ad, batching, mlir

from . import _noinline_transforms as rules
from ._errors import check_callable
from ._method import BindsAsMethod, method_as_pytree, register_wrapper
from ._noinline_swappable import Swappable
from ._noinline_trace import (
    executable,
    lower_as_callback,
    rebuild_output,
    split_call,
    trace,
)
from ._noinline_transforms import transformed


def noinline(
    fn: Callable[..., Any], abstract_fn: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """Compile `fn` once, as its own XLA program, and call it from compiled code without
    inlining it: a caller's compile time no longer grows with the number of calls.

    Inside `jax.jit` a call of an ordinary function puts a copy of its body in the caller's
    program at every call site (a Runge-Kutta step evaluating a vector field once per
    stage compiles the vector field once per stage). A call of `noinline(fn)` is instead a
    call out to `fn`'s own executable: `fn` is traced once, compiled once, and every call
    site with the same static arguments and input shapes and dtypes runs that executable.
    This trades run time for compile time: each call goes through the host (a callback)
    and XLA cannot optimise across it, so use it where compilation dominates.

    The arguments are filtered as by `filter_jit`: their array leaves (and those of `fn`
    itself, when it is a pytree such as a Module) are inputs of the compiled function;
    every other leaf (Python numbers included) is static, and a new static value traces
    and compiles `fn` again. `fn` returns any pytree: its arrays come from the compiled
    function, its other leaves are returned as they were when it was traced. `fn` must be
    pure: it may be called any number of times, or not at all when its result is unused.

    `jax.jit`, `jax.grad`, `jax.vjp`, `jax.jvp`, `jax.vmap` (and the filtered transforms)
    work through it, and what they make of `fn` is itself compiled once and not inlined.

    With `abstract_fn`, which function runs becomes an input of the call: functions
    wrapped with the same `abstract_fn` can be passed to a jitted caller in turn without
    compiling it again (a solver given one vector field, then another). The caller takes
    the output's structure, shapes and dtypes from
    `abstract_fn(fn's arrays, *args, **kwargs)` (`fn` with its non-array leaves replaced
    by None; None for a plain function), which every function sharing it must agree with;
    `fn` itself is traced only when it is first run, on the host.

    Arguments:
        fn: the function: any callable, including a Module or another pytree whose array
            leaves are then inputs like the arguments'.
        abstract_fn: None, or a function giving the output's shapes and dtypes as above
            (it is traced, never run), which makes `fn` swappable.

    Returns:
        A function with `fn`'s signature. It is a pytree whose children are `fn`'s (with
        `abstract_fn`: a number naming `fn`, and `fn`'s arrays), so
        `filter_jit(noinline(model))` traces the model's arrays.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import noinline
        >>> traces = []
        >>> @noinline
        ... def field(y, scale):
        ...     traces.append(1)
        ...     return scale * jnp.tanh(y)
        >>> @jax.jit
        ... def step(y):
        ...     k1 = field(y, 0.5)
        ...     k2 = field(y + k1, 0.5)
        ...     return y + (k1 + k2) / 2
        >>> step(jnp.ones(3))
        Array([1.410681, 1.410681, 1.410681], dtype=float32)
        >>> len(traces)  # two calls, one trace (and one compilation) of `field`
        1
    """
    check_callable(fn, "noinline", "fn", spelling="noinline({})")
    if abstract_fn is None:
        return _NoInline(method_as_pytree(fn))
    check_callable(abstract_fn, "noinline", "abstract_fn", spelling="noinline(fn, {})")
    return Swappable(method_as_pytree(fn), abstract_fn)


@register_wrapper
class _NoInline(BindsAsMethod):
    """The function `noinline` returns."""

    def __init__(self, fun: Callable[..., Any]):
        self._fun = fun
        functools.update_wrapper(self, fun, updated=())

    def _options(self) -> tuple[Any, tuple[Any, ...]]:
        """`noinline` has no options (see `register_wrapper`)."""
        return None, ()

    @classmethod
    def _rebuild(cls, arguments: tuple[Any, ...], fun: Any) -> "_NoInline":
        del arguments
        return cls(fun)

    # Equal for equal functions, so that wrapping a function again (`noinline(f)` passed to
    # a jitted caller at every step) reuses the caller's compilation.
    def __eq__(self, other: object) -> bool:
        return type(other) is _NoInline and self._fun == other._fun

    def __hash__(self) -> int:
        return hash((_NoInline, self._fun))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call, arrays = split_call((self._fun, args, kwargs))
        traced = trace(call)
        outs = _noinline_p.bind(*arrays, jaxpr=traced.jaxpr) if traced.jaxpr.out_avals else []
        return rebuild_output(traced, outs)


# The primitive. Its only parameter is the jaxpr it runs; cached jaxprs make equal calls
# bind equal parameters.

_noinline_p = Primitive("noinline")
_noinline_p.multiple_results = True


def _impl(*args: Any, jaxpr: ClosedJaxpr) -> list[Any]:
    return executable(jaxpr)(*args)


def _abstract_eval(*avals: Any, jaxpr: ClosedJaxpr) -> list[Any]:
    del avals
    return jaxpr.out_avals


def _lower(ctx: Any, *args: Any, jaxpr: ClosedJaxpr) -> Any:
    """A call lowers to a host callback that runs the jaxpr's own executable."""
    return lower_as_callback(ctx, executable(jaxpr), args)


def _bind_with(jaxpr: ClosedJaxpr) -> Any:
    """How a rule of the call of `jaxpr` binds a call of the transformed jaxpr."""

    def bind(transform: Any, operands: list[Any]) -> list[Any]:
        return _noinline_p.bind(*operands, jaxpr=transformed(jaxpr, (transform,)))

    return bind


def _jvp(primals: list[Any], tangents: list[Any], *, jaxpr: ClosedJaxpr) -> tuple[list, list]:
    outs = _noinline_p.bind(*primals, jaxpr=jaxpr)
    return rules.jvp(_bind_with(jaxpr), jaxpr.out_avals, primals, outs, tangents)


def _transpose(cts: list[Any], *args: Any, jaxpr: ClosedJaxpr) -> list[Any]:
    return rules.transpose(_bind_with(jaxpr), cts, list(args))


def _batch(args: list[Any], dims: list[Any], *, jaxpr: ClosedJaxpr) -> tuple[list, list]:
    return rules.batch(_bind_with(jaxpr), args, dims)


_noinline_p.def_impl(_impl)
_noinline_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[_noinline_p] = _jvp
ad.primitive_transposes[_noinline_p] = _transpose
batching.primitive_batchers[_noinline_p] = _batch
mlir.register_lowering(_noinline_p, _lower)


def forget_traces() -> None:
    """Forget the traced jaxprs and their executables (see `clear_caches`)."""
    for cache in (trace, executable):
        cache.cache_clear()
    rules.forget()
