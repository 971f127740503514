"""The single-file checkpoint format: a State in one safetensors file, written atomically."""

import contextlib
import errno
import json
import os
import stat
import uuid
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import Path, path_text

from ._checkpoint_entries import (
    FORMAT,
    FORMAT_VERSION,
    check_version,
    encode_path,
    entry_for,
    entry_problem,
    is_int,
    show_array,
)

# dtypes written as themselves (every safetensors version reads and writes these); any
# other dtype is written as its raw bytes (uint8, one more axis) and named in the header.
_NATIVE = {
    "bool": "BOOL",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "uint32": "U32",
    "int64": "I64",
    "uint64": "U64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
}
_BY_CODE = {code: name for name, code in _NATIVE.items()}


def spanned_processes(value: Any) -> int:
    """How many processes hold a different part of `value` (1 for anything one process
    holds whole, replicated arrays included: each process has all of it)."""
    if (
        isinstance(value, jax.Array)
        and not value.is_fully_addressable
        and not value.is_fully_replicated
    ):
        return len({device.process_index for device in value.sharding.device_set})
    return 1


def file_contents(
    flat: dict[Path, Any], *, copy: bool
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays and the header of the file holding `flat` (a flat State).

    `copy` makes every array a copy of its own, so that the file can be written later
    whatever happens to the model's arrays meanwhile (a donated buffer, say).

    Raises:
        TypeError, ValueError: as `entry_for`; ValueError for an array that spans processes.
    """
    tensors: dict[str, np.ndarray] = {}
    entries: dict[str, Any] = {}
    for path, leaf in flat.items():
        key = encode_path(path)
        value, entry = entry_for(path, leaf)
        if (processes := spanned_processes(value)) > 1:
            raise ValueError(
                f"save_checkpoint: the {type(leaf).__name__} at {path_text(path)} is spread "
                f"over the devices of {processes} processes; one file would need all of it "
                "gathered in one process. Save to a directory instead (a path ending in '/', "
                "e.g. 'checkpoints/run/'): every process then writes its own shards, with "
                "orbax-checkpoint (pip install 'pytree-nn[orbax]')."
            )
        # None is written as an empty array (every key of the file names an array).
        if entry["kind"] == "none":
            array = np.zeros(0, np.uint8)
        else:
            array = np.ascontiguousarray(np.array(value) if copy else np.asarray(value))
        if array.dtype.name not in _NATIVE:
            array = array.reshape(-1).view(np.uint8).reshape(*array.shape, array.dtype.itemsize)
        entry["crc32"] = zlib.crc32(array.reshape(-1).view(np.uint8))
        tensors[key], entries[key] = array, entry
    header = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "entries": json.dumps(entries, allow_nan=False),
    }
    return tensors, header


def check_file_path(path: str) -> None:
    """Refuse a path whose directory does not exist, before anything is written."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"save_checkpoint: the directory {directory!r} does not exist; create it first."
        )


