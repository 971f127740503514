"""Abstract attributes and methods: what a Module base class declares and subclasses provide.

`x: AbstractVar[int]` says every concrete subclass has an attribute `x`, and
`y: AbstractClassVar[int]` says every concrete subclass has a class attribute `y`. Neither is
a field of the class that declares it. Which abstract names a class leaves unprovided is
worked out once, when the class is made (`abstract_attributes`), so classes without any pay
nothing per instance. `@abc.abstractmethod` is honoured too (`abstract_methods`): Python
itself refuses to make instances of a class whose `__abstractmethods__` is not empty.
"""

import enum
import inspect
import re
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, TypeVar, get_args, get_origin

_T = TypeVar("_T")

if TYPE_CHECKING:
    # Type checkers read `x: AbstractVar[int]` as `x: int`, and `AbstractClassVar[int]` as
    # `ClassVar[int]`, so code using the attribute type-checks as if it were provided.
    from typing import ClassVar as AbstractClassVar
    from typing import TypeAlias

    AbstractVar: TypeAlias = Annotated[_T, "AbstractVar"]
else:

    class AbstractVar(Generic[_T]):
        """Annotation of an attribute that every concrete subclass must provide.

        `x: AbstractVar[int]` on a Module class declares that instances of its concrete
        subclasses have an attribute `x` of type `int`, without saying how. It is not a
        field of the declaring class (no `__init__` argument, nothing stored). A subclass
        provides it in any of these ways:

        * a field, `x: int` (it becomes an argument of the generated `__init__`, after the
          fields of the parent classes);
        * a class attribute, `x = 3`, or `x: ClassVar[int] = 3`;
        * a property (or any other class-level descriptor);
        * an assignment `self.x = ...` in `__init__` (its status is then inferred from the
          value, as for any unannotated attribute).

        A subclass may repeat `x: AbstractVar[int]`, or narrow it to
        `x: AbstractClassVar[int]`. Instantiating a class that leaves `x` unprovided runs
        `__init__` and then raises `TypeError` naming `x`.

        The type in brackets (`AbstractVar[int]`) is for readers and type checkers (which
        read `AbstractVar[T]` as `T`); it is never checked at runtime.

        Examples:
            >>> from pytree_module import AbstractVar, Module
            >>> class Shape(Module):
            ...     sides: AbstractVar[int]
            ...     def describe(self):
            ...         return f"{type(self).__name__} with {self.sides} sides"
            >>> class Square(Shape):
            ...     sides = 4
            >>> Square().describe()
            'Square with 4 sides'
            >>> class Polygon(Shape):
            ...     sides: int
            >>> Polygon(5).describe()
            'Polygon with 5 sides'
            >>> class Regular(Shape):
            ...     def __init__(self, n):
            ...         self.sides = n
            >>> Regular(6).describe()
            'Regular with 6 sides'
            >>> Shape()
            Traceback (most recent call last):
            ...
            TypeError: Can't instantiate abstract class Shape: ...
        """

    class AbstractClassVar(Generic[_T]):
        """Annotation of a class attribute that every concrete subclass must provide.

        `y: AbstractClassVar[int]` on a Module class declares that its concrete subclasses
        have a class attribute `y` of type `int`, so `cls.y` works as well as `self.y`. It is
        not a field. A subclass provides it with a value in its class body: `y = 3` or
        `y: ClassVar[int] = 3` (a bare `y: ClassVar[int]` provides nothing). Annotating it
        as an instance field (`y: int`) is refused when the class is made. Instantiating a
        class that leaves `y` unprovided raises `TypeError` before `__init__` runs.

        The type in brackets (`AbstractClassVar[int]`) is for readers and type checkers;
        it is never checked at runtime.

        Type checkers see it as `typing.ClassVar`. One that does not follow the re-export
        (pyright had that bug, as Equinox notes) understands
        `if TYPE_CHECKING: from typing import ClassVar as AbstractClassVar`.

        Examples:
            >>> from typing import ClassVar
            >>> from pytree_module import AbstractClassVar, Module
            >>> class Activation(Module):
            ...     name: AbstractClassVar[str]
            >>> class Relu(Activation):
            ...     name: ClassVar[str] = "relu"
            >>> Relu.name, Relu().name
            ('relu', 'relu')
            >>> Activation()
            Traceback (most recent call last):
            ...
            TypeError: Can't instantiate abstract class Activation: ...
        """


