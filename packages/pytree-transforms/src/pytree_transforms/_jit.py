"""`filter_jit`: `jax.jit` for functions of any pytrees, as fast as `jax.jit` itself."""

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from pytree_filter import is_array

from ._arguments import ArgumentSpecs
from ._jit_default import DefaultJitWrapper
from ._jit_wrapper import JitWrapper
from ._static_key import static_key

_DONATE = ("none", "all", "all-except-first", "warn")
# `jax.jit` options that depend on how the arguments are passed in.
_SHARDINGS = {"in_shardings", "out_shardings"}


def filter_jit(
    fun: Callable[..., Any] | None = None,
    *,
    donate: str = "none",
    default: Any = is_array,
    fn: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    out: Any = is_array,
    **jitkwargs: Any,
) -> Any:
    """`jax.jit` for functions of any pytrees: arrays are traced, everything else is static.

    Every array leaf of the arguments (and of `fun` itself, which may be a Module, a bound
    method or any callable pytree) is traced; every other leaf is held static, so it must be
    hashable, and a change in it retraces. Non-array outputs (strings, functions, Modules'
    static parts) are returned as they are. Calls never block: they return as soon as the
    computation is dispatched, like `jax.jit`.

    Arguments:
        fun: the function to compile. Omit it to get a decorator with these options.
        donate: `"none"`, `"all"` (donate every traced input buffer), `"all-except-first"`
            (all but those of the first argument), or `"warn"` (as `"all"`).
        default: the filter deciding what is traced in every argument without an override:
            `True`/`False`, a leaf predicate, or a prefix pytree of those.
        fn: the filter for `fun` itself (defaults to `default`).
        args: per-positional-argument overrides: a tuple of filters, one per argument.
        kwargs: per-parameter overrides, by parameter name; they apply whether the argument
            is passed by keyword or by position.
        out: the filter of the output: selected leaves come back as arrays, the rest as they
            were returned (they must not be tracers).
        **jitkwargs: passed on to `jax.jit`.

    Returns:
        The compiled function. Its `.lower(*args, **kwargs)` lowers ahead of time.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jit
        >>> @filter_jit
        ... def scale(x, factor, name):
        ...     return x * factor, name.upper()
        >>> scale(jnp.ones(2), 3, "done")
        (Array([3., 3.], dtype=float32), 'DONE')
        >>> @filter_jit(args=(True,))
        ... def traced(x):
        ...     return x + 1
        >>> traced(1)
        Array(2, dtype=int32, weak_type=True)
    """
    options = dict(donate=donate, default=default, fn=fn, args=args, kwargs=kwargs, out=out)
    if fun is None:
        return lambda f: filter_jit(f, **options, **jitkwargs)
    if not callable(fun):
        raise TypeError(f"filter_jit expects a callable to compile, got {fun!r}.")
    if donate not in _DONATE:
        raise ValueError(f"filter_jit(donate=...) must be one of {_DONATE}, got {donate!r}.")
    for name in ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames"):
        if name in jitkwargs:
            raise TypeError(
                f"filter_jit does not take {name}: non-array arguments are static already; "
                "choose what is traced with `args=`/`kwargs=`/`default=`, and donation with "
                "`donate=`."
            )

    def build() -> JitWrapper:
        fn_spec = default if fn is None else fn
        specs = ArgumentSpecs("filter_jit", fun, default, fn_spec, args, kwargs)
        plain = specs.trivial and default is is_array and out is is_array and donate == "none"
        if plain and not _SHARDINGS & set(jitkwargs):
            return DefaultJitWrapper(fun, specs, out, donate, jitkwargs)
        return JitWrapper(fun, specs, out, donate, jitkwargs)

    return _WRAPPERS.get((fun, options, jitkwargs), build)


class _WrapperCache:
    """The `filter_jit` wrappers made so far, by function and options, so that wrapping the
    same function again (in a loop, or `filter_jit(filter_grad(f))` built twice) reuses the
    wrapper and its compilations instead of tracing again.

    A wrapper stays findable while anything uses it, and the `_RECENT` last looked up stay
    alive besides, so a wrapper made and dropped on every step of a loop is found again; older
    ones are released with their functions. Functions or options that cannot be hashed get a
    wrapper of their own every time.
    """

    _RECENT = 32

    def __init__(self) -> None:
        self._live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._recent: OrderedDict[Any, JitWrapper] = OrderedDict()
        # Wrappers may be made from several threads; the recent list's moves must not
        # interleave (a key popped by one thread between another's store and move).
        self._lock = threading.Lock()

    def get(self, options: Any, build: Callable[[], JitWrapper]) -> JitWrapper:
        """The wrapper for `options` (the function, its options and jit options), or a new
        one from `build()`."""
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
            if len(self._recent) > self._RECENT:
                self._recent.popitem(last=False)
        return wrapper


_WRAPPERS = _WrapperCache()
