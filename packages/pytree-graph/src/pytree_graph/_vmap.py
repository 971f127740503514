"""`vmap` for functions of object graphs, with mapping axes chosen per filter."""

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax

from pytree_filter import path_text, to_predicate
from pytree_transforms.extend import BindsAsMethod

from ._aliases import check_one_spec, lift_recording_aliases
from ._boundary import Call, Inside
from ._errors import check_callable
from ._state import check_everything_last, show_filter


class StateAxes:
    """Mapping axes chosen per filter, for the Variables and arrays of one argument.

    Each leaf takes the axis of the first filter it matches (Variable types, `...`,
    predicates on the leaf, filter objects such as `PathContains`, which see the leaf's
    path within the argument); every leaf must match one, so end with `...` for the
    rest. An axis is an int or `None` (not mapped: the same value for every example).

    Arguments:
        axes: `{filter: axis}`, in order.

    Examples:
        >>> from pytree_graph import Cache, Param, StateAxes
        >>> axes = StateAxes({Param: None, Cache: 0})  # parameters shared, caches mapped
        >>> axes
        StateAxes({Param: None, Cache: 0})
    """

    __slots__ = ("_items", "_predicates")

    def __init__(self, axes: Mapping[Any, int | None]):
        if not isinstance(axes, Mapping) or not axes:
            raise TypeError(
                "StateAxes expects a non-empty dict {filter: axis}, e.g. "
                f"StateAxes({{Param: None, ...: 0}}); got {axes!r}."
            )
        for axis in axes.values():
            if axis is not None and not isinstance(axis, int):
                raise TypeError(f"StateAxes: an axis must be an int or None, got {axis!r}.")
        check_everything_last(tuple(axes))
        self._items = tuple(axes.items())
        self._predicates = tuple(to_predicate(f) for f in axes)

    def axis_of(self, path: tuple, leaf: Any) -> int | None:
        """The axis of the leaf at `path` (within its argument)."""
        for predicate, (_, axis) in zip(self._predicates, self._items, strict=True):
            if predicate(path, leaf):
                return axis
        raise ValueError(
            f"vmap: no filter of {self!r} matches the {type(leaf).__name__} at "
            f"{path_text(path)}. Every Variable and array of the argument needs an axis: "
            "add a filter for it, or end with `...: 0` (or `...: None`)."
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{show_filter(f)}: {a}" for f, a in self._items)
        return f"StateAxes({{{shown}}})"


def _check_axis_spec(spec: Any, where: str) -> None:
    if spec is None or isinstance(spec, int | StateAxes):
        return
    raise TypeError(
        f"vmap: {where} must be an int, None or a StateAxes, got {spec!r}. (Per-leaf "
        "axes inside an argument are given with StateAxes({filter: axis}).)"
    )


class _GraphVmap(BindsAsMethod):
    """The function `vmap` returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        vmap_kwargs: dict[str, Any],
    ):
        self._call = Call(fun)
        if isinstance(in_axes, list):
            in_axes = tuple(in_axes)
        for i, spec in enumerate(in_axes if isinstance(in_axes, tuple) else (in_axes,)):
            _check_axis_spec(spec, f"in_axes[{i}]" if isinstance(in_axes, tuple) else "in_axes")
        if out_axes is not None and not isinstance(out_axes, int):
            raise TypeError(
                f"vmap: out_axes must be an int or None (one axis for every output "
                f"array), got {out_axes!r}."
            )
        self._in_axes = in_axes
        self._out_axes = out_axes
        self._vmap_kwargs = vmap_kwargs
        functools.update_wrapper(self, fun, updated=())

    def _spec_of(self, argument: Any, num_args: int) -> Any:
        if argument is None:
            return None  # the function itself is broadcast
        if isinstance(argument, str):
            return 0  # keyword arguments are mapped over their leading axis, as in jax.vmap
        if isinstance(self._in_axes, tuple):
            if len(self._in_axes) != num_args:
                raise ValueError(
                    f"vmap: in_axes has {len(self._in_axes)} entries but the function was "
                    f"called with {num_args} positional argument(s)."
                )
            return self._in_axes[argument]
        return self._in_axes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._call
        lifted, walk = lift_recording_aliases(call.tree(args, kwargs))

        def axis_of(path: tuple, leaf: Any) -> int | None:
            argument, relative = call.split_path(path)
            spec = self._spec_of(argument, len(args))
            return spec.axis_of(relative, leaf) if isinstance(spec, StateAxes) else spec

        check_one_spec(
            "vmap",
            "in_axes",
            call,
            walk,
            axis_of,
            "Give the arguments that share it the same axis for it, or pass separate "
            "objects (e.g. `pytree_graph.clone(model)`).",
        )
        axes = list(map(axis_of, lifted.paths, lifted.leaves))
        if all(a is None for a in axes) and "axis_size" not in self._vmap_kwargs:
            raise ValueError(
                "vmap: nothing is mapped (every array and Variable has axis None), so the "
                "batch size is unknown. Pass `axis_size=`, or map an argument."
            )

        def batched(values: list[Any]) -> Any:
            inside = Inside(lifted.graphdef, values)
            outcome, values = inside.finish(
                call.run(inside.tree), structure="fixed", transform="vmap"
            )
            # Argument leaves get their in_axes, the output's own values the out_axes.
            return values[: outcome.num_leaves], outcome, values[outcome.num_leaves :]

        try:
            values, outcome, out_values = jax.vmap(
                batched,
                in_axes=(axes,),
                out_axes=(axes, None, self._out_axes),
                **self._vmap_kwargs,
            )(lifted.values)
        except ValueError as error:
            if "out_axes" not in str(error) or "None" not in str(error):
                raise
            raise ValueError(
                "vmap: a value that is not mapped (axis None: a broadcast Variable or array, "
                "or an output with out_axes=None) was given a value that differs across "
                "the batch. Map it (an axis in in_axes, e.g. StateAxes({Param: None, "
                "BatchStat: 0, ...: None})), or compute it from values that are the same "
                "for every example."
            ) from error
        return lifted.apply(outcome, values + out_values)


def vmap(
    fun: Callable[..., Any] | None = None,
    *,
    in_axes: Any = 0,
    out_axes: int | None = 0,
    **vmap_kwargs: Any,
) -> Any:
    """`jax.vmap` for functions of Modules and Variables, with axes chosen per filter.

    Each positional argument is mapped over one axis (an int), not mapped (`None`), or,
    for an argument holding Variables, mapped per leaf with `StateAxes({filter: axis})`:
    e.g. a model's parameters broadcast while its cache is mapped. Keyword arguments are
    mapped over axis 0, the function itself (a Module, a bound method) is broadcast.
    Variables written inside are written back with their axis: a mapped Variable gets
    every example's value; a broadcast one must get a value that is the same for all.
    The structure of the objects passed must not change inside (see `jit` for that).
    Objects created inside and returned (e.g. a model built from a batch of keys) come
    back with the batch axis in every Variable, at `out_axes`.

    Arguments:
        fun: the function. Omit it to get a decorator.
        in_axes: one spec for every positional argument, or a tuple with one per
            argument; a spec is an int, `None` or a `StateAxes`.
        out_axes: where the batch axis goes in every output array (an int), or `None`.
        **vmap_kwargs: passed on to `jax.vmap` (`axis_name`, `axis_size`,
            `spmd_axis_name`).

    Returns:
        The vectorised function.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Cache, Param, StateAxes, vmap
        >>> class Layer(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.full(3, 2.0))
        ...         self.last = Cache(jnp.zeros((4, 3)))
        ...     def __call__(self, x):
        ...         self.last.value = x * self.w.value
        ...         return self.last.value.sum()
        >>> layer = Layer()
        >>> out = vmap(lambda m, x: m(x), in_axes=(StateAxes({Param: None, Cache: 0}), 0))(
        ...     layer, jnp.ones((4, 3)))
        >>> out.tolist(), layer.last.value.shape
        ([6.0, 6.0, 6.0, 6.0], (4, 3))
    """
    if fun is None:
        return functools.partial(vmap, in_axes=in_axes, out_axes=out_axes, **vmap_kwargs)
    check_callable(fun, "vmap")
    return _GraphVmap(fun, in_axes, out_axes, vmap_kwargs)
