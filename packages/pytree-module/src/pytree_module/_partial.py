"""`Partial`: `functools.partial` as a Module, so its arguments are pytree leaves."""

from collections.abc import Callable
from typing import Any

from ._module import Module
from ._status import data


class Partial(Module):
    """A pytree version of `functools.partial`.

    The bound arguments are always children, so arrays among them are traced and
    differentiated like any other leaves. The function's status is inferred: a Module or
    bound method is data (its arrays are leaves too), a plain function is static, so
    `jax.jit` and `jax.grad` accept a `Partial` directly.

    Arguments:
        fn: the callable to wrap.
        *args: leading positional arguments to bind.
        **kwargs: keyword arguments to bind.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Partial
        >>> add = Partial(jnp.add, jnp.ones(2))
        >>> add(jnp.ones(2))
        Array([2., 2.], dtype=float32)
        >>> jax.tree.leaves(add)[-1]
        Array([1., 1.], dtype=float32)
    """

    def __init__(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any):
        if not callable(fn):
            raise TypeError(f"Partial(fn, ...) expects a callable first argument, got {fn!r}.")
        self.func = fn
        self.args = data(args)
        self.keywords = data(kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*self.args, *args, **self.keywords, **kwargs)
