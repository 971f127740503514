"""Axis specs of `filter_vmap` and `filter_pmap`: which leaves map over which axis."""

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import PyTreeDef

from pytree_filter import is_array, is_array_like, path_text

from ._errors import describe_leaf
from ._sharing import Sharing, find_sharing, has_repeats, same_axes_once


# One function per axis, so that equal specs are equal options for the compilation caches.
@functools.cache
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
    spec_tree: Any, tree: Any, what: str, transform: str = "filter_vmap", output: bool = False
) -> tuple[list[Any], list[Any], Any]:
    """Flatten `tree` and resolve, leaf by leaf, the axis its prefix spec gives it.

    For the inputs (`tree` is `(fn, args, kwargs)`) an axis must be one the array has; for
    an `output` it is where the mapped axis goes, so any array or Python number may take
    one (a value that does not depend on the mapped inputs is broadcast).
    """
    mappable = is_array_like if output else is_array
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
            index = len(axes)
            axis = spec(leaf) if callable(spec) else spec
            if isinstance(axis, bool):
                axis = None  # booleans mean "not mapped", as with filter_pmap specs
            if axis is not None and not isinstance(axis, int):
                raise TypeError(
                    f"{transform}: an axis spec gave {axis!r} for a leaf of {what}; axes "
                    "must be ints or None."
                )
            if axis is not None and not mappable(leaf):
                raise ValueError(
                    f"{transform}: axis {axis} was given for {_where(tree, index, output)}, "
                    f"a {type(leaf).__name__}, which is not an array and cannot be mapped "
                    "over. Give it None."
                )
            if axis is not None and not output and not -np.ndim(leaf) <= axis < np.ndim(leaf):
                where = _where(tree, index, output)
                raise ValueError(
                    f"{transform}: {where} is an array of shape {np.shape(leaf)}, which has "
                    f"no axis {axis} to map over. Give it the axis None (the same value for "
                    "every element) or an axis it has, or add the mapped axis to it."
                )
            axes.append(axis)
    return leaves, axes, treedef


class MappedOutput:
    """Where each leaf of a mapped function's output goes, and its leaves that JAX does not
    carry. A pytree node with no children, so it can leave a transform in the output
    treedef, like `StaticOutput`; compared by identity, as it stands for one trace's output."""

    __slots__ = ("arrays", "axes", "sharing", "static", "treedef")

    def __init__(
        self,
        treedef: PyTreeDef,
        axes: list[Any],
        arrays: list[bool],
        static: list[Any],
        sharing: Sharing | None = None,
    ):
        self.treedef = treedef
        self.axes = axes
        self.arrays = arrays
        self.static = static
        # Where the output holds a shared object, `axes` and `arrays` cover its unique
        # leaves, and rebuilding makes one object for every place it stood.
        self.sharing = sharing

    def rebuild(self, with_axis: list[Any], unmapped: list[Any]) -> Any:
        """The output, from the leaves mapped down axis 0 and the unmapped arrays."""
        with_axis_it, unmapped_it, static_it = iter(with_axis), iter(unmapped), iter(self.static)
        unflatten = self.treedef.unflatten if self.sharing is None else self.sharing.unflatten
        return unflatten(
            [
                _move_mapped_axis(next(with_axis_it), axis)
                if axis is not None
                else next(unmapped_it if array else static_it)
                for axis, array in zip(self.axes, self.arrays, strict=True)
            ]
        )


jax.tree_util.register_static(MappedOutput)


def _move_mapped_axis(x: Any, axis: int) -> Any:
    return x if axis == 0 else jnp.moveaxis(x, 0, axis)


