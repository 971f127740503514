"""Combining layers: `Sequential`, `Lambda` and the placeholder `Identity`."""

from collections.abc import Callable
from typing import Any

from ._module import Module


class Lambda(Module):
    """A function as a layer (e.g. an activation in a `Sequential`).

    Arguments:
        fn: the function; it is static (part of the structure, not a parameter).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_nn import Lambda
        >>> Lambda(jax.nn.relu)(jnp.array([-1.0, 2.0])).tolist()
        [0.0, 2.0]
    """

    def __init__(self, fn: Callable[..., Any]):
        if not callable(fn):
            raise TypeError(f"Lambda expects a callable, got {type(fn).__name__}: {fn!r}.")
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function."""
        return self.fn(*args, **kwargs)


class Identity(Module):
    """A layer that returns its input unchanged: a placeholder for an optional layer.

    It has no parameters. Constructor arguments are accepted and ignored, so it can stand
    in where another layer's arguments are passed (as Equinox's `eqx.nn.Identity` does);
    so are keyword arguments of the call, such as Equinox's `key=`.

    Arguments:
        *args: ignored.
        **kwargs: ignored.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Identity
        >>> Identity(3, 4, rngs=0)(jnp.array([1.0, 2.0]), key=None).tolist()
        [1.0, 2.0]
    """

    def __init__(self, *args: Any, **kwargs: Any):
        del args, kwargs

    def __call__(self, x: Any, **ignored: Any) -> Any:
        """Return `x`, of any type, unchanged; keyword arguments are ignored."""
        return x


class Sequential(Module):
    """Layers applied one after the other; modules and bare callables alike.

    Arguments:
        *layers: the layers, each called with the previous one's output.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_nn import Linear, Sequential
        >>> net = Sequential(Linear(2, 4, rngs=0), jax.nn.relu, Linear(4, 1, rngs=1))
        >>> net(jnp.ones((3, 2))).shape
        (3, 1)
    """

    def __init__(self, *layers: Callable[..., Any]):
        for i, layer in enumerate(layers):
            if not callable(layer):
                raise TypeError(
                    f"Sequential: layer {i} is a {type(layer).__name__}, which cannot be "
                    "called. Pass Modules or functions."
                )
        self.layers = tuple(layers)

    def __call__(self, x: Any) -> Any:
        """Apply every layer in turn."""
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)
