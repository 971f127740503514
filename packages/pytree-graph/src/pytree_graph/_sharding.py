"""Shardings from Variables' `sharding` metadata: `get_partition_spec`, `get_named_sharding`,
`shard`, which lays a model out on a device mesh, and `create_sharded`, which builds one
there."""

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_module import Module

from ._axis_rules import active_rules, axis_rules
from ._boundary import holds_graph_nodes
from ._jit import jit
from ._split_merge import state, update
from ._state import State
from ._variables import Variable, is_variable, missing_mesh_axes, partition_spec


def spec_of(leaf: Any) -> PartitionSpec:
    """The `PartitionSpec` of one Variable (from its `sharding` metadata, logical names
    mapped by the `axis_rules` in force) or array."""
    return partition_spec(leaf.metadata.get("sharding") if isinstance(leaf, Variable) else None)


def _spec(leaf: Any) -> Any:
    if isinstance(leaf, Variable):
        return leaf.replace(spec_of(leaf))
    if leaf is None:
        return None
    return PartitionSpec()


def get_partition_spec(tree: Any) -> Any:
    """The `PartitionSpec` of every Variable, from its `sharding` metadata.

    A Variable with `sharding=("data", None)` gets `PartitionSpec("data", None)`; one
    without it, and every bare array, gets `PartitionSpec()` (replicated). Logical axis
    names are mapped to mesh axes by the `axis_rules` in force.

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
    missing = {axis for spec in jax.tree.leaves(specs) for axis in missing_mesh_axes(spec, mesh)}
    if missing:
        raise ValueError(
            f"get_named_sharding: the `sharding` metadata names mesh axes {sorted(missing)}, "
            f"which the mesh does not have (its axes: {list(mesh.axis_names)}). Use the "
            "mesh's axis names in the Variables' `sharding` metadata, or map logical names "
            "to them with `pytree_graph.axis_rules`."
        )
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)


def _is_graph(tree: Any) -> bool:
    """Whether `tree` is an object graph to lay out in place (a State is a plain pytree)."""
    return not isinstance(tree, State) and holds_graph_nodes(tree)


def shard(tree: Any, mesh: Mesh) -> Any:
    """Lay out every Variable and array of a model or State on `mesh`, as the Variables'
    `sharding` metadata says (the rest replicated).

    Outside a transform the arrays move (`jax.device_put`); inside one (under
    `pytree_graph.jit`, say) the layout is a constraint on the compiled code
    (`jax.lax.with_sharding_constraint`): use it there to pin the layout of values the
    step computes, e.g. parameters after an optimizer update, instead of leaving it to
    the compiler's sharding propagation.

    Arguments:
        tree: a Module or other object graph (laid out in place: its Variables keep
            their identity), or a State or pytree of arrays (a new one is returned).
        mesh: the device mesh whose axis names the `sharding` metadata uses.

    Returns:
        `tree` itself for an object graph; the laid-out copy for a State or pytree.

    Raises:
        ValueError: the `sharding` metadata names an axis the mesh does not have (nothing
            is moved).

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, shard
        >>> class Dense(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones((4, 8)), sharding=(None, "model"))
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
        >>> dense = shard(Dense(), mesh)
        >>> dense.w.value.sharding.mesh.axis_names
        ('model',)
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"shard: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
    values = state(tree) if _is_graph(tree) else tree
    shardings = get_named_sharding(values, mesh)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(values)):
        placed = jax.lax.with_sharding_constraint(values, shardings)
    else:
        placed = jax.device_put(values, shardings)
    if not _is_graph(tree):
        return placed
    update(tree, placed)
    return tree


def create_sharded(make: Callable[..., Any], mesh: Mesh, *args: Any, **kwargs: Any) -> Any:
    """Build a model directly on a device mesh: `make(*args, **kwargs)`, each array placed
    as its Variable's `sharding` metadata says.

    The model is built inside one compiled function whose outputs are constrained to their
    `NamedSharding`s, so each device computes only its own shard of every parameter: a
    model too large for one device is never gathered on one. Arrays without `sharding`
    metadata are replicated. Building with the same `make` on the same mesh again (with
    arguments of the same structure) reuses the compiled function.

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

    return _build_and_shard(make, mesh, active_rules(), args, kwargs)


@jit
def _build_and_shard(
    make: Callable[..., Any], mesh: Mesh, rules: tuple, args: tuple, kwargs: dict
) -> Any:
    # One compiled function for every call: `make`, `mesh` and the axis rules are static, so
    # building the same model on the same mesh, with the same rules, reuses the compiled code.
    with axis_rules(rules):
        return shard(make(*args, **kwargs), mesh)
