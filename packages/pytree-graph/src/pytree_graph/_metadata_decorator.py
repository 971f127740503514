"""`transform_metadata` as a decorator: a function that sees Variables without one axis of
their `sharding` metadata, as a `vmap` or `scan` body does, for code that maps by hand."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax

from ._refs import deref, reref
from ._transform_metadata import PARTITION_NAME, TransformMetadata
from ._variables import Variable, is_variable

_WHERE = "transform_metadata"


def _per_item(axes: Any, count: int, option: str) -> tuple[Any, ...]:
    """One axis (an int or None) per argument or output, from an int, None or a sequence."""
    if axes is None or (isinstance(axes, int) and not isinstance(axes, bool)):
        return (axes,) * count
    if isinstance(axes, tuple | list) and all(
        a is None or (isinstance(a, int) and not isinstance(a, bool)) for a in axes
    ):
        if len(axes) != count:
            raise ValueError(
                f"{_WHERE}: {option} has {len(axes)} entries but there are {count} "
                f"{'arguments' if option == 'in_axes' else 'outputs'}; give one axis (an int "
                "or None) each, or a single int for all."
            )
        return tuple(axes)
    raise TypeError(
        f"{_WHERE}: {option} must be an int, None, or a tuple of those (one per "
        f"{'argument' if option == 'in_axes' else 'output'}); got {axes!r}."
    )


def _variables(tree: Any) -> list[tuple[str, Variable]]:
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)
    return [(jax.tree_util.keystr(path), v) for path, v in pairs if isinstance(v, Variable)]


def _bound_arguments(fun: Callable[..., Any], args: tuple, kwargs: dict) -> tuple:
    # Keyword arguments become positional, so that in_axes counts every argument (NNX's rule).
    if not kwargs:
        return args
    bound = inspect.signature(fun).bind(*args, **kwargs)
    if bound.kwargs:
        raise TypeError(
            f"{_WHERE}: the keyword-only argument(s) {sorted(bound.kwargs)} have no place in "
            "in_axes; make them positional, or close over them."
        )
    return bound.args


def transform_metadata(
    fun: Callable[..., Any] | None = None,
    /,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    partition: str | None,
    graph: bool | None = None,
) -> Any:
    """Run `fun` on Variables whose `sharding` metadata lacks one mapped axis, as inside
    `vmap` or `scan` with `transform_metadata={PARTITION_NAME: partition}`; as Flax NNX's
    `nnx.transform_metadata`.

    Each Variable of an argument mapped at an int axis of `in_axes` is seen by `fun` as a copy
    whose `sharding` lacks that entry (which must be `partition`); values `fun` writes go back
    to the caller's Variables, whose metadata stays as it was. Each Variable of an output at an
    int axis of `out_axes` gets `partition` inserted there. Variables without `sharding`
    metadata are left alone. Shared Variables stay shared (the copies are shared alike).

    Arguments:
        fun: the function (or use `@transform_metadata(...)` with keywords only).
        in_axes: an int or None for every argument, or a tuple with one per argument.
        out_axes: an int or None for the output, or a tuple with one per output.
        partition: the name of the mapped axis in the `sharding` metadata (or None).
        graph: accepted for Flax NNX's signature: sharing is kept either way.

    Returns:
        The wrapped function.

    Raises:
        ValueError: a mapped Variable's `sharding` lacks `partition` at the axis, or `fun`
            returns a Variable it was given (the caller's metadata would be ambiguous).

    Example:
        >>> import jax.numpy as jnp
        >>> import pytree_graph as pg
        >>> v = pg.Param(jnp.zeros(()), sharding=("din", "dout"))
        >>> @pg.transform_metadata(in_axes=0, out_axes=1, partition="din")
        ... def f(v):
        ...     v.value += 1
        ...     assert v.sharding == ("dout",)
        ...     return pg.Param(jnp.array(10), sharding=("dmid", "dout"))
        >>> out = f(v)
        >>> v.sharding, int(v.value), out.sharding
        (('din', 'dout'), 1, ('dmid', 'din', 'dout'))
    """
    if partition is not None and not isinstance(partition, str):
        raise TypeError(f"{_WHERE}: partition must be a str or None, got {partition!r}.")
    if graph is not None and not isinstance(graph, bool):
        raise TypeError(f"{_WHERE}: graph= takes True, False or None; got {graph!r}.")
    if fun is None:
        return functools.partial(
            transform_metadata, in_axes=in_axes, out_axes=out_axes, partition=partition
        )
    if not callable(fun):
        raise TypeError(f"{_WHERE}: expected a function to wrap, got {fun!r}.")
    metadata = TransformMetadata({PARTITION_NAME: partition}, _WHERE)

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args = _bound_arguments(fun, args, kwargs)
        axes = _per_item(in_axes, len(args), "in_axes")
        originals = _variables(args)
        copies = reref(deref(args))  # new Variables, shared as the caller's are
        inside = _variables(copies)
        # Checked on every Variable before `fun` runs; the caller's objects are untouched.
        done: set[int] = set()  # a shared Variable loses its axis once
        for i, (argument, axis) in enumerate(zip(copies, axes, strict=True)):
            if axis is None:
                continue
            for path, variable in _variables(argument):
                if id(variable) not in done and variable.metadata.get("sharding"):
                    metadata.remove_axis(variable, axis, f"args[{i}]{path}")
                    done.add(id(variable))
        before = [v.value for _, v in inside]
        out = fun(*copies)
        given = {id(v) for _, v in inside}
        for path, variable in _variables(out):
            if id(variable) in given:
                raise ValueError(
                    f"{_WHERE}: the output at {path or 'the top'} is a Variable the function "
                    "was given. Return a new Variable (or its value): the caller's keeps "
                    "its own metadata."
                )
        outputs = out if isinstance(out_axes, tuple | list) else (out,)
        done.clear()
        out_each = _per_item(out_axes, len(outputs), "out_axes")
        for output, axis in zip(outputs, out_each, strict=True):
            if axis is None:
                continue
            for _, variable in _variables(output):
                if id(variable) not in done:
                    metadata.add_axis(variable, axis)
                    done.add(id(variable))
        for (_, original), (_, copy), value in zip(originals, inside, before, strict=True):
            if copy.value is not value:
                original.value = copy.value
        return out

    return wrapper
