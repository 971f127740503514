"""One small transformer trained on a device mesh four ways, each matching one device.

The model is two pre-norm transformer blocks (causal self-attention and an MLP) between an
input and an output projection. It learns to output, at every position of a sequence of
vectors, the mean of the vectors so far: a task only attention can solve. It is trained with
Adam, through `pytree_nn.Optimizer` under `pytree_graph.jit`, with each of these layouts:

- **one device**: the reference;
- **data parallel**: every device holds the whole model and an eighth of each batch;
- **fully sharded** (FSDP): every parameter is split over the same "data" axis as the batch,
  so each device holds an eighth of the model too, and XLA gathers the weights a layer needs;
- **tensor parallel** (with data parallel): a 2x4 mesh, the batch split over "data" and
  each block split Megatron-style over "model": the attention heads and the MLP's hidden
  units, with the projections that gather them split on their input side.

Each layout is only `sharding` metadata given to the layers (`kernel_sharding=` and
friends) and a mesh for `pytree_graph.create_sharded`, which builds the model directly on it;
the training step is the same function every time. The losses of every layout are compared
with one device's, and the time per step measured.

Without GPUs or TPUs the script asks XLA for `--devices` fake CPU devices: they share the
machine's cores, so the times show that the program runs, not a speed-up.

Several hosts: start the same program once per host with `--coordinator HOST:PORT
--processes N --process-id I` (`jax.distributed.initialize`); the mesh then spans every
host's devices, and each process feeds its own part of every batch. On one machine, two
processes with 4 fake devices each show it:

    python examples/sharding.py --devices 4 --processes 2 --coordinator localhost:12355 \
        --process-id 0 &
    python examples/sharding.py --devices 4 --processes 2 --coordinator localhost:12355 \
        --process-id 1

Run it from the repository root::

    hatch run python examples/sharding.py
    hatch run python examples/sharding.py --steps 100 --layouts data fsdp

The last line printed is ``every layout matches one device: max loss difference ...``.
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_nn import (
    LayerNorm,
    Linear,
    Module,
    MultiHeadAttention,
    Optimizer,
    Rngs,
    make_causal_mask,
)

DEFAULT_DEVICES = 8
DEFAULT_STEPS = 30
BATCH = 32  # sequences per step, over all devices
LENGTH = 16  # positions per sequence
INPUTS = 4  # features of each position's vector
FEATURES = 64  # the model's width
HEADS = 8
HIDDEN = 256  # the MLP's hidden units
DEFAULT_BLOCKS = 2
LEARNING_RATE = 3e-3
# Float32 sums in another order: per-step losses agree to about this.
TOLERANCE = 1e-4
MAX_SEED = 2**32 - 1


class Plan(NamedTuple):
    """The mesh axes of each kind of kernel (None: not split), and the mesh's shape."""

    mesh: dict[str, int]  # axis name -> size, e.g. {"data": 2, "model": 4}
    embed: tuple = (None, None)  # the input projection (INPUTS, FEATURES)
    qkv: tuple = (None, None, None)  # attention's query, key, value (FEATURES, HEADS, dim)
    out: tuple = (None, None, None)  # attention's output (HEADS, dim, FEATURES)
    up: tuple = (None, None)  # the MLP's first layer (FEATURES, HIDDEN)
    down: tuple = (None, None)  # its second (HIDDEN, FEATURES)
    head: tuple = (None, None)  # the output projection (FEATURES, INPUTS)


