"""while_loop and scan: values, gradients against unrolled references, the checkpointing
schedule's memory, buffers, transforms and errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pytree_transforms import scan, while_loop

KINDS = ["lax", "checkpointed", "bounded"]


def vector_field(params, y):
    return jnp.tanh(params["w"] @ y + params["b"])


def euler(params, y0, steps, kind, checkpoints=None, dt=0.1):
    """`steps` explicit Euler steps of y' = vector_field(y), as a while loop."""

    def body(carry):
        i, y, name = carry
        return i + 1, y + dt * vector_field(params, y), name

    _, y, _ = while_loop(
        lambda carry: carry[0] < steps,
        body,
        (jnp.int32(0), y0, "state"),
        max_steps=steps + 5,
        kind=kind,
        checkpoints=checkpoints,
    )
    return y


def euler_unrolled(params, y0, steps, dt=0.1):
    y = y0
    for _ in range(steps):
        y = y + dt * vector_field(params, y)
    return y


@pytest.fixture
def problem():
    keys = jax.random.split(jax.random.key(0), 3)
    params = {
        "w": jax.random.normal(keys[0], (4, 4)) / 2,
        "b": jax.random.normal(keys[1], (4,)) / 4,
    }
    return params, jax.random.normal(keys[2], (4,))


def loss(params, y0, steps, kind, checkpoints=None):
    return jnp.sum(euler(params, y0, steps, kind, checkpoints) ** 2)


def reference_loss(params, y0, steps):
    return jnp.sum(euler_unrolled(params, y0, steps) ** 2)


def close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("kind", KINDS)
def test_values_equal_lax_while_loop(kind):
    def cond(c):
        return c[1] < 100.0

    def body(c):
        return c[0] + 1, c[1] * 1.5 + 1.0

    init = (jnp.int32(0), jnp.float32(1.0))
    expected = lax.while_loop(cond, body, init)
    got = while_loop(cond, body, init, max_steps=50, kind=kind, checkpoints=3)
    close(got, expected)
    assert int(got[0]) == int(expected[0])


@pytest.mark.parametrize("kind", KINDS)
def test_max_steps_stops_the_loop(kind):
    got = while_loop(lambda c: c < 100, lambda c: c + 1, jnp.int32(0), max_steps=7, kind=kind)
    assert int(got) == 7


def test_static_leaves_pass_through():
    out = while_loop(
        lambda c: c["x"] < 3,
        lambda c: {**c, "x": c["x"] + 1},
        {"x": jnp.int32(0), "name": "n", "f": abs},
        kind="checkpointed",
        checkpoints=2,
    )
    assert out["name"] == "n" and out["f"] is abs and int(out["x"]) == 3


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("kind", ["lax", "checkpointed"])
def test_scan_values_equal_lax_scan(kind, reverse):
    def f(c, x):
        return c * 0.9 + x["a"], {"y": c * x["a"], "z": jnp.stack([c, c])}

    xs = {"a": jnp.linspace(0.0, 1.0, 7)}
    expected = lax.scan(f, jnp.float32(1.0), xs, reverse=reverse)
    close(scan(f, jnp.float32(1.0), xs, kind=kind, checkpoints=2, reverse=reverse), expected)


def test_scan_with_length_and_no_xs():
    expected = lax.scan(lambda c, _: (c + 1.0, c), jnp.float32(0), None, length=5)
    got = scan(lambda c, _: (c + 1.0, c), jnp.float32(0), None, length=5, kind="checkpointed")
    close(got, expected)


# ---------------------------------------------------------------------------------------------
# Gradients against the unrolled loop


@pytest.mark.parametrize("steps", [0, 1, 2, 7, 23])
@pytest.mark.parametrize("checkpoints", [1, 2, 3, None])
def test_checkpointed_gradients_match_unrolled(problem, steps, checkpoints):
    params, y0 = problem
    expected = jax.grad(reference_loss, argnums=(0, 1))(params, y0, steps)
    got = jax.grad(loss, argnums=(0, 1))(params, y0, steps, "checkpointed", checkpoints)
    close(got, expected)


