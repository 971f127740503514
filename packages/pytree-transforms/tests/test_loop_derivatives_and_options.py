"""Checkpointed loops in forward mode and with unperturbed carry parts, buffers updated in
place, and the loop options `scan(buffers=, checkpoints="all")`, `while_loop(base=)` and
`while_loop(progress_meter=)`."""

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_transforms import (
    AbstractProgressMeter,
    NoProgressMeter,
    TextProgressMeter,
    TqdmProgressMeter,
    nondifferentiable,
    scan,
    while_loop,
)


def close(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def power(a, kind, steps=7, **options):
    """A loop whose carry mixes a perturbed value, an integer and values the derivative
    never reaches (one constant, one fed only by itself)."""

    def body(c):
        i, y, z, w = c
        return i + 1, jnp.sin(y * a) + 0.5 * y, z, w * 0.5 + 1.0

    init = (jnp.int32(0), jnp.float32(0.3), jnp.float32(2.0), jnp.float32(1.0))
    return while_loop(lambda c: c[0] < steps, body, init, max_steps=steps + 2, kind=kind, **options)


# ---------------------------------------------------------------------------------------------
# Forward mode


@pytest.mark.parametrize("checkpoints", [1, 3, 9])
def test_jvp_through_checkpointed_while_loop(checkpoints):
    def f(a, kind):
        return power(a, kind, checkpoints=checkpoints if kind == "checkpointed" else None)[1]

    expected = jax.jvp(lambda a: f(a, "bounded"), (1.3,), (1.0,))
    close(jax.jvp(lambda a: f(a, "checkpointed"), (1.3,), (1.0,)), expected)
    close(jax.jit(jax.jacfwd(lambda a: f(a, "checkpointed")))(1.3), expected[1])
    batch = jnp.array([0.5, 1.0, 1.5])
    close(
        jax.vmap(jax.jacfwd(lambda a: f(a, "checkpointed")))(batch),
        jax.vmap(jax.jacfwd(lambda a: f(a, "bounded")))(batch),
    )


def test_jvp_through_checkpointed_scan_with_buffers_and_reverse():
    xs = jnp.linspace(0.1, 1.0, 6)

    def f(a, kind, **options):
        def step(c, x):
            i, y, buf = c
            y = jnp.sin(y * a) + x * jnp.where(i > 0, buf[jnp.maximum(i - 1, 0)], 1.0)
            return (i + 1, y, buf.at[i].set(y)), y**2

        init = (jnp.int32(0), jnp.float32(0.5), jnp.ones(6))
        (_, y, buf), ys = scan(step, init, xs, kind=kind, reverse=True, **options)
        return y + jnp.sum(buf * jnp.arange(6.0)) + jnp.sum(ys * xs)

    expected = jax.jvp(lambda a: f(a, "lax"), (1.3,), (1.0,))
    got = jax.jvp(
        lambda a: f(a, "checkpointed", checkpoints=2, buffers=lambda c: c[2]), (1.3,), (1.0,)
    )
    close(got, expected)


def test_second_derivatives_forward_over_reverse():
    def f(a, kind):
        return power(a, kind, checkpoints=3 if kind == "checkpointed" else None)[1]

    close(
        jax.hessian(lambda a: f(a, "checkpointed"))(1.3),
        jax.hessian(lambda a: f(a, "bounded"))(1.3),
    )
    close(
        jax.jacfwd(jax.grad(lambda a: f(a, "checkpointed")))(0.7),
        jax.jacfwd(jax.grad(lambda a: f(a, "bounded")))(0.7),
    )


def test_reverse_over_forward_is_refused_with_a_clear_error():
    def f(a):
        return power(a, "checkpointed", checkpoints=3)[1]

    with pytest.raises(RuntimeError, match=r"reverse mode over forward.*jacfwd\(jax.grad"):
        jax.grad(lambda a: jax.jvp(f, (a,), (1.0,))[1])(1.3)


# ---------------------------------------------------------------------------------------------
# Carry parts the derivative does not reach


@pytest.mark.parametrize("kind", ["checkpointed", "bounded"])
def test_unperturbed_outputs_get_symbolic_zero_cotangents(kind):
    def loss(a):
        i, y, z, w = power(a, kind)
        # `z` and `w` never depend on `a`: marking them must not raise.
        z, w, i = nondifferentiable((z, w, i), name="an unperturbed output")
        return y + z + w

    expected = jax.grad(lambda a: power(a, "bounded")[1])(1.3)
    close(jax.grad(loss)(1.3), expected)
    close(
        jax.jit(jax.vmap(jax.grad(loss)))(jnp.array([1.0, 2.0])),
        jax.vmap(jax.grad(lambda a: power(a, "bounded")[1]))(jnp.array([1.0, 2.0])),
    )


def test_perturbed_outputs_still_refuse_nondifferentiable():
    def loss(a):
        y = power(a, "checkpointed")[1]
        return nondifferentiable(y, name="the perturbed output")

    with pytest.raises(RuntimeError, match="the perturbed output cannot be differentiated"):
        jax.grad(loss)(1.3)


def test_perturbation_spreads_through_the_carry_over_several_steps():
    # `x` feeds `y` which feeds `z`: after two steps all three are reached from `x`, and
    # `w` (stopped) never is.
    def run(x, kind):
        def body(c):
            i, x_, y, z, w = c
            return i + 1, x_, y + x_, z + y, jax.lax.stop_gradient(w * 2.0)

        init = (jnp.int32(0), x, jnp.float32(1.0), jnp.float32(1.0), jnp.float32(1.0))
        return while_loop(lambda c: c[0] < 3, body, init, max_steps=3, kind=kind)

    def loss(x, kind):
        _, x_, y, z, w = run(x, kind)
        nondifferentiable(w)
        return x_ + y + z

    close(jax.grad(loss)(2.0, "checkpointed"), jax.grad(loss)(2.0, "bounded"))
    with pytest.raises(RuntimeError):
        jax.grad(lambda x: nondifferentiable(run(x, "checkpointed")[3]))(2.0)


# ---------------------------------------------------------------------------------------------
# Buffers: updated in place


def buffer_loop(x, steps, read=False):
    def body(c):
        i, y, buf = c
        if read:
            # Only locations written by earlier steps are read.
            y = y + jnp.where(i > 0, 0.1 * buf[jnp.maximum(i - 1, 0)], 0.0)
        y = jnp.sin(y) + x
        return i + 1, y, buf.at[i].set(y)

    init = (jnp.int32(0), jnp.float32(0.0), jnp.zeros(steps))
    out = while_loop(
        lambda c: c[0] < steps,
        body,
        init,
        max_steps=steps,
        kind="checkpointed",
        buffers=lambda c: c[2],
    )
    return jnp.sum(out[2] * jnp.arange(steps)) + out[1]


def copies_in_loops(fun, shape):
    """The copies of arrays of `shape` (e.g. "[1234]") inside the while loops' bodies of
    the compiled `fun`, made at every iteration."""
    text = jax.jit(fun).lower(1.0).compile().as_text()
    bodies = set(re.findall(r"body=%?([\w.\-]+)", text))
    copies, inside = [], False
    for line in text.splitlines():
        header = re.match(r"^%?([\w.\-]+) ", line)
        if header and line.rstrip().endswith("{"):
            inside = header.group(1) in bodies
        elif inside and re.search(re.escape(shape) + r".* copy\(", line):
            copies.append(line.strip())
    return copies


def test_write_only_buffer_is_not_copied_in_the_backward_pass():
    # One copy of a buffer of the loop's length per step made the gradient quadratic in the
    # number of steps: the compiled gradient has no copy of an array of that length.
    assert copies_in_loops(jax.grad(lambda x: buffer_loop(x, 1234)), "[1234]") == []


def test_checkpoint_stack_is_not_copied_per_step():
    def run(x):
        def body(c):
            return c[0] + 1, jnp.sin(c[1]) + x

        init = (jnp.int32(0), jnp.float32(0.0))
        return while_loop(
            lambda c: c[0] < 777, body, init, max_steps=777, kind="checkpointed", checkpoints=777
        )[1]

    # The stack holds 777 checkpoints and one spare slot.
    assert copies_in_loops(jax.grad(run), "[778]") == []


@pytest.mark.parametrize("read", [False, True])
def test_buffer_gradients_match_an_unrolled_loop(read):
    def unrolled(x, steps):
        y, buf = jnp.float32(0.0), jnp.zeros(steps)
        for i in range(steps):
            if read:
                y = y + 0.1 * buf[max(i - 1, 0)]
            y = jnp.sin(y) + x
            buf = buf.at[i].set(y)
        return jnp.sum(buf * jnp.arange(steps)) + y

    close(jax.value_and_grad(buffer_loop)(0.7, 25, read), jax.value_and_grad(unrolled)(0.7, 25))


# ---------------------------------------------------------------------------------------------
# scan(buffers=, checkpoints="all")


def scan_loss(a, kind, **options):
    xs = jnp.linspace(0.1, 1.0, 7)

    def step(c, x):
        i, y, buf = c
        y = jnp.sin(y * a) + x
        return (i + 1, y, buf.at[i].set(2 * y)), y**2

    (_, y, buf), ys = scan(
        step, (jnp.int32(0), jnp.float32(0.5), jnp.zeros(7)), xs, kind=kind, **options
    )
    return y + jnp.sum(buf * jnp.arange(7.0)) + jnp.sum(ys)


@pytest.mark.parametrize(
    "options",
    [
        {"buffers": lambda c: c[2]},
        {"checkpoints": "all"},
        {"checkpoints": "all", "buffers": lambda c: c[2]},
        {"checkpoints": 2, "buffers": lambda c: c[2]},
    ],
)
def test_scan_buffers_and_all_checkpoints(options):
    expected = jax.value_and_grad(scan_loss)(1.3, "lax")
    close(jax.value_and_grad(scan_loss)(1.3, "checkpointed", **options), expected)
    close(
        scan_loss(1.3, "lax", **{k: v for k, v in options.items() if k == "buffers"}), expected[0]
    )


def test_scan_buffers_are_not_checkpointed():
    def run(a):
        def step(c, _):
            i, y, buf = c
            return (i + 1, y * a, buf.at[i].set(y)), None

        init = (jnp.int32(0), jnp.float32(1.0), jnp.zeros(500))
        (_, _, buf), _ = scan(
            step, init, length=500, kind="checkpointed", checkpoints=4, buffers=lambda c: c[2]
        )
        return jnp.sum(buf)

    text = str(jax.make_jaxpr(jax.grad(run))(1.0))
    assert "f32[5,500]" not in text and "f32[4,500]" not in text


def test_scan_checkpoints_all_keeps_every_step():
    def run(a):
        return scan(
            lambda c, x: (jnp.sin(c * a) + x, None),
            jnp.float32(0.1),
            jnp.arange(50.0),
            kind="checkpointed",
            checkpoints="all",
        )[0]

    text = str(jax.make_jaxpr(jax.grad(run))(1.0))
    assert "f32[51]" in text  # 50 checkpoints and a spare slot
    close(
        jax.grad(run)(0.9),
        jax.grad(
            lambda a: scan(
                lambda c, x: (jnp.sin(c * a) + x, None), jnp.float32(0.1), jnp.arange(50.0)
            )[0]
        )(0.9),
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"checkpoints": "every"}, r'`checkpoints` must be a positive int, "all" or None'),
        ({"checkpoints": 0}, "`checkpoints` must be a positive Python int"),
        ({"buffers": lambda c: c[2] * 1}, r"every leaf of `buffers\(init\)` must be an array"),
        ({"buffers": 3}, "buffers"),
    ],
)
def test_scan_option_errors(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        scan_loss(1.3, "checkpointed", **options)


# ---------------------------------------------------------------------------------------------
# while_loop(base=)


@pytest.mark.parametrize("base", [2, 3, 16, 100])
def test_bounded_base(base):
    def run(a):
        def body(c):
            return c[0] + 1, c[1] * a

        init = (jnp.int32(0), jnp.float32(1.0))
        return while_loop(lambda c: c[0] < 37, body, init, max_steps=40, kind="bounded", base=base)[
            1
        ]

    close(jax.value_and_grad(run)(1.01), (1.01**37, 37 * 1.01**36), rtol=1e-4)
    # ceil(log(40, base)) levels of nested scans.
    levels = str(jax.make_jaxpr(run)(1.0)).count("scan[")
    expected = 1
    while base**expected < 40:
        expected += 1
    assert levels == expected


@pytest.mark.parametrize("base", [1, 0, 2.0, True, "16"])
def test_bad_base_is_refused(base):
    with pytest.raises(ValueError, match=r"`base` must be a Python int of at least 2.*base=16"):
        power(1.0, "bounded", base=base)


def test_base_is_ignored_by_other_kinds_as_in_equinox():
    close(power(1.2, "checkpointed", base=3), power(1.2, "checkpointed"))
    close(power(1.2, "lax", base=3), power(1.2, "lax"))


# ---------------------------------------------------------------------------------------------
# Progress meters


def printed_percentages(text):
    return [float(line[:-1]) for line in text.split() if line.endswith("%")]


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_text_progress_meter_from_inside_the_compiled_loop(kind, capsys):
    meter = TextProgressMeter(minimum_increase=0.25)
    run = jax.jit(lambda a: power(a, kind, steps=8, progress_meter=meter)[1])
    run(1.1).block_until_ready()
    jax.effects_barrier()
    # 8 steps of max_steps=10: the start, 30% and 60% (more than 25% on), and the loop's end.
    expected = [0.0, 30.0, 60.0, 100.0]
    assert printed_percentages(capsys.readouterr().out) == expected
    run(1.1).block_until_ready()  # each run starts afresh
    jax.effects_barrier()
    assert printed_percentages(capsys.readouterr().out) == expected
    if kind != "lax":
        # Reverse mode: the forward pass reports once; recomputed steps report nothing.
        jax.block_until_ready(jax.jit(jax.grad(run))(1.1))
        jax.effects_barrier()
        assert printed_percentages(capsys.readouterr().out) == expected


def test_text_progress_meter_with_a_fraction_of_the_carry(capsys):
    meter = TextProgressMeter(0.3, fraction=lambda c: c[0])
    out = while_loop(
        lambda c: c[0] < 1.0,
        lambda c: (c[0] + 0.125, c[1]),
        (jnp.float32(0), 1),
        progress_meter=meter,
    )
    assert float(out[0]) == 1.0
    jax.effects_barrier()
    # 100% is reached by the last step: `close` does not print it again.
    assert printed_percentages(capsys.readouterr().out) == [0.0, 37.5, 75.0, 100.0]


def test_text_progress_meter_under_vmap_shows_the_furthest(capsys):
    meter = TextProgressMeter(0.3, fraction=lambda c: c[0] / c[1])

    def run(limit):
        return while_loop(
            lambda c: c[0] < c[1],
            lambda c: (c[0] + 1.0, c[1]),
            (jnp.float32(0), limit),
            progress_meter=meter,
        )[0]

    jax.block_until_ready(jax.vmap(run)(jnp.array([2.0, 4.0])))
    jax.effects_barrier()
    # One line per report for the whole batch, with the furthest element's progress: after
    # one step the elements are at 50% and 25%, after two at 100% and 50%.
    assert printed_percentages(capsys.readouterr().out) == [0.0, 50.0, 100.0]


def test_no_progress_meter(capsys):
    out = power(1.0, "lax", progress_meter=NoProgressMeter())
    close(out, power(1.0, "lax"))
    jax.effects_barrier()
    assert capsys.readouterr().out == ""
    assert repr(NoProgressMeter()) == "NoProgressMeter()"


def test_tqdm_progress_meter(capfd):
    pytest.importorskip("tqdm")
    meter = TqdmProgressMeter(refresh_steps=3)
    out = jax.jit(lambda a: power(a, "checkpointed", steps=8, progress_meter=meter)[1])(1.1)
    jax.block_until_ready(out)
    jax.effects_barrier()
    frames = capfd.readouterr().err.split("\r")
    # Refreshed after steps 3 and 6 (30%, 60%), then closed at 100% when the loop ended.
    shown = [frame.split("%")[0] for frame in frames if "%" in frame]
    assert shown[0] == "0.00" and "30.00" in shown and "60.00" in shown
    assert shown[-1] == "100.00" and "80.00" not in shown


def test_tqdm_progress_meter_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(ImportError, match=r"pip install tqdm.*TextProgressMeter"):
        TqdmProgressMeter()


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: TextProgressMeter(0), ValueError, "`minimum_increase` must be a number in"),
        (lambda: TextProgressMeter(1.5), ValueError, "`minimum_increase` must be a number in"),
        (lambda: TextProgressMeter(fraction=3), TypeError, "fraction"),
        (lambda: TqdmProgressMeter(refresh_steps=0), ValueError, "`refresh_steps` must be a"),
    ],
)
def test_bad_meter_arguments(make, error, message):
    if "Tqdm" in message or "refresh" in message:
        pytest.importorskip("tqdm")
    with pytest.raises(error, match=message):
        make()


