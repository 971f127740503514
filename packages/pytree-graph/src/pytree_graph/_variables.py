"""Variables: mutable, shareable cells holding one value and its metadata."""

import itertools
import operator
from collections.abc import Callable, Iterator, Mapping
from types import GenericAlias, MappingProxyType
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.tree_util import GetAttrKey

from pytree_module import Module, TraceContextError, register_data_type

# The trace token helpers are shared with pytree_module's own guard, so Modules and
# Variables agree on what "the same trace" means.
from pytree_module.extend import (
    constructor_pdoc,
    current_trace_token,
    register_tree_at_rule,
    same_trace,
    touch,
)

from . import _array_refs
from ._array_refs import PLAIN_TYPES, RefCell
from ._array_refs import defaults as _defaults
from ._array_refs import defaults_set as _defaults_set
from ._axis_rules import to_mesh_axes
from ._static import static_key


class _Kind:
    """A Variable's type and metadata: the treedef entry of every Variable that has them.

    Interned per (type, metadata), so treedefs compare kinds by identity; called with the
    children of an unflatten, it builds a new Variable.
    """

    __slots__ = ("cls", "items", "metadata")

    def __init__(self, cls: type, items: tuple[tuple[str, Any], ...]):
        self.cls = cls
        self.items = items
        self.metadata = MappingProxyType(dict(items))

    def __call__(self, children: Any) -> "Variable":
        variable = object.__new__(self.cls)
        _set_flat(variable, (list(children), self))
        _set_trace(variable, current_trace_token())
        return variable

    def cell(self, value: Any) -> list[Any]:
        """A new value list holding `value`, as a Variable of this kind stores it."""
        return [value]

    def build(self, value: Any) -> "Variable":
        """A new Variable of this kind holding `value` (in new refs, if array-backed)."""
        variable = object.__new__(self.cls)
        _set_flat(variable, (self.cell(value), self))
        _set_trace(variable, current_trace_token())
        return variable

    def rewrite(self, variable: "Variable", value: Any) -> None:
        """Give an existing Variable this kind and `value` (a merge into it)."""
        _set_flat(variable, ([value], self))

    def __repr__(self) -> str:
        return f"{self.cls.__name__}{dict(self.items)}"


class _ArrayBackedKind(_Kind):
    """The kind of an array-backed Variable (`ref=True` or `hijax=True` in its metadata):
    built outside JAX transforms, its value is put in new refs and its value list is a
    `RefCell`; built inside one, it holds the traced value in a plain list. (JAX's
    unflattening, `__call__`, keeps the leaves it is given, the refs passed into a
    `jax.jit` included, in a `RefCell`.)"""

    __slots__ = ()

    def __call__(self, children: Any) -> "Variable":
        variable = object.__new__(self.cls)
        _set_flat(variable, (RefCell(children), self))
        _set_trace(variable, current_trace_token())
        return variable

    def cell(self, value: Any) -> list[Any]:
        # Inside a transform the Variable holds the value as it is, in a plain list (a
        # graph transform passes values in and writes them back into the refs outside;
        # refs made here would be local to the trace, and could not be returned from
        # `jax.jit`).
        if isinstance(value, jax.core.Tracer) or not _array_refs.is_top_level():
            return [value]
        if _array_refs.holds_ref(value):
            return RefCell([value])
        return RefCell([_array_refs.to_refs(value)])

    def rewrite(self, variable: "Variable", value: Any) -> None:
        cell = variable._pg_flat[0]
        if type(cell) is RefCell and variable._pg_flat[1] is self:
            cell[0] = value  # into the refs it has: their holders see the new value
        else:
            _set_flat(variable, (self.cell(value), self))


_kinds: dict[tuple[type, Any], _Kind] = {}
_MISSING: Any = object()

# Flax NNX 0.12 keeps a Variable's mesh axes under `out_sharding` (earlier `sharding_names`,
# which it still reads); here they are `sharding` (what `get_partition_spec`,
# `with_partitioning` and the layers' `*_sharding=` use). The NNX names are read and written
# as other names for the same entry, so code written for either library finds the axes and
# no Variable ever holds two of them.
_SHARDING_ALIASES = frozenset({"out_sharding", "sharding_names"})
# The metadata entries saying a Variable is array-backed (see `Variable`).
_FLAGS = ("ref", "hijax")


def _entry_name(name: Any) -> Any:
    """The name a metadata entry is kept under (`out_sharding` is kept as `sharding`)."""
    return "sharding" if name in _SHARDING_ALIASES else name


