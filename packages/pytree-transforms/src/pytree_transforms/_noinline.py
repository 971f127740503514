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

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Primitive, jaxpr_as_fun
from jax.interpreters import ad, batching, mlir

from pytree_filter import is_array

from ._errors import check_callable, describe_leaf
from ._method import BindsAsMethod, method_as_pytree, register_wrapper
from ._static_key import KeyedStatics

# Each cache holds jaxprs (and the functions they were traced from) for at most this many
# functions and input shapes.
_CACHE_SIZE = 512


def noinline(fn: Callable[..., Any]) -> Callable[..., Any]:
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

    Arguments:
        fn: the function: any callable, including a Module or another pytree whose array
            leaves are then inputs like the arguments'.

    Returns:
        A function with `fn`'s signature. It is a pytree whose children are `fn`'s, so
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
    return _NoInline(method_as_pytree(fn))


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
        tree = (self._fun, args, kwargs)
        leaves, treedef = jax.tree.flatten(tree)
        dynamic = tuple(i for i, leaf in enumerate(leaves) if is_array(leaf))
        static = tuple(leaf for leaf in leaves if not is_array(leaf))
        try:
            statics = KeyedStatics(static)
        except TypeError:
            raise _unhashable(tree, leaves) from None
        arrays = [leaves[i] for i in dynamic]
        avals = tuple(jax.typeof(x) for x in arrays)
        traced = _trace(_Call(treedef, dynamic, statics, avals))
        outs = _noinline_p.bind(*arrays, jaxpr=traced.jaxpr) if traced.jaxpr.out_avals else []
        full = list(traced.out_static)
        for i, x in zip(traced.out_dynamic, outs, strict=True):
            full[i] = x
        return traced.out_def.unflatten(full)


def _unhashable(tree: tuple[Any, ...], leaves: list[Any]) -> TypeError:
    """The error for a static leaf that cannot key the cache of traces."""
    for i, leaf in enumerate(leaves):
        if not is_array(leaf):
            try:
                KeyedStatics((leaf,))
            except TypeError:
                where = describe_leaf(tree, i, ("fn", "args", "kwargs"))
                return TypeError(
                    f"noinline: {where} is {type(leaf).__name__} {leaf!r:.60}, which is not "
                    "hashable. Leaves that are not arrays are static: they pick the "
                    "compiled function, so they must be hashable. Pass an array there, or "
                    "a hashable value (a tuple instead of a list of numbers, say)."
                )
    return TypeError("noinline: an argument is not hashable.")


class _Call:
    """What a call traces `fn` for: the static leaves and the input shapes and dtypes."""

    __slots__ = ("_hash", "avals", "dynamic", "statics", "treedef")

    def __init__(self, treedef: Any, dynamic: tuple[int, ...], statics: KeyedStatics, avals):
        self.treedef = treedef
        self.dynamic = dynamic
        self.statics = statics
        self.avals = avals
        self._hash = hash((treedef, dynamic, statics, avals))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is _Call
            and self.treedef == other.treedef
            and self.dynamic == other.dynamic
            and self.statics == other.statics
            and self.avals == other.avals
        )


