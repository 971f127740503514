"""`apply_updates`: add updates to a model, skipping `None`."""

from collections.abc import Callable
from typing import Any

import jax

from ._sharing import Sharing, find_sharing, has_repeats, selected_once


def apply_updates(model: Any, updates: Any) -> Any:
    """Return `model + updates` leaf by leaf, leaving leaves whose update is `None` unchanged.

    The companion of optax: `updates` usually comes from `optimizer.update(grads, ...)`, with
    `None` for every leaf that was not trained (non-arrays, frozen parts).

    Arguments:
        model: any pytree.
        updates: a pytree of the same structure with arrays or `None`.

    Returns:
        The updated copy of `model`. An object reached by several paths of `model` (a tied
        weight) is updated once, with the update at its first place (`filter_grad` puts the
        same summed gradient at every place, so optax gives the same update at each), and
        the copy holds one new object at all its places.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import apply_updates
        >>> apply_updates({"w": jnp.ones(2), "act": "relu"}, {"w": jnp.ones(2), "act": None})
        {'act': 'relu', 'w': Array([2., 2.], dtype=float32)}
    """

    def apply(update: Any, leaf: Any) -> Any:
        return leaf if update is None else leaf + update

    leaves, treedef = jax.tree.flatten(model)
    if has_repeats(leaves):
        sharing = find_sharing(model, treedef)
        if sharing is not None:
            return _apply_shared(model, updates, leaves, sharing, apply)
    try:
        return jax.tree.map(apply, updates, model, is_leaf=lambda x: x is None)
    except ValueError as error:
        raise _structure_error(error) from None


def _apply_shared(
    model: Any, updates: Any, leaves: list[Any], sharing: Sharing, apply: Callable[..., Any]
) -> Any:
    """Update each shared object once, and put the one new object at all its places."""
    try:
        update_leaves = sharing.treedef.flatten_up_to(updates)
    except (TypeError, ValueError) as error:
        raise _structure_error(error) from None
    selected_once(sharing, model, [u is not None for u in update_leaves], "updated")
    new = map(apply, sharing.dedupe(update_leaves), sharing.dedupe(leaves))
    return sharing.unflatten(list(new))


def _structure_error(error: Exception) -> ValueError:
    return ValueError(
        "apply_updates: `updates` must have the structure of `model` (with None for leaves "
        f"that are not updated): {error}"
    )
