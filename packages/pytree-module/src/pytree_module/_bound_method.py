"""Bound methods of Modules are pytrees whose only child is the instance."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax


class BoundMethod:
    """`module.method`: a callable pytree with the module as its only child.

    Because the instance is a child, `filter_jit(module.method)` traces the module's arrays
    instead of baking them in. It hashes and compares by (function, instance identity).

    Arguments:
        func: the function, called as `func(instance, *args, **kwargs)`.
        instance: the object it is bound to, the pytree child.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_module.extend import BoundMethod
        >>> class Scale(Module):
        ...     factor: jnp.ndarray
        ...     def __call__(self, x):
        ...         return self.factor * x
        >>> scale = Scale(jnp.ones(2))
        >>> call = BoundMethod(type(scale).__call__, scale)
        >>> jax.tree.leaves(call)
        [Array([1., 1.], dtype=float32)]
        >>> call(2.0)
        Array([2., 2.], dtype=float32)
    """

    __slots__ = ("__func__", "__self__", "__weakref__")

    def __init__(self, func: Callable[..., Any], instance: Any):
        self.__func__ = func
        self.__self__ = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def __hash__(self) -> int:
        return hash((self.__func__, id(self.__self__)))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is BoundMethod
            and self.__func__ is other.__func__
            and self.__self__ is other.__self__
        )

    @property
    def __name__(self) -> str:
        return self.__func__.__name__

    @property
    def __signature__(self) -> inspect.Signature:
        signature = inspect.signature(self.__func__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])

    def __repr__(self) -> str:
        return f"<bound method {self.__func__.__qualname__} of {type(self.__self__).__name__}>"


jax.tree_util.register_pytree_with_keys(
    BoundMethod,
    lambda m: (((jax.tree_util.GetAttrKey("__self__"), m.__self__),), m.__func__),
    lambda func, children: BoundMethod(func, children[0]),
    flatten_func=lambda m: ((m.__self__,), m.__func__),
)


class MethodDescriptor:
    """Class attribute standing in for a method: instance access returns a `BoundMethod`."""

    def __init__(self, func: Callable[..., Any]):
        self.__func__ = func
        functools.update_wrapper(self, func)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.__func__
        return BoundMethod(self.__func__, instance)

    def __set_name__(self, owner: type, name: str) -> None:
        set_name = getattr(self.__func__, "__set_name__", None)
        if set_name is not None:
            set_name(owner, name)
