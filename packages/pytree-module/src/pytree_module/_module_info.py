"""`ModuleInfo`: what a Module class's declaration says, worked out once when it is made."""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from ._abstract import abstract_attributes
from ._field import declared_static, field_converter


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleInfo:
    """The facts about one Module class that its instances' construction and assignment read.

    Made by the metaclass right after the class (and its dataclass fields) exist, and kept in
    the class attribute `__module_info__`; subclasses inherit `frozen` and `pytree` from it
    unless they set them. The class also carries copies of those two flags,
    `__module_frozen__` and `__module_pytree__`, for the C-speed getters of
    `pytree_module.extend`; everything else is read from here.
    """

    frozen: bool
    """`class M(Module, frozen=True)`: instances refuse assignment after `__init__`."""
    pytree: bool
    """`class M(Module, pytree=False)` says False: instances are not registered with JAX."""
    custom_init: bool
    """The class runs an `__init__` written by hand (its own or inherited), not a generated one."""
    fields: tuple[dataclasses.Field, ...]
    """The dataclass fields, in declaration order."""
    field_index: dict[str, int]
    """Field name -> position in `fields`: declared fields come first in a layout."""
    field_static: dict[str, bool]
    """Field name -> whether it is declared static (`field(static=True)`). A field left out
    has no declared status: its value decides (fields of a `dataclass`-decorated class)."""
    converters: tuple[tuple[str, Callable[[Any], Any]], ...]
    """(field name, converter) for the fields declared with `field(converter=...)`."""
    class_provided: frozenset[str]
    """Fields that a subclass replaced with a class attribute (a property, say)."""
    check_inits: tuple[Callable[[Any], None], ...]
    """Every `__check_init__` along the MRO, run after `__init__`, most derived first."""
    abstract_vars: tuple[str, ...]
    """`AbstractVar` names that no class provides: `__init__` must set them on the instance.
    Empty for almost every class, so the check after `__init__` is one truth test."""
    abstract_class_vars: tuple[str, ...]
    """`AbstractClassVar` names that no class provides: instantiation is refused."""
    descriptors: dict[str, bool]
    """Cache: attribute name -> whether a class-level data descriptor handles it."""
    infer_fields: bool = False
    """`dataclass`-decorated (or below one): undeclared fields take their value's status."""

    @classmethod
    def of(
        cls,
        module_class: type,
        *,
        frozen: bool,
        pytree: bool,
        custom_init: bool,
        infer_fields: bool = False,
    ) -> "ModuleInfo":
        """Work out the facts of `module_class`, once it is a dataclass.

        With `infer_fields` (a class decorated with `dataclass`), a field declared neither
        data nor static gets its status from its value, as an attribute set in `__init__`
        does; otherwise it is data (Equinox's rule).
        """
        fields = dataclasses.fields(module_class)
        field_static = {}
        for f in fields:
            static = declared_static(f)
            if static is None and not infer_fields:
                static = False
            if static is not None:
                field_static[f.name] = static
        abstract_vars, abstract_class_vars = abstract_attributes(module_class)
        return cls(
            frozen=frozen,
            pytree=pytree,
            custom_init=custom_init,
            fields=fields,
            field_index={f.name: i for i, f in enumerate(fields)},
            field_static=field_static,
            converters=tuple(
                (f.name, converter) for f in fields if (converter := field_converter(f)) is not None
            ),
            class_provided=frozenset(
                f.name for f in fields if _overridden_by_class_attribute(module_class, f)
            ),
            check_inits=tuple(
                klass.__dict__["__check_init__"]
                for klass in module_class.__mro__
                if "__check_init__" in klass.__dict__
            ),
            abstract_vars=abstract_vars,
            abstract_class_vars=abstract_class_vars,
            descriptors={},
            infer_fields=infer_fields,
        )

    def is_data_descriptor(self, cls: type, name: str) -> bool:
        """Whether `name` is handled by a data descriptor (a property, say) of `cls`.

        `cls` is the class this info belongs to. The answer is cached per name: assignment
        asks it on every call.
        """
        found = self.descriptors.get(name)
        if found is None:
            found = False
            for klass in cls.__mro__:
                if name in klass.__dict__:
                    found = hasattr(type(klass.__dict__[name]), "__set__")
                    break
            self.descriptors[name] = found
        return found


def _overridden_by_class_attribute(cls: type, f: dataclasses.Field) -> bool:
    """Whether a subclass replaced field `f` with a class attribute, such as a property.

    Such a field is provided by the class: an instance that `__init__` leaves without the
    attribute reads the class attribute, which is not part of the pytree (Equinox does the
    same). Only classes below the one that declares the field count, and there a field's own
    default (which dataclasses leave on the class) is no override.
    """
    for klass in cls.__mro__:
        if f.name in klass.__dict__:
            return klass.__dict__[f.name] is not f.default
        if f.name in inspect.get_annotations(klass):
            return False
    return False