def split_mapped_output(
    out_spec: Any, out: Any, transform: str
) -> tuple[list[Any], list[Any], MappedOutput]:
    """Split a mapped function's output: the leaves with an axis, which leave JAX mapped
    down axis 0 (so JAX broadcasts those that do not depend on the mapped inputs, Python
    numbers included); the arrays without one, which leave unmapped (so JAX refuses them
    if they do depend on the mapped inputs); and a `MappedOutput` with the rest."""
    leaves, axes, treedef = axes_of(out_spec, out, "the output", transform, output=True)
    # An object reached by several paths leaves once, and comes back one object.
    sharing = find_sharing(out, treedef) if has_repeats(leaves) else None
    if sharing is not None:
        axes = same_axes_once(sharing, out, axes, transform)
        leaves = sharing.dedupe(leaves)
    with_axis, unmapped, static = [], [], []
    for leaf, axis in zip(leaves, axes, strict=True):
        if axis is not None:
            with_axis.append(leaf)
        elif is_array(leaf):
            unmapped.append(leaf)
        else:
            static.append(leaf)
    arrays = [is_array(x) for x in leaves]
    return with_axis, unmapped, MappedOutput(treedef, axes, arrays, static, sharing)


def _where(tree: Any, index: int, output: bool) -> str:
    """Name the leaf at flat `index` of the inputs `(fn, args, kwargs)` or of the output."""
    if not output:
        return describe_leaf(tree, index, ("fn", "args", "kwargs"))
    path = jax.tree_util.tree_flatten_with_path(tree)[0][index][0]
    return f"the output leaf at {path_text(path)}"


def merge_axis_options(
    transform: str,
    fun: Callable[..., Any],
    in_axes: Any,
    out_axes: Any,
    default: Any,
    args: Any,
    kwargs: Any,
    out: Any,
) -> tuple[Any, Any, Any, Any]:
    """Fold the newer `in_axes=`/`out_axes=` spellings into `(default, args, kwargs, out)`.

    A dict `in_axes` names parameters: it becomes the `kwargs` specs, checked against
    `fun`'s signature here, once, so that calls never bind a signature.
    """
    if isinstance(in_axes, Mapping):
        if args or kwargs:
            raise TypeError(
                f"{transform}: pass either a dict `in_axes=` or `args=`/`kwargs=`, not both."
            )
        kwargs = _named_axes(transform, fun, in_axes)
    elif in_axes is not UNSET:
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
    return default, args, kwargs, out


def _named_axes(transform: str, fun: Callable[..., Any], in_axes: Mapping) -> dict[str, Any]:
    """Check that every key of a dict `in_axes` names a parameter of `fun` (not one that
    `*args` or `**kwargs` would catch), and return it as a dict."""
    name = getattr(fun, "__name__", type(fun).__name__)
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):
        raise TypeError(
            f"{transform}(in_axes=dict(...)) maps arguments by parameter name, but the "
            f"signature of {name} cannot be read. Give the axes by position instead: "
            "`in_axes=(axis_of_first_argument, ...)`."
        ) from None
    parameters = signature.parameters
    by_name = {p.name for p in parameters.values() if p.kind not in _VARIADIC}
    for key in in_axes:
        if key in by_name:
            continue
        where = f"{name}{signature}"
        if not isinstance(key, str):
            problem = f"has the key {key!r}, which is not a parameter name"
        elif key in parameters:
            star = "*" if parameters[key].kind is inspect.Parameter.VAR_POSITIONAL else "**"
            problem = (
                f"names {key!r}, the `{star}{key}` of {where}, which takes any number of "
                "arguments: name the parameters themselves"
            )
        else:
            problem = f"names {key!r}, which is not a parameter of {where}"
        kinds = {p.kind for p in parameters.values()}
        hint = ""
        if inspect.Parameter.VAR_POSITIONAL in kinds:
            hint += " Positional arguments caught by `*args` take their axes by position, "
            hint += "from a tuple `in_axes`."
        if inspect.Parameter.VAR_KEYWORD in kinds:
            hint += " Keyword arguments caught by `**kwargs` take theirs by name, from "
            hint += "`kwargs=dict(...)`."
        named = [p for p in parameters if p in by_name]
        raise ValueError(
            f"{transform}(in_axes=...) {problem}. Its named parameters: {named or 'none'}." + hint
        )
    return dict(in_axes)


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
