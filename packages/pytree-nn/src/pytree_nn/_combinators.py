"""Combining layers: `Sequential`, `Lambda` and the placeholder `Identity`."""

from collections.abc import Callable
from typing import Any

from ._module import Module
from ._stateful import State, takes_state


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

    Called with a `State` as well (Equinox's `y, state = seq(x, state)`), it passes the
    State through its stateful layers (`BatchNorm`, `SpectralNorm`, a nested `Sequential`
    holding one, or any layer whose `is_stateful()` returns True, as Equinox's
    `StatefulLayer`s), each called `x, state = layer(x, state)`, and returns `(y, state)`.

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

    def __call__(self, x: Any, state: State | None = None) -> Any:
        """Apply every layer in turn.

        Arguments:
            x: the input of the first layer.
            state: None, or a `State` to pass through the stateful layers.

        Returns:
            The last layer's output; with a `state`, the pair `(output, new_state)`.
        """
        if state is None:
            for layer in self.layers:
                x = layer(x)
            return x
        if not isinstance(state, State):
            raise TypeError(
                "Sequential: the second argument is the State of Equinox-style state "
                f"passing (`y, state = seq(x, state)`), got {type(state).__name__}."
            )
        for layer in self.layers:
            if takes_state(layer):
                x, state = layer(x, state)
            else:
                x = layer(x)
        return x, state

    def is_stateful(self) -> bool:
        """Whether a layer of it takes a `State` (see `make_with_state`)."""
        return any(takes_state(layer) for layer in self.layers)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)