class Declared(enum.Enum):
    """What one class annotation declares."""

    FIELD = "field"
    CLASS_VAR = "class variable"
    ABSTRACT_VAR = "abstract attribute"
    ABSTRACT_CLASS_VAR = "abstract class attribute"


# A string annotation (`from __future__ import annotations`) is recognised by the name it
# starts with, as `dataclasses` recognises `"ClassVar[int]"`: an optional dotted prefix
# (`pm.AbstractVar[int]`), the name, then `[` if subscripted.
_STRING_HEAD = re.compile(r"\s*(?:\w+\s*\.\s*)*(\w+)\s*(\[)?")
_STRING_NAMES = {
    "AbstractVar": Declared.ABSTRACT_VAR,
    "AbstractClassVar": Declared.ABSTRACT_CLASS_VAR,
    "ClassVar": Declared.CLASS_VAR,
}
_ABSTRACT_KINDS = (Declared.ABSTRACT_VAR, Declared.ABSTRACT_CLASS_VAR)


def declared_kind(name: str, annotation: Any) -> Declared:
    """What the annotation `name: annotation` in a class body declares.

    Raises `TypeError` for `AbstractVar` or `AbstractClassVar` without a type argument.
    """
    if isinstance(annotation, str):
        match = _STRING_HEAD.match(annotation)
        if match is None:
            return Declared.FIELD
        kind = _STRING_NAMES.get(match.group(1), Declared.FIELD)
        subscripted = match.group(2) is not None
    elif annotation is AbstractVar or annotation is AbstractClassVar:
        kind = Declared.ABSTRACT_VAR if annotation is AbstractVar else Declared.ABSTRACT_CLASS_VAR
        subscripted = False
    else:
        origin = get_origin(annotation)
        if annotation is ClassVar or origin is ClassVar:
            return Declared.CLASS_VAR
        if origin is AbstractVar:
            kind = Declared.ABSTRACT_VAR
        elif origin is AbstractClassVar:
            kind = Declared.ABSTRACT_CLASS_VAR
        else:
            return Declared.FIELD
        subscripted = True
    if kind in _ABSTRACT_KINDS and not subscripted:
        spelling = "AbstractVar" if kind is Declared.ABSTRACT_VAR else "AbstractClassVar"
        raise TypeError(
            f"`{name}: {spelling}` needs the attribute's type: write `{name}: {spelling}[T]`, "
            f"e.g. `{name}: {spelling}[int]`."
        )
    return kind


def is_abstract(name: str, annotation: Any) -> bool:
    """Whether `name: annotation` declares an abstract attribute (which is not a field)."""
    return declared_kind(name, annotation) in _ABSTRACT_KINDS


