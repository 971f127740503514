"""The directory checkpoint format: a State written with orbax-checkpoint, one folder per save
(named by its step), each process writing only the shards it holds.

Layout of `path/<step>/`: `arrays/` holds the arrays (orbax's StandardSave of a dict keyed as
in the single file), `entries/` the same header entries as the file (JSON, written by one
process): Variable types, metadata, dtypes and shapes, and the values that are not arrays
(Python scalars, None, arrays with no elements, which orbax does not write).

`path/_pytree_nn.lock` is the writers' lock: one save at a time in a process (a lock per
directory), and one writer at a time across processes (an exclusive `flock` on the file,
taken by the first process of a `jax.distributed` job for the whole job). Old steps are
renamed out of the step names before they are deleted, so a kill mid-deletion leaves no
listed step behind; leftovers (cut-off saves, half-deleted folders) go at the next save.
"""

import json
import os
import re
import shutil
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from pytree_filter import Path, path_text

try:
    import fcntl
except ImportError:  # Windows: saves are serialized within a process only
    fcntl = None

from ._checkpoint_entries import (
    FORMAT,
    FORMAT_VERSION,
    check_version,
    encode_path,
    entry_for,
    entry_problem,
    is_int,
)

ARRAYS = "arrays"
ENTRIES = "entries"
_STEP = re.compile(r"[0-9]+\Z")
_EXTRA = "pip install 'pytree-nn[orbax]'"
# Python scalars in the entries: JSON keeps bools and ints exactly; a float is written in hex,
# which keeps every bit (NaN and infinities too, which JSON itself has not).
_FROM_JSON: dict[str, Callable[[Any], Any]] = {"bool": bool, "int": int, "float": float.fromhex}


def orbax(function: str) -> Any:
    """`orbax.checkpoint`, or an ImportError that names the extra to install."""
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:
        raise ImportError(
            f"{function}: a directory checkpoint is written and read with orbax-checkpoint, "
            f"which is not installed. Install pytree-nn's orbax extra: {_EXTRA} (or save to "
            "a single file, a path ending in '.safetensors')."
        ) from error
    return ocp


LOCK = "_pytree_nn.lock"
_DISCARDED = "_deleting."  # an old step or a leftover, renamed before it is deleted
_TEMPORARY = ".orbax-checkpoint-tmp"  # orbax's name for a step being written
_STEP_METADATA = "_CHECKPOINT_METADATA"  # orbax's record of a step, in every step it writes
_ENTRIES_FILE = "metadata"  # what orbax's JsonSave names its file
_ARRAYS_METADATA = "_METADATA"  # orbax's tree metadata, written with the arrays

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def directory_lock(path: str) -> threading.Lock:
    """The lock that one process's saves to (and loads from) the directory `path` hold:
    one at a time, so that no save picks a step another is writing, or deletes a step
    another is reading."""
    with _locks_guard:
        return _locks.setdefault(os.path.realpath(path), threading.Lock())


def _complete(folder: str) -> bool:
    """Whether a step folder holds a whole save: orbax's record of the step, the entries,
    and the arrays' metadata when there are arrays. Orbax itself counts a folder as a
    finished step by its name alone (the temporary name of a save being written is renamed
    to the step once written), which a deletion cut off part-way does not change. Looks at
    a few files' presence only (listing runs at every save and load), and reads the entries
    only for a step without `arrays/`, which a save leaves out when there are none."""
    if os.path.islink(folder) or not os.path.isfile(os.path.join(folder, _STEP_METADATA)):
        return False
    entries_file = os.path.join(folder, ENTRIES, _ENTRIES_FILE)
    if not os.path.isfile(entries_file):
        return False
    if os.path.isdir(os.path.join(folder, ARRAYS)):
        return os.path.isfile(os.path.join(folder, ARRAYS, _ARRAYS_METADATA))
    try:
        with open(entries_file, encoding="utf-8") as file:
            document = json.load(file)
    except (OSError, ValueError):
        return False
    entries = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        return True  # not a form of ours: loading says what is wrong with it
    return not any(_has_elements(entry) for entry in entries.values())


def _has_elements(entry: Any) -> bool:
    """Whether an entry stands for an array that orbax writes (one with elements)."""
    if not isinstance(entry, dict) or entry.get("kind") != "array":
        return False
    shape = entry.get("data_shape", entry.get("shape"))
    return isinstance(shape, list) and all(shape)


