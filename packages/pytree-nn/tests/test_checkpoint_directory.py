"""Checkpoint directories (written with orbax-checkpoint): the same guarantees as one file, plus
steps, `keep`, saving in the background and restoring onto any layout. Several processes:
test_multiprocess_checkpoints.py."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checkpoint_models import Everything, Two, assert_unchanged, snapshot
from jax.sharding import NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_nn import (
    Linear,
    SaveHandle,
    checkpoint_steps,
    load_checkpoint,
    save_checkpoint,
)

ocp = pytest.importorskip("orbax.checkpoint", reason="the orbax extra: pytree-nn[orbax]")


def directory(tmp_path, name="run"):
    """A checkpoint directory's path, as a str ending in '/' (that asks for a directory)."""
    return os.path.join(tmp_path, name) + "/"


def test_layout_one_folder_per_step_with_entries_and_arrays(tmp_path):
    path = directory(tmp_path)
    save_checkpoint(path, Everything(0))
    assert sorted(os.listdir(path)) == ["0", "_pytree_nn.lock"]  # the writers' lock
    assert {"arrays", "entries"} <= set(os.listdir(os.path.join(path, "0")))
    restored = ocp.CheckpointManager(path).restore(
        0, args=ocp.args.Composite(entries=ocp.args.JsonRestore())
    )
    document = restored["entries"]
    assert document["format"] == "pytree_nn.checkpoint"
    entries = document["entries"]
    assert len({"w", "tied"} & entries.keys()) == 1  # the shared Variable, once
    assert entries["table/a~1b"]["type"] == "Param"
    assert entries["scale"] == {**entries["scale"], "kind": "python", "value": (0.5).hex()}
    assert entries["rngs/default/key"]["key_impl"] == "threefry2x32"
    json.dumps(document, allow_nan=False)  # plain JSON


