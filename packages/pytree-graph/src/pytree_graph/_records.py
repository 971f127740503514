"""Records: the nodes of a `GraphDef`, one named tuple per kind, each beginning with its tag.

A graph's structure is a tree of records (`GraphDef.root` is the top one). They are
plain tuples underneath, so they hash and compare exactly as tuples of the same items
(a `GraphDef`'s equality and hash, and every cache keyed by one, rely on that), and code
that handles them dispatches on `record.tag` (a small int) before reading named fields.
"""

from typing import Any, NamedTuple

from ._static import Static

# Record tags, one per record kind below.
MODULE = 0
OBJECT = 1
SHARED = 2
VARIABLE = 3
LEAF = 4
STATIC = 5
LIST = 6
TUPLE = 7
DICT = 8
PYTREE = 9


class ModuleRecord(NamedTuple):
    """A pytree Module, rebuilt by its treedef `entry` from its children's records."""

    tag: int  # MODULE
    entry: Any  # pytree_module's treedef entry (`TreedefEntry`)
    index: int  # the object's index in the graph
    children: tuple  # the records of its data attributes, in the entry's order
    early: bool  # made before its children (a cycle comes back to it)


class ObjectRecord(NamedTuple):
    """A `pytree=False` Module: its class and attributes, by name."""

    tag: int  # OBJECT
    cls: type
    index: int
    attributes: tuple  # ((name, record), ...), by name


class SharedRecord(NamedTuple):
    """An object met before on another path (or on a cycle)."""

    tag: int  # SHARED
    index: int


class VariableRecord(NamedTuple):
    """A Variable: its type and metadata (`kind`); its value is leaf `position`."""

    tag: int  # VARIABLE
    kind: Any  # the Variable's interned type and metadata
    index: int
    position: int


class LeafRecord(NamedTuple):
    """An array: leaf `position` of the state."""

    tag: int  # LEAF
    position: int


class StaticRecord(NamedTuple):
    """Any other value, kept in the structure as it is (see `_static`)."""

    tag: int  # STATIC
    static: Static


class ListRecord(NamedTuple):
    """A list, or a `pytree_module.List` (`cls`, rebuilt as such).

    A `List` is an object of the graph (`index`, so one held twice is one again after
    `merge`, as Flax NNX's `nnx.List`); a plain list is copied by value (`index` -1).
    """

    tag: int  # LIST
    children: tuple
    cls: type
    index: int = -1


class TupleRecord(NamedTuple):
    tag: int  # TUPLE
    children: tuple


class DictRecord(NamedTuple):
    """A dict, or a `pytree_module.Dict` (`cls`, rebuilt as such); `index` as a
    `ListRecord`'s."""

    tag: int  # DICT
    keys: tuple
    children: tuple
    cls: type
    index: int = -1


class PytreeRecord(NamedTuple):
    """Any other registered pytree node, rebuilt by its (one-level) `treedef`."""

    tag: int  # PYTREE
    treedef: Any
    children: tuple


NONE_RECORD = StaticRecord(STATIC, Static(None))

_CONTAINER_NAMES = {TUPLE: "tuple", STATIC: "static value"}


def describe(record: Any) -> str:
    """A short name for what `record` describes (for a `GraphDef`'s repr)."""
    tag = record.tag
    if tag == MODULE:
        return record.entry.layout.cls.__name__
    if tag == OBJECT:
        return record.cls.__name__
    if tag == PYTREE:
        return f"pytree {record.treedef}"
    if tag in (LIST, DICT):
        return record.cls.__name__
    return _CONTAINER_NAMES.get(tag, "Variable")
