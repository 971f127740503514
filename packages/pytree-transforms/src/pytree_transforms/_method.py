"""Transformed functions used as methods."""

import functools
import types
from typing import Any

import jax

from pytree_module import Module
from pytree_module.extend import BoundMethod

from ._static_key import static_key


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


class ComparedByOptions(BindsAsMethod):
    """Base of the transform wrappers that compare (and hash) equal when made around equal
    functions with equal options, so that `filter_jit(filter_vmap(f))` built again, in a
    loop say, finds the compilations of the first instead of tracing again.

    Subclasses define `_key()`: a tuple of the wrapped function and a key of the options
    (their `static_key`, so `1`, `1.0` and `True` are different options). A wrapper whose
    options cannot be hashed cannot be hashed either, and is found again by no cache.
    """

    __slots__ = ()

    def _key(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._key())


def options_key(options: Any) -> Any:
    """The key of a wrapper's options, for `ComparedByOptions._key` and `register_wrapper`:
    their `static_key`, or where they cannot be hashed a token of their own, so that the
    wrapper compares equal to itself and its rebuilt copies only."""
    key = static_key(options)
    try:
        hash(key)
    except TypeError:
        return object()
    return key


def method_as_pytree(fun: Any) -> Any:
    """`fun`, where it is a method bound by Python to a pytree, as a pytree bound method.

    A Module's methods are pytrees whose child is the Module (`m.method`), so a transform
    of one gets the Module as an input. Python binds special methods itself, though:
    `m.__call__` is a `types.MethodType`, a leaf for JAX, as is any method of another
    pytree class. Held as a leaf, its object would be fixed: `filter_jit` would compile its
    arrays in as constants, and later writes to it would not be seen. So such a method is
    rebuilt as a `BoundMethod`, with the object as its child. (A `pytree=False` Module's
    method is rebuilt too, so that the transform refuses the Module with its usual error.)
    """
    if type(fun) is types.MethodType:
        instance = fun.__self__
        if isinstance(instance, Module) or not is_pytree_leaf(instance):
            return BoundMethod(fun.__func__, instance)
    return fun


def is_pytree_leaf(value: Any) -> bool:
    """Whether JAX takes `value` as a leaf (no registered node type), looking one level down
    only, at no cost growing with the value's size."""
    return _flatten_one_level(value) is None


_flatten_one_level = jax.tree_util.default_registry.flatten_one_level


def register_wrapper(cls: type) -> type:
    """Register a transform's wrapper class as a pytree whose child is the wrapped function,
    where that function is a pytree (a Module, a bound method of one).

    Then a transform of the wrapper (`filter_jit(filter_grad(model.loss))`) gets the Module
    as an input, as it would for `model.loss` itself, instead of compiling its arrays in as
    constants. A wrapper of a plain function has no children: it is its own static part.

    `cls` has the function as `_fun`, a method `_options()` returning `(key, arguments)`:
    a hashable key of its options (equal for wrappers that behave alike) and the arguments
    other than the function that rebuild it, and a classmethod `_rebuild(arguments, fun)`.
    """

    def flatten(wrapper: Any) -> tuple[tuple[Any, ...], Any]:
        if is_pytree_leaf(wrapper._fun):
            return (), wrapper
        key, arguments = wrapper._options()
        return (wrapper._fun,), _Shell(cls, key, arguments)

    def unflatten(aux: Any, children: tuple[Any, ...]) -> Any:
        if type(aux) is _Shell:
            return cls._rebuild(aux.arguments, children[0])
        return aux

    jax.tree_util.register_pytree_node(cls, flatten, unflatten)
    return cls


class _Shell:
    """The static part of a wrapper whose function is a pytree: its class and options."""

    __slots__ = ("arguments", "cls", "key")

    def __init__(self, cls: type, key: Any, arguments: tuple[Any, ...]):
        self.cls = cls
        self.key = key
        self.arguments = arguments

    def __eq__(self, other: object) -> bool:
        return type(other) is _Shell and self.cls is other.cls and self.key == other.key

    def __hash__(self) -> int:
        return hash((self.cls, self.key))
