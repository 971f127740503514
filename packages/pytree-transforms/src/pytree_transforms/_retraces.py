"""Why a jitted function was traced again: signatures of traces, their differences, the switch.

A retrace is a trace after the first, so everything here runs while tracing, never on a
cached call: each transform, inside the function it hands to `jax.jit`, describes the call
it is traced for as a `Signature` (for each argument path, an array's shape, dtype and weak
type, a static value, or a node of the structure) and records it in the `TraceHistory` of
the transformed function. On a later trace the new signature is compared with the closest
of the last few, and the differences are said one per line, each with how to avoid it where
there is a way. They are logged (logger `pytree_transforms.retraces`, level WARNING) while
the switch is on (`explain_retraces`, or `PYTREE_EXPLAIN_RETRACES=1` at import), and
`assert_max_traces` adds them to its error whether it is on or not.

With the switch off, a trace costs one signature more and a cached call nothing.
"""

import logging
import os
import re
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from pytree_filter import path_text
from pytree_module.extend import static_key

logger = logging.getLogger("pytree_transforms.retraces")

ENVIRONMENT_VARIABLE = "PYTREE_EXPLAIN_RETRACES"
# How many earlier signatures of one function are kept to compare a new trace with.
_KEPT = 8
# The most differences one explanation lists (a new model has thousands).
_SHOWN = 12
_TRUE = ("1", "true", "yes", "on")


def _from_environment() -> bool:
    return os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in _TRUE


class _Switch:
    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = _from_environment()


_switch = _Switch()


class explain_retraces:
    """Log why `filter_jit`, `pytree_graph.jit` and `jit_partial` functions are traced again.

    While on, every trace of a jitted function after its first logs one message through
    Python's `logging` (logger `"pytree_transforms.retraces"`, level WARNING), one line per
    difference from the closest earlier trace: the argument path, what changed (an array's
    shape, dtype or weak type, a static value, an attribute added or removed, a Module's
    class, a Variable's type, what is shared), and how to avoid it where there is a way. The
    first trace of a function logs nothing, and neither does a call that reuses a
    compilation. `PYTREE_EXPLAIN_RETRACES=1` in the environment turns it on at import.

    Calling it sets the switch at once and gives a context manager: used in a `with`
    block, the setting it replaced comes back when the block ends (so these nest).

    Arguments:
        enabled: `True` (the default) to explain retraces, `False` to stop.

    Raises:
        TypeError: when `enabled` is not a bool.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import explain_retraces, filter_jit
        >>> @filter_jit
        ... def scale(x, factor):
        ...     return x * factor
        >>> with explain_retraces():
        ...     _ = scale(jnp.ones(2), 2)
        ...     _ = scale(jnp.ones(3), 2)  # logs a WARNING: args[0]: shape (2,) -> (3,) ...
        >>> explain_retraces(True).enabled, explain_retraces(False).enabled
        (True, False)
    """

    __slots__ = ("before", "enabled")

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(
                f"explain_retraces(enabled) takes True or False; got {enabled!r}, a "
                f"{type(enabled).__name__}. Use `explain_retraces()` to turn it on, "
                "`explain_retraces(False)` to turn it off."
            )
        self.enabled = enabled
        self.before = _switch.on
        _switch.on = enabled

    def __enter__(self) -> "explain_retraces":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        _switch.on = self.before


def explaining_retraces() -> bool:
    """Whether retraces are explained now (see `explain_retraces`).

    Returns:
        True while the switch is on.

    Examples:
        >>> from pytree_transforms import explain_retraces, explaining_retraces
        >>> with explain_retraces():
        ...     explaining_retraces()
        True
    """
    return _switch.on


