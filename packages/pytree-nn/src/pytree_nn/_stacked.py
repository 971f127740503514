"""Stacked layers: several layers of one shape held as one, to run with `jax.lax.scan`; and
the per-layer paths of a stacked model's state, for checkpoints."""

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from pytree_filter import Path, path_text
from pytree_graph import PARTITION_NAME, State, Variable

from ._rngs import Rngs

M = TypeVar("M")


def _is_variable(x: Any) -> bool:
    return isinstance(x, Variable)


def map_arrays(fn: Callable[..., jax.Array], *layers: Any) -> Any:
    """A layer like `layers[0]`, whose every array is `fn` of the layers' arrays at its
    place. A Variable's `sharding` gets None for the new leading axis (the layer axis is
    not split over the mesh; each layer's own axes are, as before)."""

    def leaf(first: Any, *rest: Any) -> Any:
        if not _is_variable(first):
            return fn(first, *rest)
        value = fn(first.value, *(variable.value for variable in rest))
        sharding = first.metadata.get("sharding")
        if sharding is None:
            return first.replace(value)
        return first.replace(value, sharding=(None, *sharding))

    return jax.tree.map(leaf, *layers, is_leaf=_is_variable)


def _stack(*values: jax.Array) -> jax.Array:
    return jnp.stack(values)


def _empty_stack(shape: jax.ShapeDtypeStruct) -> jax.Array:
    return jnp.zeros((0, *shape.shape), shape.dtype)


def stack_layers(make_layer: Callable[[Rngs], M], count: int, rngs: Rngs) -> M:
    """`count` layers `make_layer(rngs)`, built one after another, held as one layer of the
    same type whose every Variable and array has a leading axis of length `count`.

    The layers draw their keys from `rngs` in the order that `count` separate layers
    would, so the stacked values are those layers' values. With `count == 0` nothing is
    drawn: the structure comes from tracing `make_layer` with `jax.eval_shape`, and every
    array is empty along the layer axis. The layers must hold arrays only (no `Rngs`) and
    share no Variables.
    """
    if count == 0:
        return map_arrays(_empty_stack, jax.eval_shape(lambda: make_layer(Rngs(0))))
    return map_arrays(_stack, *[make_layer(rngs) for _ in range(count)])


# ------------------------------------------------------------------ per-layer paths


def _metadata_names(function: str, transform_metadata: Mapping[str, Any] | None) -> tuple:
    """`(metadata key, axis name)` pairs of a `transform_metadata`, as `pytree_graph.vmap`
    reads it: `PARTITION_NAME` stands for the `sharding` entry."""
    if transform_metadata is None:
        return ()
    if not isinstance(transform_metadata, Mapping) or PARTITION_NAME not in transform_metadata:
        raise TypeError(
            f"{function}: `transform_metadata` must be None or the dict the stack was built "
            f"with, e.g. {{pytree_graph.PARTITION_NAME: 'layers'}}; got {transform_metadata!r}."
        )
    return tuple(
        ("sharding" if key == PARTITION_NAME else key, name)
        for key, name in transform_metadata.items()
    )


def _key_at(function: str, path: Path, key: str | int) -> int | None:
    """The position of `key` in `path`, or None; a path holding it twice is ambiguous."""
    found = [i for i, part in enumerate(path) if part == key and type(part) is type(key)]
    if len(found) > 1:
        raise ValueError(
            f"{function}: {path_text(path)} holds the key {key!r} {len(found)} times, so "
            "which of them is the stack is unclear. Pass a key that names the stacked "
            "layers only (the attribute holding them)."
        )
    return found[0] if found else None


def _check_key(function: str, key: Any) -> None:
    """Refuse a `key` that is not one path key."""
    if not isinstance(key, str | int) or isinstance(key, bool):
        raise TypeError(
            f"{function}: `key` must be the str (or int) path key of the stacked layers, "
            f"such as 'blocks' for `model.blocks`; got {key!r}."
        )


def _check_state(function: str, state: Any) -> None:
    """Refuse a `state` that is not a `pytree_graph.State`."""
    if not isinstance(state, State):
        raise TypeError(
            f"{function}: `state` must be a pytree_graph.State, such as "
            f"`pytree_graph.state(model)`; got a {type(state).__name__}."
        )


def _value(leaf: Any) -> Any:
    """A Variable's value, or the array itself."""
    return leaf.value if _is_variable(leaf) else leaf