@pytest.mark.parametrize("steps", [0, 1, 17, 40])
def test_bounded_gradients_match_unrolled(problem, steps):
    params, y0 = problem
    expected = jax.grad(reference_loss, argnums=(0, 1))(params, y0, steps)
    close(jax.grad(loss, argnums=(0, 1))(params, y0, steps, "bounded"), expected)


@pytest.mark.parametrize("kind", ["checkpointed", "bounded"])
def test_gradients_under_jit_vmap_and_grad_of_vmap(problem, kind):
    params, y0 = problem
    y0s = jnp.stack([y0, 2 * y0, -y0])
    grad = jax.grad(loss, argnums=(0, 1))
    ref = jax.grad(reference_loss, argnums=(0, 1))
    close(jax.jit(grad, static_argnums=(2, 3, 4))(params, y0, 9, kind, 2), ref(params, y0, 9))
    vmapped = jax.vmap(grad, in_axes=(None, 0, None, None, None))(params, y0s, 9, kind, 2)
    close(vmapped, jax.vmap(ref, in_axes=(None, 0, None))(params, y0s, 9))

    def batch_loss(params, fn, *args):
        return jnp.sum(jax.vmap(lambda y: fn(params, y, 9, *args))(y0s))

    close(
        jax.grad(batch_loss)(params, loss, kind, 2),
        jax.grad(batch_loss)(params, reference_loss),
    )


def test_vmap_with_different_step_counts_per_example():
    # The number of steps depends on the batched value, so each example stops elsewhere.
    def run(x, kind):
        return while_loop(
            lambda c: c[1] < 5.0,
            lambda c: (c[0] * 1.1, c[1] + c[0]),
            (x, jnp.float32(0)),
            max_steps=100,
            kind=kind,
            checkpoints=3,
        )[0]

    xs = jnp.array([0.5, 1.0, 3.0])
    expected = jax.vmap(jax.grad(lambda x: run(x, "bounded")))(xs)
    close(jax.vmap(jax.grad(lambda x: run(x, "checkpointed")))(xs), expected)


def test_gradient_wrt_closed_over_outer_tracer():
    def outer(scale):
        inner = jnp.sin(scale)  # a tracer of the outer grad, closed over by the body
        return while_loop(
            lambda c: c[0] < 4,
            lambda c: (c[0] + 1, c[1] * inner),
            (jnp.int32(0), jnp.float32(2.0)),
            kind="checkpointed",
            checkpoints=2,
        )[1]

    x = 0.7
    assert jax.grad(outer)(x) == pytest.approx(2.0 * 4 * math.sin(x) ** 3 * math.cos(x), 1e-5)


def test_integer_leaves_get_no_cotangent():
    def f(x, n):
        return while_loop(
            lambda c: c[0] < c[2],
            lambda c: (c[0] + 1, c[1] * 2.0, c[2]),
            (jnp.int32(0), x, n),
            kind="checkpointed",
            checkpoints=2,
        )[1]

    gx, gn = jax.grad(f, argnums=(0, 1), allow_int=True)(jnp.float32(1.5), jnp.int32(3))
    assert float(gx) == 8.0 and gn.dtype == jax.dtypes.float0


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("checkpoints", [1, 3])
def test_scan_gradients_match_lax_scan(checkpoints, reverse):
    w = jnp.array([[0.5, -0.2], [0.3, 0.8]])

    def f(c, x):
        c = jnp.tanh(w @ c + x)
        return c, jnp.sum(c * x)

    def total(w_scale, xs, kind):
        def g(c, x):
            c, y = f(c * w_scale, x)
            return c, y

        c, ys = scan(g, jnp.ones(2), xs, kind=kind, checkpoints=checkpoints, reverse=reverse)
        return jnp.sum(c) + jnp.sum(ys**2)

    xs = jnp.linspace(-1.0, 1.0, 22).reshape(11, 2)
    args = (jnp.float32(0.9), xs)
    close(jax.grad(total, (0, 1))(*args, "checkpointed"), jax.grad(total, (0, 1))(*args, "lax"))


