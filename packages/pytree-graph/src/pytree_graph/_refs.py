"""`deref` and `reref`: shared Variables across any JAX transform, for any pytree."""

from typing import Any

import jax

from ._variables import Variable, _Kind, is_variable


def _metadata_entry(reference: Any, name: str) -> Any:
    # A Variable's metadata reads as attributes (`x.collection`); so it does on what `deref`
    # leaves in its place, for predicates written for either (refx's `by_collection`).
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return reference.kind.metadata[name]
    except KeyError:
        raise AttributeError(
            f"{type(reference).__name__} of a {reference.kind.cls.__name__} has no attribute "
            f"or metadata {name!r}."
        ) from None


class VariableValue:
    """What `deref` puts where a Variable was first met: its value, and in the treedef its
    type, metadata and index. A pytree whose only leaf is the value.

    Attributes:
        value: the Variable's value (a leaf).
        type: the Variable's type (`Param`, ...), for predicates that partition by it.
            The Variable's metadata reads as attributes too (`x.collection`).
        index: the number `VariableIndex`es of the same Variable point at.
    """

    __slots__ = ("index", "kind", "value")

    def __init__(self, value: Any, kind: _Kind, index: int):
        self.value = value
        self.kind = kind
        self.index = index

    @property
    def type(self) -> type:
        return self.kind.cls

    def __getattr__(self, name: str) -> Any:
        return _metadata_entry(self, name)

    def __repr__(self) -> str:
        return f"VariableValue({self.kind.cls.__name__}, index={self.index}, value={self.value!r})"


class VariableIndex:
    """What `deref` puts where an already-met Variable appears again: a pytree with no
    leaves, pointing at the `VariableValue` of the same index.

    Attributes:
        type: the Variable's type, as `VariableValue.type`.
        index: the index of the `VariableValue` it stands for.
    """

    __slots__ = ("index", "kind")

    def __init__(self, index: int, kind: _Kind):
        self.index = index
        self.kind = kind

    @property
    def type(self) -> type:
        return self.kind.cls

    def __getattr__(self, name: str) -> Any:
        return _metadata_entry(self, name)

    def __repr__(self) -> str:
        return f"VariableIndex({self.kind.cls.__name__}, index={self.index})"


jax.tree_util.register_pytree_with_keys(
    VariableValue,
    lambda v: (((jax.tree_util.GetAttrKey("value"), v.value),), (v.kind, v.index)),
    lambda aux, children: VariableValue(children[0], *aux),
    lambda v: ((v.value,), (v.kind, v.index)),
)
jax.tree_util.register_pytree_node(
    VariableIndex, lambda v: ((), (v.index, v.kind)), lambda aux, _: VariableIndex(*aux)
)


def _is_ref_leaf(x: Any) -> bool:
    return isinstance(x, Variable | VariableValue | VariableIndex)


def deref(tree: Any) -> Any:
    """Replace the Variables of a pytree by plain values, keeping track of sharing.

    The first time a Variable is met it becomes a `VariableValue` (its value, a leaf,
    with its type and metadata in the treedef); later places holding the same Variable
    become a `VariableIndex`, which has no leaves. The result is an ordinary pytree: pass
    it through any JAX transform, then `reref` it to get Variables back, shared as before.

    Arguments:
        tree: any pytree (Modules included) holding Variables.

    Returns:
        The same structure with the Variables replaced.

    Examples:
        >>> import jax
        >>> from pytree_graph import Variable, deref, reref
        >>> shared = Variable(1.0)
        >>> tree = {"a": [shared, shared], "b": Variable(2.0)}
        >>> @jax.jit
        ... def double(tree):
        ...     tree = reref(tree)
        ...     tree["a"][0].value = tree["a"][0].value * 2  # also tree["a"][1]
        ...     return deref(tree)
        >>> out = reref(double(deref(tree)))
        >>> out["a"][0] is out["a"][1], float(out["a"][1].value)
        (True, 2.0)
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_variable)
    index: dict[int, int] = {}
    keep: list[Variable] = []  # holds the Variables, so ids stay unique meanwhile
    out = []
    for leaf in leaves:
        if isinstance(leaf, Variable):
            found = index.get(id(leaf))
            if found is None:
                found = index[id(leaf)] = len(keep)
                keep.append(leaf)
                children, kind = leaf._pg_flat
                leaf = VariableValue(children[0], kind, found)
            else:
                leaf = VariableIndex(found, leaf._pg_flat[1])
        out.append(leaf)
    return treedef.unflatten(out)


def reref(tree: Any) -> Any:
    """Turn a `deref`'d pytree back into one holding Variables, shared as they were.

    The Variables are new (created in the current JAX trace, so they may be written to
    there).

    Arguments:
        tree: a pytree from `deref` (possibly transformed: its values may be tracers).

    Returns:
        The same structure, each `VariableValue`/`VariableIndex` replaced by a Variable.

    Examples:
        >>> from pytree_graph import Param, deref, reref
        >>> type(reref(deref([Param(1.0)]))[0]).__name__
        'Param'
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_ref_leaf)
    made: dict[int, Variable] = {}
    out = []
    for leaf in leaves:
        if isinstance(leaf, VariableValue):
            made[leaf.index] = variable = leaf.kind.build(leaf.value)
            leaf = variable
        elif isinstance(leaf, VariableIndex):
            try:
                leaf = made[leaf.index]
            except KeyError:
                raise ValueError(
                    f"reref: VariableIndex({leaf.index}) comes before the VariableValue it "
                    "points to. Pass the whole tree `deref` returned, unchanged in structure."
                ) from None
        out.append(leaf)
    return treedef.unflatten(out)


def update_refs(target: Any, source: Any, *, where: str = "update_refs") -> None:
    """Write the values of `source` into the Variables of `target`, place by place.

    `source` has `target`'s structure, with a Variable, a `VariableValue`, a
    `VariableIndex` (skipped: the shared Variable is written where its value is) or a
    bare value in each Variable's place. `target` is any pytree holding Variables: a model,
    or a partition of one (`get_partition`), whose `NOTHING` places hold no values. Every
    place is checked before any Variable is written.

    Arguments:
        target: a pytree holding the Variables to write.
        source: a pytree of the same structure holding the new values.
        where: the name errors give the caller (internal callers pass theirs).

    Raises:
        ValueError: `source` does not have `target`'s structure (nothing is written).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, deref, update_refs
        >>> shared = Param(jnp.ones(2))
        >>> tree = {"a": [shared, shared], "b": 3}
        >>> doubled = jax.tree.map(lambda x: 2 * x, deref(tree))
        >>> update_refs(tree, doubled)
        >>> shared.value
        Array([2., 2.], dtype=float32)
    """
    targets, target_def = jax.tree_util.tree_flatten(target, is_leaf=is_variable)
    sources, source_def = jax.tree_util.tree_flatten(source, is_leaf=_is_ref_leaf)
    if len(targets) != len(sources):
        raise ValueError(
            f"{where}: the source has {len(sources)} places for values but the target has "
            f"{len(targets)}. Pass a source with the target's structure (from `deref(target)` "
            f"or a matching partition).\n  target: {target_def}\n  source: {source_def}"
        )
    writes = []
    for variable, value in zip(targets, sources, strict=True):
        if not isinstance(variable, Variable) or isinstance(value, VariableIndex):
            continue
        writes.append(
            (variable, value.value if isinstance(value, Variable | VariableValue) else value)
        )
    for variable, value in writes:
        variable.value = value
