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
from ._donation import check_donate, kept_leaves
from ._errors import check_callable, check_pytree_objects, describe_leaf
from ._input_writes import check_input_writes, record_inputs
from ._jit_plan import Plan
from ._jit_stages import Lowered
from ._method import ComparedByOptions, method_as_pytree, options_key
from ._wrapper_cache import FunctionRef, shared_cache


class _Compilations:
    """The `jax.pmap`s of one function with one `out=` spec, donation and `jax.pmap`
    options, shared by every wrapper made around that function with those options.

    One `jax.pmap` per pattern of input axes (its `in_axes` are fixed when made); each
    caches its compilations by the static part of the call, like `jax.jit`. The function
    itself comes in that static part, so that nothing here holds it.
    """

    __slots__ = ("__weakref__", "donate", "out", "plans", "pmapkwargs", "pmapped")

    def __init__(self, out: Any, donate: str, pmapkwargs: dict[str, Any]):
        self.out = out
        self.donate = donate
        self.pmapkwargs = pmapkwargs
        self.pmapped: dict[tuple[Any, ...], Callable[..., Any]] = {}
        # With donation, the `Plan` of each input structure, which splits a call's arrays
        # into kept and donated ones as `filter_jit` does.
        self.plans: dict[tuple[PyTreeDef, tuple[int, ...]], Plan] = {}

    def get(self, in_axes: tuple[tuple[Any, ...], ...]) -> Callable[..., Any]:
        """The `jax.pmap` for inputs mapped down `in_axes`, one tuple per group of arrays
        (see `_PmapWrapper._split`)."""
        pmapped = self.pmapped.get(in_axes)
        if pmapped is None:
            pmapped = self.pmapped[in_axes] = jax.pmap(
                self.traced,
                in_axes=(None, *map(list, in_axes)),
                # Unmapped arrays too leave down axis 0, one copy per device: `jax.pmap`
                # cannot return arrays with axis None that were broadcast to it.
                out_axes=0,
                static_broadcasted_argnums=(0,),
                # The donated arrays are the second group, after the kept ones.
                donate_argnums=(2,) if self.donate != "none" else (),
                **self.pmapkwargs,
            )
        return pmapped

    def plan(self, treedef: PyTreeDef, positions: tuple[int, ...], has_args: bool) -> Plan:
        """The donation plan of calls of this structure with arrays at `positions`."""
        plan = self.plans.get((treedef, positions))
        if plan is None:
            mask = [False] * treedef.num_leaves
            for i in positions:
                mask[i] = True
            kept = kept_leaves(self.donate, treedef, has_args)
            plan = self.plans[(treedef, positions)] = Plan(treedef, mask, None, (), kept, False)
        return plan

    def traced(self, key: tuple[PyTreeDef, tuple[int, ...], tuple[Any, ...], Any], *groups):
        """Run the function on one device's slice of the arrays."""
        treedef, positions, static, aliases = key
        leaves = list(static)
        if leaves and type(leaves[0]) is FunctionRef:
            leaves[0] = leaves[0]()
        # The last group holds at most an array of `axis_size` elements that only sets
        # the axis size.
        if self.donate == "none":
            dynamic = groups[0]
        else:
            kept, donated = groups[0], groups[1]
            dynamic = self.plans[(treedef, positions)].undo_donation(
                aliases, tuple(kept), tuple(donated)
            )
        for i, leaf in zip(positions, dynamic, strict=True):
            leaves[i] = leaf
        fun, args, kwargs = treedef.unflatten(leaves)
        inputs = record_inputs(fun, args, kwargs)
        out = fun(*args, **kwargs)
        check_input_writes(inputs, out, "filter_pmap", fun)
        return split_mapped_output(self.out, out, "filter_pmap")


class _PmapWrapper(ComparedByOptions):
    """The function `filter_pmap` returns: it splits each call and hands it to the shared
    `_Compilations` of its function and options (see `_wrapper_cache.shared_cache`). Two
    made around equal functions with equal options compare (and hash) equal."""

    def __init__(
        self,
        fun: Callable[..., Any],
        specs: ArgumentSpecs,
        out: Any,
        axis_size: int | None,
        donate: str,
        kw: dict[str, Any],
        options: Any,
    ):
        self._fun = fun
        self._options_key = options
        self._specs = specs
        self._axis_size = axis_size
        self._compilations = shared_cache(
            fun, (out, donate, kw), lambda: _Compilations(out, donate, kw)
        )
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pmapped, key, groups = self._split(args, kwargs)
        return _unpack(pmapped(key, *groups))

    def _key(self) -> tuple[Any, ...]:
        return self._fun, self._options_key

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking arguments of the same
            structures, shapes and static (non-array) values.
        """
        pmapped, key, groups = self._split(args, kwargs)
        return Lowered(pmapped.lower(key, *groups), self._stage_arguments, (pmapped, key), _unpack)

    def _stage_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple:
        """The key and arguments of a compiled stage for one call (see `_jit_stages`)."""
        pmapped, key, groups = self._split(args, kwargs)
        return (pmapped, key), groups

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple, tuple]:
        """One call's `jax.pmap`, static argument and groups of arrays.

        The groups are the arrays (or with donation, the kept arrays and the donated ones),
        then a group with at most the array that sets the axis size.
        """
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
        dynamic = tuple(leaves[i] for i in positions)
        if self._axis_size is not None:
            # `jax.pmap` takes its axis size from a mapped input, so give it one.
            sizing, sizing_axes = [np.zeros(self._axis_size, dtype=np.bool_)], (0,)
        elif all(axis is None for axis in in_axes):
            raise ValueError(
                "filter_pmap: no input is mapped over (every leaf has axis None), so the "
                "number of devices to run on is unknown. Pass `axis_size=` or map an array "
                "argument."
            )
        else:
            sizing, sizing_axes = [], ()
        if self._compilations.donate == "none":
            aliases, groups, group_axes = None, [list(dynamic)], [in_axes]
        else:
            plan = self._compilations.plan(treedef, positions, bool(args))
            aliases, kept, donated = plan.donation(dynamic)
            kept_axes, donated_axes = _donation_axes(tree, positions, dynamic, in_axes, plan)
            groups, group_axes = [list(kept), list(donated)], [kept_axes, donated_axes]
        pmapped = self._compilations.get((*group_axes, sizing_axes))
        return pmapped, (treedef, positions, static, aliases), (*groups, sizing)


def _donation_axes(
    tree: Any,
    positions: tuple[int, ...],
    dynamic: tuple[Any, ...],
    in_axes: tuple[Any, ...],
    plan: Plan,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The axes of the kept and of the donated arrays that `plan.donation` split from
    `dynamic`: an array standing at several places is passed once, with one axis."""
    first: dict[int, int] = {}
    for place, x in enumerate(dynamic):
        at = first.setdefault(id(x), place)
        if in_axes[at] != in_axes[place]:
            where = describe_leaf(tree, positions[place], ("fn", "args", "kwargs"))
            raise ValueError(
                f"filter_pmap(donate=...): one array is passed at two places with different "
                f"axes ({in_axes[at]} and {in_axes[place]}, at {where}), so it cannot be "
                "donated once for both. Pass a copy at one of them."
            )
    places = sorted(first.values())
    kept = tuple(in_axes[p] for p in places if p < plan.kept)
    donated = tuple(in_axes[p] for p in places if p >= plan.kept)
    return kept, donated