class _Entry:
    """What one path of a call holds, as far as a trace depends on it."""

    __slots__ = ("_text", "detail", "holder", "key", "kind")

    def __init__(
        self, kind: str, key: Any, text: str | None, detail: Any = None, holder: Any = None
    ):
        self.kind = kind  # "array", "static", "node" or "shared"
        self.key = key  # compared between traces
        # A short description, for an entry added or removed; a static's is made from its
        # value only when a message needs it (a repr can be long to make).
        self._text = text
        self.detail = detail  # array: (shape, dtype, weak_type); static: the value
        self.holder = holder  # array: the Variable type holding it; static: declared

    @property
    def text(self) -> str:
        return _short(self.detail) if self._text is None else self._text


_DTYPE = re.compile(r"^(float|int|uint|complex|bfloat)(\d+)$")


def _dtype_text(dtype: Any) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:  # an extended dtype (a PRNG key's `key<fry>`) is named as it prints
        return str(dtype)
    match = _DTYPE.match(name)
    if match is None:
        return name
    kind = {"float": "f", "int": "i", "uint": "u", "complex": "c", "bfloat": "bf"}[match[1]]
    return f"{kind}{match[2]}"


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not hide the explanation
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Signature:
    """What a call a function is traced for looks like, path by path: built while tracing.

    Paths are a root text (`"args[0]"`, `"kwargs['x']"`) followed by keys, as
    `pytree_filter.path_text` prints them. Each is added once; a later entry for a path
    already described is ignored, so an object reached twice is described by its first path.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms.extend import Signature
        >>> signature = Signature()
        >>> signature.pytree("args[0]", {"w": jnp.ones(2), "name": "a"})
        >>> for path, text in signature.described():
        ...     print(f"{path}: {text}")
        args[0]: dict
        args[0]['name']: 'a'
        args[0]['w']: f32[2]
    """

    __slots__ = ("entries", "seen")

    def __init__(self) -> None:
        self.entries: dict[tuple, _Entry] = {}
        # The first path of each array object met (a tracer reached twice is one input).
        self.seen: dict[int, tuple] = {}

    def _add(self, path: tuple, entry: _Entry) -> None:
        self.entries.setdefault(path, entry)

    def array(self, path: tuple, value: Any, holder: Any = None, holder_text: str = "") -> None:
        """An array (or tracer) at `path`, inside a Variable of type `holder` if given.

        Arguments:
            path: the root text and keys.
            value: the array or tracer (only its shape, dtype and weak type are kept).
            holder: what keys the Variable holding it (its type and metadata), or None.
            holder_text: how to name that Variable (`"Param"`).
        """
        aval = getattr(value, "aval", None)
        shape = tuple(getattr(aval if aval is not None else value, "shape", ()))
        dtype = getattr(aval if aval is not None else value, "dtype", None)
        weak = bool(getattr(aval, "weak_type", False))
        dims = ",".join(map(str, shape))
        text = f"{_dtype_text(dtype) if dtype is not None else '?'}[{dims}]"
        if holder_text:
            text = f"{holder_text} {text}"
        key = (shape, str(dtype), weak, holder)
        self._add(path, _Entry("array", key, text, (shape, dtype, weak), (holder, holder_text)))

    def static(self, path: tuple, value: Any, declared: bool = False) -> None:
        """A static value at `path` (compared as caches compare statics: by `static_key`).

        Arguments:
            path: the root text and keys.
            value: the value.
            declared: whether it is static by declaration (a Module's static field, a
                static argument), not for being a Python value.
        """
        try:
            key = static_key(value)
            hash(key)
        except Exception:  # an unhashable static is refused elsewhere, with its own error
            key = ("unhashable", id(value))
        self._add(path, _Entry("static", key, None, value, declared))

    def node(self, path: tuple, text: str, key: Any = None) -> None:
        """A node of the structure at `path`: a Module, a container (`text` names it, and
        `key`, if given, is what else about it the cache compares)."""
        self._add(path, _Entry("node", (text, key), text))

    def shared(self, path: tuple, first: tuple) -> None:
        """The object at `path` is the one first met at path `first`."""
        where = render(first)
        self._add(path, _Entry("shared", where, f"the same object as {where}"))

    def pytree(self, root: Any, tree: Any, keys: tuple = ()) -> None:
        """Describe a pytree (arrays or tracers as arrays, other leaves as statics, pytree
        Modules with their static attributes) under the path `(root, *keys)`."""
        path = (root, *keys)
        if isinstance(tree, jax.Array) or hasattr(tree, "aval"):
            first = self.seen.setdefault(id(tree), path)
            if first != path:
                self.shared(path, first)
            else:
                self.array(path, tree)
            return
        flat = jax.tree_util.default_registry.flatten_one_level_with_keys(tree)
        if flat is None:  # a leaf
            if isinstance(tree, np.ndarray | np.generic) and not isinstance(tree, np.bool_):
                self.array(path, tree)
            else:
                self.static(path, tree)
            return
        children, aux = flat
        layout = getattr(aux, "layout", None)
        statics = getattr(aux, "statics", None)
        if layout is not None and statics is not None:  # a pytree Module's treedef entry
            self.node(path, layout.cls.__name__, layout.cls)
            for name, value in zip(layout.static_keys, statics, strict=False):
                self.static((*path, name), value, declared=True)
        elif type(tree) in (list, tuple, dict) or tree is None:
            self.node(path, type(tree).__name__)
        else:
            try:
                hash(aux)
                aux_key: Any = (type(tree), aux)
            except TypeError:
                aux_key = type(tree)
            self.node(path, type(tree).__name__, aux_key)
        for key, child in children:
            self.pytree(root, child, (*keys, key))

    def described(self) -> Iterator[tuple[str, str]]:
        """`(path, description)` for each path, in order."""
        for path, entry in self.entries.items():
            yield render(path), entry.text


