"""`Dropout`."""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pytree_module import data

from ._flat_draws import flat_when_eager
from ._module import Module
from ._rngs import as_rngs, forked_rngs


def drop(
    key: jax.Array, x: jax.Array, rate: float, broadcast_dims: Sequence[int] = ()
) -> jax.Array:
    """`x` with elements zeroed with probability `rate`, the rest scaled by `1 / (1 - rate)`.

    One mask is shared along `broadcast_dims`. `Dropout` and attention dropout both use it,
    so the two draw the same masks from the same key.
    """
    if rate == 1.0:
        return jnp.zeros_like(x)
    shape = list(jnp.shape(x))
    for axis in broadcast_dims:
        shape[axis] = 1
    keep = 1.0 - rate
    mask = jax.random.bernoulli(flat_when_eager(key), keep, tuple(shape))
    return jnp.where(mask, x / keep, jnp.zeros_like(x))


class Dropout(Module):
    """Randomly zero a fraction `rate` of the inputs in training, scaling the rest.

    In training mode (the default; see `Module.train`/`eval`) each element is kept with
    probability `1 - rate` and divided by it, so expectations are unchanged; in
    evaluation mode (`deterministic=True`) the input passes through.

    Keys come from a stream of the layer's own, forked at construction from the
    `rng_collection` stream of `rngs` (as Flax NNX's `Dropout` does): `rngs` advances by
    one key, and the layer keeps an `Rngs` whose default stream is the fork (at
    `.rngs.default`; its counter advances at each mask drawn). Two layers built from
    one `Rngs` so draw different masks, and every way of running the model
    (`pytree_graph.jit`, `filter_jit`, `jax.jit`, no jit) draws the same ones. An `rngs=`
    given to a call is used instead, from its `rng_collection` stream.

    Arguments:
        rate: the probability of dropping an element, in [0, 1].
        broadcast_dims: axes along which the same mask is used (e.g. drop whole channels).
        deterministic: start in evaluation mode.
        rng_collection: the name of the `Rngs` stream to draw from.
        rngs: an `Rngs`, an `RngStream`, a PRNG key or an int seed to fork the layer's
            stream from (or None: pass `rngs=` to each call).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Dropout, Rngs
        >>> dropout = Dropout(0.5, rngs=Rngs(0))
        >>> y = dropout(jnp.ones(1000))
        >>> set(y.tolist()) == {0.0, 2.0}
        True
        >>> dropout.eval()(jnp.ones(3)).tolist()
        [1.0, 1.0, 1.0]
        >>> rngs = Rngs(0)
        >>> first, second = Dropout(0.5, rngs=rngs), Dropout(0.5, rngs=rngs)
        >>> bool((first(jnp.ones(8)) == second(jnp.ones(8))).all())  # streams of their own
        False
    """

    def __init__(
        self,
        rate: float,
        *,
        broadcast_dims: tuple[int, ...] = (),
        deterministic: bool = False,
        rng_collection: str = "dropout",
        rngs: Any = None,
    ):
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ValueError(f"Dropout: rate must be a number in [0, 1], got {rate!r}.")
        self.rate = float(rate)
        self.broadcast_dims = tuple(broadcast_dims)
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        self.rngs = data(None if rngs is None else forked_rngs(rngs, rng_collection, "Dropout"))

    def set_view(self, deterministic: bool | None = None) -> None:
        """What `pytree_graph.view` (and `view_info`) set on a Dropout layer.

        Arguments:
            deterministic: if True, disables dropout masking.
        """
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(
        self,
        x: jax.Array,
        *,
        deterministic: bool | None = None,
        rngs: Any = None,
        key: Any = None,
    ) -> jax.Array:
        """Apply dropout to `x`.

        Arguments:
            x: the input.
            deterministic: override the layer's mode for this call.
            rngs: keys for this call (an `Rngs`, `RngStream`, key or seed) instead of the
                layer's own stream.
            key: refused with a TypeError that says to pass `rngs=` (Equinox's `Dropout`
                takes its key as `key=`).
        """
        if key is not None:
            raise TypeError(
                "Dropout takes the keys for a call as rngs=..., not key=... (Equinox's "
                "name): dropout(x, rngs=key) with a PRNG key, an Rngs or a seed; or no "
                "argument, to draw from the layer's own stream."
            )
        if deterministic is None:
            deterministic = self.deterministic
        if deterministic or self.rate == 0.0:
            return x
        if self.rate == 1.0:
            # Everything is dropped: no keys needed.
            return jnp.zeros_like(x)
        rngs = self.rngs if rngs is None else as_rngs(rngs, "Dropout")
        if rngs is None:
            raise ValueError(
                "Dropout needs random keys in training mode: build it with rngs=..., pass "
                "rngs=... to the call, or switch to evaluation mode with `.eval()` (or "
                "deterministic=True)."
            )
        key = getattr(rngs, self.rng_collection)()
        return drop(key, x, self.rate, self.broadcast_dims)
