"""Static lists, dicts and sets, frozen when they are assigned to a Module.

A static attribute lives in the module's treedef entry, which JAX and every cache of
compiled functions key on. A list changed in place behind that key would go unseen: the
old program, and the old value in every rebuilt module, would keep coming back. So a
static list becomes a `StaticList` and a dict a `StaticDict` when assigned (after `__init__`
returns, for values given while it runs), recursively, and a set a `frozenset`. They
compare, hash and print by content, are `list`/`dict` instances, and every in-place change
raises an error that names the attribute and says to assign a new value, which the
caches see. Freezing happens on assignment only: unflattening never pays for it.
"""

from collections.abc import Callable
from typing import Any, NoReturn


class _Where:
    """Where a frozen container sits: the class, the attribute, the path inside it."""

    __slots__ = ("attribute", "owner", "path")

    def __init__(self, owner: str, attribute: str, path: str):
        self.owner = owner
        self.attribute = attribute
        self.path = path

    def child(self, key: Any) -> "_Where":
        return _Where(self.owner, self.attribute, f"{self.path}[{key!r}]")

    def refuse(self, kind: str, action: str) -> NoReturn:
        raise TypeError(
            f"{self.owner}.{self.attribute}{self.path} is static (part of the treedef, so "
            f"of the key of every compiled program and cache), so it cannot be changed in "
            f"place (`{action}`): the change would not be seen. Assign a new {kind} "
            f"instead: `module.{self.attribute} = ...` (e.g. `module.{self.attribute} = "
            f"[*module.{self.attribute}, x]` to append), which is seen; or make it data, "
            f"whose values are traced: `module.{self.attribute} = data(...)`."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return _Where, (self.owner, self.attribute, self.path)


def _refusing(kind: str, name: str) -> Callable[..., NoReturn]:
    def refuse(self: Any, /, *args: Any, **kwargs: Any) -> NoReturn:
        self._pm_where.refuse(kind, name)

    refuse.__name__ = name
    return refuse


class StaticList(list):
    """A static list of a Module: a `list` that cannot change in place (see `_frozen`)."""

    __slots__ = ("_pm_where",)

    def __init__(self, items: Any, where: _Where):
        list.__init__(self, items)
        self._pm_where = where

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return StaticList, (list(self), self._pm_where)

    def __copy__(self) -> "StaticList":
        return self


for _name in [
    "__setitem__",
    "__delitem__",
    "__iadd__",
    "__imul__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
]:
    setattr(StaticList, _name, _refusing("list", _name))


class StaticDict(dict):
    """A static dict of a Module: a `dict` that cannot change in place (see `_frozen`)."""

    __slots__ = ("_pm_where",)

    def __init__(self, items: Any, where: _Where):
        dict.__init__(self, items)
        self._pm_where = where

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return StaticDict, (dict(self), self._pm_where)

    def __copy__(self) -> "StaticDict":
        return self


for _name in [
    "__setitem__",
    "__delitem__",
    "__ior__",
    "pop",
    "popitem",
    "clear",
    "update",
    "setdefault",
]:
    setattr(StaticDict, _name, _refusing("dict", _name))
del _name


def freeze_static(value: Any, owner: str, attribute: str) -> Any:
    """`value` with its lists, dicts and sets frozen, for static attribute `attribute`."""
    kind = type(value)
    if kind is not list and kind is not dict and kind is not set:
        return value
    return _freeze(value, _Where(owner, attribute, ""))


def _freeze(value: Any, where: _Where) -> Any:
    kind = type(value)
    if kind is list:
        return StaticList((_freeze(v, where.child(i)) for i, v in enumerate(value)), where)
    if kind is dict:
        return StaticDict(((k, _freeze(v, where.child(k))) for k, v in value.items()), where)
    if kind is set:
        return frozenset(value)
    return value