def steps(path: str) -> list[int]:
    """The steps of the checkpoints saved whole in the directory `path`, oldest first: a
    save in progress or cut off (in a temporary folder), a step folder that lacks a part
    (a deletion cut off), and a step being deleted are not listed."""
    return sorted(
        int(name)
        for name in os.listdir(path)
        if _STEP.match(name) and _complete(os.path.join(path, name))
    )


def _discard(path: str, name: str) -> None:
    """Delete `path/name`: first renamed out of the step names (at once, whole), so that a
    deletion cut off part-way leaves no folder that could pass for a step."""
    if not name.startswith(_DISCARDED):
        discarded = f"{_DISCARDED}{name}.{uuid.uuid4().hex}"
        try:
            os.rename(os.path.join(path, name), os.path.join(path, discarded))
        except FileNotFoundError:
            return
        name = discarded
    shutil.rmtree(os.path.join(path, name), ignore_errors=True)


def _clean_up(path: str) -> None:
    """Delete what earlier saves cut off left in `path`: step folders that are not whole,
    orbax's temporary folders, and folders whose deletion was cut off. Only while holding
    the writers' lock, so none of them belongs to a save in progress."""
    for name in os.listdir(path):
        folder = os.path.join(path, name)
        if not os.path.isdir(folder) or os.path.islink(folder):
            continue
        if (
            name.startswith(_DISCARDED)
            or _TEMPORARY in name
            or (_STEP.match(name) and not _complete(folder))
        ):
            _discard(path, name)


def _rotate(path: str, keep: int) -> None:
    """Delete all but the `keep` newest steps of `path`, oldest first."""
    for step in steps(path)[:-keep]:
        _discard(path, str(step))


def _lock_writer(path: str) -> int | None:
    """Take the exclusive lock of the directory `path` for this process (its file
    descriptor, to close when the save is done), or raise if another process holds it."""
    if fcntl is None:
        return None
    descriptor = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(descriptor, 4096).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise RuntimeError(
            f"save_checkpoint: another program is saving to the checkpoint directory "
            f"{path!r} ({holder}, which holds {os.path.join(path, LOCK)!r}); two writers "
            "would pick the same steps and delete each other's. Save each run to a "
            "directory of its own, or wait until the other save is done."
        ) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"process {os.getpid()} on host {socket.gethostname()}".encode())
    return descriptor


def _unlock_writer(descriptor: int | None) -> None:
    if descriptor is not None:
        os.close(descriptor)  # closing the file releases its flock


def _agree(path: str, refused: BaseException | None) -> None:
    """In a job of several processes, tell every process whether the first one took the
    writers' lock (each calls this once per save): all of them then save, or all raise."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        failed = multihost_utils.broadcast_one_to_all(np.int32(refused is not None))
        if int(failed) and refused is None:
            raise RuntimeError(
                f"save_checkpoint: the first process of this job could not start the save "
                f"to {path!r} (see its error): another program is saving to that checkpoint "
                "directory, or it cannot be written. Nothing was written."
            )
    if refused is not None:
        raise refused


def check_directory(path: str) -> None:
    """Refuse a directory that holds something other than checkpoints (whose older steps a
    save may delete), or whose parent does not exist; before anything is written."""
    if os.path.isdir(path):
        others = sorted(
            name
            for name in os.listdir(path)
            if not (_STEP.match(name) or ".orbax-checkpoint-tmp" in name or name.startswith("_"))
        )
        if others:
            shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
            raise ValueError(
                f"save_checkpoint: {path!r} is a directory that holds other things ({shown}); "
                "a checkpoint directory holds only its saves, one folder per step. Save to a "
                "new or empty directory."
            )
    else:
        parent = os.path.dirname(os.path.abspath(path.rstrip("/" + os.sep)))
        if not os.path.isdir(parent):
            raise FileNotFoundError(
                f"save_checkpoint: the directory {parent!r} does not exist; create it first."
            )


def directory_contents(flat: dict[Path, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arrays orbax writes (key -> array, PRNG keys as their data) and the entries
    document, for `flat` (a flat State).

    Raises:
        TypeError, ValueError: as `entry_for`.
        ValueError: in a program of several processes, a jax.Array held by this process
            alone (each process would write its own, different array under one name).
    """
    arrays: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    processes = jax.process_count()
    for path, leaf in flat.items():
        key = encode_path(path)
        value, entry = entry_for(path, leaf)
        if processes > 1 and isinstance(value, jax.Array) and value.is_fully_addressable:
            raise ValueError(
                f"save_checkpoint: the {type(leaf).__name__} at {path_text(path)} is held by "
                f"this process alone (on {', '.join(map(str, value.devices()))}), but this "
                f"program has {processes} processes, which write one checkpoint directory "
                "together from arrays laid out over all of their devices. Build the model on "
                "a mesh of jax.devices() (pytree_graph.create_sharded, or "
                "pytree_graph.shard(model, mesh)), or give each process a file of its own."
            )
        if entry["kind"] == "python":
            entry["value"] = value.hex() if isinstance(value, float) else value
        elif entry["kind"] == "array":
            if "key_impl" in entry:
                entry["data_shape"] = list(value.shape)
            if np.size(value):
                arrays[key] = np.asarray(value) if isinstance(value, np.generic) else value
        entries[key] = entry
    return arrays, {"format": FORMAT, "format_version": FORMAT_VERSION, "entries": entries}