def render(path: tuple) -> str:
    """A signature path as text: `args[0].layers[1].weight`."""
    root, *keys = path
    return str(root) + (path_text(keys) if keys else "")


_NUMBERS = (bool, int, float, complex)

_HINTS = {
    "shape": "every new shape traces again: pad or bucket inputs to a few fixed shapes",
    "dtype": "cast to one dtype before the call, with `x.astype(...)`",
    "weak": (
        "a Python scalar made into an array is weakly typed: make it with "
        "`jnp.asarray(x, dtype=...)` every time"
    ),
    "number": "a Python number is static: pass `jnp.asarray(...)` to avoid retracing",
}


def _change(old: _Entry, new: _Entry) -> str:
    """One difference at one path, with how to avoid it where there is a way."""
    if old.kind == new.kind == "array":
        (old_shape, old_dtype, old_weak), (new_shape, new_dtype, new_weak) = old.detail, new.detail
        old_holder, new_holder = old.holder, new.holder
        parts, hint = [], ""
        if old_holder[0] != new_holder[0]:
            old_cls = getattr(old_holder[0], "cls", None)
            new_cls = getattr(new_holder[0], "cls", None)
            if old_cls is not new_cls or not old_holder[1] or not new_holder[1]:
                parts.append(
                    f"Variable type {old_holder[1] or 'none'} -> {new_holder[1] or 'none'}"
                )
            else:
                old_meta = dict(getattr(old_holder[0], "items", ()))
                new_meta = dict(getattr(new_holder[0], "items", ()))
                changed = sorted(
                    {k for k in {*old_meta, *new_meta} if old_meta.get(k) != new_meta.get(k)},
                    key=str,
                )
                parts.append(
                    "Variable metadata "
                    + ", ".join(
                        f"{k}: {_short(old_meta.get(k))} -> {_short(new_meta.get(k))}"
                        for k in changed
                    )
                    if changed
                    else "Variable metadata changed"
                )
        if old_shape != new_shape:
            parts.append(f"shape {old_shape} -> {new_shape}")
            hint = hint or _HINTS["shape"]
        if str(old_dtype) != str(new_dtype):
            parts.append(f"dtype {old_dtype} -> {new_dtype}")
            hint = hint or _HINTS["dtype"]
        if old_weak != new_weak:
            parts.append(f"weak type {old_weak} -> {new_weak}")
            hint = hint or _HINTS["weak"]
        text = ", ".join(parts) or f"{old.text} -> {new.text}"
        return f"{text} ({hint})" if hint else text
    if old.kind == new.kind == "static":
        if new.holder:
            return (
                f"static value {old.text} -> {new.text} (a static attribute or argument "
                "compiles anew for each value: hold one that varies as an array instead)"
            )
        if isinstance(old.detail, _NUMBERS) and isinstance(new.detail, _NUMBERS):
            return f"Python value {old.text} -> {new.text} ({_HINTS['number']})"
        if type(old.detail) is not type(new.detail) and old.detail == new.detail:
            return (
                f"static value {old.text} ({type(old.detail).__name__}) -> {new.text} "
                f"({type(new.detail).__name__}): equal values of different types trace apart"
            )
        return f"static value {old.text} -> {new.text}"
    if old.kind == new.kind == "node":
        if old.text != new.text:
            return f"class {old.text} -> {new.text}"
        return f"{new.text}'s structure data changed"
    if old.kind == new.kind == "shared":
        return f"now the same object as {new.key}, before as {old.key}"
    if new.kind == "shared":
        return f"now the same object as {new.key} (before its own {old.text})"
    if old.kind == "shared":
        return f"now its own {new.text} (before the same object as {old.key})"
    if old.kind == "static" and new.kind == "array":
        if isinstance(old.detail, _NUMBERS):
            return (
                f"Python value {old.text} -> array {new.text} (passing an array from the "
                "start compiles once)"
            )
        return f"static value {old.text} -> array {new.text}"
    if old.kind == "array" and new.kind == "static":
        hint = f" ({_HINTS['number']})" if isinstance(new.detail, _NUMBERS) else ""
        return f"array {old.text} -> static value {new.text}{hint}"
    return f"{old.text} -> {new.text}"


