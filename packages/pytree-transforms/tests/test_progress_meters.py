"""The progress meters' `init`/`step`/`close` protocol, driven from a loop of one's own,
eagerly and under `jax.jit`, `jax.vmap` and `jax.grad`."""

import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from pytree_transforms import (
    AbstractProgressMeter,
    NoProgressMeter,
    TextProgressMeter,
    TqdmProgressMeter,
)

STEPS = 10
TEN_LINES = "".join(f"{10 * k:.2f}%\n" for k in range(STEPS + 1))


def run_meter(meter, x=0.0, steps=STEPS):
    """`steps` steps of a `lax.scan`, reporting `(i + 1) / steps` after step `i`; the
    progress depends on `x` so that under `vmap` it is batched."""

    def body(carry, i):
        x, state = carry
        progress = (i + 1) / steps + 0.0 * x
        return (x, meter.step(state, progress)), None

    (x, state), _ = lax.scan(body, (x, meter.init()), jnp.arange(steps))
    meter.close(state)
    return x


# A line that XLA itself logs (glog format: severity, date, time), such as its warning when
# a cached executable was compiled for another CPU: not the meter's output.
_XLA_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ .*\n?", re.MULTILINE)


def output(capfd):
    """What was printed, less XLA's own log lines."""
    jax.effects_barrier()
    captured = capfd.readouterr()
    return type(captured)(captured.out, _XLA_LOG_LINE.sub("", captured.err))


def test_the_meters_are_progress_meters():
    assert issubclass(TextProgressMeter, AbstractProgressMeter)
    assert issubclass(NoProgressMeter, AbstractProgressMeter)
    assert issubclass(TqdmProgressMeter, AbstractProgressMeter)


@pytest.mark.parametrize("transform", ["eager", "jit", "vmap", "jit_vmap"])
def test_no_progress_meter_prints_nothing(transform, capfd):
    meter = NoProgressMeter()
    if transform == "eager":
        run_meter(meter)
    elif transform == "jit":
        jax.jit(run_meter, static_argnums=0)(meter)
    else:
        run = jax.vmap(lambda x: run_meter(meter, x))
        (jax.jit(run) if transform == "jit_vmap" else run)(jnp.arange(3.0))
    captured = output(capfd)
    assert captured.out == "" and captured.err == ""
    assert meter.init() is None and meter.step(None, 0.5) is None


@pytest.mark.parametrize("transform", ["eager", "jit", "vmap", "jit_vmap"])
def test_text_progress_meter_prints_each_increase(transform, capfd):
    meter = TextProgressMeter(minimum_increase=0.0999)
    if transform == "eager":
        run = lambda: run_meter(meter)  # noqa: E731
    elif transform == "jit":
        run = jax.jit(lambda: run_meter(meter))
    else:
        # A batch of 3 progressing alike prints what one element would, once.
        batched = jax.vmap(lambda x: run_meter(meter, x))
        if transform == "jit_vmap":
            batched = jax.jit(batched)
        run = lambda: batched(jnp.arange(3.0))  # noqa: E731
    run()
    assert output(capfd) == (TEN_LINES, "")
    run()  # each run starts a fresh meter
    assert output(capfd) == (TEN_LINES, "")


def test_text_progress_meter_under_grad(capfd):
    meter = TextProgressMeter(minimum_increase=0.0999)

    def f(p):
        def body(carry, i):
            p, state = carry
            return (p, meter.step(state, (i + 1) / STEPS)), None

        (p, state), _ = lax.scan(body, (p, meter.init()), jnp.arange(STEPS))
        meter.close(state)
        return p * p

    assert float(jax.grad(f)(1.0)) == 2.0
    assert output(capfd) == (TEN_LINES, "")
    assert float(jax.jit(jax.grad(f))(1.0)) == 2.0
    assert output(capfd) == (TEN_LINES, "")


def test_text_progress_meter_lines_and_close(capfd):
    # Lines only for an increase of more than `minimum_increase`; `close` prints 100%
    # unless it was printed.
    meter = TextProgressMeter(minimum_increase=0.25)
    jax.jit(lambda: run_meter(meter, steps=8))()
    assert output(capfd).out == "0.00%\n37.50%\n75.00%\n100.00%\n"
    state = meter.init()
    state = meter.step(state, 0.3)
    meter.close(state)
    assert output(capfd).out == "0.00%\n30.00%\n100.00%\n"


def test_text_progress_meter_under_vmap_shows_the_furthest(capfd):
    meter = TextProgressMeter(minimum_increase=0.3)

    def run(speed):
        state = meter.init()
        state = meter.step(state, 0.2 * speed)
        state = meter.step(state, 0.4 * speed)
        meter.close(state)
        return speed

    jax.jit(jax.vmap(run))(jnp.array([1.0, 2.0]))
    assert output(capfd).out == "0.00%\n40.00%\n80.00%\n100.00%\n"


def tqdm_frames(err):
    return [frame for frame in err.split("\r") if frame.strip()]


@pytest.mark.parametrize("transform", ["jit", "jit_vmap"])
def test_tqdm_progress_meter(transform, capfd):
    pytest.importorskip("tqdm")
    meter = TqdmProgressMeter(refresh_steps=3)
    if transform == "jit":
        jax.jit(lambda: run_meter(meter))()
    else:
        jax.jit(jax.vmap(lambda x: run_meter(meter, x)))(jnp.arange(3.0))
    captured = output(capfd)
    assert captured.out == "" and "\r" in captured.err
    frames = tqdm_frames(captured.err)
    assert frames[0].startswith("0.00%")
    # Refreshed after steps 3, 6 and 9 only, then closed at 100%.
    shown = [frame.split("%")[0] for frame in frames]
    assert [s for s in shown if s not in ("0.00", "100.00")] == ["30.00", "60.00", "90.00"]
    assert "100.00%" in frames[-1] and "█" in frames[-1]


def test_tqdm_progress_meter_eagerly(capfd):
    pytest.importorskip("tqdm")
    run_meter(TqdmProgressMeter(refresh_steps=5))
    frames = tqdm_frames(output(capfd).err)
    assert "50.00%" in "".join(frames) and frames[-1].startswith("100.00%")