def _file_mode(path: str) -> int:
    """The permission bits for a checkpoint written at `path`."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)  # reading the umask means setting it: put it straight back
        os.umask(umask)
        return 0o666 & ~umask


def write_file(path: str, tensors: dict[str, np.ndarray], header: dict[str, str]) -> None:
    """Write the file under a temporary name, flush it to disk, and rename it over `path`."""
    check_file_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        # Made here first, so that a directory we may not write to is reported for the
        # user's path (safetensors would name its own temporary file, in its own error).
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except PermissionError:
        raise PermissionError(
            errno.EACCES,
            f"save_checkpoint: cannot write {path!r}: no permission to create files in "
            f"{directory!r}. Save to a directory you can write to, or change its "
            "permissions",
            path,
        ) from None
    # Imported on first save or load, not with pytree_nn (most programs never checkpoint).
    import safetensors.numpy

    try:
        safetensors.numpy.save_file(tensors, temporary, metadata=header)
        # safetensors creates files readable by their owner only; give the checkpoint the
        # mode of the file it replaces, or that of any new file (the umask applied).
        os.chmod(temporary, _file_mode(path))
        with open(temporary, "rb+") as file:
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable (POSIX)
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _checksum_problem(entry: dict[str, Any]) -> str | None:
    return None if is_int(entry["crc32"]) else f"has the checksum {entry['crc32']!r} (not an int)"


class FileReader:
    """A checkpoint file, read whole: its `entries` (key -> header entry), checked for form,
    and `values` to decode the arrays of some of them."""

    def __init__(self, path: str):
        import safetensors

        self.path = path
        with open(path, "rb") as file:
            content = file.read()
        corrupt = f"load_checkpoint: {path!r} is not a readable checkpoint (truncated or corrupt?)"
        try:
            self.tensors = dict(safetensors.deserialize(content))
            header = json.loads(content[8 : 8 + int.from_bytes(content[:8], "little")])
        except (safetensors.SafetensorError, ValueError) as error:
            raise ValueError(f"{corrupt}: {error}") from None
        metadata = header.get("__metadata__") or {}
        if metadata.get("format") != FORMAT:
            raise ValueError(
                f"load_checkpoint: {path!r} is a safetensors file, but not one written by "
                "save_checkpoint (its header has no pytree_nn format entry). Read it with "
                "`safetensors.numpy.load_file` and write the arrays with `pytree_graph.update`."
            )
        check_version(path, metadata.get("format_version"), str(FORMAT_VERSION))
        try:
            entries = json.loads(metadata["entries"])
        except (KeyError, ValueError) as error:
            raise ValueError(f"{corrupt}: its header entries cannot be read ({error}).") from None
        if not isinstance(entries, dict) or entries.keys() != self.tensors.keys():
            raise ValueError(f"{corrupt}: its header does not describe the arrays it holds.")
        for key, entry in entries.items():
            if problem := entry_problem(key, entry, ("crc32",), _checksum_problem):
                raise ValueError(f"{corrupt}: the header entry of {key!r} {problem}.")
        self.entries: dict[str, dict[str, Any]] = entries

    def values(self, wanted: dict[str, tuple[Path, Any]]) -> tuple[dict[str, Any], list[str]]:
        """The decoded values of the keys in `wanted` (key -> (path, value replaced)), and a
        problem for each one that is corrupt."""
        values, problems = {}, []
        for key, (path, _) in wanted.items():
            try:
                values[key] = self._decoded(key)
            except (ValueError, TypeError) as error:
                problems.append(f"{path_text(path)}: {error}")
        return values, problems

    def _decoded(self, key: str) -> Any:
        """The value of one entry, as a NumPy array (or PRNG key array), checked."""
        tensor, entry = self.tensors[key], self.entries[key]
        data, code, shape = tensor["data"], tensor["dtype"], tuple(tensor["shape"])
        if code not in _BY_CODE or zlib.crc32(data) != entry.get("crc32"):
            raise ValueError(
                f"the array {key!r} is corrupt (its checksum or dtype {code} is not what was "
                "written)"
            )
        array = np.frombuffer(data, dtype=jnp.dtype(_BY_CODE[code])).reshape(shape)
        if entry["kind"] == "none":
            if array.size:
                raise ValueError(f"the entry {key!r} holds None but has {array.size} values")
            return None
        if "key_impl" in entry:
            keys = jax.random.wrap_key_data(array, impl=entry["key_impl"])
            if str(keys.dtype) != entry["dtype"] or list(keys.shape) != entry["shape"]:
                raise ValueError(
                    f"the PRNG keys {key!r} are {show_array(str(keys.dtype), keys.shape)}, not "
                    f"the {show_array(entry['dtype'], entry['shape'])} written"
                )
            return keys
        dtype = jnp.dtype(entry["dtype"]) if entry["kind"] == "array" else array.dtype
        if array.dtype != dtype:
            array = array.reshape(-1).view(dtype)
        return array.reshape(entry["shape"])

    def close(self) -> None:
        """Nothing to release: the file was read whole."""
