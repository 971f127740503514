"""The derivative and batching rules of the `noinline` primitives, written once for both.

A `noinline` call runs a function given as a jaxpr: its own (`noinline(fn)`), or the jaxpr
of whichever function the call picks at run time (`noinline(fn, abstract_fn)`). Each rule
makes a new call of the same kind that runs a transformed jaxpr: the tangents of the
outputs (`jax.jvp`), the transpose of a linear call (`jax.grad`), the call mapped over a
batch axis (`jax.vmap`). A `Transform` names one of those; `transformed` applies a sequence
of them to a jaxpr, and `rules` gives the JAX rules of a primitive from how it binds a call
with one more transform.
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
from jax.interpreters import ad

# Each cache holds transformed jaxprs for at most this many jaxprs and options.
CACHE_SIZE = 512

# ("tangent", live), ("transpose", undefined) or ("batch", in_axes, size).
Transform = tuple[Any, ...]
# Binds the primitive again for one more transform, on the call's array operands.
BindWith = Callable[[Transform, list[Any]], list[Any]]


def transformed(jaxpr: ClosedJaxpr, transforms: tuple[Transform, ...]) -> ClosedJaxpr:
    """`jaxpr` with `transforms` applied in order."""
    for kind, *options in transforms:
        jaxpr = _BY_KIND[kind](jaxpr, *options)
    return jaxpr


def jvp(
    bind_with: BindWith, out_avals: Any, primals: list[Any], outs: list[Any], tangents: list[Any]
) -> tuple[list[Any], list[Any]]:
    """The JVP rule: `outs` (the call on `primals`), and the tangents of the inexact outputs
    from a call of the tangent jaxpr; the others are symbolic zeros."""
    live = tuple(_is_live(t) for t in tangents)
    inexact = [_is_inexact(a) for a in out_avals]
    if not any(live) or not any(inexact):
        return outs, [ad.Zero(a.to_tangent_aval()) for a in out_avals]
    given = [t for t, lv in zip(tangents, live, strict=True) if lv]
    out_tangents = iter(bind_with(("tangent", live), [*primals, *given]))
    return outs, [
        next(out_tangents) if i else ad.Zero(a.to_tangent_aval())
        for a, i in zip(out_avals, inexact, strict=True)
    ]


def transpose(bind_with: BindWith, cts: list[Any], args: list[Any]) -> list[Any]:
    """The transpose rule: the cotangents of the undefined (linear) inputs."""
    undefined = tuple(ad.is_undefined_primal(x) for x in args)
    if all(type(c) is ad.Zero for c in cts):
        return [None] * len(args)
    cts = [ad.instantiate_zeros(c) for c in cts]
    defined = [x for x, u in zip(args, undefined, strict=True) if not u]
    out = iter(bind_with(("transpose", undefined), [*defined, *cts]))
    return [next(out) if u else None for u in undefined]


def batch(bind_with: BindWith, args: list[Any], dims: list[Any]) -> tuple[list, list]:
    """The batching rule: one call of the jaxpr mapped over a leading axis."""
    # An input that is not mapped has the batch dimension None.
    size = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None)
    args = [x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims, strict=True)]
    in_axes = tuple(None if d is None else 0 for d in dims)
    outs = bind_with(("batch", in_axes, size), args)
    return outs, [0] * len(outs)


def _is_live(tangent: Any) -> bool:
    """Whether a tangent can be nonzero (not a symbolic zero, nor of an integer input)."""
    return type(tangent) is not ad.Zero and jnp.result_type(tangent) != jax.dtypes.float0


def _is_inexact(aval: Any) -> bool:
    return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


@functools.lru_cache(maxsize=CACHE_SIZE)
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


@functools.lru_cache(maxsize=CACHE_SIZE)
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


@functools.lru_cache(maxsize=CACHE_SIZE)
def _batched_jaxpr(jaxpr: ClosedJaxpr, in_axes: tuple[int | None, ...], size: int) -> ClosedJaxpr:
    """The jaxpr mapped over a leading axis of size `size` of the inputs `in_axes` maps."""
    batched = jax.vmap(jaxpr_as_fun(jaxpr), in_axes=in_axes, axis_size=size)
    avals = [
        a if axis is None else a.update(shape=(size, *a.shape))
        for a, axis in zip(jaxpr.in_avals, in_axes, strict=True)
    ]
    return jax.make_jaxpr(batched)(*avals)


_BY_KIND = {"tangent": _tangent_jaxpr, "transpose": _transpose_jaxpr, "batch": _batched_jaxpr}


def forget() -> None:
    """Forget the transformed jaxprs."""
    for cache in (_tangent_jaxpr, _transpose_jaxpr, _batched_jaxpr):
        cache.cache_clear()