def abstract_attributes(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The `AbstractVar` and the `AbstractClassVar` names that no class of `cls`'s MRO provides.

    Walks the MRO from `object` down, as Equinox does: an abstract annotation declares a
    name, a later field annotation (for `AbstractVar`) or a value in a class body (any
    class attribute, property or method) provides it. Also refuses, with `TypeError`, the
    declarations of `cls` itself that cannot work: a value on an abstract annotation, and an
    instance field for a name that a parent declares `AbstractClassVar`.

    Returns:
        `(abstract_vars, abstract_class_vars)`, each in declaration order.
    """
    # Dicts as ordered sets: the error messages list names in declaration order.
    instance: dict[str, None] = {}
    class_level: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        own_values = vars(klass)
        for name, annotation in inspect.get_annotations(klass).items():
            kind = declared_kind(name, annotation)
            if kind in _ABSTRACT_KINDS:
                if klass is cls and name in own_values:
                    raise _value_on_abstract_error(cls, name, annotation, own_values[name])
                if kind is Declared.ABSTRACT_CLASS_VAR:
                    instance.pop(name, None)
                    class_level[name] = None
                elif name not in class_level:
                    # Below an `AbstractClassVar`, an `AbstractVar` does not weaken it.
                    instance[name] = None
            elif kind is Declared.FIELD:
                if name in class_level and klass is cls:
                    raise _field_for_class_var_error(cls, name, annotation)
                instance.pop(name, None)
            # A `ClassVar[...]` annotation alone provides nothing; its value, below, does.
        for name in own_values:
            instance.pop(name, None)
            class_level.pop(name, None)
    return tuple(instance), tuple(class_level)


def abstract_methods(cls: type) -> frozenset[str]:
    """The names of `cls`'s methods (and properties) still marked `@abc.abstractmethod`.

    The same rule as `abc.update_abstractmethods`, for a class whose metaclass is not
    `ABCMeta`: assigning the result to `cls.__abstractmethods__` makes Python refuse to
    instantiate `cls` while it is not empty, at no cost to other classes.
    """
    names = {
        name for name, value in vars(cls).items() if getattr(value, "__isabstractmethod__", False)
    }
    for base in cls.__bases__:
        for name in getattr(base, "__abstractmethods__", ()):
            if getattr(getattr(cls, name, None), "__isabstractmethod__", False):
                names.add(name)
    return frozenset(names)


# ------------------------------------------------------------------------------- errors


def unprovided_class_vars_error(cls: type, names: tuple[str, ...]) -> TypeError:
    """The error for instantiating `cls`, which leaves the `AbstractClassVar`s `names`."""
    first = names[0]
    return TypeError(
        f"Can't instantiate abstract class {cls.__name__}: it does not provide the abstract "
        f"class attribute(s) {_declarations(cls.__mro__, names)}. A concrete subclass (or "
        f"{cls.__name__} itself) provides each with a value in its class body: "
        f"`{first}: ClassVar[{_type_text(cls, first)}] = ...` or `{first} = ...`."
    )


def refuse_unset_abstract_vars(module: Any, names: tuple[str, ...]) -> None:
    """Raise `TypeError` if `__init__` left any of the `AbstractVar`s `names` unset."""
    values = module.__dict__
    unset = tuple(name for name in names if name not in values)
    if unset:
        cls = type(module)
        first = unset[0]
        raise TypeError(
            f"Can't instantiate abstract class {cls.__name__}: it does not provide the "
            f"abstract attribute(s) {_declarations(cls.__mro__, unset)}, and its __init__ "
            f"did not set them. A concrete subclass (or {cls.__name__} itself) provides each "
            f"as a field (`{first}: {_type_text(cls, first)}`), a class attribute "
            f"(`{first} = ...`), a property, or by assigning `self.{first} = ...` in __init__."
        )


def _declaration(classes: tuple[type, ...], name: str) -> tuple[type, Any] | None:
    """The first of `classes` that declares `name` abstract, and its annotation."""
    for klass in classes:
        annotation = inspect.get_annotations(klass).get(name)
        if annotation is not None and is_abstract(name, annotation):
            return klass, annotation
    return None


def _declarations(classes: tuple[type, ...], names: tuple[str, ...]) -> str:
    """`'x' (declared `x: AbstractVar[int]` in Base), ...` for each name."""
    shown = []
    for name in names:
        found = _declaration(classes, name)
        if found is None:
            shown.append(f"'{name}'")
        else:
            klass, annotation = found
            shown.append(
                f"'{name}' (declared `{name}: {_annotation_text(annotation)}` in "
                f"{klass.__qualname__})"
            )
    return ", ".join(shown)


def _type_text(cls: type, name: str) -> str:
    """The `T` of the most derived abstract declaration of `name` along `cls`'s MRO."""
    found = _declaration(cls.__mro__, name)
    return "..." if found is None else _argument_text(found[1])


def _argument_text(annotation: Any) -> str:
    """`int` for `AbstractVar[int]`, written or as a string."""
    if isinstance(annotation, str):
        return annotation[annotation.index("[") + 1 : annotation.rindex("]")].strip()
    return inspect.formatannotation(get_args(annotation)[0])


def _annotation_text(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return f"{get_origin(annotation).__name__}[{_argument_text(annotation)}]"


def _value_on_abstract_error(cls: type, name: str, annotation: Any, value: Any) -> TypeError:
    text = _annotation_text(annotation)
    inner = _argument_text(annotation)
    return TypeError(
        f"{cls.__qualname__} declares `{name}: {text}` with a value ({value!r}), but an "
        f"abstract attribute has none: subclasses provide it. Either drop the value "
        f"(`{name}: {text}`), or make it concrete here: `{name}: {inner} = ...` for a "
        f"field with a default, `{name}: ClassVar[{inner}] = ...` for a class attribute."
    )


def _field_for_class_var_error(cls: type, name: str, annotation: Any) -> TypeError:
    shown = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return TypeError(
        f"{cls.__qualname__} annotates `{name}: {shown}`, an instance field, but a parent "
        f"class declares {_declarations(cls.__mro__[1:], (name,))}: a class attribute, which "
        f"an instance field cannot provide. Give it a value in the class body instead: "
        f"`{name}: ClassVar[{shown}] = ...` or `{name} = ...`."
    )
