"""`filter_jit`: `jax.jit` for functions of any pytrees, as fast as `jax.jit` itself."""

from collections.abc import Callable
from typing import Any

from pytree_filter import is_array

from ._arguments import ArgumentSpecs
from ._jit_direct import _DirectJitWrapper
from ._jit_wrapper import JitWrapper

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
    specs = ArgumentSpecs("filter_jit", fun, default, default if fn is None else fn, args, kwargs)
    if specs.trivial and donate == "none" and out is is_array and not _SHARDINGS & set(jitkwargs):
        return _DirectJitWrapper(fun, specs, out, donate, jitkwargs)
    return JitWrapper(fun, specs, out, donate, jitkwargs)
