"""Layouts: which attributes of a Module are leaves and which live in the treedef.

A `Layout` is interned per (class, attribute names, statuses) and carries generated code
to read an instance's leaves and to rebuild an instance without running `__init__`.

The treedef entry of a Module (JAX's "aux data") is a `TreedefEntry`: a `functools.partial`
of the layout's builder over the static values, interned per (layout, static values). So
equal structures share one entry object, and the two operations JAX performs on every
`jax.jit` call and every unflatten stay in C: hashing and comparing the entry is by
identity, and unflattening calls the entry (`operator.call(entry, children)`).
"""

import copy
import functools
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from jax.tree_util import GetAttrKey

from ._status import freeze
from ._trace import current_trace_token, trace_state


class TreedefEntry(functools.partial):
    """A Module's entry in its treedef; calling it with the leaves rebuilds the Module."""

    __slots__ = ("get_data", "layout", "statics")

    def __repr__(self) -> str:
        layout = self.layout
        shown = ", ".join(
            f"{k}={v!r}" for k, v in zip(layout.static_keys, self.statics, strict=True)
        )
        return f"{layout.cls.__name__}({shown})" if shown else layout.cls.__name__


class Layout:
    """The interned structure of Module instances (compares by identity)."""

    __slots__ = (
        "_entries",
        "build",
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
        set_entry: Callable[[Any, Any], None],
        set_trace: Callable[[Any, Any], None],
    ):
        self.cls = cls
        self.data_keys = data_keys
        self.static_keys = static_keys
        self.unhashable = unhashable
        self.key_entries = tuple(GetAttrKey(k) for k in data_keys)
        self.get_data = _make_getter(data_keys)
        self.build = _make_builder(
            cls, order, data_keys, static_keys, unhashable, set_entry, set_trace
        )
        self._entries: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def entry(self, values: dict[str, Any]) -> TreedefEntry:
        """The interned treedef entry for an instance whose `__dict__` is `values`.

        Static lists, dicts and sets are copied into the entry (and copied again on each
        rebuild), so rebuilt modules never alias them. Static values count as immutable:
        reassign them to change them; an in-place change is not seen by JAX.
        """
        statics = tuple(
            copy.copy(values[k]) if unhashable else values[k]
            for k, unhashable in zip(self.static_keys, self.unhashable, strict=True)
        )
        # Types are part of the key: 1 == 1.0 == True, but rebuilding must give back
        # the very value that was stored.
        key = tuple((type(v), freeze(v)) for v in statics)
        found = self._entries.get(key)
        if found is None:
            box: list[Any] = [None, statics]
            found = TreedefEntry(self.build, box)
            found.layout = self
            found.statics = statics
            found.get_data = self.get_data
            box[0] = found
            self._entries[key] = found
        return found

    def __repr__(self) -> str:
        return f"Layout({self.cls.__qualname__}, data={self.data_keys}, static={self.static_keys})"


def _make_getter(keys: tuple[str, ...]) -> Callable[[dict], tuple]:
    if len(keys) >= 2:
        return operator.itemgetter(*keys)
    if len(keys) == 1:
        (key,) = keys
        return lambda d: (d[key],)
    return lambda d: ()


def _make_builder(
    cls: type,
    order: Sequence[str],
    data_keys: tuple[str, ...],
    static_keys: tuple[str, ...],
    unhashable: tuple[bool, ...],
    set_entry: Callable[[Any, Any], None],
    set_trace: Callable[[Any, Any], None],
) -> Callable[[list, Sequence[Any]], Any]:
    """Generate `build(box, children)`, making an instance without running `__init__`.

    `box` is `[treedef entry, static values]`. Straight-line code storing each attribute
    by name is about twice as fast as a generic loop; unflattening is on the hot path of
    every transform's outputs. The current trace is recorded for the trace-level guard.
    """
    data_index = {k: i for i, k in enumerate(data_keys)}
    static_index = {k: i for i, k in enumerate(static_keys)}
    lines = ["def build(box, children):", "    obj = new(cls)", "    d = obj.__dict__"]
    if static_keys:
        lines.append("    statics = box[1]")
    for key in order:
        if key in data_index:
            lines.append(f"    d[{key!r}] = children[{data_index[key]}]")
        else:
            i = static_index[key]
            value = f"statics[{i}]"
            lines.append(f"    d[{key!r}] = {f'copy({value})' if unhashable[i] else value}")
    token = "trace_state.value" if trace_state is not None else "token()"
    lines += ["    set_entry(obj, box[0])", f"    set_trace(obj, {token})", "    return obj"]
    namespace = {
        "new": object.__new__,
        "copy": copy.copy,
        "cls": cls,
        "set_entry": set_entry,
        "set_trace": set_trace,
        "token": current_trace_token,
        "trace_state": trace_state,
    }
    exec("\n".join(lines), namespace)
    return namespace["build"]


_LAYOUTS: dict[tuple, Layout] = {}


def get_layout(
    cls: type,
    order: Sequence[str],
    data: Sequence[bool],
    unhashable: Sequence[bool],
    set_entry: Callable[[Any, Any], None],
    set_trace: Callable[[Any, Any], None],
) -> Layout:
    """Return the interned layout for attributes `order` with these statuses."""
    key = (cls, tuple(order), tuple(data), tuple(unhashable))
    layout = _LAYOUTS.get(key)
    if layout is None:
        data_keys = tuple(k for k, d in zip(order, data, strict=True) if d)
        static_keys = tuple(k for k, d in zip(order, data, strict=True) if not d)
        static_unhashable = tuple(u for u, d in zip(unhashable, data, strict=True) if not d)
        layout = Layout(cls, order, data_keys, static_keys, static_unhashable, set_entry, set_trace)
        _LAYOUTS[key] = layout
    return layout
