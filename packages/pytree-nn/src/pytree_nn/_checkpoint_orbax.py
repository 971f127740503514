"""The directory checkpoint format: a State written with orbax-checkpoint, one folder per save
(named by its step), each process writing only the shards it holds.

Layout of `path/<step>/`: `arrays/` holds the arrays (orbax's StandardSave of a dict keyed as
in the single file), `entries/` the same header entries as the file (JSON, written by one
process): Variable types, metadata, dtypes and shapes, and the values that are not arrays
(Python scalars, None, arrays with no elements, which orbax does not write).
"""

import os
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from pytree_filter import Path, path_text

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


def steps(path: str) -> list[int]:
    """The steps of the checkpoints saved in the directory `path`, oldest first (a save
    still in progress, or one cut off, is in a temporary folder and not listed)."""
    return sorted(
        int(name)
        for name in os.listdir(path)
        if _STEP.match(name) and os.path.isdir(os.path.join(path, name))
    )


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
    saved = steps(path) if os.path.isdir(path) else []
    if step is None:
        step = saved[-1] + 1 if saved else 0
    elif saved and step <= saved[-1]:
        raise ValueError(
            f"save_checkpoint: {path!r} already holds step {saved[-1]}; a new save needs a "
            f"greater step than {step}, or leave `step` out to take the next one."
        )
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=True
    )
    manager = ocp.CheckpointManager(os.path.abspath(path), options=options)
    items = {ENTRIES: ocp.args.JsonSave(document)}
    if arrays:
        items[ARRAYS] = ocp.args.StandardSave(arrays)
    try:
        manager.save(step, args=ocp.args.Composite(**items))
    except BaseException:
        manager.close()
        raise

    def finish() -> None:
        try:
            manager.wait_until_finished()
        finally:
            manager.close()

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
        try:
            document = self._restore(entries=self._ocp.args.JsonRestore())[ENTRIES]
            self.entries = self._checked(document)
        except BaseException:
            self.close()
            raise

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
        self._manager.close()
