"""Loop options and derivatives side by side with equinox.internal: `scan(buffers=,
checkpoints="all")`, `while_loop(base=)`, buffers, unperturbed carry parts, and forward mode
(which Equinox's checkpointed loop lacks: checked against its bounded loop)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pytree_transforms import nondifferentiable, scan, while_loop

eqx = pytest.importorskip("equinox")
eqxi = pytest.importorskip("equinox.internal")


def close(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def scan_loss(scan_fn, a, **options):
    xs = jnp.linspace(0.1, 1.0, 9)

    def step(c, x):
        i, y, buf = c
        y = jnp.sin(y * a) + x
        return (i + 1, y, buf.at[i].set(2 * y)), y**2

    init = (jnp.int32(0), jnp.float32(0.5), jnp.zeros(9))
    (_, y, buf), ys = scan_fn(step, init, xs, kind="checkpointed", **options)
    return y + jnp.sum(buf * jnp.arange(9.0)) + jnp.sum(ys)


@pytest.mark.parametrize("checkpoints", ["all", 2, None])
def test_scan_buffers_and_checkpoints_like_equinox(checkpoints):
    options = {"buffers": lambda c: c[2], "checkpoints": checkpoints}
    ours = jax.value_and_grad(lambda a: scan_loss(scan, a, **options))(1.3)
    theirs = jax.value_and_grad(lambda a: scan_loss(eqxi.scan, a, **options))(1.3)
    close(ours, theirs)


@pytest.mark.parametrize("base", [2, 3, 16])
def test_bounded_base_like_equinox(base):
    def run(loop, a):
        def body(c):
            return c[0] + 1, c[1] * a + 0.1

        init = (jnp.int32(0), jnp.float32(1.0))
        out = loop(lambda c: c[0] < 29, body, init, max_steps=40, kind="bounded", base=base)
        return out[1]

    close(
        jax.value_and_grad(lambda a: run(while_loop, a))(1.01),
        jax.value_and_grad(lambda a: run(eqxi.while_loop, a))(1.01),
    )


def buffer_loss(loop, x, steps):
    def body(c):
        i, y, buf = c
        y = jnp.sin(y) + x
        return i + 1, y, buf.at[i].set(y)

    init = (jnp.int32(0), jnp.float32(0.0), jnp.zeros(steps))
    out = loop(
        lambda c: c[0] < steps,
        body,
        init,
        max_steps=steps,
        kind="checkpointed",
        buffers=lambda c: c[2],
    )
    return jnp.sum(out[2] * jnp.linspace(0, 1, steps)) + out[1]


def test_checkpointed_buffers_like_equinox():
    ours = jax.jit(jax.value_and_grad(lambda x: buffer_loss(while_loop, x, 3000)))(0.3)
    theirs = jax.jit(jax.value_and_grad(lambda x: buffer_loss(eqxi.while_loop, x, 3000)))(0.3)
    close(ours, theirs, rtol=1e-4)


@pytest.mark.parametrize(
    "loop, mark", [(while_loop, nondifferentiable), (eqxi.while_loop, eqxi.nondifferentiable)]
)
def test_unperturbed_outputs_like_equinox(loop, mark):
    # Equinox's own check: outputs that nothing differentiated reaches may be marked
    # nondifferentiable; perturbed ones may not. The same code runs on both libraries.
    def body(c):
        i, unperturbed, perturbed, _, buf = c
        buf = buf.at[0].set(perturbed)
        return i + 1, unperturbed * 2.0, jnp.sin(perturbed), perturbed, buf

    def run(x):
        init = (jnp.int32(0), lax.stop_gradient(x), x, lax.stop_gradient(x), jnp.zeros(1))
        out = loop(
            lambda c: c[0] < 3,
            body,
            init,
            max_steps=3,
            kind="checkpointed",
            buffers=lambda c: c[4],
        )
        i, unperturbed, perturbed, copied, buf = out
        mark((i, unperturbed))
        for value in (perturbed, copied, buf):
            with pytest.raises(RuntimeError):
                mark(value)
        return unperturbed + perturbed + copied + jnp.sum(buf)

    jax.linearize(run, jnp.float32(0.5))
    jax.grad(run)(jnp.float32(0.5))


def test_forward_mode_like_equinox_bounded_loop():
    # Equinox's checkpointed loop refuses jax.jvp; ours gives what its bounded loop gives.
    def run(loop, kind, a):
        def body(c):
            return c[0] + 1, jnp.sin(c[1] * a) + 0.5 * c[1]

        init = (jnp.int32(0), jnp.float32(0.3))
        return loop(lambda c: c[0] < 11, body, init, max_steps=16, kind=kind)[1]

    expected = jax.jvp(lambda a: run(eqxi.while_loop, "bounded", a), (1.3,), (1.0,))
    close(jax.jvp(lambda a: run(while_loop, "checkpointed", a), (1.3,), (1.0,)), expected)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(lambda a: run(eqxi.while_loop, "checkpointed", a), (1.3,), (1.0,))


def run_progress(meter, x, steps):
    """A scan of `steps` steps reporting `(i + 1) / steps`, batched along `x` under vmap."""

    def body(carry, i):
        x, state = carry
        return (x, meter.step(state, (i + 1) / steps + 0.0 * x)), None

    (x, state), _ = lax.scan(body, (x, meter.init()), jnp.arange(steps))
    meter.close(state)
    return x


@pytest.mark.parametrize("minimum_increase, steps", [(0.0999, 10), (0.25, 8), (0.02, 7)])
@pytest.mark.parametrize("transform", ["eager", "jit", "jit_vmap"])
def test_text_progress_meter_prints_as_equinox(minimum_increase, steps, transform, capfd):
    from pytree_transforms import TextProgressMeter

    def printed(meter):
        run = lambda x: run_progress(meter, x, steps)  # noqa: E731
        if transform == "jit":
            run = jax.jit(run)
        elif transform == "jit_vmap":
            run = jax.jit(jax.vmap(run))
        run(jnp.arange(3.0) if transform == "jit_vmap" else 0.0)
        jax.effects_barrier()
        return capfd.readouterr().out

    ours = printed(TextProgressMeter(minimum_increase=minimum_increase))
    theirs = printed(eqxi.TextProgressMeter(minimum_increase=minimum_increase))
    assert ours == theirs and ours.startswith("0.00%\n") and ours.endswith("100.00%\n")


def test_text_progress_meter_under_grad_as_equinox(capfd):
    from pytree_transforms import TextProgressMeter

    def printed(meter):
        def f(p):
            run_progress(meter, 0.0, 10)
            return p * p

        grad = jax.grad(f)(1.0)
        jax.effects_barrier()
        return float(grad), capfd.readouterr().out

    assert printed(TextProgressMeter(0.0999)) == printed(eqxi.TextProgressMeter(0.0999))