# ---------------------------------------------------------------------------------------------
# Memory independent of the steps (the schedule itself: test_checkpoint_schedule.py)


def saved_bytes(fn, *args):
    """The bytes of the residuals `jax.vjp` keeps from the forward pass to the backward."""
    _, vjp = jax.vjp(fn, *args)
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(vjp) if hasattr(x, "dtype"))


def test_residuals_do_not_grow_with_the_number_of_steps(problem):
    params, y0 = problem

    def checkpointed_bytes(steps):
        return saved_bytes(lambda p, y: loss(p, y, steps, "checkpointed", 4), params, y0)

    def bounded_bytes(steps):
        return saved_bytes(lambda p, y: loss(p, y, steps, "bounded"), params, y0)

    sizes = {steps: checkpointed_bytes(steps) for steps in (10, 100, 1000)}
    assert len(set(sizes.values())) == 1, sizes
    assert bounded_bytes(100) > bounded_bytes(10)  # the contrast: bounded stores every step


# ---------------------------------------------------------------------------------------------
# Buffers


def test_buffers_gradients_and_reads_of_written_locations():
    def run(x, kind, with_buffers=True):
        def body(c):
            i, y, buf = c
            previous = jnp.where(i > 0, buf[jnp.maximum(i - 1, 0)], 0.0)
            y = jnp.sin(y) + 0.5 * previous
            return i + 1, y, buf.at[i].set(y * y)

        init = (jnp.int32(0), x, jnp.zeros(12))
        out = while_loop(
            lambda c: c[0] < 12,
            body,
            init,
            kind=kind,
            checkpoints=3,
            max_steps=12,
            buffers=(lambda c: c[2]) if with_buffers else None,
        )
        return out[1] + jnp.sum(out[2] * jnp.arange(12.0))

    expected = jax.value_and_grad(run)(jnp.float32(0.4), "bounded", False)
    close(jax.value_and_grad(run)(jnp.float32(0.4), "checkpointed"), expected)
    close(jax.value_and_grad(run)(jnp.float32(0.4), "bounded"), expected)
    close(run(jnp.float32(0.4), "lax"), expected[0])


def test_buffers_are_not_checkpointed():
    def run(x, steps):
        def body(c):
            i, y, buf = c
            return i + 1, y * 0.9, buf.at[i].set(y)

        out = while_loop(
            lambda c: c[0] < steps,
            body,
            (jnp.int32(0), x, jnp.zeros(steps)),
            kind="checkpointed",
            checkpoints=5,
            buffers=lambda c: c[2],
        )
        return jnp.sum(out[2])

    text = str(jax.make_jaxpr(jax.grad(run), static_argnums=1)(jnp.float32(1.0), 1000))
    # The stack of checkpoints holds the carry's `y` (and one spare slot), not the buffer.
    assert "f32[5,1000]" not in text and "f32[6,1000]" not in text and "f32[6]" in text


# ---------------------------------------------------------------------------------------------
# Errors


def test_lax_kind_is_not_reverse_differentiable():
    with pytest.raises(ValueError, match=r"[Rr]everse-mode"):
        jax.grad(lambda x: while_loop(lambda c: c < 1.0, lambda c: c + 0.5, x))(0.0 + jnp.zeros(()))


