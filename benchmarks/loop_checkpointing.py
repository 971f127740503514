"""Time the gradient of a 10,000-step loop through `pytree_transforms.while_loop` with
``kind="checkpointed"``, against the forward pass and other ways to differentiate it.

The loop is explicit Euler for y' = tanh(W2 tanh(W1 y + b1) + b2), with a state y of 64
floats and a 64-64-64 MLP as the vector field; the loss is sum(y**2) at the end, and the
gradient is taken with respect to the MLP's parameters. Timed, all jit-compiled, on CPU with
``jax_cpu_enable_async_dispatch`` off, each the median of several runs after a warm-up:

* the forward pass alone, as ``lax.while_loop`` and as ``lax.scan``;
* the gradient through ``while_loop(kind="checkpointed", checkpoints=100)``;
* the gradient through ``lax.scan`` with ``jax.checkpoint`` on the step (stores one carry a
  step, recomputes each step once);
* the gradient through ``lax.scan`` as it is (stores every step's residuals);
* the gradient through ``equinox.internal.while_loop(kind="checkpointed",
  checkpoints=100)``, when Equinox is installed.

For each gradient, the memory: the temporary bytes XLA allocates for the compiled program
(``memory_analysis()``), and the bytes of the residuals ``jax.vjp`` keeps from the forward
pass, with the same figures for 1,000 steps to show which grow with the number of steps.

Then buffers: a checkpointed loop that writes one location of a buffer as long as the loop
at every step (``buffers=``), forward and forward+backward, at 10k, 20k, 40k and 80k steps,
ours and ``equinox.internal.while_loop`` side by side in the same run: the time per step
should stay flat as the loop grows (each step costs the same), as Equinox's does.

Run it from the repository root::

    hatch run bench:loops                   # full run; writes results/loops.md
    hatch run bench:loops --quick           # shorter loops, 3 repeats, writes no file
    hatch run bench:loops --only buffers    # the buffers table alone

or ``python benchmarks/loop_checkpointing.py [--quick] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pytree_transforms import while_loop

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "loops.md"
SIZE = 64
CHECKPOINTS = 100
DT = 1e-3


def vector_field(params: dict[str, Any], y: Any) -> Any:
    hidden = jnp.tanh(params["w1"] @ y + params["b1"])
    return jnp.tanh(params["w2"] @ hidden + params["b2"])


def euler_step(params: dict[str, Any], y: Any) -> Any:
    return y + DT * vector_field(params, y)


def make_problem() -> tuple[dict[str, Any], Any]:
    keys = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(keys[0], (SIZE, SIZE)) / SIZE**0.5,
        "b1": jnp.zeros(SIZE),
        "w2": jax.random.normal(keys[1], (SIZE, SIZE)) / SIZE**0.5,
        "b2": jnp.zeros(SIZE),
    }
    return params, jax.random.normal(keys[2], (SIZE,))


def losses(steps: int) -> dict[str, Callable[..., Any]]:
    """Every way of computing the loss, by name; the gradients differentiate these."""

    def while_lax(params: Any, y0: Any) -> Any:
        def body(carry: Any) -> Any:
            return carry[0] + 1, euler_step(params, carry[1])

        return jnp.sum(lax.while_loop(lambda c: c[0] < steps, body, (0, y0))[1] ** 2)

    def scan(params: Any, y0: Any, remat: bool = False) -> Any:
        def body(y: Any, _: Any) -> Any:
            return euler_step(params, y), None

        body = jax.checkpoint(body) if remat else body
        return jnp.sum(lax.scan(body, y0, None, length=steps)[0] ** 2)

    def checkpointed(loop: Callable[..., Any]) -> Callable[..., Any]:
        """The loss through `loop`, a checkpointed while loop with Equinox's signature."""

        def loss(params: Any, y0: Any) -> Any:
            def body(carry: Any) -> Any:
                return carry[0] + 1, euler_step(params, carry[1])

            out = loop(
                lambda c: c[0] < steps,
                body,
                (jnp.int32(0), y0),
                max_steps=steps,
                kind="checkpointed",
                checkpoints=CHECKPOINTS,
            )
            return jnp.sum(out[1] ** 2)

        return loss

    result = {
        "while_lax": while_lax,
        "scan": scan,
        "scan_remat": lambda p, y: scan(p, y, remat=True),
        "ours": checkpointed(while_loop),
    }
    try:
        import equinox.internal as eqxi
    except ImportError:
        return result

    result["equinox"] = checkpointed(eqxi.while_loop)
    return result


