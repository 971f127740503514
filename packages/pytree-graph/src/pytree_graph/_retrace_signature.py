"""What a trace of a graph jit depends on, by argument path: the `Signature` (from
`pytree_transforms.extend`) of a lifted call, for explaining retraces.

A graph jit's compilations are keyed by the call's `GraphDef` (classes, static attributes,
Variable types and metadata, what is shared, the lists' lengths) and the abstract values of
its Variables and arrays. Both are walked here, while tracing, into one entry per path,
named as the caller wrote it (`args[0].layers[1].kernel`); an object reached twice is
described at its first path and named there from the others.
"""

from typing import Any

from jax.tree_util import DictKey

from pytree_transforms.extend import Signature

from ._graphdef import GraphDef
from ._records import DICT, LEAF, LIST, MODULE, OBJECT, PYTREE, SHARED, STATIC, TUPLE, VARIABLE


def static_signature(static_args: Any, statics: tuple | None) -> Signature:
    """A signature holding a call's static arguments (`StaticArguments.split`'s statics),
    at their paths: the graph walked after it holds `None` in their places."""
    signature = Signature()
    if statics is not None:
        values, named = statics
        for position, value in zip(static_args.positions, values, strict=False):
            signature.static((f"args[{position}]",), value, declared=True)
        for name, value in named:
            signature.static((f"kwargs[{name!r}]",), value, declared=True)
    return signature


def graph_signature(
    graphdef: GraphDef, values: list[Any], lift_fun: bool, signature: Signature | None = None
) -> Signature:
    """The signature of a lifted call (`graphdef` and its values in leaf order).

    Arguments:
        graphdef: the call's structure, whose root is `(fun, args, kwargs)` where the
            function is lifted too (`lift_fun`), else `(args, kwargs)`.
        values: the leaves' values (tracers), in the graphdef's leaf order.
        lift_fun: whether the function is part of the tree.
        signature: a signature to add to (one started for other arguments), or None.
    """
    signature = Signature() if signature is None else signature
    walk = _Walk(signature, values)
    *fun_part, args, kwargs = graphdef.root.children
    if fun_part:
        walk.visit(fun_part[0], ("fun",))
    for i, record in enumerate(args.children):
        walk.visit(record, (f"args[{i}]",))
    for name, record in zip(kwargs.keys, kwargs.children, strict=True):
        walk.visit(record, (f"kwargs[{name!r}]",))
    return signature


class _Walk:
    __slots__ = ("first", "signature", "values")

    def __init__(self, signature: Signature, values: list[Any]):
        self.signature = signature
        self.values = values
        self.first: dict[int, tuple] = {}  # each object's first path, by graph index

    def visit(self, record: Any, path: tuple) -> None:
        signature, tag = self.signature, record.tag
        if tag == VARIABLE:
            self.first[record.index] = path
            kind = record.kind
            signature.array(path, self.values[record.position], kind, kind.cls.__name__)
        elif tag == LEAF:
            signature.array(path, self.values[record.position])
        elif tag == STATIC:
            signature.static(path, record.static.value)
        elif tag == SHARED:
            first = self.first.get(record.index)
            if first is not None:
                signature.shared(path, first)
        elif tag == MODULE:
            self.first[record.index] = path
            layout = record.entry.layout
            signature.node(path, layout.cls.__name__, layout.cls)
            for name, value in zip(layout.static_keys, record.entry.statics, strict=True):
                signature.static((*path, name), value, declared=True)
            for name, child in zip(layout.data_keys, record.children, strict=True):
                self.visit(child, (*path, name))
        elif tag == OBJECT:
            self.first[record.index] = path
            signature.node(path, record.cls.__name__, record.cls)
            for name, child in record.attributes:
                self.visit(child, (*path, name))
        elif tag in (LIST, TUPLE):
            cls = tuple if tag == TUPLE else record.cls
            if tag == LIST and record.index >= 0:
                self.first[record.index] = path
            signature.node(path, cls.__name__, cls)
            for i, child in enumerate(record.children):
                self.visit(child, (*path, i))
        elif tag == DICT:
            if record.index >= 0:
                self.first[record.index] = path
            signature.node(path, record.cls.__name__, record.cls)
            for key, child in zip(record.keys, record.children, strict=True):
                self.visit(child, (*path, DictKey(key)))
        elif tag == PYTREE:
            node_type = record.treedef.node_data()
            name = node_type[0].__name__ if node_type is not None else "pytree"
            signature.node(path, name, record.treedef)
            for i, child in enumerate(record.children):
                self.visit(child, (*path, i))
