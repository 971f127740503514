"""`field`: declare an annotated Module attribute and its options."""

import dataclasses
from collections.abc import Callable
from typing import Any

# Keys under which the options live in `dataclasses.Field.metadata`. Plain
# `dataclasses.field(metadata={"static": True})` is honoured too.
STATIC = "static"
CONVERTER = "converter"


def field(
    *,
    static: bool = False,
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
        static: keep the value in the treedef instead of the leaves. Static values must be
            hashable (lists, dicts and sets of hashable values are hashed by content) and
            may not contain arrays.
        converter: called once on the value after `__init__` returns, before the
            statuses are settled and before `__check_init__` runs.
        default: default value for the generated `__init__`.
        default_factory: zero-argument callable making the default (for mutable defaults).
        init: whether the generated `__init__` takes this field as an argument.
        repr: whether `repr(module)` shows this field.
        kw_only: make the generated `__init__` argument keyword-only.
        metadata: extra metadata stored on the `dataclasses.Field`.

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
    """
    if not isinstance(static, bool):
        raise TypeError(f"field(static=...) must be True or False, got {static!r}.")
    if converter is not None and not callable(converter):
        raise TypeError(f"field(converter=...) must be callable, got {converter!r}.")
    full_metadata = dict(metadata or {})
    full_metadata[STATIC] = static
    if converter is not None:
        full_metadata[CONVERTER] = converter
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        init=init,
        repr=repr,
        kw_only=kw_only,
        metadata=full_metadata,
    )