def test_progress_meter_errors():
    with pytest.raises(TypeError, match=r"`progress_meter` must be an AbstractProgressMeter.*str"):
        power(1.0, "lax", progress_meter="text")
    with pytest.raises(TypeError, match=r"must be an AbstractProgressMeter.*TextProgressMeter\(\)"):
        power(1.0, "lax", progress_meter=TextProgressMeter)  # the class, not an instance
    with pytest.raises(ValueError, match=r"`max_steps` is None.*fraction"):
        while_loop(
            lambda i: i < 3, lambda i: i + 1, jnp.int32(0), progress_meter=TextProgressMeter()
        )
    with pytest.raises(TypeError, match="`fraction` must return a scalar"):
        while_loop(
            lambda c: c[0] < 3,
            lambda c: (c[0] + 1, c[1]),
            (jnp.int32(0), jnp.ones(2)),
            progress_meter=TextProgressMeter(fraction=lambda c: c[1]),
        )


class StepLog(AbstractProgressMeter):
    """A meter of one's own: counts the steps and logs each progress it is given."""

    def init(self):
        jax.debug.callback(lambda: print("start"))
        return jnp.int32(0)

    def step(self, state, progress):
        jax.debug.callback(lambda p: print(f"step {float(p):.2f}"), progress)
        return state + 1

    def close(self, state):
        jax.debug.callback(lambda n: print(f"end after {int(n)}"), state)


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_a_meter_of_ones_own_drives_the_loop(kind, capsys):
    out = while_loop(
        lambda i: i < 3,
        lambda i: i + 1,
        jnp.int32(0),
        max_steps=4,
        kind=kind,
        progress_meter=StepLog(),
    )
    assert int(out) == 3
    jax.effects_barrier()
    lines = capsys.readouterr().out.split("\n")
    assert lines == ["start", "step 0.25", "step 0.50", "step 0.75", "end after 3", ""]


def test_a_meter_of_ones_own_needs_max_steps_or_a_fraction():
    with pytest.raises(ValueError, match=r"`max_steps` is None"):
        while_loop(lambda i: i < 3, lambda i: i + 1, jnp.int32(0), progress_meter=StepLog())

    class Bad(StepLog):
        fraction = 0.5

    with pytest.raises(TypeError, match=r"`fraction` must be a function.*Bad.fraction is float"):
        while_loop(lambda i: i < 3, lambda i: i + 1, jnp.int32(0), progress_meter=Bad())


def test_abstract_progress_meter_needs_its_three_methods():
    class OnlyInit(AbstractProgressMeter):
        def init(self):
            return None

    with pytest.raises(TypeError, match="abstract"):
        OnlyInit()
