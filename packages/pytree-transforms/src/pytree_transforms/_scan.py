"""`scan`: `jax.lax.scan` over any carry, optionally checkpointed for reverse mode."""

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from pytree_filter import is_array, path_text

from ._checkpointed_loop import checkpointed_loop
from ._errors import check_callable
from ._while_loop import (
    Carry,
    buffer_mask,
    check_count,
    check_kind,
    default_checkpoints,
    with_weak_type,
)

KINDS = ("lax", "checkpointed")


def _scan_length(xs_leaves: list[Any], length: int | None) -> int:
    lengths = {int(jnp.shape(x)[0]) for x in xs_leaves if jnp.ndim(x) > 0}
    if any(jnp.ndim(x) == 0 for x in xs_leaves):
        raise ValueError("scan: every array of `xs` needs a leading axis to scan over.")
    if length is not None:
        lengths.add(length)
    if len(lengths) != 1:
        raise ValueError(
            f"scan: the arrays of `xs` (and `length`, if given) must agree on the number of "
            f"steps, but they give {sorted(lengths) or 'none'}. Pass `length=` when `xs` is "
            "None."
        )
    return lengths.pop()


def _outputs(y: Any) -> Any:
    """`y`, after checking that its leaves are arrays."""
    pairs, _ = jax.tree_util.tree_flatten_with_path(y)
    for path, leaf in pairs:
        if not is_array(leaf):
            raise ValueError(
                f"scan: `f` returned {type(leaf).__name__} {leaf!r:.40} at {path_text(path)} "
                "of its per-step output `y`; every leaf of `y` must be an array, stacked "
                "over the steps. Return `jnp.asarray(...)` there, or keep it in the carry."
            )
    return y


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    *,
    kind: Literal["lax", "checkpointed"] = "lax",
    checkpoints: int | Literal["all"] | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    buffers: Callable[[Any], Any] | None = None,
) -> tuple[Any, Any]:
    """`jax.lax.scan` with any carry, and a checkpointed kind for reverse mode in bounded
    memory.

    The carry follows `jax.lax.scan`, with every `kind`: Python numbers in it are carried
    as weakly typed arrays, a weakly typed leaf takes the dtype the step gives it (`0.0`
    added to bfloat16 `xs` is carried as bfloat16), and the outputs are weakly typed where
    the step's are. Leaves that are neither arrays nor numbers (strings, functions) are
    static and must come back unchanged.

    Arguments:
        f: `(carry, x) -> (carry, y)`.
        init: the initial carry.
        xs: arrays with a leading axis of the number of steps, sliced one row per step; or
            None with `length`.
        length: the number of steps, when `xs` is None (else it must agree with `xs`).
        kind: `"lax"`: `jax.lax.scan`, whose reverse mode stores every step's residuals.
            `"checkpointed"`: reverse mode keeps only `checkpoints` copies of the carry and
            recomputes the steps in between (binomial checkpointing: the forward pass stores
            those of the backward pass's first sweep); the outputs `ys` are
            written into a preallocated array, not checkpointed. Forward-mode
            differentiable too (not reverse over forward), with symbolic-zero
            (co)tangents for the carry leaves the derivative does not reach.
        checkpoints: for `"checkpointed"`, the number of carries kept, the initial one
            included; by default the fewest with which the backward pass recomputes no step
            more than once (about `sqrt(2 * length)`). `"all"`: one a step, so none is
            recomputed (the memory of `kind="lax"`, with this kind's interface), as
            Equinox's.
        reverse: scan from the last row of `xs` to the first (and stack `ys` likewise).
        unroll: as for `jax.lax.scan`; `kind="lax"` only.
        buffers: `init -> pytree of array leaves of init`: large arrays of the carry that
            `f` fills in place, `buf.at[i].set(...)`, on the conditions of `while_loop`'s
            `buffers` (each location written at most once, read only after it was
            written). With `"checkpointed"` they are not copied into the checkpoints;
            `"lax"` only checks that they are leaves of the carry.

    Returns:
        `(final carry, ys)`, as `jax.lax.scan`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import scan
        >>> def total(xs):
        ...     step = lambda c, x: (c + x, c * x)
        ...     return scan(step, jnp.float32(0), xs, kind="checkpointed", checkpoints=2)
        >>> total(jnp.arange(4.0))
        (Array(6., dtype=float32), Array([0., 0., 2., 9.], dtype=float32))
        >>> jax.grad(lambda xs: total(xs)[1].sum())(jnp.arange(4.0))
        Array([6., 5., 4., 3.], dtype=float32)
    """
    caller = "scan"
    check_callable(f, caller, "f", spelling=f"{caller}({{}}, init, xs)")
    check_kind(kind, caller, KINDS)
    length = check_count(length, "length", caller, minimum=0)
    every_step = isinstance(checkpoints, str) and checkpoints == "all"
    if isinstance(checkpoints, str) and not every_step:
        raise ValueError(
            f'{caller}: `checkpoints` must be a positive int, "all" or None, but got '
            f'{checkpoints!r}. Pass e.g. `checkpoints=100`, or `checkpoints="all"` to keep '
            "every step's carry."
        )
    if not every_step:
        checkpoints = check_count(checkpoints, "checkpoints", caller, minimum=1)
    if kind != "lax" and unroll != 1:
        raise ValueError(
            f'{caller}: `unroll` applies to kind="lax" only; drop it for kind={kind!r}.'
        )
    carry = Carry(init, caller, "init")
    is_buffer = buffer_mask(carry, buffers, caller)
    xs_leaves, xs_def = jax.tree.flatten(xs)
    xs_leaves = [jnp.asarray(x) for x in xs_leaves]

    def step(arrays: list[Any], x: Any) -> tuple[list[Any], Any]:
        new_carry, y = f(carry.rebuild(arrays), x)
        return carry.split(new_carry, "f"), _outputs(y)

    if kind == "lax":
        arrays, ys = carry.run(
            lambda: lax.scan(step, carry.arrays, xs, length, reverse=reverse, unroll=unroll)
        )
        return carry.rebuild(arrays), ys

    steps = _scan_length(xs_leaves, length)
    x_example = xs_def.unflatten([jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs_leaves])
    # Traced once for the outputs' shapes, which also settles the carry's types (`Carry`).
    y_shapes = carry.run(lambda: jax.eval_shape(step, carry.arrays, x_example))[1]
    y_leaves, y_def = jax.tree.flatten(y_shapes)
    ys = [jnp.zeros((steps, *y.shape), y.dtype) for y in y_leaves]

    def outputs(arrays: list[Any], ys: list[Any]) -> tuple[Any, Any]:
        # As `lax.scan`'s, with the weak types of the step's outputs.
        ys = [with_weak_type(b, y.weak_type) for b, y in zip(ys, y_leaves, strict=True)]
        return carry.rebuild(carry.finish(arrays)), y_def.unflatten(ys)

    if steps == 0:
        return outputs(carry.arrays, ys)
    if every_step:
        checkpoints = steps
    elif checkpoints is None:
        checkpoints = default_checkpoints(steps, caller)

    # The carry's buffers go with the outputs `ys`: written in place, not checkpointed.
    def merge(state: list[Any], buffers: list[Any]) -> list[Any]:
        state_iter, buffer_iter = iter(state), iter(buffers)
        return [next(buffer_iter) if b else next(state_iter) for b in is_buffer]

    n_buffers = sum(is_buffer)

    def loop_step(state: list[Any], buffers: list[Any], x: list[Any]) -> Any:
        i, *arrays = state
        carry_buffers, ys = buffers[:n_buffers], buffers[n_buffers:]
        arrays, y = step(merge(arrays, carry_buffers), xs_def.unflatten(x))
        y = jax.tree.leaves(y)
        index = steps - 1 - i if reverse else i
        ys = [lax.dynamic_update_index_in_dim(b, v, index, 0) for b, v in zip(ys, y, strict=True)]
        new_state = [a for a, b in zip(arrays, is_buffer, strict=True) if not b]
        new_buffers = [a for a, b in zip(arrays, is_buffer, strict=True) if b]
        return [i + 1, *new_state], [*new_buffers, *ys]

    state, buffers = checkpointed_loop(
        loop_step,
        None,
        [jnp.int32(0), *(a for a, b in zip(carry.arrays, is_buffer, strict=True) if not b)],
        [*(a for a, b in zip(carry.arrays, is_buffer, strict=True) if b), *ys],
        xs_leaves,
        max_steps=steps,
        checkpoints=min(checkpoints, steps),
        reverse_xs=reverse,
    )
    return outputs(merge(state[1:], buffers[:n_buffers]), buffers[n_buffers:])
