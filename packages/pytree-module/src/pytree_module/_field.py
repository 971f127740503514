"""`field`: declare an annotated Module attribute and its options."""

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

T = TypeVar("T")

# Metadata keys that a plain `dataclasses.field(metadata={"static": True})` (Equinox's older
# spelling) uses for the options. `field` keeps its options on the Field object instead, so
# the user's metadata stays exactly as given.
STATIC = "static"
CONVERTER = "converter"


class ModuleField(dataclasses.Field):
    """A `dataclasses.Field` that also holds `field`'s options."""

    __slots__ = ("converter", "static")


# The markers of `Data[T]` and `Static[T]` inside `typing.Annotated`.
DATA_MARK = "__data__"
STATIC_MARK = "__static__"

Data = Annotated[T, DATA_MARK]
"""`x: Data[int]` declares field `x` data (a pytree leaf), whatever its value; as Flax NNX's."""

Static = Annotated[T, STATIC_MARK]
"""`x: Static[int]` declares field `x` static (in the treedef); as Flax NNX's."""


def _annotated_static(annotation: Any) -> bool | None:
    """Whether `Data[...]` (False) or `Static[...]` (True) marks the annotation, else None."""
    if isinstance(annotation, str):
        # `from __future__ import annotations`: the text, read as the marker it names.
        head = annotation.split("[", 1)[0].rsplit(".", 1)[-1].strip()
        return {"Data": False, "Static": True}.get(head) if "[" in annotation else None
    for mark in getattr(annotation, "__metadata__", ()):
        if mark == DATA_MARK:
            return False
        if mark == STATIC_MARK:
            return True
    return None


def declared_static(f: dataclasses.Field) -> bool | None:
    """Whether a field was declared static (True), declared data (False), or neither (None).

    Declared by `field(static=...)` / `data()` / `static()`, a plain dataclass field's
    `metadata={"static": ...}`, or a `Data[...]` / `Static[...]` annotation.
    """
    if isinstance(f, ModuleField) and f.static is not None:
        return f.static
    if STATIC in f.metadata:
        return bool(f.metadata[STATIC])
    return _annotated_static(f.type)


def field_is_static(f: dataclasses.Field) -> bool:
    """Whether an annotated field was declared static (fields are data unless declared)."""
    return bool(declared_static(f))


def field_converter(f: dataclasses.Field) -> Callable[[Any], Any] | None:
    """The converter declared for a field, if any."""
    if isinstance(f, ModuleField):
        return f.converter
    return f.metadata.get(CONVERTER)


def field(
    *,
    static: bool | None = None,
    converter: Callable[[Any], Any] | None = None,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    init: bool = True,
    repr: bool = True,
    kw_only: bool | Any = dataclasses.MISSING,
    metadata: dict[str, Any] | None = None,
) -> Any:
    """Declare an annotated attribute of a Module (Equinox-style field).

    Annotated attributes are *data* (pytree children) unless declared static here.

    Arguments:
        static: keep the value in the treedef instead of the leaves (`True`), or in the
            leaves (`False`); left out, the field is data, except in a class decorated
            with `dataclass`, where its value decides as for any attribute. Static values
            must be hashable (lists, dicts and sets of hashable values are hashed by content) and
            may not contain arrays.
        converter: called once on the value after `__init__` returns, before the
            statuses are settled and before `__check_init__` runs. The generated
            `__init__` annotates the argument with the type of the converter's first
            parameter (`Any` if it has none), since that is what it accepts.
        default: default value for the generated `__init__`.
        default_factory: zero-argument callable making the default (for mutable defaults).
        init: whether the generated `__init__` takes this field as an argument.
        repr: whether `repr(module)` shows this field.
        kw_only: make the generated `__init__` argument keyword-only.
        metadata: your own metadata, kept exactly as given and readable as
            `dataclasses.fields(cls)[i].metadata`. The options above are not stored in it,
            and the keys `"static"` and `"converter"` are refused (pass the options instead).

    Returns:
        A `dataclasses.Field` to assign as the class attribute's value.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module, field
        >>> class Scale(Module):
        ...     factor: jnp.ndarray = field(converter=jnp.asarray)
        ...     name: str = field(static=True, default="scale")
        >>> Scale(2.0).factor
        Array(2., dtype=float32, weak_type=True)
        >>> import dataclasses
        >>> class Documented(Module):
        ...     x: float = field(static=True, metadata={"doc": "a size"})
        >>> dict(dataclasses.fields(Documented)[0].metadata)
        {'doc': 'a size'}
    """
    if static is not None and not isinstance(static, bool):
        raise TypeError(f"field(static=...) must be True or False, got {static!r}.")
    if converter is not None and not callable(converter):
        raise TypeError(f"field(converter=...) must be callable, got {converter!r}.")
    clashing = sorted(k for k in (STATIC, CONVERTER) if k in (metadata or {}))
    if clashing:
        raise ValueError(
            f"field(metadata=...) has the key(s) {clashing}, which plain dataclass fields use "
            f"for this function's options. Pass them as options instead: "
            f"`field({clashing[0]}=...)`; metadata is for your own keys."
        )
    plain = dataclasses.field(
        default=default,
        default_factory=default_factory,
        init=init,
        repr=repr,
        kw_only=kw_only,
        metadata=metadata,
    )
    # Copy the plain Field slot by slot, so every Python version's Field attributes come
    # along without repeating its constructor's signature here.
    declared = object.__new__(ModuleField)
    for name in dataclasses.Field.__slots__:
        object.__setattr__(declared, name, getattr(plain, name))
    declared.static = static
    declared.converter = converter
    return declared
