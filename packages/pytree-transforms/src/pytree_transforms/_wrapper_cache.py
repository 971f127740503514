"""What lets a transform built again around the same function reuse its compilations.

Wrapping a function anew (in a loop, or `filter_jit(filter_grad(f))` built twice) must not
trace again. Two caches do this, and they differ in what they keep:

- `WrapperCache` (`filter_jit`) keeps whole wrappers, found by the function and options
  compared by value, so callables that compare equal (a bound method made again, a Module)
  share too. A wrapper holds its function, so it cannot be kept for as long as the function
  lives (the entry would keep the function alive): wrappers in use are found through weak
  references, and the last few looked up are kept besides.
- `shared_cache` (`filter_pmap`) keeps only the compilations, which hold the function weakly
  (`FunctionRef`), so they can live exactly as long as the function: keyed weakly by a plain
  function's identity (a callable pytree's class), they never expire while it lives and
  never keep it alive.

Neither can take the other's place without changing what is found: `WrapperCache` would
forget a pmap's compilations after a few other wrappers, and `shared_cache` cannot hold a
`filter_jit` wrapper (whose fast path keeps the function and its plans at hand) without
keeping the function alive.
"""

import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import jax

from ._method import is_pytree_leaf
from ._static_key import static_key

_Wrapper = TypeVar("_Wrapper")


class WrapperCache:
    """Wrappers made so far, by function and options, so that wrapping the same function
    again (in a loop, or `filter_jit(filter_grad(f))` built twice) reuses the wrapper and its
    compilations instead of tracing again.

    A wrapper stays findable while anything uses it, and the `RECENT` last looked up stay
    alive besides, so a wrapper made and dropped on every step of a loop is found again; older
    ones are released with their functions. Functions or options that cannot be hashed get a
    wrapper of their own every time.
    """

    RECENT = 32

    def __init__(self) -> None:
        self._live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._recent: OrderedDict[Any, Any] = OrderedDict()
        # Wrappers may be made from several threads; the recent list's moves must not
        # interleave (a key popped by one thread between another's store and move).
        self._lock = threading.Lock()

    def get(self, options: Any, build: Callable[[], _Wrapper]) -> _Wrapper:
        """The wrapper for `options` (the function, its options and the options passed on
        to JAX; compared by `static_key`), or a new one from `build()`."""
        try:
            key = static_key(options)
            wrapper = self._live.get(key)
        except (TypeError, ValueError):  # unhashable, or an `==` that does not give a bool
            return build()
        if wrapper is None:
            wrapper = build()
        with self._lock:
            wrapper = self._live.setdefault(key, wrapper)
            self._recent[key] = wrapper
            self._recent.move_to_end(key)
            if len(self._recent) > self.RECENT:
                self._recent.popitem(last=False)
        return wrapper

    def clear(self) -> None:
        """Forget every wrapper; wrappers already handed out keep working."""
        with self._lock:
            self._live.clear()
            self._recent.clear()


# function (or a callable pytree's class) -> {options key -> cache}. Weak in the function:
# its entries go when it does.
_SHARED: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()


def shared_cache(fun: Callable[..., Any], options: Any, make: Callable[[], Any]) -> Any:
    """The cache of compilations for `fun` with `options`, shared by every wrapper made
    around the same function with equal options, for as long as the function lives.

    Plain Python functions are shared by identity. A callable pytree (a Module, a bound
    method of one), which comes into each call with the arguments, its arrays traced and
    its structure in the static part, is shared by its class, so a new instance (the model
    after an update) finds the compilations of the last; they live as long as the class.
    For any other callable (a `functools.partial`, a callable object that is a leaf), or
    options that are not hashable once flattened, the caller gets a fresh `make()` of its
    own. What `make()` returns must not hold `fun` (strongly), or the entry would keep the
    function alive: pass the function to its compilations as `FunctionRef(fun)` instead.

    Arguments:
        fun: the wrapped function.
        options: a pytree of the wrapper's options that its compilations depend on; leaves
            are compared by type and value, so `1`, `1.0` and `True` are different options.
        make: builds an empty cache.

    Returns:
        The shared cache, or a fresh one when `fun` or `options` cannot key it.
    """
    owner: Any = fun
    if type(fun) is not types.FunctionType:
        if is_pytree_leaf(fun):  # a leaf: it would be held in the static part
            return make()
        owner = type(fun)
    leaves, treedef = jax.tree.flatten(options)
    key = (treedef, tuple((type(leaf), leaf) for leaf in leaves))
    try:
        hash(key)
    except TypeError:
        return make()
    per_options = _SHARED.get(owner)
    if per_options is None:
        per_options = _SHARED[owner] = {}
    cache = per_options.get(key)
    if cache is None:
        cache = per_options[key] = make()
    return cache


def clear_shared() -> None:
    """Forget every shared cache (see `shared_cache`)."""
    _SHARED.clear()


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
