"""Training on a mesh spanning two real processes (4 fake CPU devices each) matches one
device, data parallel and fully sharded; and `run_processes`, which starts them, reports a
failure or a hang at once and leaves no process behind."""

import json
import subprocess
import time

import numpy as np
import pytest
from local_processes import run_processes

pytestmark = pytest.mark.multi_process

# Every process trains each layout on the 8-device mesh over both processes, and the
# reference on one device of its own; the layout is only the kernels' `sharding` metadata.
# Both processes print the same JSON line: the losses and the first kernel's shards.
TRAINING = """
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_nn import MLP, Optimizer, Rngs

STEPS, BATCH, FEATURES = 3, 32, 8


def build(kernel_sharding, rngs):
    model = MLP(FEATURES, FEATURES, 32, depth=1, kernel_sharding=kernel_sharding, rngs=rngs)
    return model, Optimizer(model, optax.adam(1e-2))


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@pg.jit
def train_step(model, optimizer, x, y, mesh):
    loss, grads = pg.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    pg.shard(optimizer, mesh)  # the next step gets the layout this one did
    return loss


def train(devices, kernel_sharding):
    mesh = Mesh(np.array(devices), ("data",))
    model, optimizer = pg.create_sharded(build, mesh, kernel_sharding, Rngs(0))
    # Each process feeds the rows of every batch its own devices hold: half of them on the
    # mesh over both processes, all of them on one device of its own.
    ours = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    per_device = BATCH // len(devices)
    rows = slice(ours[0] * per_device, (ours[-1] + 1) * per_device)
    batches = np.random.default_rng(0).normal(size=(STEPS, BATCH, FEATURES)).astype("float32")
    losses = []
    for batch in batches:
        x, y = (
            jax.make_array_from_process_local_data(
                NamedSharding(mesh, PartitionSpec("data")), part[rows]
            )
            for part in (batch, np.sin(batch))
        )
        losses.append(float(train_step(model, optimizer, x, y, mesh)))
    kernel = model.layers[0].kernel.value
    return {
        "losses": losses,
        "mesh": {"devices": mesh.size, "processes": len({d.process_index for d in devices})},
        "kernel": kernel.shape,
        "shards": [shard.data.shape for shard in kernel.addressable_shards],
    }


print(json.dumps({
    "process": jax.process_index(),
    "one device": train(jax.local_devices()[:1], None),
    "data parallel": train(jax.devices(), None),
    "fully sharded": train(jax.devices(), ("data", None)),
}))
"""


@pytest.fixture(scope="module")
def trained():
    """What process 0 printed (having checked that process 1 printed the same)."""
    first, second = (json.loads(out.splitlines()[-1]) for out in run_processes(TRAINING))
    assert (first.pop("process"), second.pop("process")) == (0, 1)  # in process-id order
    assert first == second  # the same losses and (as many) shards in both processes
    return first


@pytest.mark.parametrize("layout", ["data parallel", "fully sharded"])
def test_two_processes_train_as_one_device(trained, layout):
    result, reference = trained[layout], trained["one device"]
    assert result["mesh"] == {"devices": 8, "processes": 2}
    assert reference["mesh"] == {"devices": 1, "processes": 1}
    # Float32 sums in another order: the losses agree to rounding.
    np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5)
    assert result["losses"][-1] < result["losses"][0]


def test_data_parallel_keeps_every_kernel_whole_on_every_device(trained):
    result = trained["data parallel"]
    assert result["shards"] == [result["kernel"]] * 4


def test_fully_sharded_leaves_each_process_part_of_each_kernel(trained):
    result = trained["fully sharded"]
    assert result["kernel"] == [8, 32]
    assert result["shards"] == [[1, 32]] * 4  # a row per device: 4 of the 8 per process


def test_one_process_gets_its_devices_arguments_and_environment():
    script = """
print(jax.process_count(), jax.device_count(), sys.argv[1:], os.environ["EXTRA"])
print("PYTEST_ADDOPTS" in os.environ, os.environ["PYTREE_TEST_PROCESS_ID"])
"""
    (output,) = run_processes(script, processes=1, devices=2, args=["a", "b"], env={"EXTRA": "x"})
    assert output == "1 2 ['a', 'b'] x\nFalse 0\n"


@pytest.fixture
def started(monkeypatch):
    """The processes run_processes starts, to check that none outlives it, each with the
    time it started (`process.started_at`)."""
    processes = []
    popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        processes.append(popen(*args, **kwargs))
        processes[-1].started_at = time.monotonic()
        return processes[-1]

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    return processes


def test_a_failing_process_stops_the_others_at_once(started):
    failing = """
import time

if jax.process_index() == 1:
    raise RuntimeError("process 1 fails on purpose")
time.sleep(600)  # process 0 would wait forever
"""
    with pytest.raises(AssertionError) as failure:
        run_processes(failing, devices=1, timeout=200)
    # Not a measure of speed: a run_processes waiting for process 0 would take 200 s. (From
    # the first start: the lock that keeps groups of processes apart may be waited for.)
    assert time.monotonic() - started[0].started_at < 60
    message = str(failure.value)
    assert "process 1 failed" in message
    assert "===== process 0: killed by run_processes =====" in message
    assert "===== process 1: exit status 1 =====" in message
    assert 'raise RuntimeError("process 1 fails on purpose")' in message  # the traceback
    assert "RuntimeError: process 1 fails on purpose" in message
    assert len(started) == 2 and all(process.poll() is not None for process in started)


def test_a_hang_is_killed_at_the_time_limit(started):
    with pytest.raises(AssertionError, match="within the time limit of 15 s"):
        run_processes("import time\ntime.sleep(600)\n", devices=1, timeout=15)
    assert len(started) == 2 and all(process.poll() is not None for process in started)
