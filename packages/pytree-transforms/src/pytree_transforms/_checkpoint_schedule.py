"""Where a checkpointed loop keeps its checkpoints: while it runs, and while the backward
pass reverses it.

While it runs, a loop whose number of steps is known (a scan, a `fori_loop`) stores the
checkpoints that the backward pass's first sweep would place (`place_offline`). A
`while_loop` does not know how many steps it will take, so it places them online
(`place_online`): Stumm and Walther's Algorithm I while the number of steps is below
`binom(checkpoints + 2, 2) - 1`, which is as good as knowing the length in advance (no step
is recomputed more than twice), and Wang and Moin's dynamic checkpointing after that.

The backward pass knows the length: between the checkpoints it finds, it places new ones by
Griewank and Walther's binomial rule (`binomial_split`), the fewest recomputations for the
slots left.

The checkpoints live on a stack of fixed-size arrays with one spare slot (`empty_stack`,
`push_if`): a write that is not wanted goes to the spare slot, so that XLA can update the
stack in place inside a loop.

References: P. Stumm and A. Walther, "New algorithms for optimal online checkpointing",
SIAM J. Sci. Comput. 32 (2010); Q. Wang, P. Moin and G. Iaccarino, "Minimal repetition
dynamic checkpointing algorithm for unsteady adjoint calculation", SIAM J. Sci. Comput. 31
(2009); A. Griewank, "Achieving logarithmic growth of temporal and spatial complexity in
reverse automatic differentiation", Optimization Methods and Software 1 (1992); A. Griewank
and A. Walther, "Algorithm 799: revolve", ACM TOMS 26 (2000).
"""

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

INT_MAX = np.iinfo(np.int32).max


def binomial_split(steps: Any, slots: Any) -> Any:
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
        saturate = whole > (INT_MAX - extra) // factor
        return r, jnp.where(saturate, INT_MAX, whole * factor + extra), b0, b1, b2

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


def empty_stack(state: list[Any], checkpoints: int) -> tuple[list[Any], Any]:
    """Room for `checkpoints` states and their step numbers, with `state` at step 0, and one
    more slot, never read, that `push_if` writes when it does not push. Unused slots are at
    step `INT_MAX`, so that sorting by step leaves them last."""
    stack = [
        jnp.zeros((checkpoints + 1, *jnp.shape(s)), jnp.result_type(s)).at[0].set(s) for s in state
    ]
    positions = jnp.full((checkpoints + 1,), INT_MAX, jnp.int32).at[0].set(0)
    return stack, positions


def push_if(
    flag: Any, stack: tuple[list[Any], Any], slot: Any, state: list[Any], position: Any
) -> tuple[list[Any], Any]:
    """`stack` with `state`, at step `position`, stored in `slot` where `flag` holds.

    Done as a write in every case, outside any `lax.cond`, into the spare last slot where
    `flag` is false: XLA then updates the stack in place, where a `cond` returning it, or a
    read of the slot before writing it, would copy the whole stack at every iteration.
    """
    states, positions = stack
    spare = positions.shape[0] - 1
    slot = jnp.where(flag, jnp.minimum(slot, spare - 1), spare)
    states = [
        lax.dynamic_update_index_in_dim(s, v, slot, 0) for s, v in zip(states, state, strict=True)
    ]
    return states, lax.dynamic_update_index_in_dim(positions, position, slot, 0)


def sort_stack(stack: tuple[list[Any], Any], count: Any) -> tuple[tuple[list[Any], Any], Any]:
    """The stack with its checkpoints in step order, and how many there are (at most
    `count`, the steps taken; at least one, the initial state): the backward pass takes the
    newest from the top. The spare slot stays last."""
    states, positions = stack
    spare = positions.shape[0] - 1
    order = jnp.append(jnp.argsort(positions[:spare]), spare)
    states = [s.at[order].get(unique_indices=True) for s in states]
    positions = positions.at[order].get(unique_indices=True)
    top = jnp.clip(jnp.sum(positions[:spare] < count, dtype=jnp.int32), 1, spare)
    return (states, positions), top


class OnlinePlacement(NamedTuple):
    """What `place_online` remembers between steps (all scalars but the last two).

    Stumm--Walther's state: `slot` is where the next checkpoint goes, `renewed` how many
    checkpoints the current round still renews, `round_end` the step at which the round
    ends and `saving` whether steps are being stored. Wang--Moin's: each slot's `level`
    (the initial state's is infinite: it is never overwritten) and whether it is
    `dispensable`.
    """

    slot: Any
    renewed: Any
    round_end: Any
    saving: Any
    level: Any
    dispensable: Any

    @classmethod
    def start(cls, checkpoints: int) -> "OnlinePlacement":
        c = jnp.int32(checkpoints)
        return cls(
            slot=jnp.int32(0),
            renewed=c,
            round_end=c,
            saving=jnp.bool_(True),
            level=jnp.zeros((checkpoints,), jnp.int32).at[0].set(INT_MAX),
            dispensable=jnp.zeros((checkpoints,), bool),
        )


