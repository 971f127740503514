"""Eager random draws that XLA compiles in a fraction of the time, with the same values.

A layer draws its parameters op by op when it is built outside `jit`, and JAX compiles each
draw (`jax.random.truncated_normal`, `normal`, `uniform`, `bernoulli`) for its shape. On CPU,
XLA takes seconds to compile the threefry hash over a shape with several small axes (a
(3, 3, 8, 16) convolution kernel: about 3 s, against 0.2 s for the same 1152 numbers drawn
flat), so building a convolutional network or a transformer eagerly spent most of its time
compiling random number generators.

Threefry's bits do not depend on the shape they are drawn in, only on each element's
row-major position (both with and without `jax_threefry_partitionable`), and the samplers
transform bits element by element: drawing flat and reshaping gives the same array, bit for
bit. `flat_when_eager(key)` gives a key whose impl does exactly that, for an initializer to
draw from. Under a trace the key is returned as it is: in a compiled program (e.g.
`pytree_graph.create_sharded`) a draw in its own shape lets XLA generate each shard where it
lives, which a flat draw would not. `drawing_flat()` makes traced keys draw flat too, for a
compiled program that builds a model on one device (`build`), where the same cost would be
paid by compiling the program.
"""

import contextlib
import contextvars
import math
from collections.abc import Iterator

import jax
import jax.extend.random as jax_random

_THREEFRY = jax_random.threefry_prng_impl


def _flat_random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    # Same bits as threefry's own: the shape enters only through each element's flat index.
    return _THREEFRY.random_bits(key, bit_width, (math.prod(shape),)).reshape(shape)


# Threefry in all but how its bits are laid out. Its name says what it is in reprs.
FLAT_THREEFRY = jax_random.define_prng_impl(
    key_shape=_THREEFRY.key_shape,
    seed=_THREEFRY.seed,
    split=_THREEFRY.split,
    random_bits=_flat_random_bits,
    fold_in=_THREEFRY.fold_in,
    name="threefry2x32 (drawn flat)",
    tag="fry_flat",
)


_FLAT_WHEN_TRACED = contextvars.ContextVar("pytree_nn_flat_when_traced", default=False)


@contextlib.contextmanager
def drawing_flat() -> Iterator[None]:
    """Within: traced threefry keys draw flat as well (read while a program is traced)."""
    token = _FLAT_WHEN_TRACED.set(True)
    try:
        yield
    finally:
        _FLAT_WHEN_TRACED.reset(token)


def flat_when_eager(key: jax.Array) -> jax.Array:
    """`key`, drawing flat (so compiling fast) when it is a concrete threefry key, or a
    traced one within `drawing_flat()`.

    Every draw from the returned key equals the draw from `key`, bit for bit. Keys of other
    impls (`rbg`, custom ones), raw `uint32` keys and other traced keys are returned
    unchanged.
    """
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if isinstance(key, jax.core.Tracer) and not _FLAT_WHEN_TRACED.get():
        return key
    if str(jax.random.key_impl(key)) != _THREEFRY.name:
        return key
    return jax.random.wrap_key_data(jax.random.key_data(key), impl=FLAT_THREEFRY)
