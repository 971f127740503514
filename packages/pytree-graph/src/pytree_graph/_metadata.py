"""Metadata given along the way: initializers whose output carries metadata for its Variable
(`with_metadata`, `with_partitioning`), and `set_metadata` over a whole graph."""

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from jax.sharding import Mesh, PartitionSpec

from pytree_filter import to_predicate

from ._traverse import iter_graph
from ._variables import Variable, VariableMetadata, _guard, canonical_metadata

F = TypeVar("F", bound=Callable[..., Any])


def _check_metadata(where: str, metadata: dict[str, Any]) -> None:
    """Refuse names a Variable cannot take and unhashable values, before anything changes."""
    for name, value in metadata.items():
        if name.startswith("_") or name == "value":
            raise ValueError(
                f"{where}: invalid metadata name {name!r}: names must not start with `_`, "
                "and `value` is the value itself."
            )
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"{where}: metadata {name!r} must be hashable (it is part of the pytree "
                f"structure), but {type(value).__name__} is not. Use a tuple instead of a "
                "list, or a frozen value."
            ) from None


def with_metadata(initializer: F, **metadata: Any) -> F:
    """An initializer that gives its output's Variable `metadata`, as Flax NNX's
    `nnx.with_metadata`.

    The new initializer is called like `initializer` (`init(key, shape, dtype)`) and
    returns its output in a `VariableMetadata`; a layer that wraps the output in a `Param`,
    as `pytree_nn.Linear` does with its `kernel_init`, gets a Param with the metadata.

    Arguments:
        initializer: any initializer.
        **metadata: hashable metadata for the Variable.

    Returns:
        The initializer (its name and docstring those of `initializer`).

    Examples:
        >>> import jax
        >>> from jax.nn.initializers import ones
        >>> from pytree_graph import Param, with_metadata
        >>> init = with_metadata(ones, tag="frozen")
        >>> Param(init(jax.random.key(0), (2,))).tag
        'frozen'
    """
    if not callable(initializer):
        raise TypeError(
            f"with_metadata takes the initializer first, got {type(initializer).__name__}: "
            "with_metadata(init, name=value, ...)."
        )
    _check_metadata("with_metadata", metadata)

    @functools.wraps(initializer)
    def initialize(*args: Any, **kwargs: Any) -> VariableMetadata:
        return VariableMetadata(initializer(*args, **kwargs), **metadata)

    return initialize  # type: ignore[return-value]


def with_partitioning(
    initializer: F, sharding: Any, mesh: Mesh | None = None, **metadata: Any
) -> F:
    """An initializer whose output's Variable gets `sharding` metadata (and, with `mesh`, is
    laid out on the mesh when it is made), as Flax NNX's `nnx.with_partitioning`.

    The same as `with_metadata(initializer, sharding=sharding, mesh=mesh, **metadata)`:
    `sharding` names a mesh axis (or a logical name that `axis_rules` maps, or None) for
    each dimension. Without `mesh` the array stays where it is made, and `shard`,
    `create_sharded` or `jit` shardings place it later.

    Arguments:
        initializer: any initializer.
        sharding: a tuple with an entry per dimension (or a `PartitionSpec`).
        mesh: a `jax.sharding.Mesh`: the Variable's value is laid out on it when made.
        **metadata: more metadata for the Variable.

    Returns:
        The initializer.

    Examples:
        >>> import jax
        >>> from jax.nn.initializers import lecun_normal
        >>> from pytree_graph import Param, with_partitioning
        >>> init = with_partitioning(lecun_normal(), (None, "model"))
        >>> kernel = Param(init(jax.random.key(0), (4, 8)))  # as a layer does
        >>> kernel.sharding, kernel.shape
        ((None, 'model'), (4, 8))
    """
    if isinstance(sharding, list):
        sharding = tuple(sharding)
    if not isinstance(sharding, tuple | PartitionSpec):
        raise TypeError(
            f"with_partitioning: sharding must be a tuple with an entry per dimension (a "
            f"mesh axis name, a tuple of them, or None), got {sharding!r}. For example "
            "with_partitioning(init, (None, 'model'))."
        )
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(
            f"with_partitioning: mesh must be a jax.sharding.Mesh or None, got "
            f"{type(mesh).__name__}."
        )
    placement = {"sharding": sharding} if mesh is None else {"sharding": sharding, "mesh": mesh}
    return with_metadata(initializer, **placement, **metadata)


def set_metadata(node: Any, /, *, only: Any = Variable, **metadata: Any) -> None:
    """Set metadata on every Variable of a graph that `only` selects, in place, as Flax
    NNX's `nnx.set_metadata`.

    Each selected Variable keeps its other metadata. Nothing moves: setting `sharding`
    or `mesh` this way changes metadata only (use `shard` to lay the arrays out). On an
    error no Variable is changed.

    Arguments:
        node: a Module, or any graph of Modules and Variables.
        only: a filter of the Variables to change (by default, all of them); it sees each
            Variable with its path.
        **metadata: the entries to set.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import BatchStat, Param, set_metadata
        >>> class Norm(Module):
        ...     def __init__(self):
        ...         self.scale = Param(jnp.ones(2))
        ...         self.mean = BatchStat(jnp.zeros(2))
        >>> norm = Norm()
        >>> set_metadata(norm, frozen=True, only=Param)
        >>> norm.scale.frozen, norm.mean.get_metadata("frozen", None)
        (True, None)
    """
    if not metadata:
        raise TypeError(
            "set_metadata needs the entries to set: set_metadata(node, name=value, ...)."
        )
    _check_metadata("set_metadata", metadata)
    metadata = canonical_metadata("set_metadata", metadata)  # NNX's `out_sharding` too
    selects = to_predicate(only)
    chosen = [
        value
        for path, value in iter_graph(node)
        if isinstance(value, Variable) and selects(path, value)
    ]
    for variable in chosen:  # every check first, so that nothing is left half-changed
        _guard(variable, "set the metadata")
    for variable in chosen:
        variable._change_metadata({**variable.metadata, **metadata}, "set the metadata")
