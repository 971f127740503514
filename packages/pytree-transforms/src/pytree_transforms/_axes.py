"""Axis specs of `filter_vmap` and `filter_pmap`: which leaves map over which axis."""

from collections.abc import Callable
from typing import Any

import jax

from pytree_filter import is_array


def if_array(axis: int) -> Callable[[Any], int | None]:
    """An axis spec: `axis` for array leaves, `None` (not mapped) for every other leaf.

    Arguments:
        axis: the axis to map arrays over.

    Returns:
        A function `leaf -> axis or None`, usable anywhere `filter_vmap` takes an axis spec.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import if_array
        >>> if_array(1)(jnp.ones((2, 3))), if_array(1)("text")
        (1, None)
    """

    def axis_if_array(x: Any) -> int | None:
        return axis if is_array(x) else None

    axis_if_array.__name__ = f"if_array({axis})"
    return axis_if_array


DEFAULT_AXES = if_array(0)
# Marks an option the caller did not pass (None is a meaningful axis).
UNSET: Any = object()


def _is_axis_spec(x: Any) -> bool:
    return x is None or isinstance(x, int) or callable(x)


def axes_of(
    spec_tree: Any, tree: Any, what: str, transform: str = "filter_vmap"
) -> tuple[list[Any], list[Any], Any]:
    """Flatten `tree` and resolve, leaf by leaf, the axis its prefix spec gives it."""
    spec_leaves, spec_def = jax.tree.flatten(spec_tree, is_leaf=_is_axis_spec)
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        raise ValueError(
            f"{transform}: the axis spec for {what} is not a prefix of it: {spec_def} "
            f"against {jax.tree.structure(tree)}."
        ) from None
    leaves, treedef = jax.tree.flatten(tree)
    axes: list[Any] = []
    for spec, subtree in zip(spec_leaves, subtrees, strict=True):
        for leaf in jax.tree.leaves(subtree):
            axis = spec(leaf) if callable(spec) else spec
            if isinstance(axis, bool):
                axis = None  # booleans mean "not mapped", as with filter_pmap specs
            if axis is not None and not isinstance(axis, int):
                raise TypeError(
                    f"{transform}: an axis spec gave {axis!r} for a leaf of {what}; axes "
                    "must be ints or None."
                )
            if axis is not None and not is_array(leaf):
                raise ValueError(
                    f"{transform}: axis {axis} was given for a {type(leaf).__name__} in "
                    f"{what}, which is not an array and cannot be mapped over. Give it None."
                )
            axes.append(axis)
    return leaves, axes, treedef


def merge_axis_options(
    transform: str, in_axes: Any, out_axes: Any, default: Any, args: Any, out: Any
) -> tuple[Any, Any, Any]:
    """Fold the newer `in_axes=`/`out_axes=` spellings into `(default, args, out)`."""
    if in_axes is not UNSET:
        if args or default is not DEFAULT_AXES:
            raise TypeError(f"{transform}: pass either `in_axes=` or `args=`/`default=`, not both.")
        if isinstance(in_axes, tuple):
            args = in_axes
        else:
            default = in_axes
    if out_axes is not UNSET:
        if out is not DEFAULT_AXES:
            raise TypeError(f"{transform}: pass either `out_axes=` or `out=`, not both.")
        out = out_axes
    return default, args, out