def median_time(fn: Callable[..., Any], args: tuple[Any, ...], repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def best_time(fn: Callable[..., Any], args: tuple[Any, ...], repeats: int) -> float:
    """The fastest of `repeats` runs after a warm-up: the least disturbed by other work on a
    shared machine, for programs of a few milliseconds."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def temp_bytes(fn: Callable[..., Any], args: tuple[Any, ...]) -> int | None:
    """The temporary bytes of the compiled program, if XLA reports them."""
    analysis = fn.lower(*args).compile().memory_analysis()
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def residual_bytes(loss: Callable[..., Any], args: tuple[Any, ...]) -> int:
    """The bytes `jax.vjp` keeps from the forward pass for the backward pass."""
    _, vjp = jax.vjp(loss, *args)
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(vjp) if hasattr(x, "dtype"))


def measure(steps: int, repeats: int) -> dict[str, dict[str, Any]]:
    params, y0 = make_problem()
    args = (params, y0)
    rows: dict[str, dict[str, Any]] = {}
    for name, loss in losses(steps).items():
        row: dict[str, Any] = {}
        if name in ("while_lax", "scan"):
            row["forward"] = median_time(jax.jit(loss), args, repeats)
        if name != "while_lax":
            grad = jax.jit(jax.grad(loss))
            row["grad"] = median_time(grad, args, repeats)
            row["temp"] = temp_bytes(grad, args)
            row["residuals"] = residual_bytes(loss, args)
        rows[name] = row
    reference = jax.grad(losses(steps)["scan"])(*args)
    for name in rows.keys() - {"while_lax", "scan"}:
        got = jax.grad(losses(steps)[name])(*args)
        error = max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference), strict=True)
        )
        scale = max(float(jnp.max(jnp.abs(b))) for b in jax.tree.leaves(reference))
        # Relative to the gradient's size (hundreds here): float32 sums of 10,000 steps'
        # contributions may differ in their last bits with the order of the additions.
        if error > 1e-6 * max(scale, 1.0):
            raise AssertionError(f"the gradient of {name} differs from lax.scan's by {error}")
    return rows


BUFFER_STEPS = (10_000, 20_000, 40_000, 80_000)


def buffer_loss(loop: Callable[..., Any], steps: int) -> Callable[..., Any]:
    """A loop writing `buf[i]` at step `i` of `steps`, through `loop` (Equinox's signature)."""

    def loss(x: Any) -> Any:
        def body(carry: Any) -> Any:
            i, y, buf = carry
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
        return jnp.sum(out[2] * jnp.linspace(0.0, 1.0, steps)) + out[1]

    return loss


def measure_buffers(all_steps: Sequence[int], repeats: int) -> dict[str, dict[int, dict]]:
    """Forward and forward+backward times of the buffer loop, ours and Equinox's."""
    loops: dict[str, Callable[..., Any]] = {"ours": while_loop}
    try:
        import equinox.internal as eqxi

        loops["equinox"] = eqxi.while_loop
    except ImportError:
        pass
    rows: dict[str, dict[int, dict]] = {name: {} for name in loops}
    x = jnp.float32(0.3)
    for steps in all_steps:
        grads = {}
        for name, loop in loops.items():
            loss = buffer_loss(loop, steps)
            grad = jax.jit(jax.value_and_grad(loss))
            rows[name][steps] = {
                "forward": best_time(jax.jit(loss), (x,), repeats),
                "grad": best_time(grad, (x,), repeats),
            }
            grads[name] = grad(x)
        if "equinox" in grads:
            error = max(
                float(jnp.max(jnp.abs(a - b)) / (1 + jnp.max(jnp.abs(b))))
                for a, b in zip(grads["ours"], grads["equinox"], strict=True)
            )
            if error > 1e-3:
                raise AssertionError(f"ours and Equinox's differ by {error} at {steps} steps")
    return rows


def micro(value: float, steps: int) -> str:
    return f"{1e6 * value / steps:.3f} us"


def millis(value: float) -> str:
    return f"{1e3 * value:.2f} ms"


def buffers_report(rows: dict[str, dict[int, dict]], repeats: int) -> list[str]:
    ours, theirs = rows["ours"], rows.get("equinox")
    lines = [
        "## Buffers: one write per step",
        "",
        '`while_loop(kind="checkpointed", buffers=...)` whose step writes `buf[i]` of a '
        "buffer as long as the loop (default checkpoints); forward, and forward+backward "
        f"(`jax.value_and_grad`), jit-compiled, the fastest of {repeats} runs. Per step: the "
        "time over the number of steps (flat when the cost is linear).",
        "",
        "| steps | pass | ours | Equinox | ours / Equinox | ours per step | Equinox per step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for steps in ours:
        for what, label in (("forward", "forward"), ("grad", "forward+backward")):
            mine = ours[steps][what]
            if theirs is None:
                lines.append(
                    f"| {steps:,} | {label} | {millis(mine)} | not installed | | "
                    f"{micro(mine, steps)} | |"
                )
                continue
            other = theirs[steps][what]
            lines.append(
                f"| {steps:,} | {label} | {millis(mine)} | {millis(other)} | "
                f"{mine / other:.2f}x | {micro(mine, steps)} | {micro(other, steps)} |"
            )
    first, last = min(ours), max(ours)
    for what, label in (("forward", "forward"), ("grad", "forward+backward")):
        growth = (ours[last][what] / last) / (ours[first][what] / first)
        lines.append("")
        lines.append(
            f"Ours, {label}: time per step at {last:,} steps / at {first:,} steps = "
            f"{growth:.2f}x (1.00x is linear)."
        )
    return lines


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{1e3 * value:.1f} ms"


def mebibytes(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.2f} MiB"


LABELS = {
    "ours": f'`pytree_transforms.while_loop(kind="checkpointed", checkpoints={CHECKPOINTS})`',
    "equinox": f'`equinox.internal.while_loop(kind="checkpointed", checkpoints={CHECKPOINTS})`',
    "scan_remat": "`lax.scan` + `jax.checkpoint` on the step",
    "scan": "`lax.scan` (stores every step)",
}


def report(
    big: dict,
    small: dict,
    steps: int,
    few: int,
    repeats: int,
    command: str,
    buffers: dict | None = None,
    buffer_repeats: int = 0,
) -> str:
    forward = big["while_lax"]["forward"]
    try:
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "n/a"
    lines = [
        "# pytree_transforms: gradients through a long loop with checkpointing",
        "",
        "<!-- --8<-- [start:report] -->",
        "",
        f"- Loop: {steps:,} explicit Euler steps of y' = MLP(y), state of {SIZE} floats, "
        f"vector field tanh(W2 tanh(W1 y + b1) + b2) with {SIZE}x{SIZE} weights; loss "
        "sum(y**2); gradient with respect to the weights",
        f"- Machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python "
        f"{platform.python_version()}; load average at start (1/5/15 min): {load}",
        f"- Versions: jax {version('jax')}, jaxlib {version('jaxlib')}, equinox "
        f"{version('equinox')}, pytree_transforms {version('pytree-transforms')}",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Command: `{command}`",
        f"- CPU, `jax_cpu_enable_async_dispatch` off, jit-compiled; each time the median of "
        f"{repeats} runs after a warm-up. Every gradient is checked against `lax.scan`'s.",
        "- Memory: XLA's temporary allocation for the compiled gradient "
        "(`memory_analysis().temp_size_in_bytes`), and the residuals `jax.vjp` keeps from "
        f"the forward pass, at {steps:,} and at {few:,} steps.",
        "",
        f"Forward pass alone: `lax.while_loop` {seconds(forward)}, `lax.scan` "
        f"{seconds(big['scan']['forward'])}.",
        "",
        f"| gradient through | time | / forward | temp ({steps:,} steps) | temp ({few:,}) "
        f"| residuals ({steps:,}) | residuals ({few:,}) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("ours", "equinox", "scan_remat", "scan"):
        if name not in big:
            lines.append(f"| {LABELS[name]} | not installed | | | | | |")
            continue
        row, other = big[name], small[name]
        lines.append(
            f"| {LABELS[name]} | {seconds(row['grad'])} | {row['grad'] / forward:.1f}x | "
            f"{mebibytes(row['temp'])} | {mebibytes(other['temp'])} | "
            f"{mebibytes(row['residuals'])} | {mebibytes(other['residuals'])} |"
        )
    if buffers is not None:
        lines += ["", *buffers_report(buffers, buffer_repeats)]
    lines += ["", "<!-- --8<-- [end:report] -->"]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="1,000 steps and 3 repeats, to check it runs"
    )
    parser.add_argument(
        "--only",
        choices=("buffers",),
        help="run only this part (and print it; writes a file only with --out)",
    )
    parser.add_argument(
        "--out", type=Path, help=f"where to write the table (default for a full run: {DEFAULT_OUT})"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    steps, few, repeats = (1_000, 100, 3) if args.quick else (10_000, 1_000, 7)
    buffer_steps = tuple(s // 10 for s in BUFFER_STEPS) if args.quick else BUFFER_STEPS
    buffers = measure_buffers(buffer_steps, 3 * repeats)
    if args.only == "buffers":
        text = "\n".join(buffers_report(buffers, 3 * repeats)) + "\n"
        print(text, end="")
        if args.out is not None:
            args.out.write_text(text)
        return
    big = measure(steps, repeats)
    small = measure(few, 1)
    command = "python benchmarks/loop_checkpointing.py" + (" --quick" if args.quick else "")
    text = report(big, small, steps, few, repeats, command, buffers, 3 * repeats)
    print(text, end="")
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"written to {out}")


if __name__ == "__main__":
    main()