def unstack_state(
    state: State, key: str | int, *, transform_metadata: Mapping[str, Any] | None = None
) -> State:
    """`state` with the stacked layers under `key` given one path per layer.

    Every entry whose path holds `key` (the attribute holding the stack, e.g. `"blocks"`)
    is split along its leading axis: `blocks/attn/kernel` of shape `(n, ...)` becomes
    `blocks/0/attn/kernel`, ..., `blocks/{n-1}/attn/kernel`, each of shape `(...)`, the
    paths a list of `n` separate layers has. Other entries are kept as they are. The
    state of an `Optimizer` (or an optax state) holds the model's paths below its own
    (`opt_state/0/mu/blocks/...`), so it is split the same way. Save the result with
    `save_checkpoint` for a checkpoint with per-layer paths; `stack_state` is the inverse.

    Arguments:
        state: a State, such as `pytree_graph.state(model)`.
        key: the path key of the stacked layers (each path may hold it once).
        transform_metadata: the option the stack was built with (`pytree_graph.vmap(...,
            transform_metadata={PARTITION_NAME: "layers"})`): its axis name is taken out
            of each Variable's `sharding`, which then names one layer's axes. Without it,
            metadata is kept as it is.

    Returns:
        A new State; `state` is unchanged. Variables keep their type and other metadata.

    Raises:
        TypeError: `state` is not a State, or `key` is not a str or int.
        ValueError: no path holds `key`; an entry under it has no leading axis, or a
            leading axis of another length than the others (its path is named); a
            Variable's `sharding` lacks the axis name of `transform_metadata` at axis 0.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import pytree_graph as pg
        >>> from pytree_filter import path_text
        >>> from pytree_nn import Linear, Module, Rngs, stack_state, unstack_state
        >>> class Model(Module):
        ...     def __init__(self):
        ...         self.blocks = pg.vmap(lambda r: Linear(2, 2, rngs=r))(Rngs(0).split(3))
        >>> model = Model()
        >>> per_layer = unstack_state(pg.state(model), "blocks")
        >>> sorted(path_text(p) for p in per_layer.flat_state())[:2]
        ['.blocks[0].bias', '.blocks[0].kernel']
        >>> stacked = stack_state(per_layer, "blocks")
        >>> bool((stacked["blocks"]["kernel"].value == model.blocks.kernel.value).all())
        True
    """
    function = "unstack_state"
    _check_state(function, state)
    _check_key(function, key)
    names = _metadata_names(function, transform_metadata)
    flat = state.flat_state()
    out: dict[Path, Any] = {}
    count: tuple[int, Path] | None = None
    for path, leaf in flat.items():
        at = _key_at(function, path, key)
        if at is None:
            out[path] = leaf
            continue
        shape = getattr(_value(leaf), "shape", ())
        if not shape:
            raise ValueError(
                f"{function}: {path_text(path)} is under {key!r} but has no leading layer "
                f"axis (shape {tuple(shape)}). Every entry under the stacked key must be "
                "stacked; keep unstacked values elsewhere in the model."
            )
        if count is None:
            count = (shape[0], path)
        elif shape[0] != count[0]:
            raise ValueError(
                f"{function}: {path_text(path)} stacks {shape[0]} layers but "
                f"{path_text(count[1])} stacks {count[0]}; every entry under {key!r} must "
                "have the same leading axis."
            )
        metadata = _without_axis(function, leaf, path, names) if _is_variable(leaf) else {}
        head, tail = path[: at + 1], path[at + 1 :]
        value = _value(leaf)
        for index in range(shape[0]):
            layer = value[index]
            out[(*head, index, *tail)] = (
                leaf.replace(layer, **metadata) if _is_variable(leaf) else layer
            )
    if count is None:
        raise ValueError(
            f"{function}: no path of the state holds the key {key!r}. Pass the path key of "
            f"the stacked layers (the attribute holding them); the state's paths start "
            f"with: {sorted({path_text(path[:1]) for path in flat})}."
        )
    return State.from_flat_path(out)


def _without_axis(function: str, leaf: Variable, path: Path, names: tuple) -> dict[str, Any]:
    """`leaf`'s metadata entries of `names`, without the layer axis's name (at axis 0)."""
    changes = {}
    for metadata_key, name in names:
        fields = leaf.metadata.get(metadata_key)
        if not fields:
            continue
        if fields[0] != name:
            raise ValueError(
                f"{function}: transform_metadata names the layer axis {name!r}, but the "
                f"{type(leaf).__name__} at {path_text(path)} has {metadata_key}="
                f"{tuple(fields)!r}, without {name!r} at axis 0. Pass the transform_metadata "
                "the stack was built with, or none."
            )
        changes[metadata_key] = tuple(fields[1:])
    return changes


