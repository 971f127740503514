"""JAX mutable array references ("refs") as the storage of array-backed Variables.

A Variable made with `ref=True` or `hijax=True` (Flax NNX 0.12's names) keeps each array of
its value in a `jax.Ref` (made by `jax.new_ref`). JAX flattens such a Variable to its refs,
so plain `jax.jit` receives them as mutable arguments: a write inside (`v[...] = x`) goes
into the ref, and is seen outside without any write-back.

The Variable's value list (`Variable._pg_flat[0]`) is then a `RefCell`: a list whose item
access reads through the refs and whose item assignment writes into them. Everything that
reads or writes a Variable's value by `_pg_flat[0][0]` (the `value` property, the graph
transforms' lift and write-back) works unchanged, and plain Variables, whose list is a
plain list, pay nothing for this. JAX's flattening reads the list's storage directly (not
through `__getitem__`), so it sees the refs themselves.

Also here: the thread-local defaults `var_defaults` sets (read by `Variable.__init__`).
"""

import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

# Values a ref can hold: JAX and NumPy arrays, NumPy scalars and Python numbers. Others
# (None, strings, `jax.ShapeDtypeStruct`s from `eval_shape`) are kept as they are.
_NUMBERS = (bool, int, float, complex)


def _top_level_check() -> Callable[[], bool]:
    """`is_top_level()`: whether no JAX transform is tracing now (refs are made only
    then: inside a transform a Variable holds the value it is given, and the graph
    transforms write it back into the refs outside)."""
    try:
        from jax._src.core import trace_ctx

        trace_ctx.is_top_level()
    except (ImportError, AttributeError):
        # Without it, a value that is not a tracer is taken as made outside transforms.
        return lambda: True
    return trace_ctx.is_top_level


is_top_level = _top_level_check()


class _Defaults(threading.local):
    """The `hijax` and `ref` defaults in force, one stack each, per thread."""

    def __init__(self) -> None:
        self.hijax: list[bool] = []
        self.ref: list[bool] = []


defaults = _Defaults()


class _Switch:
    """Whether `var_defaults` ever set a default (in any thread): until then, making a
    Variable skips reading the thread-local stacks (two reads, most of its cost here)."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


defaults_set = _Switch()


# `jax.Ref`, or None where the running JAX has no mutable array references. A concrete
# ref's type is `jax.Ref` itself; `isinstance(x, jax.Ref)` also accepts tracers of refs,
# through a metaclass check that costs a microsecond, so it is asked of tracers only.
_REF: Any = getattr(jax, "Ref", None)
_Tracer = jax.core.Tracer


def require_refs(owner: str) -> None:
    """Raise a clear error where the running JAX cannot make mutable array references."""
    if getattr(jax, "new_ref", None) is None or getattr(jax, "Ref", None) is None:
        raise RuntimeError(
            f"{owner} needs JAX mutable array references (`jax.new_ref` and `jax.Ref`, in "
            f"JAX 0.7.2 and newer), but the installed JAX is {jax.__version__}. Upgrade JAX "
            "(`pip install -U jax`), or leave out `ref=True` / `hijax=True` (and "
            "`var_defaults`) to keep the value as a plain array."
        )


def is_ref(x: Any) -> bool:
    """Whether `x` is a JAX mutable array reference (or a tracer of one)."""
    return type(x) is _REF or (isinstance(x, _Tracer) and _REF is not None and isinstance(x, _REF))


# Types whose instances are never refs nor hold any: every Variable made asks, so the
# usual answer is one set lookup (array types are added as they are met).
PLAIN_TYPES: set[type] = {*_NUMBERS, np.ndarray, type(None), str}


def holds_ref(value: Any) -> bool:
    """Whether `value` is a ref or a pytree with a ref among its leaves."""
    kind = type(value)
    if kind in PLAIN_TYPES:
        return False
    if kind is _REF:
        return True
    if isinstance(value, _Tracer):
        return is_ref(value)
    if _can_hold(value):
        PLAIN_TYPES.add(kind)
        return False
    return any(map(is_ref, jax.tree_util.tree_leaves(value)))


def _can_hold(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic) or type(x) in _NUMBERS


def _new_ref(x: Any) -> Any:
    if _can_hold(x) and not is_ref(x):
        return jax.new_ref(x)
    return x


def to_refs(value: Any) -> Any:
    """`value` with each array (or number) in a new ref: what an array-backed Variable
    stores. A value with no arrays (`None`, a `ShapeDtypeStruct`) is stored as it is."""
    if _can_hold(value):
        return jax.new_ref(value)
    return jax.tree_util.tree_map(_new_ref, value)


def _read_leaf(x: Any) -> Any:
    return x[...] if is_ref(x) else x


def read(raw: Any) -> Any:
    """The value an array-backed Variable holds: its refs read (a new array each)."""
    if is_ref(raw):
        return raw[...]
    if _can_hold(raw):
        return raw
    return jax.tree_util.tree_map(_read_leaf, raw)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, _Tracer)


class RefCell(list):
    """The value list of an array-backed Variable (see the module docstring).

    Holds one item, the raw value (a ref, or a pytree of refs). Reading item 0 reads the
    refs; assigning it writes into them, so the new value is seen by every holder of the
    refs (the caller of a `jax.jit` that received them included).
    """

    __slots__ = ()

    def __getitem__(self, index: Any) -> Any:
        return read(list.__getitem__(self, index))

    def __setitem__(self, index: Any, value: Any) -> None:
        raw = list.__getitem__(self, index)
        if is_ref(raw):
            if _can_hold(value) or _is_tracer(value):
                raw[...] = value
                return
        elif not _can_hold(raw):  # a pytree of refs (a dict value), or None
            raw_leaves, raw_def = jax.tree_util.tree_flatten(raw)
            leaves, treedef = jax.tree_util.tree_flatten(value)
            if treedef == raw_def and any(map(is_ref, raw_leaves)):
                for ref, leaf in zip(raw_leaves, leaves, strict=True):
                    if is_ref(ref):
                        ref[...] = leaf
                return
            if any(map(_is_tracer, leaves)) or any(map(_is_tracer, raw_leaves)):
                if treedef != raw_def:
                    # Inside `jax.jit` the new value would be lost: no ref holds it.
                    raise ValueError(
                        f"Cannot change the structure of an array-backed Variable's value "
                        f"inside a JAX transform (from {raw_def} to {treedef}): its refs "
                        "were passed in, and new ones cannot be passed out. Keep the "
                        "structure (set the same keys), or change it outside the transform."
                    )
            elif is_top_level():
                list.__setitem__(self, index, to_refs(value))
                return
        # Nothing to write into (a value no ref can hold, or one set with
        # `set_raw_value`): the value replaces the item.
        list.__setitem__(self, index, value)

    def raw(self) -> Any:
        """The raw value: the ref (or pytree of refs) itself."""
        return list.__getitem__(self, 0)
