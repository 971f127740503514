"""`filter_pmap`: `jax.pmap` for functions of any pytrees."""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.tree_util import PyTreeDef

from pytree_filter import is_array

from ._arguments import ArgumentSpecs
from ._axes import DEFAULT_AXES, UNSET, axes_of, merge_axis_options
from ._errors import check_pytree_objects
from ._method import BindsAsMethod
from ._outputs import split_output


class _PmapWrapper(BindsAsMethod):
    def __init__(self, fun: Callable[..., Any], specs: ArgumentSpecs, out: Any, kw: dict):
        self._fun = fun
        self._specs = specs
        self._out = out
        self._pmapkwargs = kw
        # One `jax.pmap` per pattern of input axes (its `in_axes` are fixed when made);
        # each caches its compilations by the static part of the call, like `jax.jit`.
        self._pmapped: dict[tuple[Any, ...], Callable[..., Any]] = {}
        functools.update_wrapper(self, fun, updated=())

    def _traced(self, key: tuple[PyTreeDef, tuple[int, ...], tuple[Any, ...]], dynamic: list):
        treedef, positions, static = key
        leaves = list(static)
        for i, leaf in zip(positions, dynamic, strict=True):
            leaves[i] = leaf
        fun, args, kwargs = treedef.unflatten(leaves)
        out = fun(*args, **kwargs)
        out_leaves, out_axes, _ = axes_of(self._out, out, "the output", "filter_pmap")
        traced_out, static_out = split_output(out, is_array, "filter_pmap")
        axes = tuple(a for x, a in zip(out_leaves, out_axes, strict=True) if is_array(x))
        return traced_out, (static_out, _Axes(axes))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree = (self._fun, args, kwargs)
        leaves, axes, treedef = axes_of(
            self._specs.tree(args, kwargs), tree, "the inputs", "filter_pmap"
        )
        # Arrays are traced (mapped or broadcast); every other leaf is static.
        positions = tuple(i for i, x in enumerate(leaves) if is_array(x))
        static = tuple(None if i in positions else x for i, x in enumerate(leaves))
        check_pytree_objects(static, "filter_pmap")
        in_axes = tuple(axes[i] for i in positions)
        pmapped = self._pmapped.get(in_axes)
        if pmapped is None:
            pmapped = self._pmapped[in_axes] = jax.pmap(
                self._traced,
                in_axes=(None, list(in_axes)),
                static_broadcasted_argnums=(0,),
                **self._pmapkwargs,
            )
        dynamic_out, (static_out, out_axes) = pmapped(
            (treedef, positions, static), [leaves[i] for i in positions]
        )
        moved = [
            x[0] if axis is None else (x if axis == 0 else jnp.moveaxis(x, 0, axis))
            for x, axis in zip(dynamic_out, out_axes.axes, strict=True)
        ]
        return static_out.rebuild(moved)


class _Axes:
    """Output axes, carried out of `jax.pmap` in the output treedef (no leaves)."""

    __slots__ = ("axes",)

    def __init__(self, axes: tuple[Any, ...]):
        self.axes = axes


jax.tree_util.register_pytree_node(_Axes, lambda a: ((), a.axes), lambda axes, _: _Axes(axes))


def filter_pmap(
    fun: Callable[..., Any] | None = None,
    *,
    in_axes: Any = UNSET,
    out_axes: Any = UNSET,
    axis_name: Any = None,
    default: Any = DEFAULT_AXES,
    fn: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    out: Any = DEFAULT_AXES,
    **pmapkwargs: Any,
) -> Any:
    """`jax.pmap` for functions of any pytrees: arrays are split across devices.

    Axis specs work as in `filter_vmap`: by default each array is split down axis 0, one
    slice per device, and every other leaf is a static input (it must be hashable; a change
    recompiles). An array with axis `None` is broadcast to every device.

    Arguments:
        fun: the function to run on each device. Omit it to get a decorator.
        in_axes: axis spec of the positional arguments (a tuple, or one spec for all).
        out_axes: axis spec of the output.
        axis_name: name of the device axis, for collectives such as `jax.lax.psum`.
        default: axis spec for every argument without an override.
        fn: axis spec for `fun` itself (default: not split).
        args: per-positional-argument axis specs.
        kwargs: per-parameter axis specs by name.
        out: axis spec of the output.
        **pmapkwargs: passed on to `jax.pmap` (`devices`, `backend`, ...).

    Returns:
        The parallelised function.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_pmap
        >>> n = jax.local_device_count()
        >>> out, name = filter_pmap(lambda x, name: (x * 2, name))(jnp.ones((n, 3)), "twice")
        >>> out.shape == (n, 3), name
        (True, 'twice')
    """
    options = dict(
        in_axes=in_axes,
        out_axes=out_axes,
        axis_name=axis_name,
        default=default,
        fn=fn,
        args=args,
        kwargs=kwargs,
        out=out,
    )
    if fun is None:
        return lambda f: filter_pmap(f, **options, **pmapkwargs)
    if not callable(fun):
        raise TypeError(f"filter_pmap expects a function, got {fun!r}.")
    if "static_broadcasted_argnums" in pmapkwargs:
        raise TypeError(
            "filter_pmap takes no static_broadcasted_argnums: non-array arguments are static "
            "already."
        )
    default, args, out = merge_axis_options("filter_pmap", in_axes, out_axes, default, args, out)
    if axis_name is not None:
        pmapkwargs["axis_name"] = axis_name
    specs = ArgumentSpecs("filter_pmap", fun, default, fn, args, kwargs)
    return _PmapWrapper(fun, specs, out, pmapkwargs)
