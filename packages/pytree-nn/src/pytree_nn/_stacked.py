"""Stacked layers: several layers of one shape held as one, to run with `jax.lax.scan`."""

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from pytree_graph import Variable

from ._rngs import Rngs

M = TypeVar("M")


def _is_variable(x: Any) -> bool:
    return isinstance(x, Variable)


def map_arrays(fn: Callable[..., jax.Array], *layers: Any) -> Any:
    """A layer like `layers[0]`, whose every array is `fn` of the layers' arrays at its
    place. A Variable's `sharding` gets None for the new leading axis (the layer axis is
    not split over the mesh; each layer's own axes are, as before)."""

    def leaf(first: Any, *rest: Any) -> Any:
        if not _is_variable(first):
            return fn(first, *rest)
        value = fn(first.value, *(variable.value for variable in rest))
        sharding = first.metadata.get("sharding")
        if sharding is None:
            return first.replace(value)
        return first.replace(value, sharding=(None, *sharding))

    return jax.tree.map(leaf, *layers, is_leaf=_is_variable)


def _stack(*values: jax.Array) -> jax.Array:
    return jnp.stack(values)


def _empty_stack(shape: jax.ShapeDtypeStruct) -> jax.Array:
    return jnp.zeros((0, *shape.shape), shape.dtype)


def stack_layers(make_layer: Callable[[Rngs], M], count: int, rngs: Rngs) -> M:
    """`count` layers `make_layer(rngs)`, built one after another, held as one layer of the
    same type whose every Variable and array has a leading axis of length `count`.

    The layers draw their keys from `rngs` in the order that `count` separate layers
    would, so the stacked values are those layers' values. With `count == 0` nothing is
    drawn: the structure comes from tracing `make_layer` with `jax.eval_shape`, and every
    array is empty along the layer axis. The layers must hold arrays only (no `Rngs`) and
    share no Variables.
    """
    if count == 0:
        return map_arrays(_empty_stack, jax.eval_shape(lambda: make_layer(Rngs(0))))
    return map_arrays(_stack, *[make_layer(rngs) for _ in range(count)])
