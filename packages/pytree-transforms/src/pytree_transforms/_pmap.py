"""`filter_pmap`: `jax.pmap` for functions of any pytrees."""

import functools
import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from pytree_filter import is_array

from ._arguments import ArgumentSpecs
from ._axes import DEFAULT_AXES, UNSET, axes_of, merge_axis_options, split_mapped_output
from ._errors import check_callable, check_pytree_objects
from ._method import BindsAsMethod
from ._wrapper_cache import FunctionRef, shared_cache


class _Compilations:
    """The `jax.pmap`s of one function with one `out=` spec and `jax.pmap` options, shared
    by every wrapper made around that function with those options.

    One `jax.pmap` per pattern of input axes (its `in_axes` are fixed when made); each
    caches its compilations by the static part of the call, like `jax.jit`. The function
    itself comes in that static part, so that nothing here holds it.
    """

    __slots__ = ("__weakref__", "out", "pmapkwargs", "pmapped")

    def __init__(self, out: Any, pmapkwargs: dict[str, Any]):
        self.out = out
        self.pmapkwargs = pmapkwargs
        self.pmapped: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def get(self, in_axes: tuple[Any, ...]) -> Callable[..., Any]:
        """The `jax.pmap` for inputs mapped down `in_axes`."""
        pmapped = self.pmapped.get(in_axes)
        if pmapped is None:
            pmapped = self.pmapped[in_axes] = jax.pmap(
                self.traced,
                in_axes=(None, list(in_axes)),
                # Unmapped arrays too leave down axis 0, one copy per device: `jax.pmap`
                # cannot return arrays with axis None that were broadcast to it.
                out_axes=0,
                static_broadcasted_argnums=(0,),
                **self.pmapkwargs,
            )
        return pmapped

    def traced(self, key: tuple[PyTreeDef, tuple[int, ...], tuple[Any, ...]], dynamic: list):
        """Run the function on one device's slice of the arrays."""
        treedef, positions, static = key
        leaves = list(static)
        if leaves and type(leaves[0]) is FunctionRef:
            leaves[0] = leaves[0]()
        # Past the arrays, an array of `axis_size` elements that only sets the axis size.
        for i, leaf in zip(positions, dynamic[: len(positions)], strict=True):
            leaves[i] = leaf
        fun, args, kwargs = treedef.unflatten(leaves)
        return split_mapped_output(self.out, fun(*args, **kwargs), "filter_pmap")


class _PmapWrapper(BindsAsMethod):
    """The function `filter_pmap` returns: it splits each call and hands it to the shared
    `_Compilations` of its function and options (see `_wrapper_cache.shared_cache`)."""

    def __init__(
        self,
        fun: Callable[..., Any],
        specs: ArgumentSpecs,
        out: Any,
        axis_size: int | None,
        kw: dict[str, Any],
    ):
        self._fun = fun
        self._specs = specs
        self._axis_size = axis_size
        self._compilations = shared_cache(fun, (out, kw), lambda: _Compilations(out, kw))
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tree = (self._fun, args, kwargs)
        leaves, axes, treedef = axes_of(
            self._specs.tree(args, kwargs), tree, "the inputs", "filter_pmap"
        )
        # Arrays are traced (mapped or broadcast); every other leaf is static.
        positions = tuple(i for i, x in enumerate(leaves) if is_array(x))
        static = tuple(None if i in positions else x for i, x in enumerate(leaves))
        check_pytree_objects(static, "filter_pmap")
        if type(self._fun) is types.FunctionType:
            # The compilations keep their static inputs: hold the function weakly there.
            static = (FunctionRef(self._fun), *static[1:])
        in_axes = tuple(axes[i] for i in positions)
        dynamic = [leaves[i] for i in positions]
        if self._axis_size is not None:
            # `jax.pmap` takes its axis size from a mapped input, so give it one.
            in_axes += (0,)
            dynamic.append(np.zeros(self._axis_size, dtype=np.bool_))
        elif all(axis is None for axis in in_axes):
            raise ValueError(
                "filter_pmap: no input is mapped over (every leaf has axis None), so the "
                "number of devices to run on is unknown. Pass `axis_size=` or map an array "
                "argument."
            )
        pmapped = self._compilations.get(in_axes)
        with_axis, unmapped, layout = pmapped((treedef, positions, static), dynamic)
        return layout.rebuild(with_axis, [x[0] for x in unmapped])


def filter_pmap(
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
    **pmapkwargs: Any,
) -> Any:
    """`jax.pmap` for functions of any pytrees: arrays are split across devices.

    Axis specs work as in `filter_vmap`: by default each array is split down axis 0, one
    slice per device, and every other leaf is a static input (it must be hashable; a change
    recompiles). An array with axis `None` is broadcast to every device. Outputs work as in
    `filter_vmap` too.

    Compilations are cached by the function: wrappers made around the same Python function
    with equal `out`/`out_axes` and `jax.pmap` options share them, so a wrapper made
    anew (in a loop, say) does not compile again. The cache does not keep the function
    alive.

    Arguments:
        fun: the function to run on each device. Omit it to get a decorator.
        in_axes: axis spec of the positional arguments (a tuple, or one spec for all).
        out_axes: axis spec of the output.
        axis_name: name of the device axis, for collectives such as `jax.lax.psum`.
        axis_size: the number of devices, needed when no input is mapped.
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
        axis_size=axis_size,
        default=default,
        fn=fn,
        args=args,
        kwargs=kwargs,
        out=out,
    )
    if fun is None:
        return lambda f: filter_pmap(f, **options, **pmapkwargs)
    check_callable(fun, "filter_pmap")
    if "static_broadcasted_argnums" in pmapkwargs:
        raise TypeError(
            "filter_pmap takes no static_broadcasted_argnums: non-array arguments are static "
            "already."
        )
    default, args, out = merge_axis_options("filter_pmap", in_axes, out_axes, default, args, out)
    if axis_name is not None:
        pmapkwargs["axis_name"] = axis_name
    if axis_size is not None and (
        isinstance(axis_size, bool) or not isinstance(axis_size, int) or axis_size < 1
    ):
        raise TypeError(
            f"filter_pmap(axis_size=...) must be a positive int (the number of devices), "
            f"got {axis_size!r}."
        )
    specs = ArgumentSpecs("filter_pmap", fun, default, fn, args, kwargs)
    return _PmapWrapper(fun, specs, out, axis_size, pmapkwargs)
