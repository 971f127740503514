"""Shardings from Variables' `sharding` metadata: `get_partition_spec`, `get_named_sharding`,
and `create_sharded`, which builds a model directly on a device mesh."""

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_module import Module

from ._jit import jit
from ._split_merge import state, update
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


def create_sharded(make: Callable[..., Any], mesh: Mesh, *args: Any, **kwargs: Any) -> Any:
    """Build a model directly on a device mesh: `make(*args, **kwargs)`, each array placed
    as its Variable's `sharding` metadata says.

    The model is built inside one compiled function whose outputs are constrained to their
    `NamedSharding`s, so each device computes only its own shard of every parameter: a
    model too large for one device is never gathered on one. Arrays without `sharding`
    metadata are replicated.

    Arguments:
        make: builds the model (a Module class, or any function returning a graph of
            Modules and Variables). It runs under `pytree_graph.jit`: pass an `Rngs` as an
            argument, and it advances as if `make` had run eagerly.
        mesh: the device mesh whose axis names the `sharding` metadata uses.
        *args: `make`'s positional arguments.
        **kwargs: its keyword arguments.

    Returns:
        The model, with arrays laid out on `mesh`.

    Raises:
        ValueError: the `sharding` metadata names an axis the mesh does not have.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, create_sharded
        >>> class Dense(Module):
        ...     def __init__(self, key):
        ...         w = jax.random.normal(key, (4, 8))
        ...         self.w = Param(w, sharding=(None, "model"))
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
        >>> dense = create_sharded(Dense, mesh, jax.random.key(0))
        >>> columns = NamedSharding(mesh, PartitionSpec(None, "model"))
        >>> dense.w.value.sharding.is_equivalent_to(columns, 2)
        True
    """
    if isinstance(make, Mesh) or not callable(make):
        raise TypeError(
            f"create_sharded takes the function that builds the model first, got "
            f"{type(make).__name__}: create_sharded(Model, mesh, *args) builds "
            "Model(*args) on the mesh."
        )
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"create_sharded: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}."
        )

    def build(*args: Any, **kwargs: Any) -> Any:
        model = make(*args, **kwargs)
        values = state(model)
        update(model, jax.lax.with_sharding_constraint(values, get_named_sharding(values, mesh)))
        return model

    return jit(build)(*args, **kwargs)
