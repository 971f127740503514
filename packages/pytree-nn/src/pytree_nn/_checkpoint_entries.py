"""What a checkpoint records about each value it holds, in either format, and the checks that
decide whether it fits a model: keys for State paths, header entries, metadata as JSON."""

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import Path, path_text
from pytree_graph import Variable

FORMAT = "pytree_nn.checkpoint"
FORMAT_VERSION = 1
NONE = "None"  # the dtype (and kind) of a Variable holding None, as optax states have
# The metadata of a Variable's layout (pytree_graph's `with_partitioning`, `shard`,
# `create_sharded`: the axes of its `sharding`, logical names included, and its `mesh`):
# the model loaded into keeps its own, and its arrays are laid out as it says.
LAYOUT = frozenset({"sharding", "mesh"})
METADATA_DIFFERS = "has metadata"  # in a problem: the hint names check_metadata=False
SAVED = (
    "a Module (or any graph of Modules and Variables), a State, or a list, tuple or dict "
    "of them or of arrays (e.g. an optax state)"
)

_PYTHON_SCALARS = (bool, int, float)
_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)
_INT = re.compile(r"-?[0-9]+\Z")
_UNESCAPE = {"0": "~", "1": "/", "2": ""}
_KINDS = {"python": {"bool", "int", "float"}, "array": None, "none": {NONE}}


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
        ValueError: `key` is not one `encode_path` writes (so no two keys of a checkpoint
            can stand for the same path).
    """
    path = tuple(
        int(part) if _INT.match(part) else re.sub(r"~([012])", lambda m: _UNESCAPE[m[1]], part)
        for part in key.split("/")
    )
    if encode_path(path) != key:
        raise ValueError(f"{key!r} is not a key save_checkpoint writes")
    return path


def describe(value: Any) -> tuple[str, str, tuple[int, ...]] | None:
    """`(kind, dtype, shape)` of a value a checkpoint can hold, else None."""
    if value is None:
        return "none", NONE, ()
    if isinstance(value, _PYTHON_SCALARS):
        return "python", type(value).__name__, ()
    if isinstance(value, _ARRAYS):
        return "array", str(value.dtype), tuple(np.shape(value))
    return None


def json_metadata(variable: Variable, path: Path, function: str) -> dict[str, Any]:
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


def entry_for(path: Path, leaf: Any) -> tuple[Any, dict[str, Any]]:
    """The value to write for one State leaf (PRNG keys as their data), and its entry.

    Raises:
        TypeError: the leaf holds something a checkpoint cannot (not an array, a Python
            bool/int/float or None; an abstract array).
    """
    value = leaf.value if isinstance(leaf, Variable) else leaf
    described = describe(value)
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
        entry["metadata"] = json_metadata(leaf, path, "save_checkpoint")
        entry["metadata_names"] = sorted(leaf.metadata)
    if kind == "array" and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        entry["key_impl"] = str(jax.random.key_impl(value))
        value = jax.random.key_data(value)
    return value, entry


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def malformed(entry: Any, required: tuple[str, ...] = ()) -> str | None:
    """What is wrong with the form of an entry (as `entry_for` writes them, with the
    format's own `required` fields), or None."""
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not a mapping"
    missing = sorted({"kind", "dtype", "shape", *required} - entry.keys())
    if missing:
        return f"has no {', '.join(missing)}"
    kind, dtype, shape = entry["kind"], entry["dtype"], entry["shape"]
    if kind not in _KINDS:
        return f"has the kind {kind!r} (not one of {sorted(_KINDS)})"
    if not isinstance(dtype, str) or (_KINDS[kind] is not None and dtype not in _KINDS[kind]):
        return f"has the dtype {dtype!r} for a value of kind {kind!r}"
    if not isinstance(shape, list) or not all(is_int(n) and n >= 0 for n in shape):
        return f"has the shape {shape!r} (not a list of sizes)"
    if kind != "array" and shape:
        return f"has the shape {shape!r} for a value of kind {kind!r}"
    if not isinstance(entry.get("key_impl", ""), str):
        return f"has the PRNG implementation {entry['key_impl']!r} (not a name)"
    if "type" in entry and not (
        isinstance(entry["type"], str)
        and isinstance(entry.get("metadata"), dict)
        and isinstance(entry.get("metadata_names"), list)
    ):
        return "has a Variable type without metadata and its names"
    return None


def check_version(path: str, found: Any, expected: Any) -> None:
    """Refuse a checkpoint of another format version (`expected`: this one, as the format
    writes it)."""
    if found != expected:
        raise ValueError(
            f"load_checkpoint: {path!r} has checkpoint format version {found!r}; this "
            f"version of pytree_nn reads version {FORMAT_VERSION}. Upgrade pytree_nn to read it."
        )


def entry_problem(
    key: str,
    entry: Any,
    required: tuple[str, ...] = (),
    check: Callable[[dict[str, Any]], str | None] | None = None,
) -> str | None:
    """What is wrong with one entry as read back (its form, then the format's own `check`,
    then its key), or None."""
    problem = malformed(entry, required)
    if problem is None and check is not None:
        problem = check(entry)
    if problem is None:
        try:
            decode_key(key)
        except ValueError as error:
            problem = str(error)
    return problem


def show_array(dtype: str, shape: tuple[int, ...]) -> str:
    return NONE if dtype == NONE else f"{dtype}[{','.join(map(str, shape))}]"


def mismatch(path: Path, leaf: Any, entry: dict[str, Any], check_metadata: bool) -> str | None:
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
    described = describe(value)
    saved = (entry["kind"], entry["dtype"], tuple(entry["shape"]))
    if described != saved:
        now = show_array(*described[1:]) if described else f"a {type(value).__name__}"
        return f"{where} is {now} in the model but {show_array(*saved[1:])} in the checkpoint"
    if check_metadata and isinstance(leaf, Variable):
        names = _what(sorted(leaf.metadata))
        current = _what(json_metadata(leaf, path, "load_checkpoint"))
        # A Variable's entry has both (`malformed` checks it when the checkpoint is read).
        saved_names, saved_metadata = _what(entry["metadata_names"]), _what(entry["metadata"])
        if names != saved_names or current != saved_metadata:
            return (
                f"the {type(leaf).__name__} at {where} {METADATA_DIFFERS} {current} (names "
                f"{names}) in the model but {saved_metadata} (names {saved_names}) in the "
                "checkpoint"
            )
    return None


def _what(metadata: Any) -> Any:
    """Metadata (a dict, or a list of names) without the layout entries, which say where
    the values live, not what they are: a checkpoint loads onto any mesh and sharding."""
    if isinstance(metadata, dict):
        return {name: value for name, value in metadata.items() if name not in LAYOUT}
    return [name for name in metadata if name not in LAYOUT]


def placed(value: Any, current: Any, kind: str) -> Any:
    """A loaded value in the form of the value it replaces (device and sharding kept)."""
    if kind == "none":
        return None
    if kind == "python":
        return type(current)(value.item() if isinstance(value, np.ndarray) else value)
    if isinstance(current, jax.Array):
        return jax.device_put(value, current.sharding)
    if isinstance(current, jax.ShapeDtypeStruct):
        sharding = current.sharding
        return jax.device_put(value, sharding) if sharding is not None else jnp.asarray(value)
    if isinstance(value, jax.Array):
        return value
    return np.array(value)[()] if isinstance(current, np.generic) else np.array(value)