def differences(old: Signature, new: Signature) -> list[str]:
    """The differences from `old` to `new`, one line each: `path: what changed`.

    Below a path added or removed, nothing more is said (a new submodule is one line).
    """
    lines: list[str] = []
    old_entries, new_entries = old.entries, new.entries
    gone: list[tuple] = []  # paths added or removed, whose insides are not listed

    def under(path: tuple) -> bool:
        return any(path[: len(p)] == p for p in gone)

    for path, entry in new_entries.items():
        if under(path):
            continue
        before = old_entries.get(path)
        if before is None:
            lines.append(f"{render(path)}: added ({entry.text})")
            gone.append(path)
        elif not _same(before, entry):
            lines.append(f"{render(path)}: {_change(before, entry)}")
            if entry.kind == "node" and before.text != entry.text:
                gone.append(path)  # another class: its insides differ as a matter of course
    for path, entry in old_entries.items():
        if path not in new_entries and not under(path):
            lines.append(f"{render(path)}: removed (was {entry.text})")
            gone.append(path)
    return lines


def _same(old: _Entry | None, new: _Entry) -> bool:
    return old is not None and old.kind == new.kind and old.key == new.key


def _distance(old: _Entry | None, new: _Entry) -> int:
    if _same(old, new):
        return 0
    if old is None or old.kind != "array" or new.kind != "array":
        return 1
    # Shape, dtype, weak type, Variable type: each one that differs counts.
    return sum(a != b for a, b in zip(old.key, new.key, strict=True))


def _count(old: Signature, new: Signature) -> int:
    """How far apart two signatures are, for choosing the closest earlier trace."""
    a, b = old.entries, new.entries
    return sum(_distance(a.get(p), e) for p, e in b.items()) + sum(1 for p in a if p not in b)