def plans(devices: int) -> dict[str, Plan]:
    """Every layout, for a mesh of `devices` devices."""
    fsdp = ("data", None)  # a kernel split on its first axis, as the batch
    return {
        "one device": Plan(mesh={"data": 1}),
        "data parallel": Plan(mesh={"data": devices}),
        "fully sharded": Plan(
            mesh={"data": devices},
            embed=(None, "data"),
            qkv=("data", None, None),
            out=(None, None, "data"),
            up=fsdp,
            down=fsdp,
            head=fsdp,
        ),
        "tensor parallel": Plan(
            mesh={"data": 2, "model": devices // 2},
            qkv=(None, "model", None),
            out=("model", None, None),
            up=(None, "model"),
            down=("model", None),
        ),
    }


LAYOUTS = {"one": "one device", "data": "data parallel", "fsdp": "fully sharded",
           "tensor": "tensor parallel"}  # fmt: skip


class Block(Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each residual."""

    def __init__(self, plan: Plan, rngs: Rngs):
        self.norm1 = LayerNorm(FEATURES, rngs=rngs)
        self.attention = MultiHeadAttention(
            HEADS, FEATURES, qkv_kernel_sharding=plan.qkv, out_kernel_sharding=plan.out,
            rngs=rngs,
        )  # fmt: skip
        self.norm2 = LayerNorm(FEATURES, rngs=rngs)
        self.up = Linear(FEATURES, HIDDEN, kernel_sharding=plan.up, rngs=rngs)
        self.down = Linear(HIDDEN, FEATURES, kernel_sharding=plan.down, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        mask = make_causal_mask(jnp.ones(x.shape[:-1]))
        x = x + self.attention(self.norm1(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class Model(Module):
    """Input projection, `blocks` transformer blocks, output projection."""

    def __init__(self, plan: Plan, rngs: Rngs, blocks: int = DEFAULT_BLOCKS):
        self.embed = Linear(INPUTS, FEATURES, kernel_sharding=plan.embed, rngs=rngs)
        self.blocks = [Block(plan, rngs) for _ in range(blocks)]
        self.head = Linear(FEATURES, INPUTS, kernel_sharding=plan.head, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_batches(seed: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """`steps` batches of random sequences and their running means, each of shape
    `(steps, BATCH, LENGTH, INPUTS)`."""
    x = np.random.default_rng(seed).normal(size=(steps, BATCH, LENGTH, INPUTS))
    y = np.cumsum(x, axis=2) / np.arange(1, LENGTH + 1)[:, None]
    return x.astype(np.float32), y.astype(np.float32)


def loss_fn(model: Model, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def build(plan: Plan, rngs: Rngs, blocks: int) -> tuple[Model, Optimizer]:
    """The model and its optimizer, whose Adam moments take each parameter's `sharding`."""
    model = Model(plan, rngs, blocks)
    return model, Optimizer(model, optax.adam(LEARNING_RATE))


@pg.jit
def train_step(
    model: Model, optimizer: Optimizer, x: jax.Array, y: jax.Array, mesh: Mesh
) -> jax.Array:
    """One Adam step; the same code for every layout (the arrays' shardings differ).

    The new parameters and moments are pinned to the layout they came in with, so the next
    step gets its inputs as this one did, and reuses its compiled code.
    """
    loss, grads = pg.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    pg.shard(optimizer, mesh)
    return loss


def make_mesh(shape: dict[str, int]) -> Mesh:
    """A mesh of that shape; one device is this process's own (each process then trains
    its own copy of the reference)."""
    size = int(np.prod(list(shape.values())))
    devices = np.array((jax.local_devices() if size == 1 else jax.devices())[:size])
    return Mesh(devices.reshape(tuple(shape.values())), tuple(shape))


def global_batch(local: np.ndarray, mesh: Mesh) -> jax.Array:
    """One global array, split over "data", from this process's part of a batch (with one
    process, the whole batch)."""
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    return jax.make_array_from_process_local_data(sharding, local)


def local_part(batch: np.ndarray) -> np.ndarray:
    """This process's rows of a batch: each process feeds its own devices."""
    rows = len(batch) // jax.process_count()
    return batch[jax.process_index() * rows : (jax.process_index() + 1) * rows]


def bytes_per_device(model: Model) -> int:
    """The bytes of parameters the first device holds."""
    first = jax.local_devices()[0]
    return sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves(pg.state(model))
        for shard in leaf.addressable_shards
        if shard.device == first
    )


class Result(NamedTuple):
    losses: np.ndarray  # the loss of every step
    model: Model
    share: float  # the fraction of the parameters' bytes the first device holds
    step_ms: float  # the median time of a step, compilation excluded


def train(plan: Plan, seed: int, steps: int, blocks: int = DEFAULT_BLOCKS) -> Result:
    """Build the model on `plan`'s mesh and train it for `steps` steps."""
    mesh = make_mesh(plan.mesh)
    model, optimizer = pg.create_sharded(build, mesh, plan, Rngs(seed), blocks)
    xs, ys = make_batches(seed, steps)
    # Over several processes each feeds its own part; on its own devices, all of it.
    own = {d.id for d in jax.local_devices()}
    part = (lambda batch: batch) if {d.id for d in mesh.devices.flat} <= own else local_part
    losses, times = [], []
    for x, y in zip(xs, ys, strict=True):
        start = time.perf_counter()
        x, y = global_batch(part(x), mesh), global_batch(part(y), mesh)
        loss = train_step(model, optimizer, x, y, mesh)
        losses.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - start)
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(pg.state(model)))
    step_ms = 1e3 * statistics.median(times[1:]) if steps > 1 else float("nan")
    return Result(np.array(losses), model, bytes_per_device(model) / total, step_ms)


