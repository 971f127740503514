"""The checkpointed loop's schedule: which steps the backward pass recomputes, in which order.

A while loop places its checkpoints online as it runs (Stumm and Walther's Algorithm I, then
Wang and Moin's dynamic checkpointing); a loop of known length (scan, fori_loop) where the
backward pass's first sweep would; the backward pass splits by Griewank and Walther's
binomial rule. `expected_order` below is a plain-Python model of that schedule, one step at
a time; the loops are checked against it step for step, and it against published orders
and bounds.
"""

import math
from functools import lru_cache

import jax
import jax.numpy as jnp
import pytest

from pytree_transforms import fori_loop, scan, while_loop
from pytree_transforms._checkpoint_schedule import binomial_split

INT_MAX = 2**31 - 1


@lru_cache(None)
def split(steps, slots):
    return int(jax.jit(binomial_split)(steps, slots))


@lru_cache(None)
def fewest_recomputations(steps, slots):
    """The least number of steps recomputed to reverse `steps` steps with `slots` stored
    carries (the initial one included), by dynamic programming over every first split."""
    if steps <= 1:
        return 0
    if slots == 1:
        return steps * (steps - 1) // 2
    return min(
        m + fewest_recomputations(steps - m, slots - 1) + fewest_recomputations(m, slots)
        for m in range(1, steps)
    )


def online_checkpoints(steps, checkpoints, max_steps):
    """The steps whose states a while loop keeps after running `steps` steps."""
    if max_steps is not None and checkpoints >= max_steps:
        return list(range(steps))
    held = [INT_MAX] * checkpoints  # the step each slot holds
    # Stumm--Walther: rounds of renewals; Wang--Moin: levels and dispensable checkpoints.
    slot, renewed, round_end, saving = 0, checkpoints, checkpoints, True
    level = [INT_MAX] + [0] * (checkpoints - 1)
    dispensable = [False] * checkpoints
    switch = math.comb(checkpoints + 2, 2) - 1
    for step in range(steps):
        if step < switch or (max_steps is not None and max_steps <= switch):
            save, where = saving, slot
            if saving:
                slot = slot + 1 if slot + 1 <= renewed else 1
            saving = saving and step + 1 != round_end
            if step == round_end:
                round_end += renewed
                renewed -= 1
                slot, saving = renewed, renewed > 0
        elif checkpoints == 1:
            save = False
        else:
            save = True
            candidates = [k for k in range(checkpoints) if dispensable[k]]
            if candidates:
                where = max(candidates, key=held.__getitem__)
                dispensable[where], new_level = False, 0
            else:
                where = max(range(checkpoints), key=held.__getitem__)
                lower = [lv < level[where] for lv in level]
                dispensable = [d or low for d, low in zip(dispensable, lower, strict=True)]
                new_level = level[where] + 1
            level[where] = new_level
        if save:
            held[where] = step
    return sorted(h for h in held if h < steps)


def offline_checkpoints(steps, checkpoints):
    """The steps whose states a loop of exactly `steps` steps keeps: where the backward
    pass's first sweep would put them."""
    held = [0]
    if checkpoints > 1 and steps > 1:
        next_save = split(steps, checkpoints)
        for step in range(steps):
            if step == next_save and len(held) < checkpoints:
                held.append(step)
                if steps - step > 1:
                    next_save = step + split(steps - step, checkpoints - len(held) + 1)
    return held


def expected_order(steps, checkpoints, max_steps, known_length=False):
    """The steps the backward pass runs the body at, in order (each recomputation, and each
    step once more for its VJP)."""
    if known_length:
        stack = offline_checkpoints(steps, checkpoints)
    else:
        stack = online_checkpoints(steps, checkpoints, max_steps)
    order, target = [], steps - 1
    while target >= 0:
        position = stack[-1]
        remaining = target + 1 - position
        advance = split(remaining, checkpoints - len(stack) + 1) if remaining > 1 else 0
        order += range(position, position + advance)
        if position + advance == target:
            order.append(target)
            target -= 1
            if advance == 0:
                stack.pop()
        else:
            stack.append(position + advance)
    return order


def run_order(steps, checkpoints, max_steps=None, loop="while_loop"):
    """The steps the body runs at, in the forward pass and in the backward pass of a
    gradient through a checkpointed loop of `steps` steps."""
    calls = []

    def step(i, y):
        jax.debug.callback(lambda i: calls.append(int(i)), i)
        return jnp.sin(y)

    def loss(y):
        if loop == "while_loop":
            return while_loop(
                lambda c: c[0] < steps,
                lambda c: (c[0] + 1, step(*c)),
                (0, y),
                max_steps=max_steps,
                kind="checkpointed",
                checkpoints=checkpoints,
            )[1]
        if loop == "scan":
            return scan(
                lambda y, i: (step(i, y), None),
                y,
                jnp.arange(steps),
                kind="checkpointed",
                checkpoints=checkpoints,
            )[0]
        return fori_loop(0, steps, step, y, kind="checkpointed", checkpoints=checkpoints)

    jax.block_until_ready(jax.jit(jax.grad(loss))(jnp.float32(0.3)))
    jax.effects_barrier()
    assert calls[:steps] == list(range(steps))
    return calls[steps:]


