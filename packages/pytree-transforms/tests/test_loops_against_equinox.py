"""while_loop and scan side by side with equinox.internal.while_loop / scan: the same values
and gradients for each kind."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_transforms import scan, while_loop

eqx = pytest.importorskip("equinox")
eqxi = pytest.importorskip("equinox.internal")


def close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def solve(loop, params, y0, kind, **options):
    """Explicit Euler until t reaches 1.3 (a step count the loop finds itself)."""

    def body(carry):
        t, y = carry
        return t + 0.1, y + 0.1 * jnp.tanh(params["w"] @ y + params["b"])

    _, y = loop(lambda c: c[0] < 1.3, body, (jnp.float32(0), y0), kind=kind, **options)
    return jnp.sum(y**2)


@pytest.fixture
def problem():
    keys = jax.random.split(jax.random.key(1), 3)
    params = {"w": jax.random.normal(keys[0], (5, 5)) / 2, "b": jax.random.normal(keys[1], (5,))}
    return params, jax.random.normal(keys[2], (5,))


@pytest.mark.parametrize("checkpoints", [1, 2, 5])
def test_checkpointed_while_loop_matches_equinox(problem, checkpoints):
    params, y0 = problem
    options = {"max_steps": 40, "checkpoints": checkpoints}
    ours = jax.value_and_grad(solve, argnums=(1, 2))(
        while_loop, params, y0, "checkpointed", **options
    )
    theirs = jax.value_and_grad(solve, argnums=(1, 2))(
        eqxi.while_loop, params, y0, "checkpointed", **options
    )
    close(ours, theirs)


def test_bounded_while_loop_matches_equinox(problem):
    params, y0 = problem
    ours = jax.value_and_grad(solve, argnums=(1, 2))(
        while_loop, params, y0, "bounded", max_steps=40
    )
    theirs = jax.value_and_grad(solve, argnums=(1, 2))(
        eqxi.while_loop, params, y0, "bounded", max_steps=40
    )
    close(ours, theirs)


def test_lax_while_loop_matches_equinox(problem):
    params, y0 = problem
    close(
        solve(while_loop, params, y0, "lax", max_steps=40),
        solve(eqxi.while_loop, params, y0, "lax", max_steps=40),
    )


def test_buffers_match_equinox():
    def run(loop, x):
        def body(c):
            i, y, buf = c
            y = jnp.sin(y) * 1.1
            return i + 1, y, buf.at[i].set(y * y)

        out = loop(
            lambda c: c[0] < 9,
            body,
            (jnp.int32(0), x, jnp.zeros(9)),
            kind="checkpointed",
            max_steps=9,
            checkpoints=3,
            buffers=lambda c: c[2],
        )
        return out[1] + jnp.sum(out[2] * jnp.arange(9.0))

    close(
        jax.value_and_grad(lambda x: run(while_loop, x))(jnp.float32(0.4)),
        jax.value_and_grad(lambda x: run(eqxi.while_loop, x))(jnp.float32(0.4)),
    )


@pytest.mark.parametrize("kind", ["lax", "checkpointed"])
def test_scan_matches_equinox(kind):
    def total(loop, w, xs):
        c, ys = loop(
            lambda c, x: (jnp.tanh(w * c + x), c * x),
            jnp.float32(0.5),
            xs,
            kind=kind,
            checkpoints=3,
        )
        return c + jnp.sum(ys**2)

    xs = jnp.linspace(-1.0, 1.0, 13)
    close(
        jax.value_and_grad(total, (1, 2))(scan, jnp.float32(0.8), xs),
        jax.value_and_grad(total, (1, 2))(eqxi.scan, jnp.float32(0.8), xs),
    )


def recomputation_order(loop, steps, checkpoints, max_steps):
    """The steps the body runs at in the backward pass of a gradient through `loop`."""
    calls = []

    def body(carry):
        i, y = carry
        jax.debug.callback(lambda i: calls.append(int(i)), i)
        return i + 1, jnp.sin(y)

    def loss(y):
        init = (jnp.int32(0), y)
        return loop(
            lambda c: c[0] < steps,
            body,
            init,
            max_steps=max_steps,
            kind="checkpointed",
            checkpoints=checkpoints,
        )[1]

    jax.block_until_ready(jax.jit(jax.grad(loss))(jnp.float32(0.3)))
    jax.effects_barrier()
    return calls[steps:]


@pytest.mark.parametrize(
    ("steps", "checkpoints"),
    [(3, 1), (5, 2), (8, 2), (11, 3), (9, 4), (14, 4), (5, 9), (20, 5)],
)
@pytest.mark.parametrize("bounded", [False, True])
def test_checkpoints_placed_as_equinox_places_them(steps, checkpoints, bounded):
    # The same placement while running (Stumm--Walther, then Wang--Moin). Where the
    # backward pass has a choice of split, ours takes the binomial rule's and Equinox's
    # bisects: these cases are ones where both choose alike (the long loops below differ).
    max_steps = steps if bounded else None
    ours = recomputation_order(while_loop, steps, checkpoints, max_steps)
    assert ours == recomputation_order(eqxi.while_loop, steps, checkpoints, max_steps)


@pytest.mark.parametrize(("steps", "checkpoints"), [(60, 2), (200, 3), (300, 5)])
def test_long_loops_recompute_fewer_steps_than_equinox(steps, checkpoints):
    ours = recomputation_order(while_loop, steps, checkpoints, None)
    theirs = recomputation_order(eqxi.while_loop, steps, checkpoints, None)
    assert len(ours) < len(theirs)
