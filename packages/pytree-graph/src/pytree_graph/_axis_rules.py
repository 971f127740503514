"""`axis_rules`: logical axis names in `sharding` metadata, mapped to mesh axes."""

import contextlib
import contextvars
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# The rules in force: logical name -> mesh axis (a name, a tuple of names, or None). A
# context variable, so that threads (and asyncio tasks) each see their own.
_active: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "axis_rules", default=types.MappingProxyType({})
)


def _check_rules(rules: Any) -> dict[str, Any]:
    try:
        pairs = dict(rules.items() if isinstance(rules, Mapping) else rules)
    except (TypeError, ValueError):
        pairs = None

    def is_target(target: Any) -> bool:
        if isinstance(target, tuple):
            return all(isinstance(name, str) for name in target)
        return target is None or isinstance(target, str)

    if pairs is None or not all(
        isinstance(name, str) and is_target(target) for name, target in pairs.items()
    ):
        raise TypeError(
            "axis_rules expects {logical name: mesh axis} (or (name, axis) pairs), each "
            "mesh axis a name, a tuple of names or None, e.g. axis_rules({'embed': None, "
            f"'mlp': 'model'}}); got {rules!r}."
        )
    return pairs


@contextlib.contextmanager
def axis_rules(rules: Mapping[str, Any] | Sequence[tuple[str, Any]]) -> Iterator[None]:
    """Map logical axis names to mesh axes, for the shardings computed inside the block.

    Layers can then name their parameters' dimensions by role (`("embed", "mlp")`) and
    each run choose the layout: `{"mlp": "model"}` splits the hidden units over a
    "model" axis, `{"embed": "data"}` splits the other dimension over "data" as in
    fully sharded training, `None` keeps a dimension whole. A name no rule maps is taken
    as a mesh axis itself. Rules nest: inner ones add to, or override, outer ones.

    The rules are read when shardings are computed: by `get_partition_spec`,
    `get_named_sharding`, `shard`, `create_sharded` and `shard_map`, and inside a
    compiled function when it is traced (a compiled step keeps the rules it was traced
    with).

    Arguments:
        rules: `{logical name: mesh axis}`, or `(name, axis)` pairs; a mesh axis is a
            name, a tuple of names (one dimension over several axes) or None.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec
        >>> from pytree_graph import Param, State, axis_rules, get_partition_spec
        >>> state = State({"w": Param(jnp.ones((4, 8)), sharding=("embed", "mlp"))})
        >>> with axis_rules({"embed": None, "mlp": "model"}):
        ...     get_partition_spec(state)["w"].value == PartitionSpec(None, "model")
        True
    """
    token = _active.set({**_active.get(), **_check_rules(rules)})
    try:
        yield
    finally:
        _active.reset(token)


def active_rules() -> tuple[tuple[str, Any], ...]:
    """The rules in force, as a hashable tuple (a static argument of compiled functions)."""
    return tuple(_active.get().items())


def to_mesh_axes(axes: Sequence[Any]) -> tuple[Any, ...]:
    """A `sharding` entry per dimension, with logical names replaced by their mesh axes."""
    rules = _active.get()
    if not rules:
        return tuple(axes)

    def entry(axis: Any) -> Any:
        if isinstance(axis, tuple):
            mapped = [rules.get(name, name) for name in axis]
            flat = tuple(
                name
                for target in mapped
                for name in (target if isinstance(target, tuple) else (target,))
                if name is not None
            )
            return flat or None
        return rules.get(axis, axis) if isinstance(axis, str) else axis

    return tuple(map(entry, axes))
