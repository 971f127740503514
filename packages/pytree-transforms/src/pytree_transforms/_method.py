"""Transformed functions used as methods."""

import functools
from typing import Any


class BindsAsMethod:
    """Base of the transform wrappers: as a class attribute, binds like a function.

    `instance.method(...)` calls the wrapper with the instance as first argument, so the
    instance's arrays are inputs of the transform like any other argument's.
    """

    __slots__ = ()

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)
