"""Layouts: which attributes of a Module are leaves and which live in the treedef.

A `Layout` is interned per (class, attribute names, statuses) and carries generated code
to read an instance's leaves and to rebuild an instance without running `__init__`.

The treedef entry of a Module (JAX's "aux data") is a *builder*: a function, interned per
(layout, static values), that rebuilds the Module from its leaves, with the static values
held in its closure. Equal structures share one builder, so the two operations JAX performs
on every `jax.jit` call and every unflatten are as cheap as they can be: hashing and
comparing the entry is by identity, in C, and unflattening calls the entry directly
(`operator.call(entry, children)`).

Because equality is identity, two threads must never intern two layouts or entries for
one structure: lookups are lock-free, and after a miss the new object is stored under a
lock, unless another thread stored one first.
"""

import copy
import itertools
import linecache
import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from jax.tree_util import GetAttrKey

from ._static_key import static_key
from ._trace import current_trace_token, trace_state


class TreedefEntry(Protocol):
    """A Module's treedef entry (JAX's "aux data"): the builder of instances of one structure.

    Calling it with the leaves rebuilds an instance without running `__init__`. It is
    interned per layout and static values, so equal structures share one entry and JAX
    compares entries by identity.
    """

    layout: "Layout"
    """The structure: class, data attribute names, static attribute names."""
    statics: tuple[Any, ...]
    """The static attributes' values, in the order of `layout.static_keys`."""
    get_data: Callable[[dict[str, Any]], tuple[Any, ...]]
    """Reads the data attributes' values, in the order of `layout.data_keys`, from a `__dict__`."""

    def __call__(self, children: Sequence[Any]) -> Any: ...


class SlotSetters(NamedTuple):
    """Setters of the Module slots that rebuilt instances fill in."""

    flat: Callable[[Any, tuple[Sequence[Any], TreedefEntry]], None]
    trace: Callable[[Any, Any], None]


class Layout:
    """The interned structure of Module instances (compares by identity)."""

    __slots__ = (
        "_entries",
        "_make_entry",
        "_set_flat",
        "cls",
        "data_keys",
        "get_data",
        "key_entries",
        "static_keys",
        "unhashable",
    )

    def __init__(
        self,
        cls: type,
        order: Sequence[str],
        data_keys: tuple[str, ...],
        static_keys: tuple[str, ...],
        unhashable: tuple[bool, ...],
        setters: "SlotSetters",
    ):
        self.cls = cls
        self.data_keys = data_keys
        self.static_keys = static_keys
        self.unhashable = unhashable
        self.key_entries = tuple(GetAttrKey(k) for k in data_keys)
        self.get_data = _make_getter(data_keys)
        self._set_flat = setters.flat
        self._make_entry = _make_entry_factory(self, order, setters)
        self._entries: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def entry(self, values: dict[str, Any]) -> TreedefEntry:
        """The interned treedef entry for an instance whose `__dict__` is `values`.

        Static values are immutable: a Module freezes its static lists, dicts and sets
        when they are assigned, so entries and rebuilt modules share them. An unhashable
        static value that was not frozen (a subclass of list, dict or set) is copied into
        the entry, and again on each rebuild, so rebuilt modules never alias it.
        """
        statics = tuple(
            copy.copy(values[k]) if unhashable else values[k]
            for k, unhashable in zip(self.static_keys, self.unhashable, strict=True)
        )
        # Keyed by type and bits, not `==` (see _static_key.py): rebuilding must give back
        # the very value that was stored, and JAX must not share a compilation between
        # `0.0` and `-0.0`.
        key = tuple(map(static_key, statics))
        found = self._entries.get(key)
        if found is None:
            # Made outside the lock: naming it runs the static values' `__repr__`.
            shown = ", ".join(f"{k}={v!r}" for k, v in zip(self.static_keys, statics, strict=True))
            made = self._make_entry(statics, f"{self.cls.__name__}({shown})")
            with _INTERNING:
                found = self._entries.get(key)
                if found is None:
                    self._entries[key] = found = made
        return found

    def rebuild_into(self, module: Any, children: Sequence[Any], entry: TreedefEntry) -> None:
        """Give `module`, an existing instance of `self.cls`, the attributes `entry` would.

        Its attributes are replaced by the data `children` and the entry's static values
        (unhashable ones copied, as a rebuild by the entry copies them), and its flattened
        form becomes `(children, entry)`. `entry` must be one of this layout's entries.
        This is the generated builder's work, done on an object that already exists: an
        object graph with cycles needs its objects before their children are built.
        """
        children = tuple(children)
        attributes = module.__dict__
        attributes.clear()
        attributes.update(zip(self.data_keys, children, strict=True))
        for key, value, unhashable in zip(
            self.static_keys, entry.statics, self.unhashable, strict=True
        ):
            attributes[key] = copy.copy(value) if unhashable else value
        self._set_flat(module, (children, entry))

    def __repr__(self) -> str:
        return f"Layout({self.cls.__qualname__}, data={self.data_keys}, static={self.static_keys})"


