"""Checkpoints: a model's State in one safetensors file, written atomically."""

import contextlib
import errno
import json
import math
import os
import re
import stat
import uuid
import zlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

import pytree_graph
from pytree_filter import Path, path_text
from pytree_graph import State, Variable
from pytree_module import TraceContextError

from ._checks import check_graph

FORMAT = "pytree_nn.checkpoint"
FORMAT_VERSION = 1

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
_PYTHON_SCALARS = (bool, int, float)
_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)
_INT = re.compile(r"-?[0-9]+\Z")
_UNESCAPE = {"0": "~", "1": "/", "2": ""}
_SHOWN = 10  # problems listed in one error
_METADATA = "has metadata"
_NONE = "None"  # the dtype (and kind) of a Variable holding None, as optax states have
_KINDS = {"python": {"bool", "int", "float"}, "array": None, "none": {_NONE}}
_SAVED = (
    "a Module (or any graph of Modules and Variables), a State, or a list, tuple or dict "
    "of them or of arrays (e.g. an optax state)"
)


def encode_path(path: Path) -> str:
    """The key of a State path in a checkpoint: its keys joined by `/`.

    An int key is written in decimal. In a str key, `~` is written `~0` and `/` is
    written `~1`; a str that is empty or reads as an int gets the prefix `~2`, which
    stands for nothing. So `("layers", 0, "kernel")` is `layers/0/kernel` and the str
    key `"0"` is `~20`, and every key decodes back to the path it came from.

    Examples:
        >>> from pytree_nn._checkpoint import decode_key, encode_path
        >>> encode_path(("layers", 0, "kernel")), encode_path(("a/b", "7"))
        ('layers/0/kernel', 'a~1b/~27')
        >>> decode_key("a~1b/~27")
        ('a/b', '7')
    """
    parts = []
    for key in path:
        if isinstance(key, int) and not isinstance(key, bool):
            parts.append(str(key))
        elif isinstance(key, str):
            text = key.replace("~", "~0").replace("/", "~1")
            parts.append("~2" + text if not text or _INT.match(text) else text)
        else:
            raise TypeError(
                f"save_checkpoint: the path {path} has a key of type {type(key).__name__} "
                f"({key!r}); checkpoints store paths whose keys are str or int. Use str "
                "keys for dicts in the model."
            )
    joined = "/".join(parts)
    # The one key safetensors keeps for itself.
    return "~2" + joined if joined == "__metadata__" else joined


def decode_key(key: str) -> Path:
    """The State path a checkpoint key (from `encode_path`) stands for.

    Raises:
        ValueError: `key` is not one `encode_path` writes (so no two keys of a file can
            stand for the same path).
    """
    path = tuple(
        int(part) if _INT.match(part) else re.sub(r"~([012])", lambda m: _UNESCAPE[m[1]], part)
        for part in key.split("/")
    )
    if encode_path(path) != key:
        raise ValueError(f"{key!r} is not a key save_checkpoint writes")
    return path


def _describe(value: Any) -> tuple[str, str, tuple[int, ...]] | None:
    """`(kind, dtype, shape)` of a value a checkpoint can hold, else None."""
    if value is None:
        return "none", _NONE, ()
    if isinstance(value, _PYTHON_SCALARS):
        return "python", type(value).__name__, ()
    if isinstance(value, _ARRAYS):
        return "array", str(value.dtype), tuple(np.shape(value))
    return None


def _json_metadata(variable: Variable, path: Path, function: str) -> dict[str, Any]:
    """The metadata JSON can represent (the other entries are only checked by name).

    Raises:
        ValueError: a metadata value holds a NaN or an infinity, which JSON cannot hold
            and which would never compare equal on loading.
    """
    saved = {}
    for name, value in variable.metadata.items():
        try:
            saved[name] = _as_json(value)
        except TypeError:
            continue  # not representable in JSON: checked by name only
        except ValueError:
            raise ValueError(
                f"{function}: the {type(variable).__name__} at {path_text(path)} has the "
                f"metadata {name}={value!r}, which holds a NaN or an infinity; a checkpoint "
                "keeps metadata as JSON, which has neither. Give it a finite value (or "
                "None) before saving."
            ) from None
    return saved


