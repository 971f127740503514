"""Transformed functions used as methods."""

import functools
from typing import Any


class BindsAsMethod:
    """Base of the transform wrappers: as a class attribute, binds like a function.

    `instance.method(...)` calls the wrapper with the instance as first argument, so the
    instance's arrays are inputs of the transform like any other argument's. Subclasses
    define `__call__` (and may add `__slots__`).

    Examples:
        >>> from pytree_transforms.extend import BindsAsMethod
        >>> class Traced(BindsAsMethod):
        ...     def __init__(self, fun):
        ...         self.fun = fun
        ...     def __call__(self, *args):
        ...         return ("traced", self.fun(*args))
        >>> class Model:
        ...     scale = 3
        ...     @Traced
        ...     def apply(self, x):
        ...         return self.scale * x
        >>> Model().apply(2)
        ('traced', 6)
    """

    __slots__ = ()

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)
