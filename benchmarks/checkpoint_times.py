"""Time `pytree_nn.save_checkpoint` and `load_checkpoint` on a model of about 100 MB.

The model is 12 ``pytree_nn.Linear(1024, 2048)`` layers, float32 (24 arrays, 100.8 MB), built
directly on a mesh of 8 fake CPU devices with ``pytree_graph.create_sharded``: every kernel is
split over the 8 devices on the mesh axis "data" (the biases are replicated). It is saved and
restored in four settings:

* one process (8 devices), one safetensors file;
* one process (8 devices), a checkpoint directory (orbax-checkpoint);
* two processes (4 devices each, joined by ``jax.distributed``, the model sharded over both),
  a checkpoint directory;
* two processes, one file: refused, since no process holds the arrays whole. The script makes
  the call and reports the ``ValueError`` it raises.

For each, three times: ``save_checkpoint`` (waits until the checkpoint is written), the time
after which ``save_checkpoint(..., wait=False)`` returns (and when the checkpoint it started
is written), and ``load_checkpoint`` into a second model built the same way with another seed,
until its arrays are ready. Every restore is checked to give exactly the saved values. Each
figure is the median of 5 repeats after a warm-up; every save goes to the same path (the file
is replaced; the directory's older step is deleted once the new one is written).

The script starts itself as the processes it measures (``--worker``), one setting's processes
at a time, each with its own count of fake devices, and writes the table to
``results/checkpoints.md``. Run it from the repository root::

    hatch run bench:checkpoints            # full run (about a minute on 2 cores)
    hatch run bench:checkpoints --quick    # a ~4 MB model, one repeat, writes no file

or ``python benchmarks/checkpoint_times.py [--quick] [--out PATH]`` where the packages, JAX and
orbax-checkpoint are importable.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

import pytree_graph
from pytree_nn import Linear, Module, Rngs, load_checkpoint, save_checkpoint

DEVICES = 8  # fake CPU devices in all, split evenly over the processes
TIME_LIMIT_S = 600  # for each setting's processes, after which they are killed
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "checkpoints.md"


class Shape:
    """The model's size: `layers` layers of `Linear(inputs, outputs)`, and the repeats timed."""

    def __init__(self, quick: bool):
        if quick:
            self.layers, self.inputs, self.outputs, self.repeats = 4, 256, 1024, 1
        else:
            self.layers, self.inputs, self.outputs, self.repeats = 12, 1024, 2048, 5


class Stack(Module):
    """The model: `layers` independent Linear layers, each kernel split on its first axis."""

    def __init__(self, layers: int, inputs: int, outputs: int, rngs: Rngs):
        self.layers = [
            Linear(inputs, outputs, kernel_sharding=("data", None), rngs=rngs)
            for _ in range(layers)
        ]


# ---------------------------------------------------------------------------------------------
# The worker: one of the processes of a setting, which builds the model and times it.


def barrier(name: str) -> None:
    """Wait for every process, so that each timed section starts together in all of them."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def arrays(model: Any) -> list[jax.Array]:
    """Every array of the model's state."""
    return jax.tree.leaves(pytree_graph.state(model))


@jax.jit
def _all_equal(a: list[jax.Array], b: list[jax.Array]) -> jax.Array:
    return jnp.all(jnp.stack([jnp.array_equal(x, y) for x, y in zip(a, b, strict=True)]))


def equal(a: Any, b: Any) -> bool:
    """Whether two models hold exactly the same values. Compared where the shards lie, so
    nothing is gathered; the answer is one scalar, replicated in every process."""
    return bool(_all_equal(arrays(a), arrays(b)))


def spans_processes(model: Any) -> bool:
    """Whether some array of the model has shards in more than one process."""
    return any(not array.is_fully_addressable for array in arrays(model))


def measure(path: str, model: Any, target: Any, blank: Any, repeats: int) -> dict[str, float]:
    """Save `model` to `path` and restore it into `target`: a warm-up round, then `repeats`
    timed rounds. Returns the median times in seconds of `save` (with `wait=True`),
    `returned` (when `wait=False` returns), `written` (when its handle's `wait()` returns,
    from the same start) and `restore` (until the restored arrays are ready).

    Before each restore `target` gets `blank`'s values back, so that every restore has to
    write every value, and the check after it shows that this restore did.
    """
    times: dict[str, list[float]] = {"save": [], "returned": [], "written": [], "restore": []}
    for round_ in range(1 + repeats):
        barrier("save")
        start = time.perf_counter()
        save_checkpoint(path, model)
        save = time.perf_counter() - start

        barrier("save, wait=False")
        start = time.perf_counter()
        handle = save_checkpoint(path, model, wait=False)
        returned = time.perf_counter() - start
        handle.wait()
        written = time.perf_counter() - start

        pytree_graph.update(target, pytree_graph.state(blank))
        barrier("restore")
        start = time.perf_counter()
        jax.block_until_ready(arrays(load_checkpoint(path, target)))
        restore = time.perf_counter() - start
        if not equal(model, target):
            raise AssertionError(f"restoring {path} did not give the saved values")

        if round_ > 0:  # the first round is the warm-up
            for key, value in zip(times, (save, returned, written, restore), strict=True):
                times[key].append(value)
    return {key: statistics.median(values) for key, values in times.items()}


