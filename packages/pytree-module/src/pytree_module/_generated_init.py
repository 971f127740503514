"""How a generated `__init__` presents itself: converter-aware annotations, inherited docstring.

`dataclasses` writes the generated `__init__`; this adjusts what `inspect.signature`,
`help()` and type checkers reading `__init__.__annotations__` see, as Equinox does:

* a field declared `field(converter=f)` accepts whatever `f` accepts, so its parameter is
  annotated with the type of `f`'s first parameter (`Any` when `f` has none to read);
* a class whose `__init__` is generated again only because it subclasses one with a generated
  `__init__` keeps the docstring of the `__init__` it replaces, so a docstring set on a
  parent's generated `__init__` (`Parent.__init__.__doc__ = "..."`) carries on.
"""

import inspect
from collections.abc import Callable
from typing import Any


def converter_input_type(converter: Callable[[Any], Any]) -> Any:
    """The annotation of `converter`'s first parameter, or `Any` if it has none to read."""
    try:
        parameters = list(inspect.signature(converter).parameters.values())
    except (TypeError, ValueError):
        # Builtins such as `int` or `str` have no signature to read.
        return Any
    if not parameters or parameters[0].annotation is inspect.Parameter.empty:
        return Any
    return parameters[0].annotation


def present_generated_init(
    cls: type,
    converters: tuple[tuple[str, Callable[[Any], Any]], ...],
    inherited_doc: str | None,
) -> None:
    """Annotate `cls.__init__`'s converted parameters, and give it `inherited_doc` if any.

    `cls.__init__` must be the one `dataclasses` just generated for `cls`. Fields with
    `init=False` have no parameter and are left alone.
    """
    init = cls.__init__
    annotations = init.__annotations__
    for name, converter in converters:
        if name in annotations:
            annotations[name] = converter_input_type(converter)
    if inherited_doc is not None:
        init.__doc__ = inherited_doc