def start_save(
    path: str, arrays: dict[str, Any], document: dict[str, Any], step: int | None, keep: int | None
) -> tuple[int, Callable[[], None]]:
    """Start writing one save into the directory `path`: its step, and a function that waits
    until it is written (and raises what went wrong, if anything did)."""
    check_directory(path)
    ocp = orbax("save_checkpoint")
    local = directory_lock(path)
    local.acquire()
    descriptor = None
    primary = jax.process_index() == 0

    def release() -> None:
        _unlock_writer(descriptor)
        local.release()

    try:
        # The processes of one job write the directory together: the first makes it, takes
        # the lock for them all and clears what cut-off saves left, then tells the others
        # (which touch nothing before, so that none can fail and leave the others waiting).
        refused = None
        if primary:
            try:
                os.makedirs(path, exist_ok=True)
                descriptor = _lock_writer(path)
                _clean_up(path)
            except Exception as error:
                refused = error
        _agree(path, refused)
        saved = steps(path)
        if step is None:
            step = saved[-1] + 1 if saved else 0
        elif saved and step <= saved[-1]:
            raise ValueError(
                f"save_checkpoint: {path!r} already holds step {saved[-1]}; a new save needs "
                f"a greater step than {step}, or leave `step` out to take the next one."
            )
        # Old steps are deleted here (`_rotate`), not by orbax, which deletes in place.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=True
        )
        manager = ocp.CheckpointManager(os.path.abspath(path), options=options)
    except BaseException:
        release()
        raise
    items = {ENTRIES: ocp.args.JsonSave(document)}
    if arrays:
        items[ARRAYS] = ocp.args.StandardSave(arrays)
    try:
        manager.save(step, args=ocp.args.Composite(**items))
    except BaseException:
        try:
            manager.close()
        finally:
            release()
        raise

    def finish() -> None:
        try:
            manager.wait_until_finished()
            if primary and keep is not None:
                _rotate(path, keep)
        finally:
            try:
                manager.close()
            finally:
                release()

    return step, finish


def _value_problem(entry: dict[str, Any]) -> str | None:
    """What is wrong with the value a Python scalar's entry holds (as `directory_contents`
    writes them), or None; other entries hold none."""
    if entry["kind"] != "python":
        return None
    value, dtype = entry.get("value"), entry["dtype"]
    if dtype == "float":
        try:
            float.fromhex(value)
            reads = True
        except (TypeError, ValueError):
            reads = False
    else:
        reads = isinstance(value, bool) if dtype == "bool" else is_int(value)
    return None if reads else f"holds the value {value!r}, not a Python {dtype}"


def _target(current: Any, entry: dict[str, Any]) -> Any:
    """What orbax restores one array as: laid out as the value it replaces."""
    shape = tuple(entry.get("data_shape", entry["shape"]))
    if isinstance(current, np.ndarray | np.generic):
        return np.zeros(shape, np.asarray(current).dtype)
    sharding = getattr(current, "sharding", None)
    if "key_impl" in entry:
        dtype = np.dtype(np.uint32)
        if isinstance(current, jax.Array):
            sharding = jax.random.key_data(current).sharding
        elif isinstance(sharding, NamedSharding):  # the key's axes, then its data's: whole
            spec = (*sharding.spec, *(None,) * (len(shape) - len(sharding.spec)))
            sharding = NamedSharding(sharding.mesh, PartitionSpec(*spec))
        else:
            sharding = None
    else:
        dtype = current.dtype
    if sharding is None:
        sharding = SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


