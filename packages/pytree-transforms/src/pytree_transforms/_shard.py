"""`filter_shard`: place or constrain the arrays of any pytree onto a sharding."""

from typing import Any

import jax

from pytree_filter import combine, is_array, partition

from ._sharing import find_sharing, has_repeats


def filter_shard(x: Any, device_or_shardings: Any) -> Any:
    """Shard the arrays of a pytree, leaving its other leaves alone.

    Outside a transform this moves the arrays (`jax.device_put`); inside `jax.jit` or
    `filter_jit` it constrains their layout (`jax.lax.with_sharding_constraint`), so the
    same call works in both places.

    Arguments:
        x: any pytree.
        device_or_shardings: a `jax.sharding.Sharding` or device for every array, or a
            prefix pytree of them matching `x`.

    Returns:
        `x` with its arrays placed or constrained, an object it holds at several places
        (a tied weight) still one object.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_shard
        >>> device = jax.devices()[0]
        >>> out = filter_shard({"w": jnp.ones(2), "name": "w"}, device)
        >>> out["name"], out["w"].devices() == {device}
        ('w', True)
    """
    arrays, rest = partition(x, is_array)
    leaves = jax.tree.leaves(arrays)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        if isinstance(device_or_shardings, jax.Device):
            raise ValueError(
                "filter_shard inside a transform needs a jax.sharding.Sharding, not a "
                "device: use jax.sharding.SingleDeviceSharding(device) or a NamedSharding."
            )
        arrays = jax.lax.with_sharding_constraint(arrays, device_or_shardings)
    else:
        arrays = jax.device_put(arrays, device_or_shardings)
    return _keep_sharing(x, combine(arrays, rest))


def _keep_sharing(x: Any, out: Any) -> Any:
    """`out`, of the structure of `x`, with each object shared in `x` one object again
    (built from its first place)."""
    leaves, treedef = jax.tree.flatten(x)
    sharing = find_sharing(x, treedef) if has_repeats(leaves) else None
    if sharing is None:
        return out
    return sharing.unflatten(sharing.dedupe(treedef.flatten_up_to(out)))
