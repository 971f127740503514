"""Shardings from Variables' `sharding` metadata: `get_partition_spec`, `get_named_sharding`."""

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_module import Module

from ._split_merge import state
from ._variables import Variable, is_variable


def _spec(leaf: Any) -> Any:
    if isinstance(leaf, Variable):
        axes = leaf.metadata.get("sharding")
        spec = PartitionSpec() if axes is None else PartitionSpec(*axes)
        return leaf.replace(spec)
    if leaf is None:
        return None
    return PartitionSpec()


def get_partition_spec(tree: Any) -> Any:
    """The `PartitionSpec` of every Variable, from its `sharding` metadata.

    A Variable with `sharding=("data", None)` gets `PartitionSpec("data", None)`; one
    without it, and every bare array, gets `PartitionSpec()` (replicated).

    Arguments:
        tree: a State, a Module (its `state` is used), or any pytree holding Variables.

    Returns:
        The same structure (a State for a Module) with each value replaced by its
        `PartitionSpec`; Variables keep their type and metadata, so the result lines up
        with the state for `jax.lax.with_sharding_constraint` or `jax.device_put`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec
        >>> from pytree_graph import Param, State, get_partition_spec
        >>> state = State({"w": Param(jnp.ones((4, 2)), sharding=("data", None))})
        >>> get_partition_spec(state)["w"].value == PartitionSpec("data", None)
        True
    """
    if isinstance(tree, Module):
        tree = state(tree)
    return jax.tree.map(_spec, tree, is_leaf=is_variable)


def get_named_sharding(tree: Any, mesh: Mesh) -> Any:
    """`NamedSharding(mesh, spec)` for every spec `get_partition_spec(tree)` gives.

    Arguments:
        tree: a State, a Module, or any pytree holding Variables.
        mesh: the device mesh whose axis names the `sharding` metadata uses.

    Returns:
        The structure of `get_partition_spec(tree)`, holding `NamedSharding`s.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import Mesh, PartitionSpec
        >>> from pytree_graph import Param, State, get_named_sharding
        >>> mesh = Mesh(jax.devices()[:1], ("data",))
        >>> state = State({"w": Param(jnp.ones(4), sharding=("data",))})
        >>> get_named_sharding(state, mesh)["w"].value.spec == PartitionSpec("data")
        True
    """
    specs = get_partition_spec(tree)
    missing = {
        axis
        for spec in jax.tree.leaves(specs)
        for entry in spec
        for axis in (entry if isinstance(entry, tuple) else (entry,))
        if axis is not None and axis not in mesh.axis_names
    }
    if missing:
        raise ValueError(
            f"get_named_sharding: the `sharding` metadata names mesh axes {sorted(missing)}, "
            f"which the mesh does not have (its axes: {list(mesh.axis_names)}). Use the "
            "mesh's axis names in the Variables' `sharding` metadata."
        )
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
