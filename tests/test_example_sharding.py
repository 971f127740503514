"""The sharding example (examples/sharding.py): every layout trains as one device does, in one
process and in two; the parameters are really split."""

import contextlib
import fcntl
import os
import re
import socket
import tempfile

import jax
import numpy as np
import pytest
from example_scripts import assert_refused, load_example, run_example, started_example

example = load_example("sharding")

ROW = re.compile(
    r"(one device|data parallel|fully sharded|tensor parallel) +(\S+) +(\d+\.\d)% +"
    r"(\d+\.\d{4}) +(\d+\.\d{4}) +(\S+) +(\d+\.\d{2})"
)
SCALING_ROW = re.compile(r" +(\d+) +(\d+\.\d{2})")
LAST_LINE = re.compile(r"every layout matches one device: max loss difference (\S+)")
SHORT_RUN = ("--steps", "3", "--blocks", "1")
needs_8_devices = pytest.mark.skipif(
    len(jax.devices()) < 8,
    reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)",
)


@pytest.fixture(scope="module", autouse=True)
def script_run():
    """The script run as a user would (every layout, and the scaling table), started before
    the other tests so that it runs alongside them; test_script_end_to_end checks it."""
    with started_example("sharding", *SHORT_RUN) as process:
        yield process


def _rows(stdout):
    return {m.group(1): m.groups()[1:] for m in map(ROW.fullmatch, stdout.splitlines()) if m}


def _ours(stdout):
    """The lines the script printed (the CPU collectives library adds its own)."""
    # Its "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer
    # ranks is : 1" comes from C++, at times in pieces across lines, which can leave a
    # line empty; the tests read no empty line of the script's.
    noise = ("[Gloo]", "is connected to", "connected peer ranks")
    return [
        line for line in stdout.splitlines() if line.strip() and not any(n in line for n in noise)
    ]