class _Traced:
    """`fn` traced for one `_Call`: its jaxpr, and how to rebuild its output."""

    __slots__ = ("jaxpr", "out_def", "out_dynamic", "out_static")

    def __init__(self, jaxpr: ClosedJaxpr, out_def: Any, out_dynamic, out_static):
        self.jaxpr = jaxpr
        self.out_def = out_def
        self.out_dynamic = out_dynamic
        self.out_static = out_static


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _trace(call: _Call) -> _Traced:
    """Trace `fn` to a jaxpr of its array inputs and outputs."""
    output: list[Any] = []

    def body(*arrays: Any) -> list[Any]:
        full: list[Any] = []
        static = iter(call.statics.values)
        array = iter(arrays)
        dynamic = set(call.dynamic)
        for i in range(call.treedef.num_leaves):
            full.append(next(array) if i in dynamic else next(static))
        fun, args, kwargs = call.treedef.unflatten(full)
        out_leaves, out_def = jax.tree.flatten(fun(*args, **kwargs))
        output.extend([out_leaves, out_def])
        return [x for x in out_leaves if is_array(x)]

    jaxpr = jax.make_jaxpr(body)(*call.avals)
    if any(isinstance(c, jax.core.Tracer) for c in jaxpr.consts):
        raise ValueError(
            "noinline: the function uses an array traced outside it (a closure over a "
            "value of an enclosing jax.jit, vmap or grad). A noinline function is compiled "
            "on its own, so it can only see what it is given: pass that array as an "
            "argument instead."
        )
    out_leaves, out_def = output
    out_dynamic = tuple(i for i, x in enumerate(out_leaves) if is_array(x))
    out_static = tuple(None if is_array(x) else x for x in out_leaves)
    return _Traced(jaxpr, out_def, out_dynamic, out_static)


# The primitive. Its only parameter is the jaxpr it runs; cached jaxprs make equal calls
# bind equal parameters.

_noinline_p = Primitive("noinline")
_noinline_p.multiple_results = True


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _executable(jaxpr: ClosedJaxpr) -> Callable[..., Any]:
    """The jaxpr as a jitted function: traced from the jaxpr, compiled on first use."""
    return jax.jit(jaxpr_as_fun(jaxpr))


def _impl(*args: Any, jaxpr: ClosedJaxpr) -> list[Any]:
    return _executable(jaxpr)(*args)


def _abstract_eval(*avals: Any, jaxpr: ClosedJaxpr) -> list[Any]:
    del avals
    return jaxpr.out_avals


def _lower(ctx: Any, *args: Any, jaxpr: ClosedJaxpr) -> Any:
    """A call lowers to a host callback that runs the jaxpr's own executable.

    The callback gets the host buffers as they are and runs the executable on JAX's
    default device (`jax.pure_callback` would copy every argument to a CPU device first,
    and run it there).
    """
    results, _, keepalive = mlir.emit_python_callback(
        ctx,
        _executable(jaxpr),
        None,
        list(args),
        ctx.avals_in,
        ctx.avals_out,
        has_side_effect=False,
    )
    ctx.module_context.add_keepalive(keepalive)
    return results


def _jvp(primals: list[Any], tangents: list[Any], *, jaxpr: ClosedJaxpr) -> tuple[list, list]:
    outs = _noinline_p.bind(*primals, jaxpr=jaxpr)
    live = tuple(_is_live(t) for t in tangents)
    inexact = [_is_inexact(a) for a in jaxpr.out_avals]
    if not any(live) or not any(inexact):
        return outs, [ad.Zero(a.to_tangent_aval()) for a in jaxpr.out_avals]
    given = [t for t, lv in zip(tangents, live, strict=True) if lv]
    out_tangents = iter(_noinline_p.bind(*primals, *given, jaxpr=_tangent_jaxpr(jaxpr, live)))
    return outs, [
        next(out_tangents) if i else ad.Zero(a.to_tangent_aval())
        for a, i in zip(jaxpr.out_avals, inexact, strict=True)
    ]


def _is_live(tangent: Any) -> bool:
    """Whether a tangent can be nonzero (not a symbolic zero, nor of an integer input)."""
    return type(tangent) is not ad.Zero and tangent.dtype != jax.dtypes.float0


def _is_inexact(aval: Any) -> bool:
    return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _tangent_jaxpr(jaxpr: ClosedJaxpr, live: tuple[bool, ...]) -> ClosedJaxpr:
    """The jaxpr from primals and live tangents to the tangents of the inexact outputs."""
    fun = jaxpr_as_fun(jaxpr)
    avals = jaxpr.in_avals
    count = len(avals)

    def tangent(*args: Any) -> list[Any]:
        primals, given = args[:count], iter(args[count:])
        tangents = [
            next(given) if lv else _zero_tangent(a) for a, lv in zip(avals, live, strict=True)
        ]
        _, out = jax.jvp(fun, list(primals), tangents)
        return [t for t, a in zip(out, jaxpr.out_avals, strict=True) if _is_inexact(a)]

    tangent_avals = [a.to_tangent_aval() for a, lv in zip(avals, live, strict=True) if lv]
    return jax.make_jaxpr(tangent)(*avals, *tangent_avals)


