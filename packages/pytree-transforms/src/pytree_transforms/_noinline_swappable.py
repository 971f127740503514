"""`noinline(fn, abstract_fn)`: noinline functions that a compiled caller can swap for one
another without compiling again.

Which function runs is an input of the call, not a part of the caller's program: the
wrapper is a pytree whose leaf is the function's number in a registry (and whose other
leaves are the function's arrays), so two wrappers with the same `abstract_fn` have the same
structure, and a jitted caller given either one runs the same compiled program. The caller
learns the shapes of the outputs from `abstract_fn`; the call is a primitive,
`noinline_dispatch`, that lowers to a host callback which looks the function up by its
number, traces and compiles it (once per function and input shapes) and runs it. The
transforms are recorded on the call (`_noinline_transforms`) and applied to the jaxpr of
the function it picks, as to the jaxpr of `abstract_fn` for the output shapes.
"""

import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from pytree_filter import combine, is_array, partition

from . import _noinline_transforms as rules
from ._noinline_trace import (
    Call,
    Traced,
    executable,
    lower_as_callback,
    rebuild_output,
    split_call,
    trace,
)
from ._noinline_transforms import transformed

# The static parts of the functions, by number; a function keeps its number for the life of
# the process, so a compiled caller can run it whenever it is given that number.
_functions: list[Any] = []
_numbers: dict[Any, int] = {}
_lock = threading.Lock()


def _number(static: Any) -> int:
    """The number of a function's static part, given one the first time it is seen."""
    leaves, treedef = jax.tree.flatten(static)
    try:
        key = (treedef, tuple(leaves))
        hash(key)
    except TypeError:
        raise TypeError(
            "noinline: with `abstract_fn`, the function must be hashable (its parts that are "
            f"not arrays, here {static!r:.60}, identify it). Pass a function or a Module."
        ) from None
    with _lock:
        if key not in _numbers:
            _numbers[key] = len(_functions)
            _functions.append(static)
        return _numbers[key]


class _Abstract:
    """Traces `abstract_fn(fn's arrays, *args, **kwargs)`: the outputs' shapes and dtypes."""

    def __init__(self, abstract_fn: Callable[..., Any]):
        self.abstract_fn = abstract_fn

    def __call__(self, dynamic: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        return self.abstract_fn(dynamic, *args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Abstract and self.abstract_fn == other.abstract_fn

    def __hash__(self) -> int:
        return hash((_Abstract, self.abstract_fn))


class _Concrete:
    """Traces the function itself: its arrays put back into its static part."""

    def __init__(self, static: Any):
        self.static = static

    def __call__(self, dynamic: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        return combine(dynamic, self.static)(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Concrete and self.static is other.static

    def __hash__(self) -> int:
        return id(self.static)


class Swappable:
    """The function `noinline(fn, abstract_fn)` returns. It takes its name and docstring
    from `abstract_fn`, which the functions it can be swapped with share, so that they are
    pytrees of the same structure."""

    def __init__(self, fun: Callable[..., Any], abstract_fn: Callable[..., Any]):
        dynamic, static = partition(fun, is_array)
        self._number = np.int32(_number(static))
        self._dynamic = dynamic
        self._abstract_fn = abstract_fn
        functools.update_wrapper(self, abstract_fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call, arrays = split_call((self._dynamic, args, kwargs))
        abstract = trace(call, _Abstract(self._abstract_fn))
        outs = []
        if abstract.jaxpr.out_avals:
            outs = _dispatch_p.bind(
                self._number, *arrays, call=call, abstract=abstract, transforms=()
            )
        return rebuild_output(abstract, outs)


def _flatten(wrapper: Swappable) -> tuple[tuple[Any, ...], Any]:
    return (wrapper._number, wrapper._dynamic), wrapper._abstract_fn


def _unflatten(abstract_fn: Callable[..., Any], children: tuple[Any, ...]) -> Swappable:
    wrapper = object.__new__(Swappable)
    wrapper._number, wrapper._dynamic = children
    wrapper._abstract_fn = abstract_fn
    functools.update_wrapper(wrapper, abstract_fn, updated=())
    return wrapper


jax.tree_util.register_pytree_node(Swappable, _flatten, _unflatten)


# The primitive: its first operand is the function's number; its parameters, the call
# (static leaves, input shapes), the trace of `abstract_fn` and the transforms applied.

_dispatch_p = Primitive("noinline_dispatch")
_dispatch_p.multiple_results = True


def _run(call: Call, abstract: Traced, transforms: tuple, number: Any, *args: Any) -> Any:
    """On the host: the picked function, traced for `call`, transformed and run."""
    static = _functions[int(np.asarray(number).reshape(-1)[0])]
    traced = trace(call, _Concrete(static))
    found = (traced.out_def, traced.out_dynamic, traced.out_static, traced.jaxpr.out_avals)
    expected = (abstract.out_def, abstract.out_dynamic, abstract.out_static)
    if found != (*expected, abstract.jaxpr.out_avals):
        raise ValueError(
            f"noinline: the function called returns {traced.out_def} with arrays "
            f"{list(traced.jaxpr.out_avals)}, but its `abstract_fn` said {abstract.out_def} "
            f"with arrays {list(abstract.jaxpr.out_avals)}. Every function sharing an "
            "`abstract_fn` must return what it returns, for the same inputs."
        )
    return executable(transformed(traced.jaxpr, transforms))(*args)


def _impl(number: Any, *args: Any, call: Call, abstract: Traced, transforms: tuple) -> Any:
    return _run(call, abstract, transforms, number, *args)


def _abstract_eval(*avals: Any, call: Call, abstract: Traced, transforms: tuple) -> Any:
    del avals, call
    return transformed(abstract.jaxpr, transforms).out_avals


def _lower(ctx: Any, *args: Any, call: Call, abstract: Traced, transforms: tuple) -> Any:
    return lower_as_callback(ctx, functools.partial(_run, call, abstract, transforms), args)


def _bind_with(number: Any, call: Call, abstract: Traced, transforms: tuple) -> Any:
    def bind(transform: Any, operands: list[Any]) -> list[Any]:
        return _dispatch_p.bind(
            number, *operands, call=call, abstract=abstract, transforms=(*transforms, transform)
        )

    return bind


def _jvp(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[list, list]:
    number, *rest = primals
    outs = _dispatch_p.bind(*primals, **params)
    out_avals = _abstract_eval(**params)
    return rules.jvp(_bind_with(number, **params), out_avals, rest, outs, list(tangents[1:]))


def _transpose(cts: list[Any], number: Any, *args: Any, **params: Any) -> list[Any]:
    return [None, *rules.transpose(_bind_with(number, **params), cts, list(args))]


def _batch(args: list[Any], dims: list[Any], **params: Any) -> tuple[list, list]:
    if dims[0] is not None:
        raise ValueError(
            "noinline: a call cannot be mapped over which function runs (the wrappers of "
            "several functions stacked by vmap): call each function in its own vmap, or "
            "pick one outside the mapped function."
        )
    return rules.batch(_bind_with(args[0], **params), list(args[1:]), list(dims[1:]))


_dispatch_p.def_impl(_impl)
_dispatch_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[_dispatch_p] = _jvp
ad.primitive_transposes[_dispatch_p] = _transpose
batching.primitive_batchers[_dispatch_p] = _batch
mlir.register_lowering(_dispatch_p, _lower)