def worker(args: argparse.Namespace) -> None:
    """One process of a setting: build the models, time every format, and (process 0) print
    the figures as one JSON line."""
    # Before anything else uses JAX: the CPU devices of different processes exchange data
    # (the barriers, the equality checks) through gloo.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.processes > 1:
        jax.distributed.initialize(
            args.coordinator, num_processes=args.processes, process_id=args.process_id
        )
    shape = Shape(args.quick)
    mesh = Mesh(np.array(jax.devices()).reshape(-1), ("data",))
    sizes = (shape.layers, shape.inputs, shape.outputs)
    model = pytree_graph.create_sharded(Stack, mesh, *sizes, Rngs(0))
    target = pytree_graph.create_sharded(Stack, mesh, *sizes, Rngs(1))
    # What `target` is reset to before each restore (its own arrays are replaced by then).
    blank = pytree_graph.create_sharded(Stack, mesh, *sizes, Rngs(1))
    if equal(model, blank):
        raise AssertionError("the models of both seeds are equal: the restore check is void")

    folder = Path(args.folder)
    rows: list[dict[str, Any]] = []
    # In the table's order: with several processes, the file (refused) comes last.
    for form in ("file", "directory") if args.processes == 1 else ("directory", "file"):
        path = str(folder / "model.safetensors") if form == "file" else f"{folder / 'orbax'}/"
        if form == "file" and spans_processes(model):
            # No process holds the arrays whole, so one file is refused: shown by trying.
            try:
                save_checkpoint(path, model)
            except ValueError as error:
                rows.append({"format": form, "refused": str(error)})
                continue
        rows.append({"format": form, **measure(path, model, target, blank, shape.repeats)})
    if jax.process_index() == 0:
        figures = {
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "arrays": len(arrays(model)),
            "bytes": sum(array.nbytes for array in arrays(model)),
            "rows": rows,
        }
        print(json.dumps(figures), flush=True)


# ---------------------------------------------------------------------------------------------
# The parent: starts each setting's processes, then writes the report.