def canonical_metadata(owner: str, metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """`metadata` with an `out_sharding` (or `sharding_names`) entry renamed `sharding`;
    two of them given, with different values, is an error."""
    aliases = [name for name in metadata if name in _SHARDING_ALIASES]
    if not aliases:
        return metadata
    given = [name for name in ("sharding", *sorted(aliases)) if name in metadata]
    first = metadata[given[0]]
    for name in given[1:]:
        if static_key(metadata[name]) != static_key(first):
            raise ValueError(
                f"{owner} got {given[0]}={first!r} and {name}={metadata[name]!r}: two names "
                "(out_sharding and sharding_names are Flax NNX's) for the one entry kept as "
                "`sharding`. Give one of them."
            )
    renamed = {name: value for name, value in metadata.items() if name not in _SHARDING_ALIASES}
    renamed["sharding"] = first
    return renamed


# Flax NNX's Variable hooks (deprecated there). Kept as metadata they would be silently
# ignored; a subclass overriding `get_value`/`set_value` does the same job, and plain
# Variables keep their direct reads.
_HOOKS = frozenset(
    {"on_get_value", "on_set_value", "on_create_value", "on_add_axis", "on_remove_axis"}
)


def _hooks_message(cls: type, hooks: list[str]) -> str:
    name = cls.__name__
    return (
        f"{name} got the Variable hook(s) {hooks} (Flax NNX's metadata hooks, deprecated "
        "there), which are not supported: they would be kept as plain metadata and never "
        f"called. Subclass instead: `class My{name}({name})` overriding `get_value` "
        "(on_get_value) or `set_value` (on_set_value), each calling `super()`; for "
        "on_create_value, transform the value before making the Variable."
    )


def _kind(cls: type, metadata: Mapping[str, Any]) -> _Kind:
    items = tuple(sorted(metadata.items()))
    try:
        hash(items)
    except TypeError:
        for name, value in items:
            try:
                hash(value)
            except TypeError:
                raise TypeError(
                    f"{cls.__name__} metadata {name!r} must be hashable (it is part of the "
                    f"pytree structure), but {type(value).__name__} is not. Use a tuple "
                    "instead of a list, or a frozen value."
                ) from None
        raise
    # Keyed by type as well as value: `tag=1`, `tag=1.0` and `tag=True` are three kinds.
    key = (cls, static_key(items))
    kind = _kinds.get(key)
    if kind is None:
        hooks = _HOOKS.intersection(metadata)
        if hooks:
            raise TypeError(_hooks_message(cls, sorted(hooks)))
        array_backed = metadata.get("ref") is True or metadata.get("hijax") is True
        kind = _kinds[key] = (_ArrayBackedKind if array_backed else _Kind)(cls, items)
    return kind


class ValueWrites:
    """The stamp of the last write of any existing Variable's value.

    `jit_partial` keeps the values it wrote into its bound Variables, and passes them to
    the next call as they are, without reading 200 Variables again, while the stamp is
    the one its own write left; it keeps the value lists it wrote into as well (see
    `_register`), which are replaced only by writes that draw a stamp (`__init__` or
    `__setstate__` run again, a merge into existing objects). So every write of a value
    into an existing Variable must end with `wrote_values()`: `set_value`, and each of
    pytree_graph's writes back. (A change of metadata needs none: it bumps
    `pytree_module.extend.mutations`, which makes `jit_partial` walk its objects again.)
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0


value_writes = ValueWrites()
# Each write draws the next number (in C, so two threads never draw the same one; not
# `last += 1`, a read and a write that two threads could interleave, losing one) and
# stores it: the stamp changes whatever the interleaving, and a writer that drew
# `taken + 1` knows that nobody wrote since it read `taken`.
_stamps = itertools.count(1)


def wrote_values() -> int:
    """Record that Variable values were just written; return the new stamp."""
    stamp = value_writes.last = next(_stamps)
    return stamp


def _guard(variable: "Variable", what: str) -> None:
    if not same_trace(variable._pg_trace):
        kind = type(variable).__name__
        raise TraceContextError(
            f"Cannot mutate {kind} from a different trace level (Flax NNX's words). "
            f"Cannot {what} of a {kind} created outside the current JAX "
            "transform (it was captured, not passed in): the new value would leak a tracer "
            "out of the transform. Pass the Variable (or the object holding it) into the "
            "transformed function as an argument, use the graph transforms of pytree_graph "
            "(which write updates back), or return the new value and assign it outside."
        )


class Variable:
    """A mutable, shareable cell holding one value (usually an array) and its metadata.

    Modules hold their state in Variables: `self.kernel = Param(w)`. A Variable can be
    referenced from several places (weight tying); the graph functions (`split`, `merge`)
    and transforms keep such sharing. Read and write the value with `.value`. Indexing
    reads and writes into the array: `v[...]` is the whole array, `v[0]` an element, and
    `v[...] = x` or `v[1:] = x` write into it (`value.at[index].set(x)`: shape and dtype
    are kept, `x` broadcast; a NumPy array is copied, not changed in place; a Python
    number supports `v[...]` and `v[...] = x`, which replaces it). Arithmetic, `@` and
    ordering comparisons apply to the value, so `x @ kernel` works. `==` and `hash` are
    by identity, as for Modules: compare values with `v.value == other`.

    A Variable is a pytree node whose only child is its value; its type and metadata live
    in the treedef. Metadata (any hashable keyword values, such as `sharding=("data", None)`)
    is read and written as attributes and travels through every operation. Writing to a
    Variable from inside a JAX transform it was not passed into raises `TraceContextError`.
    A Variable is also accepted where JAX expects an array (`jnp.dot(x, w)`, `jnp.sum(w)`,
    through `__jax_array__`), while `jax.jit` and the other transforms see it as the pytree
    it is.

    With `mesh=` (a `jax.sharding.Mesh`) as well as `sharding=`, the value is laid out on
    the mesh when the Variable is made: `jax.device_put` with
    `NamedSharding(mesh, PartitionSpec(*sharding))` (logical names mapped by `axis_rules`),
    or, inside a traced function, a sharding constraint; without `sharding` it is
    replicated. Both stay in the metadata. A value given as `VariableMetadata` (what
    `with_metadata` and `with_partitioning` initializers return) is unpacked, its metadata
    added to the keywords.

    `out_sharding`, Flax NNX 0.12's name for the mesh axes, is another name for the
    `sharding` entry: `Param(x, out_sharding=axes)`, `set_metadata(out_sharding=axes)` and
    `with_metadata(init, out_sharding=axes)` store `sharding`, and `w.out_sharding` and
    `get_metadata("out_sharding")` read it.

    With `ref=True` (or `hijax=True`, Flax NNX's other name; defaults from `var_defaults`)
    the value is kept in JAX mutable array references (`jax.new_ref`; a dict or list value
    gets one per array): JAX flattens the Variable to its refs, so inside plain `jax.jit`
    a write (`v[...] = x`) goes into the ref and is seen outside without a write-back.
    Reads give arrays; `get_raw_value()` gives the ref. `v.ref` / `v.hijax` say which (they
    are metadata entries, kept only when true); `with_vars` converts a graph's Variables.

    Subclass it to make your own kinds of state: `class Count(Variable): pass`. A subclass
    may override `get_value` and `set_value` (calling `super()`) to change every read and
    write: `.value`, `v[...]`, operators and in-place operators go through them. The
    constructor, pytree unflattening and the graph transforms' write-back store values as
    given. `Param[jax.Array]` is an annotation (a `types.GenericAlias`), as in Flax NNX.

    Arguments:
        value: the value to hold, or a `VariableMetadata` holding it and more metadata.
        hijax: keep the value in JAX mutable array references (None: `var_defaults()`).
        ref: the same (NNX's two names; both are recorded as given).
        **metadata: hashable values kept with it (e.g. `sharding`; with `mesh`, the value
            is laid out on that mesh).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param
        >>> w = Param(jnp.ones((2, 3)), sharding=(None, "model"))
        >>> (jnp.ones(2) @ w).shape, w.sharding
        ((3,), (None, 'model'))
        >>> w.out_sharding  # Flax NNX's name for the same entry
        (None, 'model')
        >>> w.value = w.value * 2
        >>> w[0, 0]
        Array(2., dtype=float32)
        >>> w[...] = 5.0  # writes into the array
        >>> w.value.tolist()
        [[5.0, 5.0, 5.0], [5.0, 5.0, 5.0]]
    """

    __slots__ = ("__weakref__", "_pg_flat", "_pg_trace")

    _pg_flat: tuple[list[Any], _Kind]  # ([value], kind): see `_register`
    _pg_trace: Any

    # `Param[jax.Array]` for annotations; `isinstance` and pytree registration use the class.
    __class_getitem__ = classmethod(GenericAlias)

    def __init__(
        self, value: Any, *, hijax: bool | None = None, ref: bool | None = None, **metadata: Any
    ):
        if not _SHARDING_ALIASES.isdisjoint(metadata):
            metadata = canonical_metadata(f"{type(self).__name__}(...)", metadata)
        if type(value) is VariableMetadata:
            value, metadata = value.value, _merged(type(self).__name__, value.metadata, metadata)
            if "ref" in metadata or "hijax" in metadata:
                hijax, ref = _boxed_flags(type(self).__name__, metadata, hijax, ref)
        if isinstance(value, Variable):
            raise TypeError(
                f"{type(self).__name__}(...) got a {type(value).__name__}: a Variable "
                "cannot hold another Variable. Pass its `.value`, or share the Variable "
                "itself by assigning it."
            )
        if _defaults_set.on:
            if hijax is None:
                stack = _defaults.hijax
                hijax = stack[-1] if stack else False
            if ref is None:
                stack = _defaults.ref
                ref = stack[-1] if stack else False
        if hijax or ref:
            _array_refs.require_refs(
                f"{type(self).__name__}(..., {'ref' if ref else 'hijax'}=True)"
            )
            metadata = _with_flags(metadata, hijax, ref)
        if type(value) not in PLAIN_TYPES and _array_refs.holds_ref(value):
            raise ValueError(
                f"{type(self).__name__}(...) got a JAX mutable array reference (jax.Ref): "
                "a Variable makes its own refs. Pass the array (`r[...]`) with `ref=True`."
            )
        kind = _kind(type(self), metadata)
        if "mesh" in metadata:
            value = _placed(type(self).__name__, value, metadata.get("sharding"), metadata["mesh"])
        # (Only an array-backed kind, made when `hijax` or `ref` is true, needs its `cell`.)
        _set_flat(self, (kind.cell(value) if hijax or ref else [value], kind))
        _set_trace(self, current_trace_token())
        wrote_values()  # (only `__init__` called again on a Variable makes it a write)
        # Called again on a live Variable, `__init__` gives it new metadata and a new
        # trace: a structural change. Counted for a new one too: telling the two apart
        # (a missing slot raises) costs more than the count.
        touch()

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        _register(cls)
        if cls.get_value is not Variable.get_value:
            # Decided once per class, so that Variables without the override keep reading
            # the slot directly: `.value` and the operators are on every layer's hot path.
            for name, method in _READS_THROUGH_GET_VALUE.items():
                if getattr(cls, name) is getattr(Variable, name):
                    setattr(cls, name, method)

    @property
    def value(self) -> Any:
        """The value held (read with `get_value`, written with `set_value`)."""
        return self._pg_flat[0][0]

    @value.setter
    def value(self, value: Any) -> None:
        self.set_value(value)

    def get_value(self) -> Any:
        """The value held; a subclass may override it to change every read.

        Returns:
            The value.

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_graph import Param
            >>> class Doubled(Param):
            ...     def get_value(self):
            ...         return super().get_value() * 2
            >>> v = Doubled(jnp.array(3.0))
            >>> [float(x) for x in (v.get_value(), v.value, v[...], v + 0)]
            [6.0, 6.0, 6.0, 6.0]
        """
        return self._pg_flat[0][0]

    def set_value(self, value: Any) -> None:
        """Replace the value; a subclass may override it to change every write.

        Arguments:
            value: the new value (not a Variable).

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_graph import Param
            >>> class Clipped(Param):
            ...     def set_value(self, value):
            ...         super().set_value(jnp.clip(value, -1.0, 1.0))
            >>> v = Clipped(jnp.zeros(2))
            >>> v.value = jnp.array([3.0, -0.5])
            >>> v[0] = -7.0
            >>> v.value.tolist()
            [-1.0, -0.5]
        """
        if isinstance(value, Variable):
            raise TypeError(
                f"Cannot store a {type(value).__name__} inside a {type(self).__name__}: "
                "assign its `.value`, or replace the attribute holding this Variable."
            )
        _guard(self, "set the value")
        self._pg_flat[0][0] = value
        wrote_values()

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The metadata, as a read-only mapping."""
        return self._pg_flat[1].metadata

    @property
    def ref(self) -> bool:
        """Whether the value is kept in JAX mutable array references (`ref=True`)."""
        return self._pg_flat[1].metadata.get("ref", False)

    @property
    def hijax(self) -> bool:
        """Whether the Variable was made with `hijax=True` (Flax NNX's name; here its
        arrays are kept in JAX mutable array references, as with `ref=True`)."""
        return self._pg_flat[1].metadata.get("hijax", False)

    def get_raw_value(self) -> Any:
        """The value as stored: for an array-backed Variable, its `jax.Ref` (or a pytree
        of them); otherwise the value, without a `get_value` override applied.

        Returns:
            The stored value.

        Examples:
            >>> import jax, jax.numpy as jnp
            >>> from pytree_graph import Param
            >>> v = Param(jnp.zeros(2), ref=True)
            >>> isinstance(v.get_raw_value(), jax.Ref), isinstance(v.value, jax.Array)
            (True, True)
        """
        cell = self._pg_flat[0]
        return cell.raw() if type(cell) is RefCell else cell[0]

    def set_raw_value(self, value: Any) -> None:
        """Store `value` as it is: no `set_value` override applies, and for an
        array-backed Variable it replaces the ref (write into the ref with `v[...] = x`).

        Arguments:
            value: the new stored value (not a Variable).

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_graph import Param
            >>> v = Param(jnp.zeros(2))
            >>> v.set_raw_value(jnp.ones(2))
            >>> v.value.tolist()
            [1.0, 1.0]
        """
        if isinstance(value, Variable):
            raise TypeError(
                f"Cannot store a {type(value).__name__} inside a {type(self).__name__}: "
                "pass its `get_raw_value()`."
            )
        _guard(self, "set the raw value")
        cell = self._pg_flat[0]
        list.__setitem__(cell, 0, value)
        wrote_values()

    @classmethod
    def from_metadata(cls, value: Any, metadata: Mapping[str, Any]) -> "Variable":
        """A Variable of this type holding `value` with `metadata`, as Flax NNX's
        `Variable.from_metadata`: the constructor's layout (`mesh`) is not applied;
        `ref=True` or `hijax=True` in the metadata keeps `value` in new refs.

        Arguments:
            value: the value.
            metadata: the metadata (`ref` and `hijax` entries are kept only when true).

        Returns:
            The new Variable.

        Examples:
            >>> from pytree_graph import Param
            >>> Param.from_metadata(1.0, {"tag": "a", "ref": False}).get_metadata()
            {'tag': 'a'}
        """
        metadata = dict(canonical_metadata(f"{cls.__name__}.from_metadata", metadata))
        hijax, ref = bool(metadata.pop("hijax", False)), bool(metadata.pop("ref", False))
        if hijax or ref:
            _array_refs.require_refs(f"{cls.__name__}.from_metadata(..., {{'ref': True}})")
        return _kind(cls, _with_flags(metadata, hijax, ref)).build(value)

    def get_metadata(self, name: str | None = None, default: Any = _MISSING) -> Any:
        """The metadata as a new dict, or one entry of it.

        Arguments:
            name: the entry to return; by default, all metadata is returned as a dict.
            default: what to return when `name` is not in the metadata (by default,
                `KeyError` is raised).

        Returns:
            A dict of all metadata (changing it does not change the Variable), or the entry.

        Examples:
            >>> from pytree_graph import Param
            >>> p = Param(1.0, sharding=("data",))
            >>> p.get_metadata(), p.get_metadata("sharding"), p.get_metadata("tag", None)
            ({'sharding': ('data',)}, ('data',), None)
        """
        metadata = self._pg_flat[1].metadata
        name = _entry_name(name)
        if name is None:
            if default is not _MISSING:
                raise TypeError(
                    "get_metadata(default=...) needs a `name`: without one, all metadata "
                    "is returned. Call `get_metadata(name, default)`."
                )
            return dict(metadata)
        if name in metadata:
            return metadata[name]
        if default is not _MISSING:
            return default
        raise KeyError(
            f"{type(self).__name__} has no metadata {name!r}. Metadata: "
            f"{sorted(metadata) or 'none'}. Pass a default: `get_metadata({name!r}, None)`."
        )

    def set_metadata(self, *args: Any, **metadata: Any) -> None:
        """Change the metadata in place, as Flax NNX's `Variable.set_metadata`.

        Called as `set_metadata(name=value, ...)` or `set_metadata(name, value)`, it sets
        those entries and keeps the others; called as `set_metadata(mapping)`, it replaces
        all metadata. Values must be hashable (they are part of the pytree structure). On
        an error nothing is changed. `replace(**metadata)` makes a new Variable instead.

        Arguments:
            *args: `(name, value)` or `(mapping,)`, instead of keywords.
            **metadata: entries to set.

        Examples:
            >>> from pytree_graph import Param
            >>> p = Param(1.0, tag="a")
            >>> p.set_metadata(sharding=("data",))
            >>> p.set_metadata("tag", "b")
            >>> p
            Param(value=1.0, sharding=('data',), tag='b')
            >>> p.set_metadata({})
            >>> p.get_metadata()
            {}
        """
        current = self._pg_flat[1].metadata
        if args and metadata:
            raise TypeError(
                "set_metadata takes either positional arguments or keywords, not both: "
                "use `set_metadata(name=value, ...)`, `set_metadata(name, value)` or "
                "`set_metadata(mapping)`."
            )
        if len(args) == 1:
            if not isinstance(args[0], Mapping):
                raise TypeError(
                    f"set_metadata with one positional argument takes a mapping that "
                    f"replaces all metadata, but got {_a(args[0])}. To set one entry, use "
                    "`set_metadata(name, value)` or `set_metadata(name=value)`."
                )
            new = dict(canonical_metadata("set_metadata", args[0]))
        elif len(args) == 2:
            new = {**current, _entry_name(args[0]): args[1]}
        elif args or not metadata:
            raise TypeError(
                f"set_metadata got {len(args)} positional arguments and no keywords: use "
                "`set_metadata(name=value, ...)`, `set_metadata(name, value)` or "
                "`set_metadata(mapping)`."
            )
        else:
            new = {**current, **canonical_metadata("set_metadata", metadata)}
        for name in new:
            if not isinstance(name, str) or name.startswith("_") or name == "value":
                raise ValueError(
                    f"Invalid metadata name {name!r} for a {type(self).__name__}: names "
                    "must be strings, must not start with `_`, and `value` is the value "
                    "(set it with `set_value`)."
                )
        self._change_metadata(new, "set the metadata")

    def _change_metadata(self, metadata: Mapping[str, Any], what: str) -> None:
        """Replace all metadata, after checking the trace and that the values are hashable."""
        current = self._pg_flat[1].metadata
        for flag in _FLAGS:
            if metadata.get(flag, False) != current.get(flag, False):
                raise ValueError(
                    f"Cannot {what} of a {type(self).__name__} to change {flag!r}: it says "
                    "where the value is kept (in JAX mutable array references or not). "
                    f"Make a new Variable with `with_vars(variable, {flag}=...)`."
                )
        # A false flag is the same as none: kept out, so the kind is a plain one's.
        metadata = {k: v for k, v in metadata.items() if k not in _FLAGS or v}
        _guard(self, what)
        _set_flat(self, (self._pg_flat[0], _kind(self._pg_flat[1].cls, metadata)))
        touch()

    def replace(self, value: Any = ..., **metadata: Any) -> "Variable":
        """A new Variable of the same type, with `value` and `metadata` changed.

        Arguments:
            value: the new value (by default, this Variable's).
            **metadata: metadata entries to set; the others are kept.

        Returns:
            The new Variable; this one is unchanged.

        Examples:
            >>> from pytree_graph import Param
            >>> Param(1.0, tag="a").replace(2.0)
            Param(value=2.0, tag='a')
        """
        if value is ...:
            value = self._pg_flat[0][0]  # as stored: `get_value` overrides are not applied
        elif isinstance(value, Variable):
            raise TypeError(
                f"{type(self).__name__}.replace got a {type(value).__name__}: a Variable "
                "cannot hold another Variable. Pass its `.value`."
            )
        # Not through the constructor: a `mesh` in the metadata lays a value out when the
        # Variable is made, not again for each copy (`get_partition_spec` puts specs here).
        owner = f"{type(self).__name__}.replace"
        merged = {**self.metadata, **canonical_metadata(owner, metadata)}
        hijax, ref = _boxed_flags(owner, merged, None, None)
        if (hijax or ref) and not (self.hijax or self.ref):
            _array_refs.require_refs(f"{owner}(..., {'ref' if ref else 'hijax'}=True)")
        return _kind(type(self), _with_flags(merged, hijax, ref)).build(value)

    def copy(self) -> "Variable":
        """A new Variable of the same type holding the same value and metadata (an
        array-backed one gets new refs: the copy does not share them)."""
        children, kind = self._pg_flat
        return kind.build(children[0])

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: metadata first, then the value's own
        # attributes (`v.shape`, `v.dtype`, `v.T`).
        if name.startswith("__") or name in ("_pg_flat", "_pg_trace"):
            raise AttributeError(name)
        metadata = self._pg_flat[1].metadata
        if name in metadata:
            return metadata[name]
        if name in _SHARDING_ALIASES:
            # Not the value's own `.sharding` (a jax.Array has one): the metadata only.
            if "sharding" in metadata:
                return metadata["sharding"]
            raise AttributeError(
                f"{type(self).__name__} has no `sharding` metadata (`{name}` is Flax NNX's "
                f"name for it). Metadata: {sorted(metadata) or 'none'}."
            )
        try:
            return getattr(self._pg_flat[0][0], name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__} has no metadata {name!r}, and its value "
                f"({type(self.value).__name__}) has no such attribute. Metadata: "
                f"{sorted(metadata) or 'none'}."
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "value":
            self.set_value(value)
        elif name.startswith("_"):
            raise AttributeError(
                f"Cannot set {name!r} on a {type(self).__name__}: names starting with `_` "
                "are reserved. Metadata names must not start with an underscore."
            )
        else:
            name = _entry_name(name)
            self._change_metadata({**self.metadata, name: value}, f"set the metadata {name!r}")

    def __delattr__(self, name: str) -> None:
        name = _entry_name(name)
        kind = self._pg_flat[1]
        if name not in kind.metadata:
            raise AttributeError(f"{type(self).__name__} has no metadata {name!r} to delete.")
        metadata = {k: v for k, v in kind.metadata.items() if k != name}
        self._change_metadata(metadata, f"delete the metadata {name!r}")

    def __getitem__(self, index: Any) -> Any:
        # `_index` inlined: `v[...]` is the usual way to read an array Variable.
        value = self._pg_flat[0][0]
        if index is Ellipsis and (type(value) in _WHOLE_TYPES or _is_whole(value)):
            return value
        return value[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, Variable):
            value = value.value
        current = self._pg_flat[0][0]
        if isinstance(current, jax.Array):  # arrays and tracers
            if (
                index is Ellipsis
                and isinstance(value, jax.Array)
                and value.shape == current.shape
                and value.dtype == current.dtype
            ):
                self.value = value  # what `.at[...].set` would give, without the copy
            else:
                self.value = current.at[index].set(value)
        elif isinstance(current, np.ndarray):
            # A new array, so that arrays shared with other objects are not changed.
            new = current.copy()
            new[index] = value
            self.value = new
        elif index is Ellipsis and type(current) in _PYTHON_NUMBERS:
            self.value = value
        elif type(current) in (dict, list):
            # A new container, so that the old one (maybe held elsewhere) is not changed.
            new = type(current)(current)
            new[index] = value
            self.value = new
        else:
            raise TypeError(
                f"Cannot assign to `[{_show_index(index)}]` of a {type(self).__name__} holding "
                f"{_a(current)}: only arrays, dicts and lists support `v[index] = x` (a "
                "Python number supports `v[...] = x`, which replaces it). Assign "
                "`v.value = new_value` to replace the value."
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A Variable holding a function calls it, as Flax NNX's Variables forward calls.
        value = self.value
        if not callable(value):
            raise TypeError(
                f"A {type(self).__name__} is called like its value, but its value "
                f"({type(value).__name__}) is not callable. Read it with `.value` (or "
                "`v[...]`)."
            )
        return value(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.value)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __complex__(self) -> complex:
        return complex(self.value)

    def __index__(self) -> int:
        return operator.index(self.value)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return np.asarray(self.value, dtype=dtype)

    def __jax_array__(self) -> Any:
        # Reached from `jax.numpy` functions given a Variable (`jnp.dot(x, w)`); `jax.jit`
        # and other transforms flatten it as a pytree first, so they never call this.
        return self._pg_flat[0][0]

    def __repr__(self) -> str:
        from pytree_module import tree_pformat

        return tree_pformat(self)

    def __pdoc__(self, **kwargs: Any) -> Any:

        return constructor_pdoc(self, [("value", self.value), *self._pg_flat[1].items], **kwargs)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Callable) -> Any:
        from treescope import repr_lib

        return repr_lib.render_object_constructor(
            object_type=type(self),
            attributes={"value": self.value, **self.metadata},
            path=path,
            subtree_renderer=subtree_renderer,
            roundtrippable=False,
        )

    def __getstate__(self) -> tuple[Any, dict[str, Any]]:
        return self._pg_flat[0][0], dict(self.metadata)

    def __setstate__(self, state: tuple[Any, dict[str, Any]]) -> None:
        value, metadata = state
        kind = _kind(type(self), metadata)
        _set_flat(self, (kind.cell(value), kind))
        _set_trace(self, current_trace_token())
        wrote_values()
        touch()  # on a live Variable, new metadata and trace: as `__init__`


class VariableMetadata:
    """A value with metadata for the Variable that will hold it: what initializers made by
    `with_metadata` and `with_partitioning` return.

    A Variable made from it (`Param(VariableMetadata(x, tag="a"))`, which is how layers
    wrap an initializer's output) holds `value` and gets `metadata`, besides any metadata
    given as keywords (the same name given both ways must have the same value). It is a
    pytree (its value the only child), so an initializer returning one can be traced.

    Arguments:
        value: the value (usually an array).
        **metadata: hashable metadata for the Variable.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, VariableMetadata
        >>> boxed = VariableMetadata(jnp.zeros(2), sharding=("model",))
        >>> Param(boxed, tag="bias").get_metadata()
        {'sharding': ('model',), 'tag': 'bias'}
    """

    __slots__ = ("metadata", "value")

    def __init__(self, value: Any, **metadata: Any):
        if isinstance(value, Variable | VariableMetadata):
            raise TypeError(
                f"VariableMetadata got a {type(value).__name__}: it holds the value a "
                "Variable will be made from. Pass the value itself."
            )
        self.value = value
        self.metadata = MappingProxyType(dict(canonical_metadata("VariableMetadata", metadata)))

    def __repr__(self) -> str:
        shown = "".join(f", {name}={v!r}" for name, v in self.metadata.items())
        return f"VariableMetadata({self.value!r}{shown})"


jax.tree_util.register_pytree_node(
    VariableMetadata,
    lambda boxed: ((boxed.value,), tuple(boxed.metadata.items())),
    lambda items, children: VariableMetadata(*children, **dict(items)),
)


def _boxed_flags(
    owner: str, metadata: dict[str, Any], hijax: bool | None, ref: bool | None
) -> tuple[bool | None, bool | None]:
    """Take `hijax` and `ref` out of `metadata` (from a `VariableMetadata`), checking them
    against the keywords given."""
    given = {"hijax": hijax, "ref": ref}
    for name in _FLAGS:
        if name in metadata:
            boxed = bool(metadata.pop(name))
            if given[name] is not None and bool(given[name]) != boxed:
                raise ValueError(
                    f"{owner} got {name}={given[name]!r}, but its value (a VariableMetadata) "
                    f"already has {name}={boxed!r}. Give {name!r} one way only."
                )
            given[name] = boxed
    return given["hijax"], given["ref"]


def _with_flags(metadata: Mapping[str, Any], hijax: Any, ref: Any) -> dict[str, Any]:
    """`metadata` with `hijax` / `ref` entries where true (a plain Variable has neither,
    so its kind, and everything that compares kinds, is as without them)."""
    metadata = dict(metadata)
    if hijax:
        metadata["hijax"] = True
    if ref:
        metadata["ref"] = True
    return metadata


def _merged(owner: str, boxed: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata of a `VariableMetadata` and the keywords, which must not disagree."""
    for name in boxed.keys() & given.keys():
        if static_key(boxed[name]) != static_key(given[name]):
            raise ValueError(
                f"{owner}(...) got {name}={given[name]!r}, but its value (from an "
                f"initializer made by with_metadata or with_partitioning) already has "
                f"{name}={boxed[name]!r}. Give {name!r} one way only."
            )
    return {**boxed, **given}


def partition_spec(axes: Any) -> PartitionSpec:
    """The `PartitionSpec` of `sharding` metadata (None: replicated), logical names mapped
    by the `axis_rules` in force."""
    return PartitionSpec() if axes is None else PartitionSpec(*to_mesh_axes(axes))


def missing_mesh_axes(spec: PartitionSpec, mesh: Any) -> set[str]:
    """The mesh axes `spec` names that `mesh` does not have."""
    return {
        axis
        for entry in spec
        for axis in (entry if isinstance(entry, tuple) else (entry,))
        if axis is not None and axis not in mesh.axis_names
    }


def _placed(owner: str, value: Any, axes: Any, mesh: Any) -> Any:
    """`value` laid out on `mesh` as `axes` (a Variable's `sharding` metadata) says."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{owner}(..., mesh=...) takes a jax.sharding.Mesh, got {_a(mesh)}: the value "
            "is laid out on that mesh as `sharding` says. Leave `mesh` out to keep "
            "`sharding` as metadata only."
        )
    spec = partition_spec(axes)
    missing = missing_mesh_axes(spec, mesh)
    if missing:
        raise ValueError(
            f"{owner}(..., sharding={axes!r}, mesh=...) names mesh axes {sorted(missing)}, "
            f"which the mesh does not have (its axes: {list(mesh.axis_names)}). Use the "
            "mesh's axis names, or map logical names to them with `pytree_graph.axis_rules`."
        )
    sharding = NamedSharding(mesh, spec)
    if isinstance(value, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(
            value.shape, value.dtype, sharding=sharding, weak_type=value.weak_type
        )
    if not isinstance(value, jax.Array | np.ndarray | np.generic) and type(value) not in (
        _PYTHON_NUMBERS
    ):
        raise TypeError(
            f"{owner}(..., mesh=...) can lay out an array, a number or a "
            f"jax.ShapeDtypeStruct, but got {_a(value)}. Leave `mesh` out for other values."
        )
    try:
        if isinstance(value, jax.core.Tracer):
            return jax.lax.with_sharding_constraint(value, sharding)
        return jax.device_put(value, sharding)
    except ValueError as error:
        raise ValueError(
            f"{owner}(..., sharding={axes!r}, mesh=...) cannot lay out a value of shape "
            f"{np.shape(value)} on a mesh of shape {dict(mesh.shape)}: {error}"
        ) from error


_PYTHON_NUMBERS = frozenset({bool, int, float, complex})


# Values whose `[...]` is the value itself: Python numbers (as for a 0-d array) and JAX
# arrays (immutable: indexing would copy, through a dispatch costing microseconds).
_WHOLE_TYPES: set[type] = {*_PYTHON_NUMBERS}


def _is_whole(value: Any) -> bool:
    """Whether `value[...]` is `value` (its type is remembered, tracers' apart)."""
    if not isinstance(value, jax.Array):
        return False
    if not isinstance(value, jax.core.Tracer):
        _WHOLE_TYPES.add(type(value))
    return True


def _index(value: Any, index: Any) -> Any:
    if index is Ellipsis and (type(value) in _WHOLE_TYPES or _is_whole(value)):
        return value
    return value[index]


def _show_index(index: Any) -> str:
    return "..." if index is Ellipsis else repr(index)


def _a(value: Any) -> str:
    return f"a {type(value).__name__}" if value is not None else "None"


_set_flat = Variable._pg_flat.__set__  # type: ignore[attr-defined]
_set_trace = Variable._pg_trace.__set__  # type: ignore[attr-defined]


# The value-reading methods as installed on subclasses that override `get_value`; Variable's
# own read the slot directly (see `Variable.__init_subclass__`).
_READS_THROUGH_GET_VALUE: dict[str, Any] = {
    "value": property(lambda self: self.get_value(), Variable.value.fset),  # type: ignore[attr-defined]
    "__getitem__": lambda self, index: _index(self.get_value(), index),
    "__jax_array__": lambda self: self.get_value(),
}


def _install(name: str, methods: tuple[Callable[..., Any], Callable[..., Any]]) -> None:
    setattr(Variable, name, methods[0])
    _READS_THROUGH_GET_VALUE[name] = methods[1]


def _unary(op: Callable[[Any], Any]) -> tuple[Callable[[Variable], Any], ...]:
    def method(self: Variable) -> Any:
        return op(self._pg_flat[0][0])

    def through_get_value(self: Variable) -> Any:
        return op(self.get_value())

    return method, through_get_value


def _binary(op: Callable[[Any, Any], Any]) -> tuple[Callable[[Variable, Any], Any], ...]:
    def method(self: Variable, other: Any) -> Any:
        if isinstance(other, Variable):
            other = other.value
        return op(self._pg_flat[0][0], other)

    def through_get_value(self: Variable, other: Any) -> Any:
        if isinstance(other, Variable):
            other = other.value
        return op(self.get_value(), other)

    return method, through_get_value


def _reflected(op: Callable[[Any, Any], Any]) -> tuple[Callable[[Variable, Any], Any], ...]:
    def method(self: Variable, other: Any) -> Any:
        return op(other, self._pg_flat[0][0])

    def through_get_value(self: Variable, other: Any) -> Any:
        return op(other, self.get_value())

    return method, through_get_value


def _in_place(op: Callable[[Any, Any], Any]) -> Callable[[Variable, Any], Variable]:
    # `v += x` writes the new value into `v` (so `self.count += 1` keeps the Variable).
    def method(self: Variable, other: Any) -> Variable:
        if isinstance(other, Variable):
            other = other.value
        self.value = op(self.value, other)
        return self

    return method


_BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "matmul": operator.matmul,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
    "lshift": operator.lshift,
    "rshift": operator.rshift,
}
for _name, _op in _BINARY.items():
    _install(f"__{_name}__", _binary(_op))
    _install(f"__r{_name}__", _reflected(_op))
    setattr(Variable, f"__i{_name}__", _in_place(_op))
_install("__divmod__", _binary(divmod))
_install("__rdivmod__", _reflected(divmod))
for _name, _op in {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}.items():
    _install(f"__{_name}__", _binary(_op))
for _name, _op in {
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": operator.abs,
    "invert": operator.invert,
}.items():
    _install(f"__{_name}__", _unary(_op))


_VALUE_KEY = GetAttrKey("value")


def _flatten_with_keys(variable: Variable) -> tuple[tuple[tuple[GetAttrKey, Any]], _Kind]:
    children, kind = variable._pg_flat
    # Unpacked, not indexed: a `RefCell`'s item access reads the refs, and JAX must get
    # the refs themselves (as the plain flatten does).
    (value,) = children
    return ((_VALUE_KEY, value),), kind


def is_variable(x: Any) -> bool:
    """Whether `x` is a Variable (the `is_leaf` that stops flattening at Variables)."""
    return isinstance(x, Variable)


def _register(cls: type) -> None:
    # The flattened form is kept in a slot, so JAX flattens a Variable with a C-level
    # attribute read; the kind is the treedef entry and builds the Variable back. The
    # value sits in a one-item list of its own (never shared: every Variable made gets a
    # new one), so a write replaces the item in place: no object is made or freed, which
    # is most of what writing back a step's ~200 values costs (`jit_partial`).
    jax.tree_util.register_pytree_with_keys(
        cls,
        _flatten_with_keys,
        operator.call,
        flatten_func=operator.attrgetter("_pg_flat"),
    )


def _tree_at_rule(old: Variable, new: Any) -> Any:
    """What `tree_at` puts in place of a Variable `where` picked, given `new`.

    A bare value is the Variable's new value: it goes into a new Variable of the same type
    and metadata, which stands wherever the old one stood (so a tied Param stays tied, and
    optimizers and `state(model, Param)` still find it), as `old.value = new` would in the
    graph style, without changing `old`. A Variable, a Module (model surgery) or `None`
    (removing it) is put in as given.
    """
    if new is None or isinstance(new, Variable | Module):
        return new
    return old._pg_flat[1].build(new)


_register(Variable)
register_data_type(Variable)
register_tree_at_rule(Variable, _tree_at_rule)


class Param(Variable):
    """A trainable parameter: what `grad` differentiates and optimizers update by default."""


class BatchStat(Variable):
    """Running statistics (e.g. a batch norm's mean and variance): state, not trained."""


class Cache(Variable):
    """Cached values, such as an attention layer's decoding cache."""


class Intermediate(Variable):
    """Intermediate values stored while a model runs (see `Module.sow` in pytree_nn)."""


class Perturbation(Variable):
    """Zeros added to an intermediate value, so that its gradient can be taken."""