def test_which_paths_are_directories(tmp_path):
    """Ending in '/', naming a directory, or new without an extension: a directory. With an
    extension, or naming a file (even one without an extension): one file."""
    for name in ("ckpt", "run.v1/step_100", ".hidden"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        save_checkpoint(tmp_path / name, Linear(2, 3, rngs=0))
        assert checkpoint_steps(tmp_path / name) == [0], name
    for name in ("model.safetensors", "model.ckpt"):
        save_checkpoint(tmp_path / name, Linear(2, 3, rngs=0))
        assert (tmp_path / name).is_file(), name
    (tmp_path / "weights").write_bytes((tmp_path / "model.ckpt").read_bytes())
    save_checkpoint(tmp_path / "weights", Linear(2, 3, rngs=1))  # an existing file: a file
    assert (tmp_path / "weights").is_file()
    loaded = load_checkpoint(tmp_path / "weights", Linear(2, 3, rngs=5))
    np.testing.assert_array_equal(loaded.kernel.value, Linear(2, 3, rngs=1).kernel.value)


def test_an_existing_directory_is_a_checkpoint_directory(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    save_checkpoint(path, Linear(2, 3, rngs=0))  # no '/' needed
    assert checkpoint_steps(path) == [0]
    loaded = load_checkpoint(path, Linear(2, 3, rngs=1))
    np.testing.assert_array_equal(loaded.kernel.value, Linear(2, 3, rngs=0).kernel.value)


def test_steps_and_keep(tmp_path):
    path = directory(tmp_path)
    for seed in range(3):
        save_checkpoint(path, Linear(2, 3, rngs=seed))
    assert checkpoint_steps(path) == [2]  # keep=1: the newest replaces the others
    for seed, step in [(3, 10), (4, 20), (5, 30)]:
        save_checkpoint(path, Linear(2, 3, rngs=seed), step=step, keep=2)
    assert checkpoint_steps(path) == [20, 30]
    save_checkpoint(path, Linear(2, 3, rngs=6), keep=None)  # step 31, all kept
    save_checkpoint(path, Linear(2, 3, rngs=7), keep=None)
    assert checkpoint_steps(path) == [20, 30, 31, 32]
    for step, seed in [(None, 7), (30, 5), (20, 4)]:
        loaded = load_checkpoint(path, Linear(2, 3, rngs=99), step=step)
        np.testing.assert_array_equal(loaded.kernel.value, Linear(2, 3, rngs=seed).kernel.value)


def test_step_errors_write_nothing(tmp_path):
    path = directory(tmp_path)
    save_checkpoint(path, Linear(2, 3, rngs=0), step=5)
    with pytest.raises(ValueError, match=r"already holds step 5; a new save needs a greater step"):
        save_checkpoint(path, Linear(2, 3, rngs=1), step=5)
    with pytest.raises(ValueError, match="greater step than 3"):
        save_checkpoint(path, Linear(2, 3, rngs=1), step=3)
    assert sorted(os.listdir(path)) == ["5", "_pytree_nn.lock"]
    with pytest.raises(ValueError, match=r"has no step 4; it holds the steps \[5\]"):
        load_checkpoint(path, Linear(2, 3, rngs=1), step=4)
    with pytest.raises(TypeError, match=r"`step` must be None or an int >= 0, got -1"):
        save_checkpoint(path, Linear(2, 3, rngs=1), step=-1)
    with pytest.raises(TypeError, match=r"`keep` must be an int >= 1 .* got 0"):
        save_checkpoint(path, Linear(2, 3, rngs=1), keep=0)
    file = tmp_path / "model.safetensors"
    with pytest.raises(ValueError, match="`step` and `keep` apply to checkpoint directories"):
        save_checkpoint(file, Linear(2, 3, rngs=1), keep=3)
    assert not file.exists()
    save_checkpoint(file, Linear(2, 3, rngs=1))
    with pytest.raises(ValueError, match="`step` applies to checkpoint directories"):
        load_checkpoint(file, Linear(2, 3, rngs=1), step=0)
    with pytest.raises(NotADirectoryError, match="only checkpoint directories hold steps"):
        checkpoint_steps(file)


def test_a_directory_holding_other_things_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds other things \(notes\.txt\)"):
        save_checkpoint(tmp_path, Linear(2, 3, rngs=0))
    assert os.listdir(tmp_path) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no checkpoint"):
        load_checkpoint(empty, Linear(2, 3, rngs=0))
    with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
        save_checkpoint(directory(tmp_path / "missing"), Linear(2, 3, rngs=0))


# A failed restore leaves a callback of orbax's I/O threads for its closed event loop.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_steps_are_refused_and_change_nothing(tmp_path):
    path = directory(tmp_path)
    save_checkpoint(path, Everything(0))
    model = Everything(1)
    before = snapshot(model)
    arrays = os.path.join(path, "0", "arrays")
    for root, _, files in os.walk(arrays):  # every stored chunk of the arrays, gone
        for name in files:
            if root != arrays:
                os.remove(os.path.join(root, name))
    with pytest.raises(ValueError, match=r"step 0 of .* is not a readable checkpoint"):
        load_checkpoint(path, model)
    assert_unchanged(before, model)

    save_checkpoint(path, Two(), keep=None)  # step 1; then its entries rewritten wrong
    entries_dir = os.path.join(path, "1", "entries")
    (name,) = [n for n in os.listdir(entries_dir) if n != "commit_success.txt"]
    with open(os.path.join(entries_dir, name)) as file:
        document = json.load(file)
    document["entries"]["a"]["shape"] = "two"
    with open(os.path.join(entries_dir, name), "w") as file:
        json.dump(document, file)
    with pytest.raises(ValueError, match=r"the entry of 'a' has the shape 'two'"):
        load_checkpoint(path, Two())
    document["format"] = "someone else's"
    with open(os.path.join(entries_dir, name), "w") as file:
        json.dump(document, file)
    with pytest.raises(ValueError, match="was not written by save_checkpoint"):
        load_checkpoint(path, Two())


def test_a_save_cut_off_leaves_the_previous_step_loadable(tmp_path):
    """A process killed while its save is written (here: it exits at once after starting a
    save in the background) leaves a temporary folder; the step before it stays the newest."""
    path = directory(tmp_path)
    save_checkpoint(path, Linear(64, 64, rngs=0))
    script = f"""
        import os
        import jax.numpy as jnp
        from pytree_graph import Param
        from pytree_nn import Module, save_checkpoint

        class Big(Module):
            def __init__(self):
                self.layers = [Param(jnp.full((512, 1024), float(i))) for i in range(48)]

        save_checkpoint({path!r}, Big(), wait=False)
        os._exit(0)  # as a kill would: no cleanup, no waiting
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, timeout=300
    )
    assert result.returncode == 0, result.stderr.decode()
    # The cut-off save's folder is there, unfinished: what a kill mid-write leaves.
    assert any(".orbax-checkpoint-tmp" in name for name in os.listdir(path))
    assert checkpoint_steps(path) == [0]
    loaded = load_checkpoint(path, Linear(64, 64, rngs=1))
    np.testing.assert_array_equal(loaded.kernel.value, Linear(64, 64, rngs=0).kernel.value)
    save_checkpoint(path, Linear(64, 64, rngs=2))  # and the next save goes on from there
    assert checkpoint_steps(path) == [1]


@pytest.mark.parametrize("form", ["file", "directory"])
def test_saving_in_the_background(tmp_path, form):
    path = directory(tmp_path) if form == "directory" else tmp_path / "model.safetensors"
    model = Linear(256, 256, rngs=0)
    expected = np.array(model.kernel.value)
    handle = save_checkpoint(path, model, wait=False)
    assert isinstance(handle, SaveHandle)
    assert handle.step == (0 if form == "directory" else None)
    # Training goes on: what was saved is what the model held when save_checkpoint returned.
    model.kernel.value = jnp.zeros_like(model.kernel.value)
    handle.wait()
    assert handle.done() and "written" in repr(handle)
    loaded = load_checkpoint(path, Linear(256, 256, rngs=1))
    np.testing.assert_array_equal(loaded.kernel.value, expected)
    # A load right after a background save waits for it.
    save_checkpoint(path, model, wait=False)
    assert float(load_checkpoint(path, Linear(256, 256, rngs=1)).kernel.value.sum()) == 0.0


def test_a_failed_background_save_raises_on_wait_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, Linear(2, 3, rngs=0))
    old = path.read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.numpy.save_file", full_disk)
    handle = save_checkpoint(path, Linear(2, 3, rngs=1), wait=False)
    with pytest.raises(OSError, match="No space left"):
        handle.wait()
    assert "failed" in repr(handle)
    assert path.read_bytes() == old
    # A failure nobody waited for is not silent: the next save of the path warns.
    unseen = save_checkpoint(path, Linear(2, 3, rngs=1), wait=False)
    while not unseen.done():  # failed, with nobody waiting
        time.sleep(0.01)
    monkeypatch.undo()
    with pytest.warns(RuntimeWarning, match=r"wait=False\) failed and was never waited for"):
        save_checkpoint(path, Linear(2, 3, rngs=2))
    loaded = load_checkpoint(path, Linear(2, 3, rngs=9))
    np.testing.assert_array_equal(loaded.kernel.value, Linear(2, 3, rngs=2).kernel.value)


@pytest.mark.multi_device
def test_restoring_lays_arrays_out_as_the_model_says(tmp_path):
    """Saved split over 8 devices, restored split another way over a 2x4 mesh, and into an
    abstract model whose ShapeDtypeStructs carry shardings."""
    path = directory(tmp_path)
    rows = jax.make_mesh((8,), ("data",))
    saved = Linear(16, 8, rngs=0)
    saved.kernel.value = jax.device_put(
        saved.kernel.value, NamedSharding(rows, PartitionSpec("data"))
    )
    save_checkpoint(path, saved)
    grid = jax.make_mesh((2, 4), ("x", "y"))
    other = NamedSharding(grid, PartitionSpec("y", "x"))
    model = Linear(16, 8, rngs=1)
    model.kernel.value = jax.device_put(model.kernel.value, other)
    load_checkpoint(path, model)
    assert model.kernel.value.sharding == other
    np.testing.assert_array_equal(model.kernel.value, saved.kernel.value)

    abstract = pg.eval_shape(lambda: Linear(16, 8, rngs=2))
    abstract.kernel.value = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=other)
    loaded = load_checkpoint(path, abstract)
    assert isinstance(loaded.kernel.value, jax.Array) and loaded.kernel.value.sharding == other
    assert isinstance(loaded.bias.value, jax.Array)
    np.testing.assert_array_equal(loaded.bias.value, saved.bias.value)


def test_orbax_used_directly_on_a_state_as_in_flax_nnx(tmp_path):
    """`StandardCheckpointer().save(dir, state(model))`, restored into the State of an
    abstract model whose arrays carry shardings, then written in with `update`."""
    model = Linear(4, 8, rngs=0)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "direct", pg.state(model))
    checkpointer.wait_until_finished()
    abstract = pg.eval_shape(lambda: Linear(4, 8, rngs=1))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[-1])
    for variable in (abstract.kernel, abstract.bias):
        variable.value = jax.ShapeDtypeStruct(variable.value.shape, jnp.float32, sharding=device)
    restored = checkpointer.restore(tmp_path / "direct", pg.state(abstract))
    pg.update(abstract, restored)
    assert isinstance(abstract.kernel.value, jax.Array)
    assert abstract.kernel.value.sharding == device
    np.testing.assert_array_equal(abstract.kernel.value, model.kernel.value)


def test_without_orbax_a_directory_names_the_extra_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "orbax", None)  # what `import orbax` meets uninstalled
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    path = directory(tmp_path)
    with pytest.raises(ImportError, match=r"pip install 'pytree-nn\[orbax\]'"):
        save_checkpoint(path, Linear(2, 3, rngs=0))
    assert os.listdir(tmp_path) == []
    save_checkpoint(tmp_path / "model.safetensors", Linear(2, 3, rngs=0))  # files need none


# Every test below bounds its waiting: threads are joined, and subprocesses run, with a time
# limit, so that a save that hangs fails the test instead of stopping the run.
_LIMIT_S = 240


def _in_threads(save, models):
    """Run `save(model)` for each model in a thread of its own, all at once; every thread
    must end within the time limit without an error."""
    errors = []

    def run(model):
        try:
            save(model)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(model,)) for model in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=_LIMIT_S)
    assert not any(thread.is_alive() for thread in threads), "a save hung"
    assert errors == []


def _kernel_bytes(model):
    return np.asarray(model.kernel.value).tobytes()


def test_threads_saving_to_one_directory_take_turns(tmp_path):
    """Four threads save to one directory at once (each twice, in the background and not):
    every save is a step of its own, and every listed step loads one of the saves."""
    path = directory(tmp_path)
    models = [Linear(16, 16, rngs=seed) for seed in range(4)]

    def save(model):
        save_checkpoint(path, model, keep=None, wait=False).wait()
        save_checkpoint(path, model, keep=None)

    _in_threads(save, models)
    assert checkpoint_steps(path) == list(range(8))
    saved = {_kernel_bytes(model) for model in models}
    loaded = [
        _kernel_bytes(load_checkpoint(path, Linear(16, 16, rngs=99), step=step))
        for step in range(8)
    ]
    assert set(loaded) == saved
    assert all(loaded.count(kernel) == 2 for kernel in saved)


def test_threads_saving_with_keep_leave_steps_that_load(tmp_path):
    path = directory(tmp_path)
    models = [Linear(16, 16, rngs=seed) for seed in range(3)]

    def save(model):
        for _ in range(2):
            save_checkpoint(path, model, keep=2)

    _in_threads(save, models)
    assert checkpoint_steps(path) == [4, 5]
    saved = {_kernel_bytes(model) for model in models}
    for step in (4, 5):
        assert _kernel_bytes(load_checkpoint(path, Linear(16, 16, rngs=9), step=step)) in saved


def test_another_process_saving_to_a_locked_directory_is_refused_at_once(tmp_path):
    """While this process saves to a directory (here: holds its writers' lock, as a save
    does from start to end), a save of another program there raises an error naming the
    directory and this process, without waiting; once the lock is free it saves."""
    from pytree_nn import _checkpoint_orbax

    path = directory(tmp_path)
    save_checkpoint(path, Linear(2, 3, rngs=0))
    script = f"""
        import sys, time
        from pytree_nn import Linear, save_checkpoint
        start = time.monotonic()
        try:
            save_checkpoint({path!r}, Linear(2, 3, rngs=1))
        except RuntimeError as error:
            print(f"refused after {{time.monotonic() - start:.1f}} s: {{error}}")
            sys.exit(3)
        print("saved")
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = [sys.executable, "-c", textwrap.dedent(script)]
    with _checkpoint_orbax.directory_lock(path):
        descriptor = _checkpoint_orbax._lock_writer(path)
        try:
            result = subprocess.run(run, env=env, capture_output=True, timeout=_LIMIT_S)
        finally:
            _checkpoint_orbax._unlock_writer(descriptor)
    out = result.stdout.decode()
    assert result.returncode == 3, out + result.stderr.decode()
    assert "another program is saving to the checkpoint directory" in out
    assert repr(path) in out and f"process {os.getpid()} on host" in out
    assert float(out.split("refused after ")[1].split(" s")[0]) < 10  # no waiting
    assert checkpoint_steps(path) == [0]  # nothing written
    result = subprocess.run(run, env=env, capture_output=True, timeout=_LIMIT_S)
    assert result.stdout.decode().strip() == "saved", result.stderr.decode()
    assert checkpoint_steps(path) == [1]


def test_only_whole_steps_are_listed_and_the_next_save_deletes_the_rest(tmp_path):
    """What a kill leaves (a step whose deletion was cut off, a step folder missing its
    arrays, a save cut off, a folder being deleted) is never listed or loaded; the newest
    whole step is loaded, and the next save deletes the leftovers."""
    path = directory(tmp_path)
    for seed in range(3):
        save_checkpoint(path, Linear(4, 4, rngs=seed), keep=None)
    os.remove(os.path.join(path, "2", "_CHECKPOINT_METADATA"))  # a deletion cut off
    shutil.copytree(os.path.join(path, "1"), os.path.join(path, "3"))
    os.remove(os.path.join(path, "3", "arrays", "_METADATA"))  # arrays half gone
    shutil.copytree(os.path.join(path, "1"), os.path.join(path, "4.orbax-checkpoint-tmp-12"))
    shutil.copytree(os.path.join(path, "0"), os.path.join(path, "_deleting.0.ab12"))
    assert checkpoint_steps(path) == [0, 1]
    loaded = load_checkpoint(path, Linear(4, 4, rngs=9))
    assert _kernel_bytes(loaded) == _kernel_bytes(Linear(4, 4, rngs=1))
    with pytest.raises(ValueError, match=r"has no step 2; it holds the steps \[0, 1\]"):
        load_checkpoint(path, Linear(4, 4, rngs=9), step=2)

    save_checkpoint(path, Linear(4, 4, rngs=5), keep=None)
    assert sorted(os.listdir(path)) == ["0", "1", "2", "_pytree_nn.lock"]
    assert checkpoint_steps(path) == [0, 1, 2]
    loaded = load_checkpoint(path, Linear(4, 4, rngs=9))
    assert _kernel_bytes(loaded) == _kernel_bytes(Linear(4, 4, rngs=5))


def test_a_rotation_cut_off_leaves_no_listed_step_behind(tmp_path, monkeypatch):
    """`keep` deletes an old step by renaming it out of the step names first: a deletion
    stopped part-way (here it raises after deleting one file) leaves a folder that is
    never listed, and the next save deletes it."""
    from pytree_nn import _checkpoint_orbax

    path = directory(tmp_path)
    save_checkpoint(path, Linear(4, 4, rngs=0))

    def cut_off(folder, ignore_errors=False):
        for root, _, files in os.walk(folder):
            if files:
                os.remove(os.path.join(root, files[0]))
                break
        raise KeyboardInterrupt  # as a kill would stop it

    monkeypatch.setattr(_checkpoint_orbax.shutil, "rmtree", cut_off)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, Linear(4, 4, rngs=1))
    monkeypatch.undo()
    assert checkpoint_steps(path) == [1]
    assert any(name.startswith("_deleting.0.") for name in os.listdir(path))
    loaded = load_checkpoint(path, Linear(4, 4, rngs=9))
    assert _kernel_bytes(loaded) == _kernel_bytes(Linear(4, 4, rngs=1))
    save_checkpoint(path, Linear(4, 4, rngs=2))  # the lock was released; leftovers go
    assert sorted(os.listdir(path)) == ["2", "_pytree_nn.lock"]


def test_a_program_that_saves_and_loads_a_directory_ends_without_tracebacks(tmp_path):
    """Orbax's threads and event loops are closed, and a save still in the background when
    the program ends is finished first (on Python 3.11; from 3.12 on, Python refuses the
    threads orbax starts once the program ends: see `unwaited` below)."""
    path = directory(tmp_path)
    unwaited = sys.version_info < (3, 12)
    script = f"""
        import sys
        from pytree_nn import Dropout, Linear, Module, Rngs, checkpoint_steps, load_checkpoint
        from pytree_nn import save_checkpoint

        class Net(Module):
            def __init__(self, seed):
                self.linear = Linear(64, 64, rngs=seed)
                self.dropout = Dropout(0.5, rngs=Rngs(seed))

        save_checkpoint({path!r}, Net(0))
        save_checkpoint({path!r}, Net(1), wait=False)
        load_checkpoint({path!r}, Net(2))  # waits for the save
        try:
            load_checkpoint({path!r}, Linear(3, 3, rngs=0))
        except ValueError:
            pass
        assert checkpoint_steps({path!r}) == [1]
        if {unwaited}:
            save_checkpoint({path!r}, Net(3), wait=False)  # the end of the program waits
        print("done")
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        timeout=_LIMIT_S,
    )
    stderr = result.stderr.decode()
    assert result.returncode == 0 and result.stdout.decode().strip() == "done", stderr
    assert "Traceback" not in stderr and "Event loop is closed" not in stderr, stderr
    assert "RuntimeWarning" not in stderr, stderr
    assert checkpoint_steps(path) == ([2] if unwaited else [1])