def _unpack(out: tuple[list[Any], list[Any], Any]) -> Any:
    """The function's output from the `jax.pmap`'s."""
    with_axis, unmapped, layout = out
    return layout.rebuild(with_axis, [x[0] for x in unmapped])


def filter_pmap(
    fun: Callable[..., Any] | None = None,
    *,
    in_axes: Any = UNSET,
    out_axes: Any = UNSET,
    axis_name: Any = None,
    axis_size: int | None = None,
    donate: str = "none",
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
    alive. A Module (any callable pytree) used as `fun` is an input like the arguments:
    its arrays are traced, and wrappers of its instances share compilations keyed by its
    structure, so `filter_pmap(model)` of the model after an update does not compile
    again.

    With `donate=`, the compiled program may reuse the buffers of the input arrays for its
    outputs, and the arrays it reused are deleted. Only arrays already split across the
    devices as the program needs them (the outputs of an earlier `filter_pmap`, say) have
    buffers to reuse: any other array is copied to the devices first, and stays as it
    was.

    Arguments:
        fun: the function to run on each device. Omit it to get a decorator.
        in_axes: axis spec of the positional arguments (a tuple, or one spec for all), or
            a dict from parameter names to specs, as in `filter_vmap`.
        out_axes: axis spec of the output.
        axis_name: name of the device axis, for collectives such as `jax.lax.psum`.
        axis_size: the number of devices, needed when no input is mapped.
        donate: as in `filter_jit`: `"none"`, `"all"` (donate every input array's
            buffers), `"all-except-first"` (all but those of `fun` and the first argument),
            `"warn"` (as `"all"`) or `"warn-except-first"` (as `"all-except-first"`). A
            buffer that cannot be reused is not an error: JAX may warn "Some donated
            buffers were not usable".
        default: axis spec for every argument without an override.
        fn: axis spec for `fun` itself (default: not split).
        args: per-positional-argument axis specs.
        kwargs: per-parameter axis specs by name.
        out: axis spec of the output.
        **pmapkwargs: passed on to `jax.pmap` (`devices`, `backend`, ...).

    Returns:
        The parallelised function. Its `.lower(*args, **kwargs)` lowers ahead of time, as
        `filter_jit`'s does.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_pmap
        >>> n = jax.local_device_count()
        >>> out, name = filter_pmap(lambda x, name: (x * 2, name))(jnp.ones((n, 3)), "twice")
        >>> out.shape == (n, 3), name
        (True, 'twice')
        >>> step = filter_pmap(lambda x: x + 1, donate="all")
        >>> state = step(out)  # `out` lies on the devices: its buffers are reused
        >>> out.is_deleted()
        True
        >>> step.lower(state).compile()(state).shape == (n, 3)
        True
    """
    options = dict(
        in_axes=in_axes,
        out_axes=out_axes,
        axis_name=axis_name,
        axis_size=axis_size,
        donate=donate,
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
    if "donate_argnums" in pmapkwargs:
        raise TypeError(
            'filter_pmap takes no donate_argnums: choose donation with `donate="all"` or '
            '`donate="all-except-first"` (which keeps the first argument).'
        )
    check_donate("filter_pmap", donate)
    default, args, kwargs, out = merge_axis_options(
        "filter_pmap", fun, in_axes, out_axes, default, args, kwargs, out
    )
    if axis_name is not None:
        pmapkwargs["axis_name"] = axis_name
    if axis_size is not None and (
        isinstance(axis_size, bool) or not isinstance(axis_size, int) or axis_size < 1
    ):
        raise TypeError(
            f"filter_pmap(axis_size=...) must be a positive int (the number of devices), "
            f"got {axis_size!r}."
        )
    fun = method_as_pytree(fun)
    specs = ArgumentSpecs("filter_pmap", fun, default, fn, args, kwargs)
    # Keyword arguments have no order, so they are keyed sorted by name.
    key = options_key((options, sorted(pmapkwargs.items())))
    return _PmapWrapper(fun, specs, out, axis_size, donate, pmapkwargs, key)
