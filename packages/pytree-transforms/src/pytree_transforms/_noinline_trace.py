"""What a `noinline` call traces its function for, and the trace: the jaxpr of the
function's array inputs and outputs, cached per call, and the jaxpr's own executable."""

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
from jax.interpreters import mlir

from pytree_filter import is_array

from ._errors import describe_leaf
from ._noinline_transforms import CACHE_SIZE
from ._static_key import KeyedStatics


def unhashable(tree: tuple[Any, ...], leaves: list[Any]) -> TypeError:
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


def split_call(tree: tuple[Any, Any, Any]) -> tuple["Call", list[Any]]:
    """The `Call` for `(fn, args, kwargs)` and its array leaves, the inputs of the call."""
    leaves, treedef = jax.tree.flatten(tree)
    dynamic = tuple(i for i, leaf in enumerate(leaves) if is_array(leaf))
    static = tuple(leaf for leaf in leaves if not is_array(leaf))
    try:
        statics = KeyedStatics(static)
    except TypeError:
        raise unhashable(tree, leaves) from None
    arrays = [leaves[i] for i in dynamic]
    return Call(treedef, dynamic, statics, tuple(jax.typeof(x) for x in arrays)), arrays


def rebuild_output(traced: "Traced", outs: list[Any]) -> Any:
    """The function's output: the call's array outputs `outs`, its other leaves as traced."""
    full = list(traced.out_static)
    for i, x in zip(traced.out_dynamic, outs, strict=True):
        full[i] = x
    return traced.out_def.unflatten(full)


class Call:
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
            type(other) is Call
            and self.treedef == other.treedef
            and self.dynamic == other.dynamic
            and self.statics == other.statics
            and self.avals == other.avals
        )


class Traced:
    """`fn` traced for one `Call`: its jaxpr, and how to rebuild its output."""

    __slots__ = ("jaxpr", "out_def", "out_dynamic", "out_static")

    def __init__(self, jaxpr: ClosedJaxpr, out_def: Any, out_dynamic, out_static):
        self.jaxpr = jaxpr
        self.out_def = out_def
        self.out_dynamic = out_dynamic
        self.out_static = out_static


def call_function(fun: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fun(*args, **kwargs)


@functools.lru_cache(maxsize=CACHE_SIZE)
def trace(call: Call, target: Callable[..., Any] = call_function) -> Traced:
    """Trace `target(fn, args, kwargs)` (by default `fn(*args, **kwargs)`), the leaves of
    `(fn, args, kwargs)` being those `call` gives, to a jaxpr of its array inputs and
    outputs. `target` is hashable, and equal for targets that trace alike."""
    output: list[Any] = []

    def body(*arrays: Any) -> list[Any]:
        full: list[Any] = []
        static = iter(call.statics.values)
        array = iter(arrays)
        dynamic = set(call.dynamic)
        for i in range(call.treedef.num_leaves):
            full.append(next(array) if i in dynamic else next(static))
        fun, args, kwargs = call.treedef.unflatten(full)
        out_leaves, out_def = jax.tree.flatten(target(fun, args, kwargs))
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
    return Traced(jaxpr, out_def, out_dynamic, out_static)


@functools.lru_cache(maxsize=CACHE_SIZE)
def executable(jaxpr: ClosedJaxpr) -> Callable[..., Any]:
    """The jaxpr as a jitted function: traced from the jaxpr, compiled on first use."""
    return jax.jit(jaxpr_as_fun(jaxpr))


def lower_as_callback(ctx: Any, callback: Callable[..., Any], args: Any) -> Any:
    """Lower a call to a host callback that runs `callback` on the host buffers as they
    are: it runs its executable on JAX's default device (`jax.pure_callback` would copy
    every argument to a CPU device first, and run it there)."""
    results, _, keepalive = mlir.emit_python_callback(
        ctx, callback, None, list(args), ctx.avals_in, ctx.avals_out, has_side_effect=False
    )
    ctx.module_context.add_keepalive(keepalive)
    return results