def _zero_tangent(aval: Any) -> Any:
    tangent = aval.to_tangent_aval()
    if tangent.dtype == jax.dtypes.float0:
        return np.zeros(aval.shape, jax.dtypes.float0)
    return jnp.zeros(aval.shape, tangent.dtype)


def _transpose(cts: list[Any], *args: Any, jaxpr: ClosedJaxpr) -> list[Any]:
    undefined = tuple(ad.is_undefined_primal(x) for x in args)
    if all(type(c) is ad.Zero for c in cts):
        return [None] * len(args)
    cts = [ad.instantiate_zeros(c) for c in cts]
    defined = [x for x, u in zip(args, undefined, strict=True) if not u]
    out = iter(_noinline_p.bind(*defined, *cts, jaxpr=_transpose_jaxpr(jaxpr, undefined)))
    return [next(out) if u else None for u in undefined]


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _transpose_jaxpr(jaxpr: ClosedJaxpr, undefined: tuple[bool, ...]) -> ClosedJaxpr:
    """The jaxpr from the defined inputs and the output cotangents to the cotangents of the
    undefined inputs, in which the jaxpr is linear."""
    fun = jaxpr_as_fun(jaxpr)
    linear_avals = [a for a, u in zip(jaxpr.in_avals, undefined, strict=True) if u]
    fixed_avals = [a for a, u in zip(jaxpr.in_avals, undefined, strict=True) if not u]

    def transposed(*args: Any) -> tuple[Any, ...]:
        fixed, cts = args[: len(fixed_avals)], list(args[len(fixed_avals) :])

        def linear(*linear_args: Any) -> list[Any]:
            fixed_iter, linear_iter = iter(fixed), iter(linear_args)
            full = [next(linear_iter) if u else next(fixed_iter) for u in undefined]
            return fun(*full)

        return jax.linear_transpose(linear, *linear_avals)(cts)

    return jax.make_jaxpr(transposed)(*fixed_avals, *jaxpr.out_avals)


def _batch(args: list[Any], dims: list[Any], *, jaxpr: ClosedJaxpr) -> tuple[list, list]:
    # An input that is not mapped has the batch dimension None.
    size = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None)
    args = [x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims, strict=True)]
    in_axes = tuple(None if d is None else 0 for d in dims)
    outs = _noinline_p.bind(*args, jaxpr=_batched_jaxpr(jaxpr, in_axes, size))
    return outs, [0] * len(outs)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _batched_jaxpr(jaxpr: ClosedJaxpr, in_axes: tuple[int | None, ...], size: int) -> ClosedJaxpr:
    """The jaxpr mapped over a leading axis of size `size` of the inputs `in_axes` maps."""
    batched = jax.vmap(jaxpr_as_fun(jaxpr), in_axes=in_axes, axis_size=size)
    avals = [
        a if axis is None else a.update(shape=(size, *a.shape))
        for a, axis in zip(jaxpr.in_avals, in_axes, strict=True)
    ]
    return jax.make_jaxpr(batched)(*avals)


_noinline_p.def_impl(_impl)
_noinline_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[_noinline_p] = _jvp
ad.primitive_transposes[_noinline_p] = _transpose
batching.primitive_batchers[_noinline_p] = _batch
mlir.register_lowering(_noinline_p, _lower)


def forget_traces() -> None:
    """Forget the traced jaxprs and their executables (see `clear_caches`)."""
    for cache in (_trace, _executable, _tangent_jaxpr, _transpose_jaxpr, _batched_jaxpr):
        cache.cache_clear()