class Retrace:
    """One trace after the first, with what it can say about why it happened."""

    __slots__ = ("_lines", "earlier", "history", "number", "signature")

    def __init__(self, history: "TraceHistory", number: int, earlier: list, signature: Signature):
        self.history = history
        self.number = number
        self.earlier = earlier
        self.signature = signature
        self._lines: list[str] | None = None

    def lines(self) -> list[str]:
        """The explanation: one line per difference from the closest earlier trace."""
        if self._lines is None:
            prefix = f"{self.history.title}: retraced (trace {self.number}): "
            # The closest earlier trace (the latest of those with fewest differences).
            closest = min(
                reversed(self.earlier), key=lambda old: _count(old, self.signature), default=None
            )
            found = [] if closest is None else differences(closest, self.signature)
            if not found:
                found = [
                    "no argument changed: JAX's tracing context did (a `jax.config` option, "
                    "a context manager such as a mesh or `jax.default_device`), or its caches "
                    "were cleared (`jax.clear_caches()`)"
                ]
            elif len(found) > _SHOWN:
                found = [*found[:_SHOWN], f"... and {len(found) - _SHOWN} more differences"]
            self._lines = [prefix + line for line in found]
        return self._lines

    def message(self) -> str:
        return "\n".join(self.lines())


_current = threading.local()


class TraceHistory:
    """The traces of one transformed function: how many, and the last few signatures.

    A transform makes one per function it wraps (shared by every wrapper that shares its
    compilations) and calls `record` with each trace's `Signature`, from inside the
    function it hands to `jax.jit`, so only traces pay for it.

    Arguments:
        transform: the transform's name, as messages show it (`"pytree_graph.jit"`).
        fun: the function transformed (named in messages).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms.extend import Signature, TraceHistory
        >>> history = TraceHistory("my_jit", abs)
        >>> def signature(x):
        ...     s = Signature()
        ...     s.pytree("args[0]", x)
        ...     return s
        >>> with history.record(signature(jnp.ones(2))):
        ...     pass
        >>> with history.record(signature(jnp.ones(3))) as retrace:
        ...     print(retrace.message())
        my_jit(abs): retraced (trace 2): args[0]: shape (2,) -> (3,) (every new shape ...)
    """

    __slots__ = ("__weakref__", "count", "lock", "signatures", "title")

    def __init__(self, transform: str, fun: Any):
        name = getattr(fun, "__name__", None)
        self.title = f"{transform}({name or type(fun).__name__})"
        self.count = 0
        self.signatures: deque[Signature] = deque(maxlen=_KEPT)
        self.lock = threading.Lock()

    def record(self, signature: Signature) -> "_Tracing":
        """Record a trace; a context manager for the traced function's run.

        While the switch is on, a trace after the first logs its explanation here. Inside
        the `with` block, `current_retrace()` gives this trace's `Retrace` (None for a
        first trace), for `assert_max_traces` to add to its error.

        Returns:
            A context manager; entering it gives the `Retrace`, or None for a first trace.
        """
        with self.lock:
            self.count += 1
            number = self.count
            earlier = list(self.signatures)
            self.signatures.append(signature)
        retrace = Retrace(self, number, earlier, signature) if number > 1 else None
        if retrace is not None and _switch.on:
            logger.warning(retrace.message())
        return _Tracing(retrace)


class _Tracing:
    """Makes a trace's `Retrace` the current one while the traced function runs."""

    __slots__ = ("before", "retrace")

    def __init__(self, retrace: Retrace | None):
        self.retrace = retrace

    def __enter__(self) -> Retrace | None:
        self.before = getattr(_current, "retrace", None)
        _current.retrace = self.retrace
        return self.retrace

    def __exit__(self, *exc_info: Any) -> None:
        _current.retrace = self.before


def current_retrace() -> Retrace | None:
    """The retrace being traced now, innermost first (None during a first trace, or
    outside any recorded trace)."""
    return getattr(_current, "retrace", None)
