"""`check_module`: run a Module's structure checks on demand."""

from typing import Any

from ._module import Module, canonical_order, repr_items
from ._status import StatusWrapper, check_static_value, contains_wrapper


def check_module(module: Module) -> None:
    """Check a Module and every Module inside it, raising `ValueError` on the first problem.

    The same rules run when `__init__` returns and on assignment (static lists and dicts
    are frozen then, so they cannot change in place); this catches what slipped past
    them, such as a value written straight into a Module's `__dict__`.
    Checked: static values hold no arrays and are hashable; no `data(...)`/`static(...)`
    wrapper sits inside a container; every attribute has a known status.

    Arguments:
        module: the Module to check.

    Returns:
        None. Raises `ValueError` naming the path of the offending attribute.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module, check_module, static
        >>> class Foo(Module):
        ...     def __init__(self):
        ...         self.shapes = static([1, 2])
        >>> foo = Foo()
        >>> foo.__dict__["shapes"] = [jnp.ones(3)]  # behind the Module's back
        >>> check_module(foo)
        Traceback (most recent call last):
        ...
        ValueError: Attribute 'shapes' of Foo (at .shapes) is static but its value holds arrays: ...
    """
    if not isinstance(module, Module):
        raise TypeError(f"check_module expects a Module, got {type(module).__name__}.")
    _check(module, "", set())


def _check(value: Any, path: str, seen: set[int]) -> None:
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Module):
        _check_module_attributes(value, path, seen)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check(v, f"{path}[{k!r}]", seen)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]", seen)


def _check_module_attributes(module: Module, path: str, seen: set[int]) -> None:
    cls = type(module)
    if not cls.__module_info__.pytree:
        for name, value in repr_items(module):
            _check(value, f"{path}.{name}", seen)
        return
    layout = module._pm_flat[1].layout
    values = module.__dict__
    known = set(layout.data_keys) | set(layout.static_keys)
    if any(a is not b for a, b in zip(module._pm_flat[0], layout.get_data(values), strict=True)):
        raise ValueError(
            f"The leaves of {cls.__name__} (at {path or 'the top'}) are out of step with its "
            "attributes: an attribute was changed without going through assignment "
            "(e.g. via __dict__ or object.__setattr__). Assign attributes normally."
        )
    for name in canonical_order(cls, values):
        here = f"{path}.{name}"
        value = values[name]
        if name not in known:
            raise ValueError(
                f"Attribute '{name}' of {cls.__name__} (at {here}) has no status: it was "
                "set without going through assignment (e.g. via __dict__). Assign it "
                "normally, or wrapped in data(...)/static(...)."
            )
        if isinstance(value, StatusWrapper) or contains_wrapper(value):
            raise ValueError(
                f"Attribute '{name}' of {cls.__name__} (at {here}) holds a "
                "data(...)/static(...) wrapper. Wrappers must be the assigned value "
                "itself, never inside a container."
            )
        if name in layout.static_keys:
            check_static_value(
                value,
                lambda name=name, here=here: f"Attribute '{name}' of {cls.__name__} (at {here})",
            )
        else:
            _check(value, here, seen)
