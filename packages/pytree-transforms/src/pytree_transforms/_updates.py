"""`apply_updates`: add updates to a model, skipping `None`."""

from typing import Any

import jax


def apply_updates(model: Any, updates: Any) -> Any:
    """Return `model + updates` leaf by leaf, leaving leaves whose update is `None` unchanged.

    The companion of optax: `updates` usually comes from `optimizer.update(grads, ...)`, with
    `None` for every leaf that was not trained (non-arrays, frozen parts).

    Arguments:
        model: any pytree.
        updates: a pytree of the same structure with arrays or `None`.

    Returns:
        The updated copy of `model`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import apply_updates
        >>> apply_updates({"w": jnp.ones(2), "act": "relu"}, {"w": jnp.ones(2), "act": None})
        {'act': 'relu', 'w': Array([2., 2.], dtype=float32)}
    """

    def apply(update: Any, leaf: Any) -> Any:
        return leaf if update is None else leaf + update

    try:
        return jax.tree.map(apply, updates, model, is_leaf=lambda x: x is None)
    except ValueError as error:
        raise ValueError(
            f"apply_updates: `updates` must have the structure of `model` (with None for "
            f"leaves that are not updated): {error}"
        ) from None
