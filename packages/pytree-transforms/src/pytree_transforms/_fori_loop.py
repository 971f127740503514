"""`fori_loop`: `jax.lax.fori_loop` over any carry, with the kinds of `while_loop`."""

from collections.abc import Callable
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import Tracer

from ._checkpointed_loop import checkpointed_loop
from ._errors import check_callable
from ._while_loop import (
    KINDS,
    Carry,
    _checkpointed,
    _lax_loop,
    bounded_loop,
    check_count,
    check_kind,
    default_checkpoints,
)


def _index_dtype(lower: Any, upper: Any, caller: str) -> Any:
    """The dtype of the loop index, as `jax.lax.fori_loop` picks it: the bounds' dtype; of
    two signed integer dtypes, the strongly typed bound's (a Python int is weakly typed)."""
    dtypes = []
    for name, bound in (("lower", lower), ("upper", upper)):
        if isinstance(bound, bool) or not (
            isinstance(bound, int)
            or (np.ndim(bound) == 0 and np.issubdtype(getattr(bound, "dtype", None), np.integer))
        ):
            raise TypeError(
                f"{caller}: `{name}` must be an integer scalar (a Python int or an integer "
                f"array of shape ()), got {type(bound).__name__} {bound!r:.60}. The loop runs "
                f"i = lower, ..., upper - 1: {caller}(0, n, body_fun, init_val)."
            )
        dtypes.append((jnp.asarray(bound).dtype, isinstance(bound, int)))
    (low, low_weak), (up, up_weak) = dtypes
    if low == up:
        return low
    signed = np.issubdtype(low, np.signedinteger) and np.issubdtype(up, np.signedinteger)
    if signed and low_weak != up_weak:
        return up if low_weak else low
    raise TypeError(
        f"{caller}: `lower` and `upper` must have the same dtype, got {low} and {up}. Cast "
        f"one, e.g. `upper.astype(jnp.{low})`."
    )


def fori_loop(
    lower: Any,
    upper: Any,
    body_fun: Callable[[Any, Any], Any],
    init_val: Any,
    *,
    unroll: int | bool | None = None,
    kind: Literal["lax", "checkpointed", "bounded"] = "lax",
    checkpoints: int | None = None,
    max_steps: int | None = None,
) -> Any:
    """`jax.lax.fori_loop` over any pytree, with the kinds of `while_loop`.

    Runs `val = body_fun(i, val)` for `i = lower, ..., upper - 1`. As `jax.lax.fori_loop`:
    when both bounds are known at trace time (Python ints, or arrays that are not traced)
    the loop is a scan of `upper - lower` steps, reverse-mode differentiable with every
    `kind`, and `i` is a weakly typed int32; when a bound is traced the loop is a while
    loop, and `kind` says how it is differentiated (as `while_loop`'s), `i` having the
    bounds' dtype. The carry follows `jax.lax`: Python numbers in it are carried as weakly
    typed arrays, a weakly typed leaf that the body returns with another dtype (a `0.0`
    that the body adds bfloat16 values to) takes that dtype, and the other non-array
    leaves (strings, functions) are static and must come back unchanged.

    Arguments:
        lower: the first index: a Python int or an integer array of shape ().
        upper: the index after the last, likewise (the same dtype as `lower`, unless one
            of them is a Python int).
        body_fun: `(i, carry) -> carry`.
        init_val: the initial carry.
        unroll: with known bounds and `kind="lax"`, as `jax.lax.fori_loop`'s.
        kind: `"lax"`: `jax.lax.fori_loop` (with traced bounds, not reverse-mode
            differentiable). `"checkpointed"`: reverse-mode differentiable in memory
            bounded by `checkpoints` copies of the carry (not forward-mode); with traced
            bounds it needs `checkpoints` or `max_steps`. `"bounded"`: with traced bounds,
            nested scans of `max_steps` steps in all (required), differentiable in both
            modes; with known bounds the same scan as `"lax"`.
        checkpoints: for `"checkpointed"`, as `while_loop`'s.
        max_steps: stop after this many steps even if `i` has not reached `upper`.

    Returns:
        The final carry.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import fori_loop
        >>> def power(x):
        ...     n, y = fori_loop(0, 3, lambda i, c: (c[0] + 1, c[1] * x), (0, 1.0),
        ...                      kind="checkpointed")
        ...     return y
        >>> power(2.0), jax.grad(power)(2.0)
        (Array(8., dtype=float32, weak_type=True), Array(12., dtype=float32, weak_type=True))
    """
    caller = "fori_loop"
    check_callable(body_fun, caller, "body_fun", spelling=f"{caller}(lower, upper, {{}}, init_val)")
    check_kind(kind, caller, KINDS)
    checkpoints = check_count(checkpoints, "checkpoints", caller, minimum=1)
    max_steps = check_count(max_steps, "max_steps", caller, minimum=0)
    dtype = _index_dtype(lower, upper, caller)
    carry = Carry(init_val, caller)

    def step(state: list[Any]) -> list[Any]:
        i, *arrays = state
        return [i + 1, *carry.split(body_fun(i, carry.rebuild(arrays)), "body_fun")]

    known = not isinstance(lower, Tracer) and not isinstance(upper, Tracer)
    unrolled = unroll is not None and unroll is not False and unroll != 1
    if unrolled and (not known or kind != "lax"):
        where = 'kind="lax"' if known else "bounds known at trace time"
        raise ValueError(
            f"{caller}: `unroll` applies to loops with {where} only; drop it, or "
            + ("use kind='lax'." if known else "pass Python ints as `lower`, `upper`.")
        )
    if known:
        steps = max(int(upper) - int(lower), 0)
        if max_steps is not None:
            steps = min(steps, max_steps)

        def loop() -> list[Any]:
            # The index starts as a Python int, weakly typed, as in `jax.lax.fori_loop`.
            state = [jnp.asarray(int(lower)), *carry.arrays]
            if kind == "checkpointed" and steps > 0:
                count = min(checkpoints or default_checkpoints(steps, caller), steps)
                return checkpointed_loop(
                    lambda s, b, _: (step(s), b),
                    None,
                    state,
                    [],
                    [],
                    max_steps=steps,
                    checkpoints=count,
                )[0]
            scanned = lax.scan(
                lambda s, _: (step(s), None), state, length=steps, unroll=unroll or False
            )
            return scanned[0]

    else:
        if kind == "bounded" and max_steps is None:
            raise ValueError(
                f'{caller}: kind="bounded" with traced bounds needs `max_steps`: it unrolls '
                "the loop to that many steps. Pass `max_steps=` (an int), or bounds known "
                "at trace time (Python ints)."
            )
        if kind == "checkpointed" and checkpoints is None:
            checkpoints = default_checkpoints(max_steps, caller)
        # A bound of the index's dtype is used as it is: a Python int `lower` makes a
        # weakly typed index, as in `jax.lax.fori_loop`.
        first, last = (
            jnp.asarray(b) if jnp.result_type(b) == dtype else lax.convert_element_type(b, dtype)
            for b in (lower, upper)
        )

        def loop() -> list[Any]:
            state = [first, *carry.arrays]
            going = lambda s: s[0] < last  # noqa: E731
            if kind == "lax":
                return _lax_loop(going, step, state, max_steps)
            if kind == "bounded":
                return bounded_loop(going, step, state, max_steps)
            no_buffers = [False] * len(state)
            return _checkpointed(going, step, state, no_buffers, max_steps, checkpoints)

    return carry.rebuild(carry.finish(carry.run(loop)[1:]))