def _stumm_walther(step: Any, p: OnlinePlacement) -> tuple[Any, Any, OnlinePlacement]:
    """Algorithm I of Stumm and Walther: the first `checkpoints` steps are stored, then, in
    rounds, the newest checkpoints are overwritten by later steps, one fewer each round, so
    that the gaps between checkpoints grow as the backward pass can afford them."""
    save, slot = p.saving, p.slot
    next_slot = jnp.where(save, p.slot + 1, p.slot)
    next_slot = jnp.where(save & (next_slot > p.renewed), 1, next_slot)
    saving = p.saving & (step + 1 != p.round_end)
    turn = step == p.round_end
    round_end = jnp.where(turn, p.round_end + p.renewed, p.round_end)
    renewed = jnp.where(turn, p.renewed - 1, p.renewed)
    next_slot = jnp.where(turn, renewed, next_slot)
    saving = jnp.where(turn, renewed > 0, saving)
    after = p._replace(slot=next_slot, renewed=renewed, round_end=round_end, saving=saving)
    return save, slot, after


def _wang_moin(positions: Any, p: OnlinePlacement) -> tuple[Any, Any, OnlinePlacement]:
    """Wang and Moin's dynamic checkpointing: every step is stored, over the newest
    dispensable checkpoint if there is one (at level 0); otherwise over the newest
    checkpoint, one level up, which makes every checkpoint of a lower level dispensable."""
    if p.level.shape[0] == 1:
        # The only slot holds the initial state.
        return jnp.bool_(False), jnp.int32(0), p
    any_dispensable = p.dispensable.any()
    newest_dispensable = jnp.argmax(jnp.where(p.dispensable, positions, -1))
    newest = jnp.argmax(positions)
    slot = jnp.where(any_dispensable, newest_dispensable, newest).astype(jnp.int32)
    level = jnp.where(any_dispensable, 0, p.level[newest] + 1)
    dispensable = jnp.where(
        any_dispensable,
        p.dispensable.at[slot].set(False),
        p.dispensable | (p.level < p.level[newest]),
    )
    after = p._replace(level=p.level.at[slot].set(level), dispensable=dispensable)
    return jnp.bool_(True), slot, after


def place_online(
    step: Any, placement: OnlinePlacement, positions: Any, max_steps: int | None
) -> tuple[Any, Any, OnlinePlacement]:
    """Whether to store the state at `step` (before the step runs), in which slot, and the
    placement's next state. `positions` are the steps of the stored checkpoints (`INT_MAX`
    where none is), spare slot excluded."""
    checkpoints = positions.shape[0]
    if max_steps is not None and checkpoints >= max_steps:
        # Room for every step.
        return jnp.bool_(True), step, placement
    # Stumm--Walther applies while step <= binom(checkpoints + 2, 2) - 2.
    switch = (checkpoints + 1) * (checkpoints + 2) // 2 - 1
    save, slot, after_sw = _stumm_walther(step, placement)
    if max_steps is not None and max_steps <= switch:
        return save, slot, after_sw
    wm_save, wm_slot, after_wm = _wang_moin(positions, placement)
    late = step >= switch
    after = OnlinePlacement(
        *(jnp.where(late, w, s) for w, s in zip(after_wm, after_sw, strict=True))
    )
    return jnp.where(late, wm_save, save), jnp.where(late, wm_slot, slot), after


class OfflinePlacement(NamedTuple):
    """What `place_offline` remembers between steps: how many checkpoints are `stored` (the
    initial state's included) and the step at which the next is (`next_save`)."""

    stored: Any
    next_save: Any

    @classmethod
    def start(cls, checkpoints: int, steps: int) -> "OfflinePlacement":
        first = binomial_split(steps, checkpoints) if steps > 1 else steps
        return cls(stored=jnp.int32(1), next_save=jnp.int32(first))


def place_offline(
    step: Any, placement: OfflinePlacement, steps: int, checkpoints: int
) -> tuple[Any, Any, OfflinePlacement]:
    """Whether to store the state at `step` of a loop of exactly `steps` steps, in which
    slot, and the placement's next state: the checkpoints the backward pass's first sweep
    would place, `binomial_split` apart."""
    stored, next_save = placement
    save = (step == next_save) & (stored < checkpoints)
    slot = stored
    stored = jnp.where(save, stored + 1, stored)
    remaining = steps - step

    def following() -> Any:
        return step + binomial_split(remaining, checkpoints - stored + 1)

    # The split is worked out only at the steps stored, not at every step.
    next_save = lax.cond(save & (remaining > 1), following, lambda: next_save)
    return save, slot, OfflinePlacement(stored, next_save)