def free_port() -> int:
    """A port nothing listens on now, for the coordinator of `jax.distributed`."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def run_setting(processes: int, folder: Path, quick: bool) -> dict[str, Any]:
    """Run the worker as `processes` processes of `DEVICES // processes` fake devices each;
    process 0's figures. Fails (killing them all) if one fails or they overrun the limit."""
    folder.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES // processes}"
    env["JAX_PLATFORMS"] = "cpu"
    coordinator = f"localhost:{free_port()}"
    children = []
    for index in range(processes):
        command = [sys.executable, str(Path(__file__).resolve()), "--worker"]
        command += ["--processes", str(processes), "--process-id", str(index)]
        command += ["--coordinator", coordinator, "--folder", str(folder)]
        command += ["--quick"] if quick else []
        # stdout to a file rather than a pipe, which nobody reads while the children run;
        # stderr (progress, tracebacks) goes straight to ours.
        stdout = open(folder.parent / f"worker-{processes}-{index}.out", "w+")  # noqa: SIM115
        children.append((subprocess.Popen(command, env=env, stdout=stdout), stdout))
    try:
        deadline = time.monotonic() + TIME_LIMIT_S
        while any(child.poll() is None for child, _ in children):
            failed = [child.returncode for child, _ in children if child.returncode]
            if failed:  # the others would wait for it at the next barrier, for ever
                raise SystemExit(f"checkpoint_times.py: a worker exited with {failed[0]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"checkpoint_times.py: the workers ran over {TIME_LIMIT_S} s")
            time.sleep(0.2)
        failed = [child.returncode for child, _ in children if child.returncode]
        if failed:
            raise SystemExit(f"checkpoint_times.py: a worker exited with {failed[0]}")
        output = children[0][1]
        output.seek(0)
        # The figures are the one JSON line; any other (gloo's "[Gloo] ..." notices) is not.
        lines = [line for line in output if line.startswith("{")]
        if len(lines) != 1:
            raise SystemExit("checkpoint_times.py: process 0 printed no figures")
        return json.loads(lines[0])
    finally:
        for child, stdout in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            stdout.close()


def seconds(value: float) -> str:
    """A time for the table: seconds, or milliseconds below one second."""
    return f"{value:.2f} s" if value >= 1 else f"{1e3 * value:.0f} ms"


def version(dist: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def filesystem(path: str) -> str:
    """The type of the file system holding `path` (e.g. tmpfs, ext4), from /proc/mounts."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    path = os.path.realpath(path)
    best = max(
        (m for m in mounts if path == m[1] or path.startswith(m[1].rstrip("/") + "/")),
        key=lambda m: len(m[1]),
        default=None,
    )
    return best[2] if best else "unknown"


FORMATS = {"file": "one file (safetensors)", "directory": "a directory (orbax)"}
SETTINGS = {1: f"one process, {DEVICES} devices", 2: f"two processes, {DEVICES // 2} devices each"}


def load_average() -> str:
    """The load average over 1, 5 and 15 minutes: other work skews the times."""
    try:
        return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "n/a"


def report(
    results: dict[int, dict[str, Any]], shape: Shape, folder: str, load: str, command: str
) -> str:
    """The markdown report: the model, the machine, the table and the refusal's message."""
    one = results[1]
    megabytes = one["bytes"] / 1e6
    repeats = "1 repeat" if shape.repeats == 1 else f"{shape.repeats} repeats"
    lines = [
        "# pytree_nn: checkpoint save and restore times",
        "",
        # What the docs include (docs/examples/sharding.md): all but the title.
        "<!-- --8<-- [start:report] -->",
        "",
        f"- Model: {shape.layers} `pytree_nn.Linear({shape.inputs}, {shape.outputs})` layers, "
        f"float32: {one['arrays']} arrays, {megabytes:.1f} MB ({one['bytes'] / 2**20:.1f} "
        f"MiB), built with `pytree_graph.create_sharded` on a mesh of {DEVICES} fake CPU "
        'devices, each kernel split over all of them on "data" (the biases replicated)',
        f"- Machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python "
        f"{platform.python_version()}; load average at start (1/5/15 min): {load}",
        f"- Versions: jax {version('jax')}, jaxlib {version('jaxlib')}, orbax-checkpoint "
        f"{version('orbax-checkpoint')}, pytree_nn {version('pytree-nn')}",
        f"- Checkpoints written to a temporary folder under {os.path.dirname(folder)} "
        f"({filesystem(folder)})",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Command: `{command}`",
        f"- Each time is the median of {repeats} after one warm-up, of process 0 when "
        "there are two (every timed section starts after a barrier of both). "
        "`save` waits until the checkpoint is written; `wait=False` returns after the time "
        "shown, and its checkpoint is written after the time in brackets (from the same "
        "start); `restore` is `load_checkpoint` into a model of the same layout until its "
        "arrays are ready, each restore checked to give exactly the saved values.",
    ]
    if shape.repeats == 1:
        lines.append("- Quick smoke run (`--quick`): a small model, one repeat, not for quoting.")
    lines += [
        "",
        "| setting | format | save | save, `wait=False` returns after | restore |",
        "| --- | --- | --- | --- | --- |",
    ]
    refusals = []
    for processes, result in results.items():
        for row in result["rows"]:
            setting = SETTINGS[processes]
            if "refused" in row:
                refusals.append((setting, row["refused"]))
                cells = ["refused (arrays span processes)", "—", "—"]
            else:
                cells = [
                    seconds(row["save"]),
                    f"{seconds(row['returned'])} (written after {seconds(row['written'])})",
                    seconds(row["restore"]),
                ]
            lines.append(f"| {setting} | {FORMATS[row['format']]} | {' | '.join(cells)} |")
    for setting, message in refusals:
        lines += ["", f"With {setting}, `save_checkpoint` to one file raised:", ""]
        lines += [f"> ValueError: {message}"]
    lines += ["", "<!-- --8<-- [end:report] -->"]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options: `--quick` and `--out` for a run, and those the parent gives a worker."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a ~4 MB model and one repeat, to check it runs"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"where to write the table (default for a full run: {DEFAULT_OUT}; a quick run "
        "writes none unless given)",
    )
    # What the parent passes to the processes it starts.
    worker_options = parser.add_argument_group("worker (internal)")
    worker_options.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    worker_options.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    worker_options.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    worker_options.add_argument("--coordinator", help=argparse.SUPPRESS)
    worker_options.add_argument("--folder", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Run every setting's processes in turn, then print the report (and write it)."""
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    shape = Shape(args.quick)
    out = args.out or (None if args.quick else DEFAULT_OUT)
    load = load_average()
    folder = tempfile.mkdtemp(prefix="checkpoint_times-")
    try:
        results = {}
        for processes in SETTINGS:
            print(f"checkpoint_times.py: {SETTINGS[processes]} ...", file=sys.stderr, flush=True)
            results[processes] = run_setting(processes, Path(folder) / str(processes), args.quick)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    command = "python benchmarks/checkpoint_times.py" + (" --quick" if args.quick else "")
    text = report(results, shape, folder, load, command)
    print(text, end="")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
