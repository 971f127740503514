"""`dataclass`: Flax NNX's decorator: Module fields whose values decide their status."""

import dataclasses
from typing import Any, dataclass_transform

from ._field import field
from ._module import Module
from ._module_info import ModuleInfo
from ._status import data, static

# The options Flax NNX's `dataclass` passes on to `dataclasses.dataclass`, with their defaults.
# A Module class is a dataclass already, with its own `__init__`, identity `==` and repr; only
# the defaults can be honoured.
_OPTIONS = {
    "init": True,
    "eq": True,
    "order": False,
    "unsafe_hash": False,
    "match_args": True,
    "kw_only": False,
    "slots": False,
    "weakref_slot": False,
}


# Type checkers then read the decorated class's fields (and these specifiers) as a dataclass's.
@dataclass_transform(field_specifiers=(dataclasses.field, field, data, static))
def dataclass(cls: type | None = None, /, **options: Any) -> Any:
    """Make a Module class's annotated fields take their status from their values, as NNX's.

    Every Module class is a dataclass already: annotated attributes are fields, taken by a
    generated `__init__`, and are data unless declared static (Equinox's rule). Decorated
    with `dataclass`, a field declared neither way gets its status from its value instead,
    as an attribute set in `__init__` does and as every field of a Flax NNX `nnx.dataclass`
    does: `n: int` holding `3` is static, `w: jax.Array` is data. `data()`, `static()`,
    `field(static=...)` and the `Data[...]` / `Static[...]` annotations still decide where
    given. Subclasses inherit the rule.

    Arguments:
        cls: the Module class (or use `@dataclass()` with options).
        **options: `dataclasses.dataclass`'s options as Flax NNX's `dataclass` takes them;
            only their defaults are accepted (a Module keeps identity `==` and its repr;
            per-field options go to `field`).

    Returns:
        The same class.

    Raises:
        TypeError: `cls` is not a Module class, or an option other than its default.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module, Static, data, dataclass
        >>> @dataclass
        ... class Foo(Module):
        ...     node: jax.Array
        ...     meta: int
        ...     forced: int = data(default=6)
        ...     marked: Static[jax.Array | None] = None
        >>> jax.tree.leaves(Foo(node=jnp.array(1), meta=1))
        [Array(1, dtype=int32, weak_type=True), 6]
    """
    for name, value in options.items():
        if name not in _OPTIONS:
            raise TypeError(f"dataclass() got an unexpected option {name}={value!r}.")
        if value != _OPTIONS[name]:
            raise TypeError(
                f"dataclass({name}={value!r}): a Module class is a dataclass already, with its "
                f"own __init__, identity == and repr, so only {name}={_OPTIONS[name]!r} is "
                "possible. Per-field options (kw_only, init, default) go to "
                "`field(...)`, `data(...)` or `static(...)`."
            )
    if cls is None:
        return lambda cls: dataclass(cls)
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise TypeError(
            f"dataclass decorates Module classes, got {cls!r}. For any other class use "
            "`dataclasses.dataclass`."
        )
    info = cls.__module_info__
    cls.__module_info__ = ModuleInfo.of(
        cls,
        frozen=info.frozen,
        pytree=info.pytree,
        custom_init=info.custom_init,
        infer_fields=True,
    )
    return cls