class DirectoryReader:
    """One step of a checkpoint directory: its `entries` (key -> header entry), checked for
    form, and `values` to read the arrays of some of them, laid out as the model's."""

    def __init__(self, path: str, step: int | None):
        self.path = path
        self._manager = None
        # Held until `close`: no save of this process deletes the step while it is read.
        self._lock: threading.Lock | None = directory_lock(path)
        self._lock.acquire()
        try:
            self._open(step)
        except BaseException:
            self.close()
            raise

    def _open(self, step: int | None) -> None:
        path = self.path
        saved = steps(path)
        if not saved:
            raise ValueError(
                f"load_checkpoint: the directory {path!r} holds no checkpoint (no step "
                "folders); save one there first, or give the path of a checkpoint."
            )
        if step is None:
            step = saved[-1]
        elif step not in saved:
            raise ValueError(
                f"load_checkpoint: {path!r} has no step {step}; it holds the steps {saved}."
            )
        self.step = step
        self._corrupt = (
            f"load_checkpoint: step {step} of {path!r} is not a readable checkpoint "
            "(cut off or damaged?)"
        )
        self._ocp = orbax("load_checkpoint")
        options = self._ocp.CheckpointManagerOptions(create=False)
        self._manager = self._ocp.CheckpointManager(os.path.abspath(path), options=options)
        document = self._restore(entries=self._ocp.args.JsonRestore())[ENTRIES]
        self.entries = self._checked(document)

    def _restore(self, **items: Any) -> Any:
        try:
            return self._manager.restore(self.step, args=self._ocp.args.Composite(**items))
        except Exception as error:  # orbax and tensorstore raise many kinds
            raise ValueError(f"{self._corrupt}: {type(error).__name__}: {error}") from None

    def _checked(self, document: Any) -> dict[str, dict[str, Any]]:
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError(
                f"load_checkpoint: step {self.step} of {self.path!r} was not written by "
                "save_checkpoint (its entries have no pytree_nn format); read it with orbax "
                "itself."
            )
        check_version(self.path, document.get("format_version"), FORMAT_VERSION)
        entries = document.get("entries")
        if not isinstance(entries, dict):
            raise ValueError(f"{self._corrupt}: it has no entries.")
        for key, entry in entries.items():
            if problem := entry_problem(key, entry, check=_value_problem):
                raise ValueError(f"{self._corrupt}: the entry of {key!r} {problem}.")
        return entries

    def values(self, wanted: dict[str, tuple[Path, Any]]) -> tuple[dict[str, Any], list[str]]:
        """The values of the keys in `wanted` (key -> (path, value replaced)), each array
        laid out as the value it replaces (on any mesh, across any number of processes)."""
        values: dict[str, Any] = {}
        targets = {}
        for key, (_, current) in wanted.items():
            entry = self.entries[key]
            if entry["kind"] == "python":
                values[key] = _FROM_JSON[entry["dtype"]](entry["value"])
            elif entry["kind"] == "none":
                values[key] = None
            elif np.prod(entry.get("data_shape", entry["shape"]), dtype=int) == 0:
                # No elements: nothing was written; the dtype may be one NumPy lacks.
                dtype = np.uint32 if "key_impl" in entry else jnp.dtype(entry["dtype"])
                values[key] = np.zeros(entry.get("data_shape", entry["shape"]), dtype)
            else:
                targets[key] = _target(current, entry)
        if targets:
            arrays = self._restore(**{ARRAYS: self._ocp.args.StandardRestore(targets)})[ARRAYS]
            values.update(arrays)
        for key, value in values.items():
            if "key_impl" in self.entries[key]:
                values[key] = jax.random.wrap_key_data(value, impl=self.entries[key]["key_impl"])
        return values, []

    def close(self) -> None:
        """Close orbax's manager (its threads and event loops) and let saves go on."""
        try:
            if self._manager is not None:
                self._manager.close()
                self._manager = None
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
