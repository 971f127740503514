"""Checkpoints across processes, as on several hosts: a model and its Adam state sharded over
two processes of four devices are saved (each process writing its own shards) and restored
onto other layouts: one process of eight devices, then two processes with another mesh."""

import json

import pytest
from local_processes import run_processes

pytest.importorskip("orbax.checkpoint", reason="the orbax extra: pytree-nn[orbax]")

# Run in every phase (argv: phase, folder): builds the same model on the phase's mesh.
SCRIPT = """
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_nn import Linear, Module, Optimizer, Rngs, load_checkpoint, save_checkpoint

phase, folder = sys.argv[1], sys.argv[2]


class Net(Module):
    def __init__(self, rngs):
        self.up = Linear(32, 16, kernel_sharding=("data", None), rngs=rngs)
        self.down = Linear(16, 8, kernel_sharding=(None, "data"), rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.tanh(self.up(x)))


def build(rngs):
    model = Net(rngs)
    return model, Optimizer(model, optax.adam(0.1))


def digest(node):
    # Every value of the state, gathered from every process: what a round trip must keep.
    found = {}
    for path, leaf in pg.state(node).flat_state().items():
        value = leaf.value
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        found["/".join(map(str, path))] = np.asarray(
            multihost_utils.process_allgather(value, tiled=True)
        ).tolist()
    return found


def on_mesh(shape, names):
    devices = np.array(jax.devices()).reshape(shape)
    return Mesh(devices, names)


def spans_processes(optimizer):
    kernel = optimizer.model.up.kernel.value
    return len({d.process_index for d in kernel.sharding.device_set})


def fresh(mesh, seed):
    return pg.create_sharded(build, mesh, Rngs(seed))


report = {"processes": jax.process_count(), "devices": len(jax.devices())}
if phase == "save":
    mesh = on_mesh((8,), ("data",))
    model, optimizer = fresh(mesh, 0)
    x = np.linspace(-1, 1, 16 * 32, dtype=np.float32).reshape(16, 32)
    rows = slice(8 * jax.process_index(), 8 * (jax.process_index() + 1))
    batch = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("data")), x[rows]
    )

    @pg.jit
    def train_step(model, optimizer, x):
        grads = pg.grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)

    train_step(model, optimizer, batch)
    report["spans"] = spans_processes(optimizer)
    save_checkpoint(os.path.join(folder, "two-by-four") + "/", optimizer)
    handle = save_checkpoint(os.path.join(folder, "background") + "/", optimizer, wait=False)
    handle.wait()
    save_checkpoint(os.path.join(folder, "spread.ckpt"), optimizer)  # sharded: a directory
    report["other_extension_is_directory"] = os.path.isdir(os.path.join(folder, "spread.ckpt"))
    try:
        save_checkpoint(os.path.join(folder, "one.safetensors"), optimizer)
    except ValueError as error:
        report["file_refused"] = str(error)
    report["file_written"] = os.path.exists(os.path.join(folder, "one.safetensors"))
    # Replicated over both processes: each holds all of it, so one file can be written.
    replicated = pg.create_sharded(lambda rngs: Linear(32, 16, rngs=rngs), mesh, Rngs(4))
    save_checkpoint(os.path.join(folder, "replicated.safetensors"), replicated)
    report["replicated"] = digest(replicated)
    try:  # each process's own arrays: no one checkpoint of them
        save_checkpoint(os.path.join(folder, "local") + "/", Linear(4, 4, rngs=Rngs(0)))
    except ValueError as error:
        report["local_refused"] = str(error)
    report["local_written"] = os.path.exists(os.path.join(folder, "local"))
    report["saved"] = digest(optimizer)
elif phase == "one-process":
    mesh = on_mesh((2, 4), ("data", "model"))
    _, optimizer = fresh(mesh, 1)
    load_checkpoint(os.path.join(folder, "two-by-four"), optimizer)
    spec = optimizer.model.up.kernel.value.sharding.spec
    report["layout"] = [*spec, *(None,) * (2 - len(spec))]
    report["mesh"] = dict(mesh.shape)
    report["two-by-four"] = digest(optimizer)
    _, other = fresh(mesh, 2)
    report["background"] = digest(load_checkpoint(os.path.join(folder, "background"), other))
    replicated = load_checkpoint(
        os.path.join(folder, "replicated.safetensors"), Linear(32, 16, rngs=Rngs(5))
    )
    report["replicated"] = digest(replicated)
    save_checkpoint(os.path.join(folder, "one-by-eight") + "/", optimizer)
    save_checkpoint(os.path.join(folder, "one-by-eight.safetensors"), optimizer)
else:  # two processes again, on a mesh of another shape
    mesh = on_mesh((2, 4), ("model", "data"))
    for name in ("one-by-eight", "spread.ckpt", "one-by-eight.safetensors"):
        _, optimizer = fresh(mesh, 3)
        load_checkpoint(os.path.join(folder, name), optimizer)
        report[name] = digest(optimizer)
    report["spans"] = spans_processes(optimizer)
    report["mesh"] = dict(mesh.shape)
if jax.process_index() == 0:
    print(json.dumps(report), flush=True)
"""


def report(lines):
    """What process 0 printed (the other prints nothing)."""
    assert all(not line.strip() for line in lines[1:]), lines
    try:
        return json.loads(lines[0])
    except ValueError:
        pytest.fail(f"process 0 printed no report: {lines[0][:500]!r}")


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("checkpoints"))
    saved = report(run_processes(SCRIPT, processes=2, devices=4, args=["save", folder]))
    one = report(run_processes(SCRIPT, processes=1, devices=8, args=["one-process", folder]))
    two = report(run_processes(SCRIPT, processes=2, devices=4, args=["other-mesh", folder]))
    return saved, one, two


@pytest.mark.multi_process
def test_two_processes_save_their_shards_to_a_directory(phases):
    saved, _, _ = phases
    assert saved["processes"] == 2 and saved["devices"] == 8
    assert saved["spans"] == 2  # each process holds only its half of every kernel
    assert saved["other_extension_is_directory"]


@pytest.mark.multi_process
def test_one_file_refuses_arrays_spread_over_processes(phases):
    saved, _, _ = phases
    message = saved["file_refused"]
    assert "kernel is spread over the devices of 2 processes" in message
    assert "Save to a directory instead" in message and "pytree-nn[orbax]" in message
    assert not saved["file_written"]


@pytest.mark.multi_process
def test_arrays_each_process_holds_alone_are_refused(phases):
    saved, _, _ = phases
    message = saved["local_refused"]
    assert "the Param at .bias is held by this process alone" in message
    assert "pytree_graph.create_sharded" in message
    assert not saved["local_written"]


@pytest.mark.multi_process
def test_one_process_of_8_devices_restores_onto_its_own_mesh(phases):
    saved, one, _ = phases
    assert one["processes"] == 1 and one["mesh"] == {"data": 2, "model": 4}
    assert one["layout"] == ["data", None]  # the model's layout, not the saved one
    assert one["two-by-four"] == saved["saved"]
    assert one["background"] == saved["saved"]  # saved with wait=False


@pytest.mark.multi_process
def test_arrays_replicated_over_processes_go_to_one_file(phases):
    saved, one, _ = phases
    assert one["replicated"] == saved["replicated"]


@pytest.mark.multi_process
def test_two_processes_restore_onto_another_mesh(phases):
    saved, _, two = phases
    assert two["processes"] == 2 and two["mesh"] == {"model": 2, "data": 4}
    assert two["spans"] == 2
    for name in ("one-by-eight", "spread.ckpt", "one-by-eight.safetensors"):
        assert two[name] == saved["saved"], name