def _as_json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_as_json(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _as_json(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


def _stored(path: Path, leaf: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """The array written for one State leaf, and its entry in the header."""
    value = leaf.value if isinstance(leaf, Variable) else leaf
    described = _describe(value)
    if described is None or isinstance(value, jax.ShapeDtypeStruct):
        what = "an abstract array (no values)" if described else f"a {type(value).__name__}"
        raise TypeError(
            f"save_checkpoint: the {type(leaf).__name__} at {path_text(path)} holds {what}; "
            "checkpoints hold arrays, Python bool/int/float and None. Leave it out, e.g. "
            "`save_checkpoint(path, pytree_graph.state(model, Param))`, or `pop` it first."
        )
    kind, dtype, shape = described
    entry: dict[str, Any] = {"kind": kind, "dtype": dtype, "shape": list(shape)}
    if isinstance(leaf, Variable):
        entry["type"] = type(leaf).__qualname__
        entry["metadata"] = _json_metadata(leaf, path, "save_checkpoint")
        entry["metadata_names"] = sorted(leaf.metadata)
    if kind == "array" and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        entry["key_impl"] = str(jax.random.key_impl(value))
        value = jax.random.key_data(value)
    # None is written as an empty array (every key of the file names an array).
    array = np.zeros(0, np.uint8) if kind == "none" else np.ascontiguousarray(np.asarray(value))
    if array.dtype.name not in _NATIVE:
        array = array.reshape(-1).view(np.uint8).reshape(*array.shape, array.dtype.itemsize)
    entry["crc32"] = zlib.crc32(array.reshape(-1).view(np.uint8))
    return array, entry


def save_checkpoint(path: str | os.PathLike, model_or_state: Any) -> None:
    """Save a model's state (or a `State`) to one safetensors file, atomically.

    Every Variable and array is written under its path (see "Keys" below), keeping its
    dtype (`bfloat16` and PRNG keys included); Variable types and metadata go in the
    file's header, with a checksum of each array. A Variable shared by several parts of
    the model is stored once. Nothing is pickled.

    The file is written under a temporary name in the same directory, flushed to disk,
    and then renamed over `path`: a failure part-way leaves any earlier file at `path`
    as it was, and a reader never sees half a file. (Two threads or processes saving to
    one `path` at once each write a file of their own; the last rename wins.)

    Keys: the keys of a path joined by `/`, ints in decimal (`layers/0/kernel`); in str
    keys `~` is written `~0` and `/` is written `~1`, and a str that is empty or reads as
    an int is prefixed with `~2`.

    Arguments:
        path: the file to write (conventionally ending in `.safetensors`).
        model_or_state: a Module (or any graph of Modules and Variables), whose whole
            state is saved; a `State`, e.g. `pytree_graph.state(model, Param)` to save
            the parameters only; or any pytree of arrays, such as an optax optimizer
            state (`tx.init(filter(model, is_inexact_array))`).

    Raises:
        TypeError: `path` is not a path, `model_or_state` is a single value (None, a
            number, an array) rather than something holding state, a Variable holds
            something that is not an array, a Python scalar or None, or a path has a
            key that is not a str or int. No file is written.
        ValueError: a Variable's metadata holds a NaN or an infinity (JSON has neither).
        PermissionError: the directory of `path` cannot be written to.

    Examples:
        >>> import os, tempfile
        >>> from pytree_nn import Linear, load_checkpoint, save_checkpoint
        >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> save_checkpoint(path, Linear(2, 3, rngs=0))
        >>> restored = load_checkpoint(path, Linear(2, 3, rngs=1))
        >>> bool((restored.kernel.value == Linear(2, 3, rngs=0).kernel.value).all())
        True
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"save_checkpoint: `path` must be a str or os.PathLike (the file to write), got "
            f"a {type(path).__name__} ({path!r})."
        )
    check_graph("save_checkpoint", "model_or_state", model_or_state, _SAVED)
    state = model_or_state if isinstance(model_or_state, State) else None
    if state is None:
        state = pytree_graph.state(model_or_state)
    tensors: dict[str, np.ndarray] = {}
    entries: dict[str, Any] = {}
    for leaf_path, leaf in state.flat_state().items():
        key = encode_path(leaf_path)
        tensors[key], entries[key] = _stored(leaf_path, leaf)
    header = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "entries": json.dumps(entries, allow_nan=False),
    }
    _write_atomically(os.fspath(path), tensors, header)


def _file_mode(path: str) -> int:
    """The permission bits for a checkpoint written at `path`."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)  # reading the umask means setting it: put it straight back
        os.umask(umask)
        return 0o666 & ~umask


def _write_atomically(path: str, tensors: dict[str, np.ndarray], header: dict[str, str]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"save_checkpoint: the directory {directory!r} does not exist; create it first."
        )
    if os.path.isdir(path):
        raise IsADirectoryError(f"save_checkpoint: {path!r} is a directory; give a file name.")
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


def _read(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors (`{key: {"dtype", "shape", "data"}}`) and entries of a checkpoint."""
    with open(path, "rb") as file:
        content = file.read()
    corrupt = f"load_checkpoint: {path!r} is not a readable checkpoint (truncated or corrupt?)"
    try:
        tensors = dict(safetensors.deserialize(content))
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
    if metadata.get("format_version") != str(FORMAT_VERSION):
        raise ValueError(
            f"load_checkpoint: {path!r} has checkpoint format version "
            f"{metadata.get('format_version')!r}; this version of pytree_nn reads version "
            f"{FORMAT_VERSION}. Upgrade pytree_nn to read it."
        )
    try:
        entries = json.loads(metadata["entries"])
    except (KeyError, ValueError) as error:
        raise ValueError(f"{corrupt}: its header entries cannot be read ({error}).") from None
    if not isinstance(entries, dict) or entries.keys() != tensors.keys():
        raise ValueError(f"{corrupt}: its header does not describe the arrays it holds.")
    for key, entry in entries.items():
        problem = _malformed(entry)
        if problem is None:
            try:
                decode_key(key)
            except ValueError as error:
                problem = str(error)
        if problem is not None:
            raise ValueError(f"{corrupt}: the header entry of {key!r} {problem}.")
    return tensors, entries


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _malformed(entry: Any) -> str | None:
    """What is wrong with the form of a header entry (as `_stored` writes them), or None."""
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not a mapping"
    missing = sorted({"kind", "dtype", "shape", "crc32"} - entry.keys())
    if missing:
        return f"has no {', '.join(missing)}"
    kind, dtype, shape = entry["kind"], entry["dtype"], entry["shape"]
    if kind not in _KINDS:
        return f"has the kind {kind!r} (not one of {sorted(_KINDS)})"
    if not isinstance(dtype, str) or (_KINDS[kind] is not None and dtype not in _KINDS[kind]):
        return f"has the dtype {dtype!r} for a value of kind {kind!r}"
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        return f"has the shape {shape!r} (not a list of sizes)"
    if kind != "array" and shape:
        return f"has the shape {shape!r} for a value of kind {kind!r}"
    if not _is_int(entry["crc32"]):
        return f"has the checksum {entry['crc32']!r} (not an int)"
    if not isinstance(entry.get("key_impl", ""), str):
        return f"has the PRNG implementation {entry['key_impl']!r} (not a name)"
    if "type" in entry and not (
        isinstance(entry["type"], str)
        and isinstance(entry.get("metadata"), dict)
        and isinstance(entry.get("metadata_names"), list)
    ):
        return "has a Variable type without metadata and its names"
    return None


def _restored(key: str, tensor: dict[str, Any], entry: dict[str, Any]) -> Any:
    """The value of one entry, as a NumPy array (or PRNG key array), checked."""
    data, code, shape = tensor["data"], tensor["dtype"], tuple(tensor["shape"])
    if code not in _BY_CODE or zlib.crc32(data) != entry.get("crc32"):
        raise ValueError(
            f"the array {key!r} is corrupt (its checksum or dtype {code} is not what was written)"
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
                f"the PRNG keys {key!r} are {_show_array(str(keys.dtype), keys.shape)}, not "
                f"the {_show_array(entry['dtype'], entry['shape'])} written"
            )
        return keys
    dtype = jnp.dtype(entry["dtype"]) if entry["kind"] == "array" else array.dtype
    if array.dtype != dtype:
        array = array.reshape(-1).view(dtype)
    return array.reshape(entry["shape"])


def _placed(value: Any, current: Any, kind: str) -> Any:
    """A loaded value in the form of the value it replaces (device and sharding kept)."""
    if kind == "none":
        return None
    if kind == "python":
        return type(current)(value.item())
    if isinstance(current, jax.Array):
        return jax.device_put(value, current.sharding)
    if isinstance(current, jax.ShapeDtypeStruct):
        sharding = current.sharding
        return jax.device_put(value, sharding) if sharding is not None else jnp.asarray(value)
    if isinstance(value, jax.Array):
        return value
    return np.array(value)[()] if isinstance(current, np.generic) else np.array(value)


def _show_array(dtype: str, shape: tuple[int, ...]) -> str:
    return _NONE if dtype == _NONE else f"{dtype}[{','.join(map(str, shape))}]"


def _mismatch(path: Path, leaf: Any, entry: dict[str, Any], check_metadata: bool) -> str | None:
    """What keeps a checkpoint entry from being loaded into `leaf`, or None."""
    where = path_text(path)
    saved_type = entry.get("type")
    if isinstance(leaf, Variable) != (saved_type is not None) or (
        saved_type is not None and type(leaf).__qualname__ != saved_type
    ):
        kind = type(leaf).__name__ if isinstance(leaf, Variable) else "bare array"
        return (
            f"{where} is a {kind} in the model but a {saved_type or 'bare array'} in the checkpoint"
        )
    value = leaf.value if isinstance(leaf, Variable) else leaf
    described = _describe(value)
    saved = (entry["kind"], entry["dtype"], tuple(entry["shape"]))
    if described != saved:
        now = _show_array(*described[1:]) if described else f"a {type(value).__name__}"
        return f"{where} is {now} in the model but {_show_array(*saved[1:])} in the checkpoint"
    if check_metadata and isinstance(leaf, Variable):
        names = sorted(leaf.metadata)
        current = _json_metadata(leaf, path, "load_checkpoint")
        if names != entry.get("metadata_names") or current != entry.get("metadata"):
            return (
                f"the {type(leaf).__name__} at {where} {_METADATA} {current} (names "
                f"{names}) in the model but {entry.get('metadata')} (names "
                f"{entry.get('metadata_names')}) in the checkpoint"
            )
    return None


def load_checkpoint(
    path: str | os.PathLike, model: Any, *filters: Any, check_metadata: bool = True
) -> Any:
    """Load a checkpoint written by `save_checkpoint` into `model`, in place where it can.

    The checkpoint must hold exactly the model's state (or, with filters, the part they
    select): the same paths, Variable types, metadata, shapes and dtypes. Everything,
    checksums included, is checked before any value is written, so a file that does not
    fit, or is truncated or corrupt, raises and leaves the model as it was. Each value
    goes where the one it replaces was (its device and sharding); a model of
    `jax.ShapeDtypeStruct`s (from `pytree_graph.eval_shape`) gets arrays. A shared
    Variable is restored once, for all its references.

    Arguments:
        path: the checkpoint file.
        model: the model to restore into (a Module, or any graph of Modules and
            Variables, or any pytree of arrays such as an optax state), built with the
            same structure as the one saved.
        *filters: the part of the model the checkpoint holds, as for
            `pytree_graph.state` (e.g. `Param` for a checkpoint saved from
            `pytree_graph.state(model, Param)`); by default, all of it.
        check_metadata: require the Variables' metadata to match the checkpoint's (the
            model's own metadata is kept either way).

    Returns:
        `model`, restored in place; or, when it holds arrays directly in something that
        cannot change in place (a frozen Module, Equinox style: `class M(Module,
        frozen=True)` with `w: jax.Array`; a tuple or namedtuple, as in an optax state),
        a new model (or state) with the loaded values, and `model` unchanged.
        `model = load_checkpoint(path, model)` works either way.

    Raises:
        TypeError: `path` is not a path, or `model` is a single value (None, a number,
            an array) rather than something holding state.
        ValueError: the file is not a checkpoint, is truncated or corrupt (any damaged
            byte of its header, any damaged array), or does not match the model (the
            message lists what differs). `model` is left as it was.

    Examples:
        >>> import os, tempfile
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param
        >>> from pytree_nn import Linear, load_checkpoint, save_checkpoint
        >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> save_checkpoint(path, Linear(2, 3, rngs=0))
        >>> load_checkpoint(path, Linear(2, 4, rngs=0))
        Traceback (most recent call last):
        ...
        ValueError: load_checkpoint: ... .bias is float32[4] in the model but float32[3] in ...
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"load_checkpoint: `path` must be a str or os.PathLike (the file to read), got "
            f"a {type(path).__name__} ({path!r})."
        )
    check_graph("load_checkpoint", "model", model, _SAVED)
    path = os.fspath(path)
    states = pytree_graph.state(model, *filters)
    flat: dict[Path, Any] = {}
    for part in states if isinstance(states, tuple) else (states,):
        flat.update(part.flat_state())
    tensors, entries = _read(path)
    saved = {decode_key(key): key for key in entries}
    problems = [
        f"{path_text(p)} is in the model but not in the checkpoint" for p in flat if p not in saved
    ]
    problems += [
        f"{path_text(p)} is in the checkpoint but not in the model" for p in saved if p not in flat
    ]
    values = {}
    for leaf_path, leaf in flat.items():
        key = saved.get(leaf_path)
        if key is None:
            continue
        problem = _mismatch(leaf_path, leaf, entries[key], check_metadata)
        if problem is None:
            try:
                value = _restored(key, tensors[key], entries[key])
            except (ValueError, TypeError) as error:
                problem = f"{path_text(leaf_path)}: {error}"
        if problem is not None:
            problems.append(problem)
            continue
        current = leaf.value if isinstance(leaf, Variable) else leaf
        values[leaf_path] = (value, current, entries[key]["kind"])
    if problems:
        listed = "; ".join(problems[:_SHOWN])
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise ValueError(
            f"load_checkpoint: {path!r} does not fit the {type(model).__name__}: "
            f"{listed}{more}. Nothing was loaded. Build the model as it was when saved"
            + (
                ", or pass check_metadata=False to ignore metadata."
                if any(_METADATA in problem for problem in problems)
                else "."
            )
        )
    placed = {p: _placed(v, c, kind) for p, (v, c, kind) in values.items()}
    try:
        # `update` checks every path before it writes one, so when it refuses, nothing of
        # `model` has changed.
        pytree_graph.update(model, State.from_flat_path(placed))
    except TraceContextError:
        raise  # a write refused inside a trace is the caller's error, not a form of model
    except ValueError:
        # Arrays held directly by frozen Modules, tuples or namedtuples (an Equinox-style
        # model, an optax state) cannot change in place: build a new graph with the
        # loaded values, which `model = load_checkpoint(...)` takes.
        graphdef, whole = pytree_graph.split(model)
        everything = dict(whole.flat_state())
        for leaf_path, value in placed.items():
            leaf = everything[leaf_path]
            everything[leaf_path] = leaf.replace(value) if isinstance(leaf, Variable) else value
        return pytree_graph.merge(graphdef, State.from_flat_path(everything))
    return model