def stack_state(
    state: State, key: str | int, *, transform_metadata: Mapping[str, Any] | None = None
) -> State:
    """The inverse of `unstack_state`: per-layer entries under `key` stacked into one.

    Entries at `blocks/0/attn/kernel`, ..., `blocks/{n-1}/attn/kernel` become one entry
    `blocks/attn/kernel` whose leading axis holds the `n` layers in order; entries whose
    path does not hold `key` are kept. This reads a checkpoint saved with per-layer paths
    (from `unstack_state`, or from a model holding its layers in a list) into a stacked
    model: `pytree_graph.update(model, stack_state(loaded, "blocks"))`.

    Arguments:
        state: a State with per-layer paths (`key` followed by the layer index).
        key: the path key of the layers, e.g. `"blocks"`.
        transform_metadata: as for `pytree_graph.vmap`: its axis name is put at the front
            of each stacked Variable's `sharding`. Without it, metadata is kept as layer
            0's.

    Returns:
        A new State; `state` is unchanged. Each stacked Variable is layer 0's type and
        metadata with the stacked value.

    Raises:
        TypeError: `state` is not a State, or `key` is not a str or int.
        ValueError: no path holds `key` followed by a layer index; the layer indices are
            not 0 to n-1; the layers differ (an entry one layer has and another lacks, or
            another shape, dtype or Variable type: the path is named).

    Examples:
        >>> import jax.numpy as jnp
        >>> import pytree_graph as pg
        >>> from pytree_graph import Param
        >>> from pytree_nn import stack_state
        >>> per_layer = pg.State({"blocks": {i: {"w": Param(jnp.full(2, i))} for i in range(3)}})
        >>> stack_state(per_layer, "blocks")["blocks"]["w"].value.tolist()
        [[0, 0], [1, 1], [2, 2]]
    """
    function = "stack_state"
    _check_state(function, state)
    _check_key(function, key)
    names = _metadata_names(function, transform_metadata)
    out: dict[Path, Any] = {}
    layers: dict[tuple[Path, Path], dict[int, tuple[Path, Any]]] = {}
    for path, leaf in state.flat_state().items():
        at = _key_at(function, path, key)
        if at is None:
            out[path] = leaf
            continue
        index = path[at + 1] if at + 1 < len(path) else None
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(
                f"{function}: {path_text(path)} is under {key!r} without a layer index after "
                f"it; per-layer paths read `{key}/0/...`, `{key}/1/...` (as `unstack_state` "
                "writes them)."
            )
        layers.setdefault((path[: at + 1], path[at + 2 :]), {})[index] = (path, leaf)
    if not layers:
        raise ValueError(f"{function}: no path of the state holds the key {key!r}.")
    counts = {max(found) + 1 for found in layers.values()}
    count = max(counts)
    for (head, tail), found in layers.items():
        if len(found) != count:
            missing = min(set(range(count)) - set(found))
            raise ValueError(
                f"{function}: {path_text((*head, missing, *tail))} is missing: the "
                f"checkpoint's layers under {key!r} do not all have the same entries "
                f"(there are {count} layers)."
            )
    for (head, tail), found in layers.items():
        first_path, first = found[0]
        for index in range(1, count):
            path, leaf = found[index]
            problem = _differs(first, leaf)
            if problem:
                raise ValueError(
                    f"{function}: {path_text(path)} is {problem} where "
                    f"{path_text(first_path)} is {_describe(first)}; stacked layers must "
                    "have the same structure, shapes and dtypes."
                )
        value = jnp.stack([_value(found[i][1]) for i in range(count)])
        if _is_variable(first):
            out[(*head, *tail)] = first.replace(value, **_with_axis(first, names))
        else:
            out[(*head, *tail)] = value
    return State.from_flat_path(out)


def _with_axis(leaf: Variable, names: tuple) -> dict[str, Any]:
    """`leaf`'s metadata entries of `names` with the layer axis's name put first."""
    return {
        metadata_key: (name, *leaf.metadata[metadata_key])
        for metadata_key, name in names
        if leaf.metadata.get(metadata_key)
    }


def _describe(leaf: Any) -> str:
    """What an entry is, for errors: `Param float32[4, 8]`."""
    value = _value(leaf)
    kind = type(leaf).__name__ if _is_variable(leaf) else "an array"
    return f"{kind} {getattr(value, 'dtype', '?')}{list(getattr(value, 'shape', ()))}"


def _differs(first: Any, leaf: Any) -> str | None:
    """How `leaf` differs from `first` (Variable type, shape or dtype), or None."""
    if type(leaf) is not type(first) or (
        getattr(_value(leaf), "shape", None),
        getattr(_value(leaf), "dtype", None),
    ) != (getattr(_value(first), "shape", None), getattr(_value(first), "dtype", None)):
        return _describe(leaf)
    return None
