"""`transform_metadata`: the axis `vmap` adds to (and `scan` takes from) each Variable, named
in the Variables' `sharding` metadata, so a stack of layers keeps a partition spec that
names its layer axis."""

from collections.abc import Mapping
from typing import Any

from ._variables import Variable

PARTITION_NAME = "partition_name"
"""The `transform_metadata` key naming the mapped axis in `sharding` metadata (as Flax
NNX's `nnx.PARTITION_NAME`): `vmap(..., transform_metadata={PARTITION_NAME: "layers"})`."""


class TransformMetadata:
    """A transform's `transform_metadata`: for each tuple-valued metadata entry of a
    Variable, the name to insert at (or remove from) the position of the mapped axis.

    `PARTITION_NAME` stands for the `sharding` metadata; any other key names a metadata
    entry itself. Variables without the entry (or with an empty one) are left alone, as
    in Flax NNX: their values are laid out by the compiler.

    Arguments:
        given: the `transform_metadata` mapping.
        transform: the transform's name, for errors.

    Raises:
        TypeError: `given` is not a mapping with string keys.
        ValueError: `given` has no `PARTITION_NAME` entry.
    """

    __slots__ = ("names", "transform")

    def __init__(self, given: Mapping[str, Any], transform: str):
        if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
            raise TypeError(
                f"{transform}: transform_metadata must be a dict with string keys, e.g. "
                f"{{pytree_graph.PARTITION_NAME: 'layers'}}; got {given!r}."
            )
        if PARTITION_NAME not in given:
            raise ValueError(
                f"{transform}: transform_metadata needs the name of the mapped axis, under "
                f"pytree_graph.PARTITION_NAME: {{PARTITION_NAME: 'layers'}} (got {given!r})."
            )
        self.transform = transform
        self.names = tuple(
            ("sharding" if key == PARTITION_NAME else key, name) for key, name in given.items()
        )

    def remove_axis(self, variable: Variable, axis: int, where: str) -> None:
        """Take the mapped axis's name out of `variable`'s metadata (inside the transform).

        Raises:
            ValueError: the entry at `axis` is not the name given.
        """
        changes = {}
        for key, name in self.names:
            fields = variable.metadata.get(key)
            if not fields:
                continue
            fields = list(fields)
            index = axis if axis >= 0 else len(fields) + axis
            if not 0 <= index < len(fields) or fields[index] != name:
                raise ValueError(
                    f"{self.transform}: transform_metadata names the mapped axis {name!r}, "
                    f"but the {type(variable).__name__} at {where} has {key}={tuple(fields)!r}, "
                    f"without {name!r} at its axis {axis}. Build the stack with the same "
                    "transform_metadata (vmap adds the name), or drop it here."
                )
            del fields[index]
            changes[key] = tuple(fields)
        if changes:
            variable.set_metadata(**changes)

    def add_axis(self, variable: Variable, axis: int) -> None:
        """Put the mapped axis's name into `variable`'s metadata, at `axis`."""
        changes = {}
        for key, name in self.names:
            fields = variable.metadata.get(key)
            if not fields:
                continue
            fields = list(fields)
            # The axis is one of the stacked value's: -1 is after the last entry.
            fields.insert(axis if axis >= 0 else len(fields) + 1 + axis, name)
            changes[key] = tuple(fields)
        if changes:
            variable.set_metadata(**changes)
