"""`filter_vmap`: `jax.vmap` for functions of any pytrees."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ._arguments import ArgumentSpecs, leaf_names
from ._axes import (
    DEFAULT_AXES,
    UNSET,
    MappedOutput,
    axes_of,
    merge_axis_options,
    split_mapped_output,
)
from ._errors import check_callable
from ._input_writes import check_input_writes, record_inputs
from ._method import ComparedByOptions, method_as_pytree, options_key, register_wrapper
from ._sharing import find_sharing, has_repeats, same_axes_once


@register_wrapper
class _VmapWrapper(ComparedByOptions):
    """The function `filter_vmap` returns. Two made around equal functions with equal
    options compare (and hash) equal (see `ComparedByOptions`)."""

    def __init__(
        self,
        fun: Callable[..., Any],
        specs: ArgumentSpecs,
        out: Any,
        vmapkwargs: dict[str, Any],
        options: Any,
    ):
        self._fun = fun
        self._specs = specs
        self._out = out
        self._vmapkwargs = vmapkwargs
        # The key of the options as the caller gave them (see `filter_vmap`).
        self._options_key = options
        functools.update_wrapper(self, fun, updated=())

    def _key(self) -> tuple[Any, ...]:
        return self._fun, self._options_key

    def _options(self) -> tuple[Any, tuple[Any, ...]]:
        """The key of the options and the arguments but `fun` (see `register_wrapper`)."""
        return self._options_key, (self._specs, self._out, self._vmapkwargs, self._options_key)

    @classmethod
    def _rebuild(cls, arguments: tuple[Any, ...], fun: Any) -> "_VmapWrapper":
        return cls(fun, *arguments)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree = (self._fun, args, kwargs)
        leaves, axes, treedef = axes_of(self._specs.tree(args, kwargs), tree, "the inputs")
        # An object reached by several paths (a tied weight) is mapped once, and the
        # function sees one object at all its places.
        unflatten, named = treedef.unflatten, (leaves, axes)
        sharing = find_sharing(tree, treedef) if has_repeats(leaves) else None
        if sharing is not None:
            axes = same_axes_once(
                sharing, tree, axes, "filter_vmap", functools.partial(_names, self._fun, tree)
            )
            leaves, unflatten = sharing.dedupe(leaves), sharing.unflatten
        mapped = [i for i, a in enumerate(axes) if a is not None]
        if not mapped and "axis_size" not in self._vmapkwargs:
            raise ValueError(
                "filter_vmap: no input is mapped over (every leaf has axis None), so the "
                "batch size is unknown. Pass `axis_size=` or map an array argument."
            )

        def batched(mapped_leaves: list[Any]) -> tuple[list[Any], list[Any], MappedOutput]:
            full = list(leaves)
            for i, leaf in zip(mapped, mapped_leaves, strict=True):
                full[i] = leaf
            fun, call_args, call_kwargs = unflatten(full)
            inputs = record_inputs(fun, call_args, call_kwargs)
            out = fun(*call_args, **call_kwargs)
            check_input_writes(inputs, out, "filter_vmap", self._fun)
            # The `MappedOutput` has no leaves: it leaves `jax.vmap` in the output treedef.
            return split_mapped_output(self._out, out, "filter_vmap")

        try:
            with_axis, unmapped, layout = jax.vmap(
                batched,
                in_axes=([axes[i] for i in mapped],),
                out_axes=(0, None, None),
                **self._vmapkwargs,
            )([leaves[i] for i in mapped])
        except ValueError:
            _check_sizes(self._fun, tree, *named, self._vmapkwargs.get("axis_size"))
            raise
        return layout.rebuild(with_axis, unmapped)


def _names(fun: Callable[..., Any], tree: Any, positions: Sequence[int]) -> list[str]:
    """The names of the leaves at `positions` of a call, as the caller wrote them."""
    names = leaf_names(fun, tree)
    return [f"`{names[i][0]}`" for i in positions]


def _check_sizes(
    fun: Callable[..., Any], tree: Any, leaves: list[Any], axes: list[Any], axis_size: Any
) -> None:
    """Refuse mapped inputs of different sizes along their mapped axes, naming each as the
    caller wrote it (`x`, `params['w']`), not as `jax.vmap` saw it (a flat list of leaves).
    Returns where the sizes agree: the error came from elsewhere."""
    sizes: dict[int, list[str]] = {}
    names = leaf_names(fun, tree)
    for (name, _), leaf, axis in zip(names, leaves, axes, strict=True):
        if axis is not None:
            size = np.shape(leaf)[axis]
            sizes.setdefault(size, []).append(f"`{name}` (axis {axis} of shape {np.shape(leaf)})")
    if axis_size is not None and set(sizes) - {axis_size}:
        sizes.setdefault(axis_size, []).insert(0, f"`axis_size={axis_size}`")
    if len(sizes) < 2:
        return
    found = "; ".join(f"size {size}: {', '.join(where)}" for size, where in sizes.items())
    raise ValueError(
        f"filter_vmap: the mapped inputs must all have one size along their mapped axes, but "
        f"they have different sizes: {found}. Give every mapped input the same size there, "
        "or give an input that is the same for every element the axis None (in `in_axes`)."
    ) from None


def filter_vmap(
    fun: Callable[..., Any] | None = None,
    *,
    in_axes: Any = UNSET,
    out_axes: Any = UNSET,
    axis_name: Any = None,
    axis_size: int | None = None,
    default: Any = DEFAULT_AXES,
    fn: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    out: Any = DEFAULT_AXES,
    **vmapkwargs: Any,
) -> Any:
    """`jax.vmap` for functions of any pytrees: arrays are mapped, everything else is not.

    An axis spec is an int (the axis to map over), `None` (not mapped: broadcast), a
    function `leaf -> int or None`, or a prefix pytree of those. By default array leaves are
    mapped over axis 0 and all other leaves are passed through unchanged; outputs likewise
    (non-array outputs are returned as they are, and must not depend on the mapped values).
    An output given an axis (`out_axes=0`, say) that does not depend on the mapped inputs,
    a Python number included, is broadcast along it; an array output given `None` must not
    depend on them.
    This makes ensembles easy: map a constructor over keys to get a batch of models.

    Arguments:
        fun: the function to vectorise. Omit it to get a decorator.
        in_axes: axis spec of the positional arguments: a tuple (one spec per argument) or
            one spec for all of them (same as `args=` / `default=`); or a dict from
            parameter names to specs, which apply whether the argument is passed by
            position or by keyword, every other argument getting `default` (same as
            `kwargs=`, but the names must be parameters of `fun`'s signature, not ones
            `*args`/`**kwargs` would catch; they are checked when the wrapper is made).
        out_axes: axis spec of the output (a prefix of it). Same as `out=`.
        axis_name: name of the mapped axis, for collectives.
        axis_size: the batch size, needed when no input is mapped.
        default: axis spec for every argument without an override.
        fn: axis spec for `fun` itself (default: not mapped).
        args: per-positional-argument axis specs.
        kwargs: per-parameter axis specs by name (applied whether passed by position or
            keyword).
        out: axis spec of the output.
        **vmapkwargs: passed on to `jax.vmap` (e.g. `spmd_axis_name`).

    Returns:
        The vectorised function. It compares (and hashes) equal to another made around an
        equal function with equal options, so `filter_jit(filter_vmap(f))` made again finds
        the first one's compilations.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_vmap
        >>> @filter_vmap(kwargs=dict(x=1))
        ... def g(x, y):
        ...     return x + y
        >>> g(jnp.array([[1, 2]]), jnp.array([3, 4]))  # x mapped down axis 1, y down axis 0
        Array([[4],
               [6]], dtype=int32)
        >>> filter_vmap(lambda x, name: (x * 2, name))(jnp.arange(3), "doubled")
        (Array([0, 2, 4], dtype=int32), 'doubled')
        >>> add = filter_vmap(lambda x, y: x + y, in_axes=dict(y=None))  # x: default axis 0
        >>> add(jnp.array([1, 2]), y=jnp.array(10))
        Array([11, 12], dtype=int32)
    """
    options = dict(
        in_axes=in_axes,
        out_axes=out_axes,
        axis_name=axis_name,
        axis_size=axis_size,
        default=default,
        fn=fn,
        args=args,
        kwargs=kwargs,
        out=out,
    )
    if fun is None:
        return lambda f: filter_vmap(f, **options, **vmapkwargs)
    check_callable(fun, "filter_vmap")
    default, args, kwargs, out = merge_axis_options(
        "filter_vmap", fun, in_axes, out_axes, default, args, kwargs, out
    )
    if axis_name is not None:
        vmapkwargs["axis_name"] = axis_name
    if axis_size is not None:
        vmapkwargs["axis_size"] = axis_size
    fun = method_as_pytree(fun)
    specs = ArgumentSpecs("filter_vmap", fun, default, fn, args, kwargs)
    # Keyword arguments have no order, so they are keyed sorted by name.
    key = options_key((options, sorted(vmapkwargs.items())))
    return _VmapWrapper(fun, specs, out, vmapkwargs, key)