def shown_mesh(shape: dict[str, int]) -> str:
    return ",".join(f"{name}={size}" for name, size in shape.items())


def scaling(seed: int, steps: int, blocks: int) -> list[tuple[int, float]]:
    """Data-parallel time per step on 1, 2, 4, ... devices, the global batch fixed."""
    rows, devices = [], 1
    while devices <= jax.device_count():
        result = train(Plan(mesh={"data": devices}), seed, steps, blocks)
        rows.append((devices, result.step_ms))
        devices *= 2
    return rows


def ask_for_devices(count: int) -> None:
    """Fake `count` CPU devices, unless the flag is set already (XLA reads it once, when
    JAX first uses a device)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def at_least(minimum: int) -> Any:
        def parse(text: str) -> int:
            value = int(text)
            if value < minimum:
                raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
            return value

        return parse

    def seed(text: str) -> int:
        value = int(text)
        if not 0 <= value <= MAX_SEED:
            raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_SEED}, got {value}")
        return value

    parser.add_argument("--steps", type=at_least(2), default=DEFAULT_STEPS)
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--blocks", type=at_least(1), default=DEFAULT_BLOCKS)
    parser.add_argument(
        "--devices", type=at_least(2), default=DEFAULT_DEVICES,
        help="fake CPU devices per process, when there are no GPUs or TPUs",
    )  # fmt: skip
    parser.add_argument(
        "--layouts", nargs="+", choices=list(LAYOUTS)[1:], default=list(LAYOUTS)[1:],
        help="the layouts to compare with one device",
    )  # fmt: skip
    parser.add_argument("--no-scaling", action="store_true", help="skip the scaling table")
    parser.add_argument("--coordinator", help="HOST:PORT of process 0, for several processes")
    parser.add_argument("--processes", type=at_least(1), default=1)
    parser.add_argument("--process-id", type=at_least(0), default=0)
    args = parser.parse_args(argv)
    if args.processes > 1 and args.coordinator is None:
        parser.error("--processes needs --coordinator HOST:PORT (process 0's address)")
    if args.process_id >= args.processes:
        parser.error(f"--process-id must be below --processes ({args.processes})")
    return args


def start(args: argparse.Namespace) -> None:
    """Fake devices and join the other processes: before JAX first uses a device."""
    ask_for_devices(args.devices)
    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only; harmless
        jax.distributed.initialize(args.coordinator, args.processes, args.process_id)


def main(argv: Sequence[str] | None = None) -> float:
    """Train every layout asked for; print the comparison; return the largest difference
    between a layout's losses and one device's."""
    args = parse_args(argv)
    start(args)
    count = jax.device_count()
    if count % 2 or BATCH % count:
        sys.exit(f"sharding.py: needs an even number of devices dividing {BATCH}, got {count}")
    say = print if jax.process_index() == 0 else (lambda *_: None)
    say(f"{count} {jax.devices()[0].platform} devices, {jax.process_count()} process(es)")
    layouts = plans(count)
    reference = train(layouts["one device"], args.seed, args.steps, args.blocks)
    say(f"{'layout':<16} {'mesh':<16} {'params/device':>14} {'first loss':>10} "
        f"{'last loss':>10} {'max |diff|':>10} {'ms/step':>8}")  # fmt: skip
    worst = 0.0
    for name in ["one device"] + [LAYOUTS[key] for key in args.layouts]:
        plan = layouts[name]
        result = (
            reference if name == "one device" else train(plan, args.seed, args.steps, args.blocks)
        )
        difference = float(np.max(np.abs(result.losses - reference.losses)))
        worst = max(worst, difference)
        say(f"{name:<16} {shown_mesh(plan.mesh):<16} {result.share:>13.1%} "
            f"{result.losses[0]:>10.4f} {result.losses[-1]:>10.4f} {difference:>10.1e} "
            f"{result.step_ms:>8.2f}")  # fmt: skip
    if not args.no_scaling and jax.process_count() == 1:
        say("\ndata parallel, the same global batch on more devices (fake CPU devices share")
        say("the cores: this shows the program runs, not a speed-up):")
        say(f"{'devices':>8} {'ms/step':>8}")
        for devices, ms in scaling(args.seed, args.steps, args.blocks):
            say(f"{devices:>8} {ms:>8.2f}")
    verdict = "matches" if worst <= TOLERANCE else "DOES NOT match"
    say(f"every layout {verdict} one device: max loss difference {worst:.1e}")
    if worst > TOLERANCE:
        sys.exit(1)
    return worst


if __name__ == "__main__":
    main()
