"""`pmap` for functions of object graphs, with device axes chosen per filter."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_transforms.extend import BindsAsMethod

from ._boundary import Call, Inside
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._tree_transforms import simple_vmap
from ._vmap import (
    LeafAxes,
    check_axes,
    check_output_items,
    check_returned_axes,
    join_by_axis,
    lift_with_axes,
    output_leaves,
    spec_at,
    split_by_axis,
)

_REFUSED = {
    "static_broadcasted_argnums": "arguments that are not arrays (Python numbers, strings, "
    "other objects) are static already: pass them as they are",
    "donate_argnums": "use `pytree_graph.jit` with donate_argnums (pmap's donation "
    "refers to arrays, not to the objects holding them)",
}


class _GraphPmap(BindsAsMethod):
    """The function `pmap` returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        pmap_kwargs: dict[str, Any],
    ):
        self._call = Call(fun)
        self._in_axes = check_axes(in_axes, "in_axes", "pmap")
        self._out_axes = check_axes(out_axes, "out_axes", "pmap")
        self._pmap_kwargs = pmap_kwargs
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._call
        lifted, axes = lift_with_axes(
            "pmap", call, args, kwargs, self._in_axes, "axis_size" in self._pmap_kwargs
        )

        out_axes = self._out_axes

        def per_device(values: list[Any]) -> Any:
            inside = Inside(lifted.graphdef, values)
            out = call.run(inside.tree)
            # The output's leaves take their axes from `out_axes` (one spec, a tuple of
            # them, or a StateAxes for the Variables of returned objects), as in `vmap`.
            check_output_items(out_axes, out, "pmap")
            check_returned_axes("pmap", call, inside, out, axes, out_axes)
            leaves, paths = output_leaves(inside, out)
            leaf_axes = tuple(
                spec_at(out_axes, path, leaf, "pmap")
                for path, leaf in zip(paths, leaves, strict=True)
            )
            outcome, values = inside.finish(out, structure="fixed", transform="pmap")
            mapped, unmapped = split_by_axis(values[outcome.num_leaves :], leaf_axes)
            return values[: outcome.num_leaves], outcome, mapped, unmapped, LeafAxes(leaf_axes)

        values, outcome, mapped, unmapped, leaf_axes = jax.pmap(
            per_device,
            in_axes=(axes,),
            out_axes=(axes, None, 0, None, None),
            **self._pmap_kwargs,
        )(lifted.values)
        return lifted.apply(outcome, values + join_by_axis(mapped, unmapped, leaf_axes.axes))


def pmap(
    fun: Callable[..., Any] | None = None,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    axis_name: Any = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **pmap_kwargs: Any,
) -> Any:
    """`jax.pmap` for functions of Modules and Variables, with axes chosen per filter.

    As `vmap`, over devices: each positional argument is split over its devices along
    an axis (an int), the same on every device (`None`), or, for an argument holding
    Variables, per leaf with `StateAxes({filter: axis})`, e.g. parameters replicated
    and per-device statistics split. Keyword arguments are split over axis 0, the
    function itself (a Module, a bound method) is replicated. Variables written inside
    are written back with their axis: a split Variable gets every device's value; a
    replicated one keeps the first device's, so make it the same on all (e.g. with
    `jax.lax.pmean` over `axis_name`). The objects' structure must not change inside.

    Arguments:
        fun: the function. Omit it to get a decorator.
        in_axes: one spec for every positional argument, or a tuple with one per
            argument; a spec is an int, `None` or a `StateAxes`.
        out_axes: where the device axis goes in the output: one spec for all of it, or a
            tuple with one per output item; a spec is an int, `None` (the same on every
            device: the first device's value is returned), or a `StateAxes` for the
            Variables of Modules the function returns (e.g. `StateAxes({Param: None,
            ...: 0})`), as `vmap`'s `out_axes`.
        axis_name: the name of the device axis, for collectives such as
            `jax.lax.pmean`.
        graph: `False` for tree mode: `jax.pmap` over the arguments as pytrees
            (`in_axes`/`out_axes` as `jax.pmap` takes them; `StateAxes` refused);
            Variables written come back with their argument's axis; a Variable met twice
            is refused. `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back values only.
            `None` reads `set_graph_updates`.
        **pmap_kwargs: passed on to `jax.pmap` (`devices`, `backend`, `axis_size`).

    Returns:
        The function, mapped over devices.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import BatchStat, Param, StateAxes, pmap
        >>> class Norm(Module):
        ...     def __init__(self):
        ...         self.scale = Param(jnp.array(2.0))
        ...         self.mean = BatchStat(jnp.array(0.0))
        ...     def __call__(self, x):
        ...         self.mean.value = jax.lax.pmean(x.mean(), "devices")
        ...         return self.scale.value * (x - self.mean.value)
        >>> n = jax.local_device_count()
        >>> norm = Norm()
        >>> step = pmap(lambda m, x: m(x), in_axes=(StateAxes({...: None}), 0),
        ...             axis_name="devices")
        >>> out = step(norm, jnp.ones((n, 3)))
        >>> out.shape == (n, 3), float(norm.mean.value)
        (True, 1.0)
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    for name, how in _REFUSED.items():
        if name in pmap_kwargs and graph and graph_updates:
            raise TypeError(f"pmap: {name} is not supported for functions of Modules: {how}.")
    if fun is None:
        return functools.partial(
            pmap,
            in_axes=in_axes,
            out_axes=out_axes,
            axis_name=axis_name,
            graph=graph,
            graph_updates=graph_updates,
            **pmap_kwargs,
        )
    check_callable(fun, "pmap")
    if not (graph and graph_updates):
        options = {"axis_name": axis_name, **pmap_kwargs}
        return simple_vmap(fun, graph, "pmap", in_axes, out_axes, options, mapper=jax.pmap)
    return _GraphPmap(fun, in_axes, out_axes, {"axis_name": axis_name, **pmap_kwargs})