# Stumm and Walther (2010), Fig. 2.2: four checkpoints, the backward pass of 4 to 14 steps
# (one step fewer than the figure draws for each pattern).
STUMM_WALTHER_FIGURE = {
    4: "3,2,1,0",
    5: "3,4,3,2,1,0",
    6: "5,2,3,4,3,2,1,0",
    7: "6,5,2,3,4,3,2,0,1,0",
    8: "7,6,5,0,1,2,3,4,3,2,1,0",
    9: "7,8,7,6,5,0,1,2,3,4,3,2,1,0",
    10: "9,6,7,8,7,6,5,0,1,2,3,4,3,2,1,0",
    11: "10,9,5,6,7,8,7,6,5,0,1,2,3,4,3,2,1,0",
    12: "10,11,10,9,5,6,7,8,7,6,5,0,1,2,3,4,3,2,1,0",
    13: "12,9,10,11,10,9,5,6,7,8,7,6,5,0,1,2,3,4,3,2,1,0",
    14: "12,13,12,9,10,11,10,9,5,6,7,8,7,6,5,0,1,2,3,4,3,2,1,0",
}


@pytest.mark.parametrize("steps", sorted(STUMM_WALTHER_FIGURE))
@pytest.mark.parametrize("bounded", [False, True])
def test_while_loop_backward_order_is_stumm_walthers(steps, bounded):
    order = ",".join(map(str, run_order(steps, 4, max_steps=steps if bounded else None)))
    assert order == STUMM_WALTHER_FIGURE[steps]


@pytest.mark.parametrize(
    ("steps", "checkpoints", "max_steps"),
    [(3, 1, None), (5, 1, 5), (5, 2, None), (8, 2, 8), (11, 3, None), (5, 9, None), (30, 3, 45),
     (40, 3, None), (50, 6, 50), (20, 4, 200), (1, 3, None), (2, 2, None)],
)  # fmt: skip
def test_while_loop_follows_the_schedule(steps, checkpoints, max_steps):
    # Past binom(checkpoints + 2, 2) - 1 steps (e.g. 40 with 3) the placement is Wang--Moin's.
    assert run_order(steps, checkpoints, max_steps) == expected_order(steps, checkpoints, max_steps)


@pytest.mark.parametrize("loop", ["scan", "fori_loop"])
@pytest.mark.parametrize(("steps", "checkpoints"), [(10, 2), (30, 3), (50, 4), (7, 7), (12, 1)])
def test_loops_of_known_length_place_checkpoints_as_the_backward_pass_would(
    loop, steps, checkpoints
):
    order = run_order(steps, checkpoints, loop=loop)
    assert order == expected_order(steps, checkpoints, steps, known_length=True)
    # Knowing the length, the forward pass saves the backward pass's first sweep.
    if checkpoints > 1:
        assert len(order) < steps + fewest_recomputations(steps, checkpoints)


@pytest.mark.parametrize("checkpoints", range(1, 9))
def test_online_placement_recomputes_no_step_twice_up_to_its_bound(checkpoints):
    # Stumm and Walther: up to binom(c + 2, 2) - 1 steps, a step runs at most three times in
    # all (forward, recomputed once, and for its VJP), as if the length were known.
    for steps in range(1, math.comb(checkpoints + 2, 2)):
        order = expected_order(steps, checkpoints, None)
        assert max(order.count(s) for s in range(steps)) <= 2


@pytest.mark.parametrize("checkpoints", [2, 3, 4, 6, 10])
@pytest.mark.parametrize("steps", [5, 20, 50, 200])
def test_online_placement_beats_reversing_from_the_initial_state(steps, checkpoints):
    # Without checkpoints placed while running, the backward pass would first recompute
    # from the initial state; the placement saves some of that, at any length.
    reversing_from_the_start = steps + fewest_recomputations(steps, checkpoints)
    assert len(expected_order(steps, checkpoints, None)) <= reversing_from_the_start


def test_split_satisfies_the_binomial_bounds_and_is_optimal():
    pairs = [(steps, slots) for steps in range(2, 60) for slots in range(1, 7)]
    splits = jax.jit(jax.vmap(binomial_split))(*map(jnp.array, zip(*pairs, strict=True)))
    chosen = dict(zip(pairs, map(int, splits), strict=True))

    def cost(steps, slots):
        if steps <= 1:
            return 0
        m = chosen[(steps, slots)]
        return m + cost(steps - m, slots - 1) + cost(m, slots)

    for (steps, slots), m in chosen.items():
        r = 0
        while math.comb(slots + r, slots) < steps:
            r += 1
        assert steps - m <= math.comb(slots - 1 + r, slots - 1)
        assert m <= math.comb(slots + r - 1, slots)
        assert cost(steps, slots) == fewest_recomputations(steps, slots)