def test_errors():
    body = lambda c: c + 1  # noqa: E731
    cond = lambda c: c < 3  # noqa: E731
    x = jnp.int32(0)
    with pytest.raises(ValueError, match=r"unknown kind='fast'.*'lax', 'checkpointed', 'bounded'"):
        while_loop(cond, body, x, kind="fast")
    with pytest.raises(ValueError, match='kind="bounded" needs `max_steps`'):
        while_loop(cond, body, x, kind="bounded")
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="`max_steps` must be a non-negative"):
            while_loop(cond, body, x, max_steps=bad)
    for bad in (0, -2, 1.0):
        with pytest.raises(ValueError, match="`checkpoints` must be a positive"):
            while_loop(cond, body, x, kind="checkpointed", checkpoints=bad, max_steps=3)
    with pytest.raises(ValueError, match="needs `checkpoints` when `max_steps` is None"):
        while_loop(cond, body, x, kind="checkpointed")
    with pytest.raises(TypeError, match="expects a function as `body_fun`"):
        while_loop(cond, body(x), x)
    with pytest.raises(ValueError, match=r"unknown kind='bounded'.*'lax', 'checkpointed'"):
        scan(lambda c, x: (c, x), x, jnp.zeros(3), kind="bounded")
    with pytest.raises(ValueError, match="`checkpoints` must be a positive"):
        scan(lambda c, x: (c, x), x, jnp.zeros(3), kind="checkpointed", checkpoints=0)


@pytest.mark.parametrize("kind", KINDS)
def test_body_errors_name_the_leaf(kind):
    init = {"a": jnp.zeros(2), "b": (jnp.int32(0), "tag")}

    def run(body):
        return while_loop(
            lambda c: c["b"][0] < 2, body, init, max_steps=3, kind=kind, checkpoints=2
        )

    with pytest.raises(
        ValueError,
        match=r"changed the array at \['a'\] from float32\[2\] to "
        r"float32\[3\]",
    ):
        run(lambda c: {**c, "a": jnp.zeros(3)})
    with pytest.raises(
        ValueError,
        match=r"changed the array at \['b'\]\[0\] from int32\[\] "
        r"to float32\[\]",
    ):
        run(lambda c: {**c, "b": (jnp.float32(1), "tag")})
    with pytest.raises(ValueError, match=r"changed the non-array leaf at \['b'\]\[1\]"):
        run(lambda c: {**c, "b": (c["b"][0] + 1, "other")})
    with pytest.raises(ValueError, match="same structure"):
        run(lambda c: {"a": c["a"]})


@pytest.mark.parametrize("kind", KINDS)
def test_cond_must_return_a_scalar_bool(kind):
    with pytest.raises(TypeError, match=r"scalar boolean.*returned float32\[2\]"):
        while_loop(lambda c: c, lambda c: c, jnp.zeros(2), max_steps=2, kind=kind, checkpoints=1)
    with pytest.raises(TypeError, match=r"scalar boolean.*returned int32\[\]"):
        while_loop(lambda c: c, lambda c: c, jnp.int32(0), max_steps=2, kind=kind, checkpoints=1)


def test_scan_errors():
    with pytest.raises(ValueError, match="must agree on the number of steps"):
        scan(lambda c, x: (c, x), jnp.float32(0), (jnp.zeros(3), jnp.zeros(4)), kind="checkpointed")
    with pytest.raises(ValueError, match=r"changed the array at the top level"):
        scan(
            lambda c, x: (c.astype(jnp.int32), x), jnp.float32(0), jnp.zeros(3), kind="checkpointed"
        )
    with pytest.raises(ValueError, match="every leaf of `y` must be an array"):
        scan(lambda c, x: (c, "label"), jnp.float32(0), jnp.zeros(3), kind="checkpointed")
    with pytest.raises(ValueError, match='`unroll` applies to kind="lax" only'):
        scan(lambda c, x: (c, x), jnp.float32(0), jnp.zeros(3), kind="checkpointed", unroll=2)


def test_lax_kind_adds_no_copies_of_buffers():
    def body(c):
        i, buf = c
        return i + 1, buf.at[i].set(i.astype(jnp.float32))

    def ours(buf):
        return while_loop(lambda c: c[0] < 1000, body, (jnp.int32(0), buf), buffers=lambda c: c[1])[
            1
        ]

    def plain(buf):
        return lax.while_loop(lambda c: c[0] < 1000, body, (jnp.int32(0), buf))[1]

    def copies(fn):
        return jax.jit(fn).lower(jnp.zeros(1000)).compile().as_text().count(" copy(")

    assert copies(ours) == copies(plain)