def _make_getter(keys: tuple[str, ...]) -> Callable[[dict], tuple]:
    if len(keys) >= 2:
        return operator.itemgetter(*keys)
    if len(keys) == 1:
        (key,) = keys
        return lambda d: (d[key],)
    return lambda d: ()


def _make_entry_factory(
    layout: Layout, order: Sequence[str], setters: SlotSetters
) -> Callable[[tuple, str], TreedefEntry]:
    """Generate `make_entry(statics, name)`, which makes a treedef entry of `layout`.

    Code is generated once per layout; each set of static values only makes a closure.
    Straight-line code storing each attribute by name is about twice as fast as a generic
    loop, and unflattening is on the hot path of every transform's outputs. The current
    trace is recorded for the trace-level guard.

    The generated source is the whole definition of an entry, the attributes that
    `TreedefEntry` declares included, so the source that a traceback through a rebuild
    shows (see the `linecache` entry below) is all there is to read.
    """
    cls = layout.cls
    data_index = {k: i for i, k in enumerate(layout.data_keys)}
    static_index = {k: i for i, k in enumerate(layout.static_keys)}
    lines = ["def make_entry(statics, name):"]
    if static_index:
        names = ", ".join(f"s{i}" for i in range(len(static_index)))
        lines.append(f"    ({names},) = statics")
    lines += ["    def build(children):", "        obj = new(cls)", "        d = obj.__dict__"]
    for key in order:
        if key in data_index:
            value = f"children[{data_index[key]}]"
        else:
            i = static_index[key]
            value = f"copy(s{i})" if layout.unhashable[i] else f"s{i}"
        lines.append(f"        d[{key!r}] = {value}")
    token = "trace_state.value" if trace_state is not None else "token()"
    lines += [
        "        set_flat(obj, (children, build))",
        f"        set_trace(obj, {token})",
        "        return obj",
        "    build.layout = layout",
        "    build.statics = statics",
        "    build.get_data = layout.get_data",
        "    build.__name__ = build.__qualname__ = name",
        "    return build",
    ]
    namespace = {
        "new": object.__new__,
        "copy": copy.copy,
        "cls": cls,
        "layout": layout,
        "set_flat": setters.flat,
        "set_trace": setters.trace,
        "token": current_trace_token,
        "trace_state": trace_state,
    }
    # The generated source is built from attribute names only (see the lines above). It is
    # compiled under a name that says what it is, and registered with `linecache`, so a
    # traceback through a rebuild shows the generated line instead of `<string>`.
    source = "\n".join(lines) + "\n"
    filename = f"<pytree_module {cls.__module__}.{cls.__qualname__} builder #{next(_BUILDERS)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace["make_entry"]


# Numbers the generated builders' file names, which must be unique for `linecache`.
_BUILDERS = itertools.count()


_LAYOUTS: dict[tuple, Layout] = {}
# Held only to store a new layout or treedef entry (see the module docstring).
_INTERNING = threading.Lock()


def get_layout(
    cls: type,
    order: Sequence[str],
    data: Sequence[bool],
    unhashable: Sequence[bool],
    setters: "SlotSetters",
) -> Layout:
    """Return the interned layout for attributes `order` with these statuses."""
    key = (cls, tuple(order), tuple(data), tuple(unhashable))
    layout = _LAYOUTS.get(key)
    if layout is None:
        data_keys = tuple(k for k, d in zip(order, data, strict=True) if d)
        static_keys = tuple(k for k, d in zip(order, data, strict=True) if not d)
        static_unhashable = tuple(u for u, d in zip(unhashable, data, strict=True) if not d)
        made = Layout(cls, order, data_keys, static_keys, static_unhashable, setters)
        with _INTERNING:
            layout = _LAYOUTS.setdefault(key, made)
    return layout
