"""A loop that reverse-mode autodiff goes through in bounded memory: binomial checkpointing.

The forward pass is a `lax.while_loop` that counts its steps and saves its inputs and, when
`max_steps` bounds the loop, the checkpoints that the backward pass's first sweep would place
for `max_steps` steps (`_save_while_running`). The backward pass reverses the steps with
Griewank's treeverse ("revolve"): it keeps at most `checkpoints` carries on a stack of
fixed-size buffers, the initial one at the bottom, and at each iteration either takes the VJP
of one step at the newest checkpoint (when that is the step to reverse) and pops it, or
advances from the newest checkpoint and pushes the carry reached, at the position that
Griewank and Walther's rule picks (`_split`), which makes the fewest recomputations of any
schedule with that many checkpoints (less the first sweep, when the forward pass placed its
checkpoints).

References: A. Griewank, "Achieving logarithmic growth of temporal and spatial complexity in
reverse automatic differentiation", Optimization Methods and Software 1 (1992); A. Griewank
and A. Walther, "Algorithm 799: revolve", ACM TOMS 26 (2000).

Everything here works on flat lists of arrays; `_while_loop` and `_scan` turn pytrees into
those lists and back.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pytree_filter import is_inexact_array

from ._closure import filter_closure_convert

_INT_MAX = np.iinfo(np.int32).max

Step = Callable[[list[Any], list[Any], list[Any]], tuple[list[Any], list[Any]]]
Cond = Callable[[list[Any], list[Any]], Any]


def _split(steps: Any, slots: Any) -> Any:
    """Where to put the next checkpoint: `m` steps past the newest one, when `steps` (>= 2)
    steps remain to reverse from it and `slots` checkpoints (its own included) are free.

    Griewank and Walther's rule (Algorithm 799, `revolve`): with `r` the least repetition
    count such that binom(slots + r, slots) >= steps, the `m` it picks satisfies
    `steps - m <= binom(slots - 1 + r, slots - 1)` and `m <= binom(slots + r - 1, slots)`,
    and among those it is one that minimises the total number of recomputed steps.
    """
    steps = jnp.asarray(steps, jnp.int32)
    slots = jnp.asarray(slots, jnp.int32)

    def grow(betas: tuple[Any, ...]) -> tuple[Any, ...]:
        # binom(slots + r, slots) from binom(slots + r - 1, slots), exactly in int32: the
        # product is split so that only the final value, and never an intermediate one,
        # could overflow (and then saturates, which ends the search).
        r, b0, b1, b2, _ = betas
        r = r + 1
        factor = slots + r
        whole, rest = b0 // r, b0 % r
        extra = rest * factor // r
        saturate = whole > (_INT_MAX - extra) // factor
        return r, jnp.where(saturate, _INT_MAX, whole * factor + extra), b0, b1, b2

    # With one slot the answer is known (advance to the last step); skip the search.
    target = jnp.where(slots == 1, 0, steps)
    zero, one = jnp.int32(0), jnp.int32(1)
    _, b0, b1, b2, b3 = lax.while_loop(
        lambda betas: betas[1] < target, grow, (zero, one, zero, zero, zero)
    )
    # b0..b3 are binom(slots + k, slots) for k = r, r-1, r-2, r-3 (zero below k = 0); the
    # other binomials of the rule follow from Pascal's rule.
    bino1 = b1  # beta(slots, r - 1)
    bino2 = b1 - b2  # beta(slots - 1, r - 1)
    bino3 = bino2 - (b2 - b3)  # beta(slots - 2, r - 1)
    bino4 = b2  # beta(slots, r - 2)
    bino5 = jnp.where(slots >= 3, (b0 - b1) - bino2 - bino3, 0)  # beta(slots - 3, r)
    m = jnp.where(
        steps <= bino1 + bino3,
        bino4,
        jnp.where(steps >= b0 - bino5, bino1, steps - bino2 - bino3),
    )
    m = jnp.where(slots == 1, steps - 1, m)
    return jnp.clip(m, 1, jnp.maximum(steps - 1, 1))


def _merge(mask: Sequence[bool], chosen: list[Any], others: list[Any]) -> list[Any]:
    """Interleave two lists back into one, `chosen` where `mask` is true."""
    chosen_iter, others_iter = iter(chosen), iter(others)
    return [next(chosen_iter) if m else next(others_iter) for m in mask]


def _pick(mask: Sequence[bool], values: Sequence[Any]) -> list[Any]:
    return [v for v, m in zip(values, mask, strict=True) if m]


def _drop(mask: Sequence[bool], values: Sequence[Any]) -> list[Any]:
    return [v for v, m in zip(values, mask, strict=True) if not m]


def _zero_cotangent(x: Any, inexact: bool) -> Any:
    """The cotangent JAX expects for an input that gets none: zeros, or float0 for integers."""
    if inexact:
        return jnp.zeros_like(x)
    return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


def _empty_stack(state: list[Any], checkpoints: int) -> tuple[list[Any], Any]:
    """Room for `checkpoints` states and their step numbers, with `state` at step 0."""
    stack = [
        jnp.zeros((checkpoints, *jnp.shape(s)), jnp.result_type(s)).at[0].set(s) for s in state
    ]
    return stack, jnp.zeros((checkpoints,), jnp.int32)


def _push_if(
    flag: Any, stack: tuple[list[Any], Any], top: Any, state: list[Any], position: Any
) -> tuple[list[Any], Any]:
    """`stack` with `state`, at step `position`, stored in slot `top` where `flag` holds.

    Done as a write of that slot in every case (of its own value where `flag` is false),
    outside any `lax.cond`: XLA then updates the stack in place, where a `cond` returning it
    would copy it at every iteration.
    """
    states, positions = stack
    checkpoints = positions.shape[0]
    slot = jnp.minimum(top, checkpoints - 1)
    states = [
        lax.dynamic_update_index_in_dim(
            s, jnp.where(flag, v, lax.dynamic_index_in_dim(s, slot, keepdims=False)), slot, 0
        )
        for s, v in zip(states, state, strict=True)
    ]
    positions = positions.at[slot].set(jnp.where(flag, position, positions[slot]))
    return states, positions


def _save_while_running(
    i: Any, state: list[Any], saved: list[Any], max_steps: int, checkpoints: int
) -> list[Any]:
    """Store the state at step `i` if the backward pass's first sweep, for a loop of
    `max_steps` steps, would checkpoint it; returns the new `(stack, top, next_to_save)`."""
    stack, top, next_to_save = saved
    save = (i == next_to_save) & (top < checkpoints)
    stack = _push_if(save, stack, top, state, i)
    top = jnp.where(save, top + 1, top)
    remaining = max_steps - i

    def following() -> Any:
        return i + _split(remaining, checkpoints - top + 1)

    # The split is worked out only at the steps saved, not at every step.
    next_to_save = lax.cond(save & (remaining > 1), following, lambda: next_to_save)
    return [stack, top, next_to_save]


def checkpointed_loop(
    step: Step,
    cond: Cond | None,
    state: list[Any],
    buffers: list[Any],
    xs: list[Any],
    *,
    max_steps: int | None,
    checkpoints: int,
    reverse_xs: bool = False,
) -> tuple[list[Any], list[Any]]:
    """Run `state, buffers = step(state, buffers, x_i)` while `cond(state, buffers)` holds (and
    fewer than `max_steps` steps ran), reverse-mode differentiably in bounded memory.

    `x_i` is `[x[i] for x in xs]` (`x[max_steps - 1 - i]` with `reverse_xs`); `xs` needs
    `max_steps`. Only `state` is checkpointed; `buffers` are written in place by `step`, each
    location at most once, and read only where written. `step` and `cond` may close over
    arrays: those get gradients (`step`'s) or none (`cond`'s).

    Returns the final `(state, buffers)`.
    """
    x_example = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs]
    step_converted = filter_closure_convert(step, state, buffers, x_example)
    step_consts, step_def = jax.tree.flatten(step_converted)
    if cond is None:
        cond_consts, cond_def = [], None
    else:
        cond_converted = filter_closure_convert(cond, state, buffers)
        cond_consts, cond_def = jax.tree.flatten(cond_converted)
        cond_consts = [lax.stop_gradient(c) for c in cond_consts]

    groups = (state, buffers, xs, step_consts, cond_consts)
    sizes = [len(g) for g in groups]

    def ungroup(values: Sequence[Any]) -> list[list[Any]]:
        out, start = [], 0
        for size in sizes:
            out.append(list(values[start : start + size]))
            start += size
        return out

    inputs = [leaf for group in groups for leaf in group]
    # Which inputs get a cotangent: floating-point ones, except what `cond` closes over.
    # Decided here, on the inputs themselves: inside the backward pass the residuals of
    # weakly typed inputs may have lost what tells their dtype.
    inexact = [is_inexact_array(x) for x in inputs]
    wants = inexact[: sum(sizes[:4])] + [False] * sizes[4]
    state_mask, buffer_mask, xs_mask, consts_mask, _ = ungroup(inexact)

    def x_at(xs: list[Any], i: Any) -> list[Any]:
        index = max_steps - 1 - i if reverse_xs else i
        return [lax.dynamic_index_in_dim(x, index, keepdims=False) for x in xs]

    def run_step(consts: list[Any], state: list[Any], buffers: list[Any], x: list[Any]) -> Any:
        return jax.tree.unflatten(step_def, consts)(state, buffers, x)

    def forward(inputs: list[Any], saving: bool) -> tuple[Any, ...]:
        """The loop; with `saving`, also the checkpoints of the backward pass's first sweep
        (see `_save_while_running`): `(count, state, buffers[, stack, top])`."""
        state, buffers, xs, step_consts, cond_consts = ungroup(inputs)

        def keep_going(carry: tuple[Any, ...]) -> Any:
            i, state, buffers = carry[:3]
            going = jnp.bool_(True) if max_steps is None else i < max_steps
            if cond_def is not None:
                going = going & jax.tree.unflatten(cond_def, cond_consts)(state, buffers)
            return going

        def advance(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            i, state, buffers, *saved = carry
            if saving:
                saved = _save_while_running(i, state, saved, max_steps, checkpoints)
            state, buffers = run_step(step_consts, state, buffers, x_at(xs, i))
            return i + 1, state, buffers, *saved

        carry: tuple[Any, ...] = (jnp.int32(0), state, buffers)
        if saving:
            first = _split(max_steps, checkpoints) if max_steps > 1 else max_steps
            carry += (_empty_stack(state, checkpoints), jnp.int32(1), jnp.int32(first))
        out = lax.while_loop(keep_going, advance, carry)
        return out[:5]

    # Checkpoints are placed during the forward pass when the loop's length is bounded: where
    # the backward pass would put them for a loop of `max_steps` steps. A loop that stops
    # earlier keeps those before its end, and the backward pass places the others.
    saving = max_steps is not None and checkpoints > 1

    @jax.custom_vjp
    def loop(inputs: list[Any]) -> tuple[Any, ...]:
        return forward(inputs, saving=False)

    def loop_fwd(inputs: list[Any]) -> tuple[Any, tuple[Any, ...]]:
        out = forward(inputs, saving)
        count, _, final_buffers, *saved = out
        return out[:3], (inputs, count, final_buffers, *saved)

    def loop_bwd(residuals: tuple[Any, ...], cotangents: Any) -> tuple[list[Any]]:
        inputs, count, final_buffers, *saved = residuals
        _, ct_state, ct_buffers = cotangents
        state, _, xs, step_consts, _ = ungroup(inputs)

        def reverse_one(position: Any, state: list[Any], cts: tuple[Any, ...]) -> Any:
            """The VJP of the step at `position`, from `state`: the cotangents before it."""
            ct_state, ct_buffers, ct_xs, ct_consts = cts
            x = x_at(xs, position)

            # Reads of the buffers see their final values: each location read was written
            # before this step and never again. Writes have VJPs that do not depend on the
            # values overwritten.
            def differentiable_step(d_state: Any, d_buffers: Any, d_x: Any, d_consts: Any) -> Any:
                out_state, out_buffers = run_step(
                    _merge(consts_mask, d_consts, _drop(consts_mask, step_consts)),
                    _merge(state_mask, d_state, _drop(state_mask, state)),
                    _merge(buffer_mask, d_buffers, _drop(buffer_mask, final_buffers)),
                    _merge(xs_mask, d_x, _drop(xs_mask, x)),
                )
                return _pick(state_mask, out_state), _pick(buffer_mask, out_buffers)

            primals = (
                _pick(state_mask, state),
                _pick(buffer_mask, final_buffers),
                _pick(xs_mask, x),
                _pick(consts_mask, step_consts),
            )
            _, vjp = jax.vjp(differentiable_step, *primals)
            ct_state, ct_buffers, ct_x, ct_step_consts = vjp((ct_state, ct_buffers))
            index = max_steps - 1 - position if reverse_xs else position
            ct_xs = [
                lax.dynamic_update_index_in_dim(c, u, index, 0)
                for c, u in zip(ct_xs, ct_x, strict=True)
            ]
            ct_consts = [a + b for a, b in zip(ct_consts, ct_step_consts, strict=True)]
            return ct_state, ct_buffers, ct_xs, ct_consts

        def recompute(state: list[Any], start: Any, count: Any) -> list[Any]:
            """The state `count` steps after the one at step `start`."""

            def body(j: Any, state: list[Any]) -> list[Any]:
                return run_step(step_consts, state, final_buffers, x_at(xs, start + j))[0]

            return lax.fori_loop(0, count, body, state)

        def backward_step(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            target, top, positions, stack, cts = carry
            newest = top - 1
            position = positions[newest]
            state = [lax.dynamic_index_in_dim(s, newest, keepdims=False) for s in stack]
            remaining = target + 1 - position
            slots = checkpoints - newest

            def advance_branch(state: list[Any]) -> tuple[list[Any], Any]:
                advance = _split(remaining, slots)
                return recompute(state, position, advance), advance

            # Most iterations reverse the step at the newest checkpoint: they skip the split
            # and the recomputation loop altogether.
            state, advance = lax.cond(
                remaining > 1, advance_branch, lambda state: (state, jnp.int32(0)), state
            )
            reached = position + advance

            reverse = reached == target
            cts = lax.cond(
                reverse,
                lambda cts, state: reverse_one(target, state, cts),
                lambda cts, state: cts,
                cts,
                state,
            )
            push = ~reverse
            stack, positions = _push_if(push, (stack, positions), top, state, reached)
            # A checkpoint at the reversed step is no longer needed.
            top = jnp.where(push, top + 1, jnp.where(advance == 0, top - 1, top))
            return jnp.where(reverse, target - 1, target), top, positions, stack, cts

        if saved:
            (stack, positions), top = saved
            # Only the checkpoints before the last step taken are of use.
            used = (jnp.arange(checkpoints) < top) & (positions < count)
            top = jnp.sum(used, dtype=jnp.int32)
        else:
            (stack, positions), top = _empty_stack(state, checkpoints), jnp.int32(1)
        cts = (
            _pick(state_mask, ct_state),
            _pick(buffer_mask, ct_buffers),
            [jnp.zeros_like(x) for x in _pick(xs_mask, xs)],
            [jnp.zeros_like(c) for c in _pick(consts_mask, step_consts)],
        )
        carry = (count - 1, top, positions, stack, cts)
        *_, cts = lax.while_loop(lambda carry: carry[0] >= 0, backward_step, carry)
        ct_state, ct_buffers, ct_xs, ct_consts = cts
        computed = [
            *_merge(state_mask, ct_state, [None] * (len(state) - sum(state_mask))),
            *_merge(buffer_mask, ct_buffers, [None] * (len(buffer_mask) - sum(buffer_mask))),
            *_merge(xs_mask, ct_xs, [None] * (len(xs) - sum(xs_mask))),
            *_merge(consts_mask, ct_consts, [None] * (len(step_consts) - sum(consts_mask))),
        ]
        computed += [None] * sizes[4]
        out = [
            c if w else _zero_cotangent(x, i)
            for c, w, x, i in zip(computed, wants, inputs, inexact, strict=True)
        ]
        return (out,)

    loop.defvjp(loop_fwd, loop_bwd)
    _, final_state, final_buffers = loop(inputs)
    return final_state, final_buffers