def _free_port():
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _alone_with_processes():
    """The lock the packages' tests take around each group of jax.distributed processes
    (packages/pytree-nn/tests/local_processes.py): one group at a time, so that two cannot
    take one free port, nor slow each other's collectives past gloo's time limit."""
    path = os.path.join(tempfile.gettempdir(), "pytree-tests-jax-distributed.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def test_two_processes_of_4_devices_train_as_one_device():
    """The several-hosts recipe, on one machine: two processes, one mesh over both."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # --devices 4 applies
    common = (*SHORT_RUN, "--layouts", "fsdp", "--no-scaling", "--devices", "4")
    with _alone_with_processes():
        common += ("--processes", "2", "--coordinator", f"localhost:{_free_port()}")
        with started_example("sharding", *common, "--process-id", "1", env=env) as second:
            first = run_example("sharding", *common, "--process-id", "0", env=env)
            second_out, second_err = second.communicate(timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert second.returncode == 0, second_out + second_err
    assert _ours(second_out) == []  # only process 0 prints
    lines = _ours(first.stdout)
    assert lines[0] == "8 cpu devices, 2 process(es)"
    rows = _rows(first.stdout)
    assert list(rows) == ["one device", "fully sharded"]
    assert rows["fully sharded"][1] == "14.1"  # as in one process: 1/8 of every kernel
    assert all(float(row[4]) <= example.TOLERANCE for row in rows.values())
    assert len({row[3] for row in rows.values()}) == 1
    assert LAST_LINE.fullmatch(lines[-1]), lines[-1]


def _shard_shapes(array):
    return {shard.data.shape for shard in array.addressable_shards}


@needs_8_devices
def test_fully_sharded_splits_each_kernel_and_its_adam_moments():
    plan = example.plans(8)["fully sharded"]
    model, optimizer = example.pg.create_sharded(
        example.build, example.make_mesh(plan.mesh), plan, example.Rngs(0), 1
    )
    block = model.blocks[0]
    assert _shard_shapes(model.embed.kernel.value) == {(4, 8)}  # (4, 64) over 8
    assert _shard_shapes(block.attention.query.kernel.value) == {(8, 8, 8)}  # (64, 8, 8)
    assert _shard_shapes(block.up.kernel.value) == {(8, 256)}  # (64, 256)
    assert _shard_shapes(block.up.bias.value) == {(256,)}  # no metadata: replicated
    # Adam's moments take their parameter's sharding: the optimizer is split alike.
    moments = [
        variable
        for _, variable in example.pg.iter_graph(optimizer)
        if isinstance(variable, example.pg.Variable) and variable.value.shape == (64, 256)
    ]
    assert len(moments) >= 3  # the kernel, and Adam's two moments of it
    assert all(_shard_shapes(v.value) == {(8, 256)} for v in moments)


@needs_8_devices
def test_tensor_parallel_gives_each_device_two_heads():
    plan = example.plans(8)["tensor parallel"]
    model = example.pg.create_sharded(
        example.Model, example.make_mesh(plan.mesh), plan, example.Rngs(0), 1
    )
    attention = model.blocks[0].attention
    assert _shard_shapes(attention.key.kernel.value) == {(64, 2, 8)}  # 8 heads over 4
    assert _shard_shapes(attention.out.kernel.value) == {(2, 8, 64)}
    assert _shard_shapes(model.blocks[0].down.kernel.value) == {(64, 64)}  # (256, 64) rows
    assert _shard_shapes(model.embed.kernel.value) == {(4, 64)}  # replicated


def test_targets_are_running_means():
    x, y = example.make_batches(seed=0, steps=2)
    assert x.shape == y.shape == (2, example.BATCH, example.LENGTH, example.INPUTS)
    np.testing.assert_allclose(y[1, 3, 5], x[1, 3, :6].mean(axis=0), rtol=1e-5)
    np.testing.assert_array_equal(example.make_batches(seed=0, steps=2)[0], x)
    assert example.local_part(x[0]) is x[0] or np.array_equal(example.local_part(x[0]), x[0])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "1"], "argument --steps: must be at least 2, got 1"),
        (["--devices", "1"], "argument --devices: must be at least 2, got 1"),
        (["--layouts", "pipeline"], "argument --layouts: invalid choice: 'pipeline'"),
        (["--processes", "2"], "--processes needs --coordinator HOST:PORT"),
        (
            ["--processes", "2", "--process-id", "2", "--coordinator", "localhost:1"],
            "--process-id must be below --processes (2)",
        ),
        (["--seed", "-1"], "argument --seed: must be between 0 and 4294967295"),
    ],
    ids=["steps-1", "devices-1", "layout", "no-coordinator", "process-id", "seed"],
)
def test_bad_arguments_exit_2(args, message, capsys):
    assert_refused(example.main, args, message, capsys)


# Last, so that the script's run has gone on alongside the tests above.
def test_script_end_to_end(script_run):
    stdout, stderr = script_run.communicate(timeout=600)
    assert script_run.returncode == 0, stdout + stderr
    lines = stdout.splitlines()
    assert lines[0] == "8 cpu devices, 1 process(es)"
    rows = _rows(stdout)
    assert list(rows) == ["one device", "data parallel", "fully sharded", "tensor parallel"]
    meshes = {name: row[0] for name, row in rows.items()}
    assert meshes["fully sharded"] == "data=8" and meshes["tensor parallel"] == "data=2,model=4"
    share = {name: float(row[1]) for name, row in rows.items()}
    assert share["one device"] == share["data parallel"] == 100.0
    assert share["fully sharded"] < 20  # every kernel split 8 ways; norms and biases are not
    assert share["tensor parallel"] < 40  # the blocks' kernels split 4 ways
    first_losses = {row[2] for row in rows.values()}
    last_losses = {row[3] for row in rows.values()}
    assert len(first_losses) == len(last_losses) == 1  # the same to 4 decimals
    assert float(last_losses.pop()) < float(first_losses.pop())
    assert all(float(row[4]) <= example.TOLERANCE for row in rows.values())
    scaling = [SCALING_ROW.fullmatch(line) for line in lines]
    assert [int(m.group(1)) for m in scaling if m] == [1, 2, 4, 8]
    assert LAST_LINE.fullmatch(lines[-1]), lines[-1]
