"""Compilation caches shared by the wrappers made around one function with equal options."""

import types
import weakref
from collections.abc import Callable
from typing import Any

import jax

# function -> {options key -> cache}. Weak in the function: its entries go when it does.
_SHARED: weakref.WeakKeyDictionary[Callable[..., Any], dict[Any, Any]] = weakref.WeakKeyDictionary()


def shared_cache(fun: Callable[..., Any], options: Any, make: Callable[[], Any]) -> Any:
    """The cache of compilations for `fun` with `options`, shared by every wrapper made
    around the same function with equal options, for as long as the function lives.

    Only plain Python functions are shared, by identity. For any other callable (a bound
    method, a `functools.partial`, a callable object), or options that are not hashable
    once flattened, the caller gets a fresh `make()` of its own. What `make()` returns
    must not hold `fun` (strongly), or the entry would keep the function alive: pass the
    function to its compilations as `FunctionRef(fun)` instead.

    Arguments:
        fun: the wrapped function.
        options: a pytree of the wrapper's options that its compilations depend on; leaves
            are compared by type and value, so `1`, `1.0` and `True` are different options.
        make: builds an empty cache.

    Returns:
        The shared cache, or a fresh one when `fun` or `options` cannot key it.
    """
    if type(fun) is not types.FunctionType:
        return make()
    leaves, treedef = jax.tree.flatten(options)
    key = (treedef, tuple((type(leaf), leaf) for leaf in leaves))
    try:
        hash(key)
    except TypeError:
        return make()
    per_options = _SHARED.get(fun)
    if per_options is None:
        per_options = _SHARED[fun] = {}
    cache = per_options.get(key)
    if cache is None:
        cache = per_options[key] = make()
    return cache


class FunctionRef:
    """A function held weakly, equal to another `FunctionRef` of the same function: its
    stand-in in a static compilation key, so that the compilations do not keep it alive.
    Call it to get the function back."""

    __slots__ = ("_hash", "_ref")

    def __init__(self, fun: Callable[..., Any]):
        self._ref = weakref.ref(fun)
        self._hash = hash(fun)

    def __call__(self) -> Callable[..., Any] | None:
        return self._ref()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return type(other) is FunctionRef and self._ref == other._ref
