"""Argument and input checks shared by the layers, with messages that name the argument."""

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

import pytree_graph
import pytree_module


def check_features(layer: str, *, smallest: int = 1, **sizes: Any) -> None:
    """Refuse sizes that are not ints of at least `smallest` (positive by default),
    naming the argument."""
    wanted = "a positive int" if smallest == 1 else f"an int >= {smallest}"
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < smallest:
            raise ValueError(f"{layer}: {name} must be {wanted}, got {size!r}.")


def check_number(layer: str, name: str, value: Any, low: float, high: float) -> float:
    """Refuse a value that is not a real number in [low, high], naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        bounds = f"in [{low}, {high}]" if high != math.inf else f">= {low}"
        raise ValueError(f"{layer}: {name} must be a number {bounds}, got {value!r}.")
    return float(value)


def check_input(
    layer: str, x: Any, axis: int, expected: int, name: str, local: int | None = None
) -> None:
    """Refuse an input whose `axis` is missing or not of size `expected`, naming the argument.

    `local` is the size the layer's weight has on that axis when it differs from `expected`:
    inside `shard_map`, a weight split on its input axis holds a shard, and so does the
    input each device sees."""
    shape = jnp.shape(x)
    where = "last dimension" if axis == -1 else f"dimension {axis}"
    wanted = expected if local is None else local
    if not -len(shape) <= axis < len(shape) or shape[axis] != wanted:
        split = "" if local is None else f" split over the mesh ({local} in each shard)"
        raise ValueError(
            f"{layer} expects inputs whose {where} is {name}={expected}{split}, got an "
            f"input of shape {shape}."
        )


def _manual_mesh_size() -> int:
    """The number of shards of the current `shard_map` (the product of its manual axes'
    sizes), 1 outside one."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = getattr(mesh, "manual_axes", ())
    return math.prod(mesh.shape[name] for name in manual) if manual else 1


def check_weight(layer: Any, name: str, sizes: str, expected: tuple[int, ...]) -> jax.Array:
    """`layer.<name>`'s value, after checking that its shape is `expected` (the shape the
    layer's `sizes` give), naming the Variable and both shapes: a value of another shape
    assigned to it would otherwise fail as a shape error deep in the computation, or give
    an output of the wrong size. Inside `shard_map`, a weight split over the mesh holds its
    local shard, whose sizes divide the expected ones by a number of shards."""
    value = getattr(layer, name).value
    shape = tuple(jnp.shape(value))
    if shape == expected:
        return value
    if len(shape) == len(expected):
        shards = _manual_mesh_size()
        if shards > 1 and all(
            got == want or (0 < got < want and want % got == 0 and shards % (want // got) == 0)
            for got, want in zip(shape, expected, strict=True)
        ):
            return value
    kind = type(layer).__name__
    if shape[1:] == expected:
        fix = (
            f"It holds a stack of {shape[0]} layers (a leading layer axis): call it one "
            "layer at a time, through `jax.lax.scan`, `pytree_graph.scan` or `vmap`."
        )
    else:
        fix = (
            f"Assign a value of shape {expected} to {kind}.{name}, or build a new {kind} "
            "with the sizes of the new value."
        )
    raise ValueError(
        f"{kind}.{name} has shape {shape}, but the layer's sizes ({sizes}) give {expected}. {fix}"
    )


def check_sharding(layer: str, name: str, sharding: Any, ndim: int) -> tuple[Any, ...] | None:
    """A parameter's sharding: None, or one mesh axis name (a str), several (a tuple of str)
    or None per dimension, as a tuple or a `PartitionSpec` (which may leave out trailing
    dimensions: they are not split). Refuses anything else, naming the argument."""
    if sharding is None:
        return None
    if isinstance(sharding, PartitionSpec):
        sharding = tuple(sharding) + (None,) * (ndim - len(sharding))

    def is_axis(entry: Any) -> bool:
        if isinstance(entry, tuple):
            return all(isinstance(name, str) for name in entry)
        return entry is None or isinstance(entry, str)

    if not isinstance(sharding, tuple | list) or not all(map(is_axis, sharding)):
        raise TypeError(
            f"{layer}: {name} must be a tuple (or PartitionSpec) with one entry per "
            "dimension, each a mesh axis name, a tuple of names or None, e.g. "
            f"(None, 'model'); got {sharding!r}."
        )
    if len(sharding) != ndim:
        raise ValueError(
            f"{layer}: {name} has {len(sharding)} entries but the parameter has {ndim} "
            f"dimensions; give one per dimension (None: not split), got {sharding!r}."
        )
    return tuple(sharding)


def check_graph(function: str, argument: str, value: Any, expected: str) -> None:
    """Refuse a single value (None, a number, a string, an array) where a model or another
    graph of objects is expected, naming the argument and what it takes."""
    if isinstance(value, pytree_module.Module | pytree_graph.Variable | pytree_graph.State):
        return
    leaves = [] if value is None else jax.tree.leaves(value)
    if value is None or (len(leaves) == 1 and leaves[0] is value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TypeError(
            f"{function}: `{argument}` must be {expected}; got {shown} (of type "
            f"{type(value).__name__}), a single value. Pass the model (or state) that "
            "holds it."
        )


def check_metadata(
    layer: str, name: str, metadata: Any, sharding_name: str, sharding: Any, ndim: int
) -> tuple[tuple[Any, ...] | None, dict[str, Any]]:
    """A parameter's `*_metadata=` mapping and `*_sharding=` argument, checked together:
    the sharding (given either way, checked as `check_sharding` does) and the other
    entries. The metadata must be a mapping of hashable values under names that are
    strings, not starting with `_`, not `value`; its `sharding` (or Flax NNX's name,
    `out_sharding`) entry is the parameter's sharding, so it must not also be given as
    `sharding_name`. Checked before the layer draws a key."""
    if metadata is None:
        return check_sharding(layer, sharding_name, sharding, ndim), {}
    if not isinstance(metadata, Mapping):
        raise TypeError(
            f"{layer}: {name} must be a mapping of metadata names to values, e.g. "
            f"{{'tag': 'attention'}}, stored on the parameter; got {type(metadata).__name__} "
            f"{metadata!r:.60}."
        )
    extra: dict[str, Any] = {}
    given = {} if sharding is None else {sharding_name: sharding}
    for key, value in metadata.items():
        if not isinstance(key, str) or key.startswith("_") or key == "value":
            raise ValueError(
                f"{layer}: {name} has the key {key!r}; metadata names must be strings, must "
                "not start with `_`, and `value` is the parameter's value."
            )
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"{layer}: {name}[{key!r}] must be hashable (metadata is part of the pytree "
                f"structure), got a {type(value).__name__}; use a tuple instead of a list, "
                "or a frozen value."
            ) from None
        if key in ("sharding", "out_sharding"):
            given[f"{name}[{key!r}]"] = value
        else:
            extra[key] = value
    if len(given) > 1:
        raise ValueError(
            f"{layer}: the sharding is given more than once ({', '.join(given)}); give it "
            f"one way, as {sharding_name}= or as {name}'s 'sharding' (NNX: 'out_sharding') "
            "entry."
        )
    ((source, axes),) = given.items() if given else ((sharding_name, None),)
    return check_sharding(layer, source, axes, ndim), extra
