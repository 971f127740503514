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
Run it from the repository root::

    hatch run bench:loops            # full run; writes results/loops.md
    hatch run bench:loops --quick    # 1,000 steps, 3 repeats, writes no file

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
        if error > 1e-4:
            raise AssertionError(f"the gradient of {name} differs from lax.scan's by {error}")
    return rows


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


def report(big: dict, small: dict, steps: int, few: int, repeats: int, command: str) -> str:
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
    lines += ["", "<!-- --8<-- [end:report] -->"]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="1,000 steps and 3 repeats, to check it runs"
    )
    parser.add_argument(
        "--out", type=Path, help=f"where to write the table (default for a full run: {DEFAULT_OUT})"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    steps, few, repeats = (1_000, 100, 3) if args.quick else (10_000, 1_000, 7)
    big = measure(steps, repeats)
    small = measure(few, 1)
    command = "python benchmarks/loop_checkpointing.py" + (" --quick" if args.quick else "")
    text = report(big, small, steps, few, repeats, command)
    print(text, end="")
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"written to {out}")


if __name__ == "__main__":
    main()
