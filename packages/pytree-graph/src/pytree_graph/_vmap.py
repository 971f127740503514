"""`vmap` for functions of object graphs, with mapping axes chosen per filter."""

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from pytree_filter import path_text
from pytree_module import Module, data, static
from pytree_module.extend import construct, flat_form, is_pytree_class
from pytree_transforms.extend import BindsAsMethod

from ._aliases import check_one_spec, leaf_aliases, lift_recording_aliases, show_argument_path
from ._argument_specs import FilterSpecs
from ._boundary import Call, Inside
from ._carry import Carry, show_axis
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._transform_metadata import TransformMetadata
from ._traverse import GraphWalk
from ._tree_transforms import simple_vmap
from ._variables import Variable


class StateAxes(FilterSpecs):
    """Axes chosen per filter, for the Variables and arrays of one argument.

    Each leaf takes the axis of the first filter it matches (Variable types, `...`,
    predicates on the leaf, filter objects such as `PathContains`, which see the leaf's
    path within the argument, or a tuple of filters, matching what any of them
    matches); every leaf must match one, so end with `...` for the rest. An axis is an
    int, `None` (not mapped: the same value for every example), or, for `scan`'s
    `in_axes` only, `Carry` (carried from step to step).

    As Flax NNX's, it is also made from a `State` of axes, one per Variable, e.g.
    `jax.tree.map(axis_of, state(model))`: each path then gets its own axis (a `PathIn`
    filter per axis, of the paths that have it), for that model's structure.

    Arguments:
        axes: `{filter: axis}`, in order; or a `State` whose leaves (Variables, or
            values) are the axes.

    Examples:
        >>> from pytree_graph import BatchStat, Cache, Param, StateAxes
        >>> StateAxes({Param: None, Cache: 0})  # parameters shared, caches mapped
        StateAxes({Param: None, Cache: 0})
        >>> StateAxes({(Param, BatchStat): 0, ...: None})  # a tuple: any of its filters
        StateAxes({(Param, BatchStat): 0, ...: None})
        >>> import jax, jax.numpy as jnp
        >>> from pytree_graph import State
        >>> StateAxes(State({"w": Param(None), "stats": {"mean": BatchStat(0)}}))
        StateAxes({PathIn(.stats.mean): 0, PathIn(.w): None})
    """

    __slots__ = ()

    def __init__(self, axes: Mapping[Any, Any]):
        super().__init__(axes)

    def check_spec(self, spec: Any) -> None:
        is_int = isinstance(spec, int) and not isinstance(spec, bool)
        if spec is not None and spec is not Carry and not is_int:
            raise TypeError(f"StateAxes: an axis must be an int, None or Carry, got {spec!r}.")

    def axis_of(self, path: tuple, leaf: Any, transform: str = "vmap") -> Any:
        """The axis of the leaf at `path` (within its argument)."""
        return self.spec_of(path, leaf, transform)

    def map_prefix(self, path: Any, variable: Any, /) -> Any:
        """Flax NNX's name for `axis_of`: the axis of `variable` (a Variable or value; None
        where only the path decides) at `path` (a tuple of keys within its argument).

        Raises:
            ValueError: no filter matches, naming the path.

        Examples:
            >>> from pytree_graph import BatchStat, Param, State, StateAxes
            >>> axes = StateAxes(State({"w": Param(0), "stats": {"mean": BatchStat(1)}}))
            >>> axes.map_prefix(("stats", "mean"), None), axes.map_prefix(("w",), None)
            (1, 0)
            >>> StateAxes({Param: None, ...: 0}).map_prefix(("w",), Param(1.0)) is None
            True
        """
        return self.spec_of(tuple(path), variable, "StateAxes.map_prefix")

    def show_spec(self, spec: Any) -> str:
        return show_axis(spec)

    @property
    def has_carry(self) -> bool:
        """Whether some filter's axis is `Carry`."""
        return any(axis is Carry for _, axis in self.items())


def _check_axis_spec(spec: Any, where: str, transform: str) -> None:
    if spec is None or (isinstance(spec, int) and not isinstance(spec, bool)):
        return
    if isinstance(spec, StateAxes):
        if spec.has_carry:
            raise TypeError(
                f"{transform}: {where} is {spec!r}, but Carry is for `scan` (what a loop "
                f"carries from step to step): give {transform} an int or None."
            )
        return
    raise TypeError(
        f"{transform}: {where} must be an int, None or a StateAxes, got {spec!r}. (Per-leaf "
        "axes inside an argument are given with StateAxes({filter: axis}).)"
    )


def check_axes(axes: Any, option: str, transform: str = "vmap") -> Any:
    """`in_axes` or `out_axes`: one spec, or a tuple of them (a list becomes a tuple)."""
    if isinstance(axes, list):
        axes = tuple(axes)
    for i, spec in enumerate(axes if isinstance(axes, tuple) else (axes,)):
        where = f"{option}[{i}]" if isinstance(axes, tuple) else option
        _check_axis_spec(spec, where, transform)
    return axes


def split_by_axis(values: list[Any], leaf_axes: tuple) -> tuple[list[Any], list[Any]]:
    """The output's values (traced) as those mapped (batched at axis 0, moved to their
    `out_axes` after, by `join_by_axis`) and those not (axis None)."""
    mapped = [v for v, a in zip(values, leaf_axes, strict=True) if a is not None]
    unmapped = [v for v, a in zip(values, leaf_axes, strict=True) if a is None]
    return mapped, unmapped


def join_by_axis(mapped: list[Any], unmapped: list[Any], leaf_axes: tuple) -> list[Any]:
    """The output's values, in order, each mapped one with its axis at its `out_axes`."""
    mapped_left, unmapped_left = iter(mapped), iter(unmapped)
    return [
        next(unmapped_left) if axis is None else place_axis(next(mapped_left), axis)
        for axis in leaf_axes
    ]


def spec_at(axes: Any, path: tuple, leaf: Any, transform: str) -> Any:
    """The axis that `out_axes` (one spec, or a tuple with one per output item) gives
    the leaf at `path` of the output (checked by `check_output_items`)."""
    if isinstance(axes, tuple):
        axes, path = axes[path[0]], path[1:]
    return axes.axis_of(path, leaf, transform) if isinstance(axes, StateAxes) else axes


def check_output_items(axes: Any, out: Any, transform: str) -> None:
    """Refuse an output that is not a tuple with one item per entry of `out_axes`."""
    if isinstance(axes, tuple) and not (isinstance(out, tuple) and len(out) == len(axes)):
        got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise ValueError(
            f"{transform}: out_axes has {len(axes)} entries, one per output, but the "
            f"function returned {got}. Return a tuple of {len(axes)}, or give one spec "
            "for the whole output."
        )


class LeafAxes:
    """The axis of each value, found while tracing: a static pytree (no leaves), so a
    transform can return it."""

    __slots__ = ("axes",)

    def __init__(self, axes: tuple):
        self.axes = axes

    def __hash__(self) -> int:
        return hash(self.axes)

    def __eq__(self, other: object) -> bool:
        return type(other) is LeafAxes and self.axes == other.axes


jax.tree_util.register_static(LeafAxes)


def place_axis(value: Any, axis: int) -> Any:
    """A value batched at axis 0, with that axis moved to `axis`."""
    return value if axis == 0 else jnp.moveaxis(value, 0, axis)


def argument_leaves(inside: Inside) -> list[Any]:
    """The Variables and arrays of the objects a transform built, in leaf order."""
    walk = GraphWalk()
    walk.graphdef(inside.tree)
    return walk.leaves


def output_leaves(inside: Inside, out: Any) -> tuple[list[Any], list[tuple]]:
    """The output's own Variables and arrays (not the arguments'), and their paths in
    it: those whose values `Inside.finish` returns, in the same order."""
    walk = GraphWalk()
    walk.visit(inside.tree, ())
    start = len(walk.leaves)
    walk.visit(out, ("<output>",))
    return walk.leaves[start:], [path[1:] for path in walk.paths[start:]]


def check_returned_axes(
    transform: str, call: Call, inside: Inside, out: Any, axes: list[Any], out_axes: Any
) -> None:
    """Refuse an output that holds a Variable or array of the arguments (e.g. the Module
    passed in, returned) where `out_axes` gives it another axis than `in_axes` did: it
    has one value, so one axis (Flax NNX raises the same "Inconsistent aliasing").

    Arguments:
        axes: the axis of each argument leaf, in leaf order (from `lift_with_axes`).
        out_axes: the transform's `out_axes`.

    Raises:
        ValueError: naming the leaf's argument path and output path, with each axis.
    """
    walk = GraphWalk(record_shared=True)
    walk.visit(inside.tree, ())
    num_leaves = len(walk.leaves)
    walk.visit(out, ("<output>",))
    shared = walk.shared_paths
    assert shared is not None
    # Only an object of the arguments that the output reaches again can alias.
    if not any(
        len(paths) > 1 and paths[0][:1] != ("<output>",) and paths[-1][:1] == ("<output>",)
        for paths in shared.values()
    ):
        return
    for position, paths in leaf_aliases(walk).items():
        if position >= num_leaves:
            continue
        leaf = walk.leaves[position]
        for path in paths:
            if path[:1] != ("<output>",):
                continue
            out_axis = spec_at(out_axes, path[1:], leaf, transform)
            if out_axis != axes[position]:
                here = show_argument_path(call, paths[0])
                there = f"the output at {path_text(path[1:], root='the top level')}"
                raise ValueError(
                    f"{transform}: Inconsistent aliasing detected: the "
                    f"{type(leaf).__name__} reached as {here} and as {there} is one "
                    f"object, but in_axes and out_axes give it two axes:\n  {here}: "
                    f"{axes[position]!r} (in_axes)\n  {there}: {out_axis!r} (out_axes)\n"
                    "It has one value, which cannot follow both. Give it the same axis in "
                    "out_axes (e.g. the same StateAxes as in_axes), or return a copy "
                    "(`pytree_graph.clone(...)`) or new objects."
                )


def lift_with_axes(
    transform: str, call: Call, args: tuple, kwargs: dict[str, Any], in_axes: Any, sized: bool
) -> tuple[Any, list[Any]]:
    """A mapping transform's call lifted, with the axis of each of its leaves.

    Arguments:
        transform: "vmap" or "pmap", for errors.
        call: how the function is called.
        args, kwargs: the call's arguments.
        in_axes: one spec for every positional argument, or a tuple with one each
            (keyword arguments left after `keywords_to_positions` are mapped over axis
            0; the function itself is not mapped).
        sized: whether the size of the mapped axis is given (`axis_size=`).

    Raises:
        ValueError: `in_axes` does not have one entry per positional argument; an object
            shared by two arguments gets two axes; nothing is mapped and the size is not
            given.
    """
    num_args = len(args)

    def spec_of(argument: Any) -> Any:
        if argument is None:
            return None  # the function itself is the same for every example
        if isinstance(argument, str):
            return 0  # keyword arguments are mapped over their leading axis, as in jax.vmap
        if isinstance(in_axes, tuple):
            if len(in_axes) != num_args:
                raise ValueError(
                    f"{transform}: in_axes has {len(in_axes)} entries but the function was "
                    f"called with {num_args} positional argument(s): give one per argument."
                )
            return in_axes[argument]
        return in_axes

    def axis_of(path: tuple, leaf: Any) -> int | None:
        argument, relative = call.split_path(path)
        spec = spec_of(argument)
        return spec.axis_of(relative, leaf, transform) if isinstance(spec, StateAxes) else spec

    lifted, walk = lift_recording_aliases(call.tree(args, kwargs))
    check_one_spec(
        transform,
        "in_axes",
        call,
        walk,
        axis_of,
        "Give the arguments that share it the same axis for it, or pass separate "
        "objects (e.g. `pytree_graph.clone(model)`).",
    )
    axes = list(map(axis_of, lifted.paths, lifted.leaves))
    if all(a is None for a in axes) and not sized:
        size = "batch size" if transform == "vmap" else "number of devices"
        raise ValueError(
            f"{transform}: nothing is mapped (every array and Variable has axis None), so "
            f"the {size} is unknown. Pass `axis_size=`, or map an argument."
        )
    return lifted, axes


def signature_or_none(fun: Callable[..., Any]) -> inspect.Signature | None:
    """`fun`'s signature, or `None` where Python cannot give one (some builtins) or it
    is a `functools.partial` (whose signature NNX also treats as opaque)."""
    if isinstance(fun, functools.partial):
        return None
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def keywords_to_positions(
    signature: inspect.Signature | None, args: tuple, kwargs: dict[str, Any]
) -> tuple[tuple, dict[str, Any]]:
    """The call with each keyword argument that names a positional parameter moved to
    its position, as Flax NNX's transforms resolve them, so that it takes that
    parameter's entry of `in_axes` (`f(x, rngs=r)` under `in_axes=(0, None)` broadcasts
    `r`). Keyword-only arguments, and those after a skipped defaulted parameter, stay
    keywords. A call that does not fit the signature is left as it is, for the function
    to raise its own error."""
    if signature is None:
        return args, kwargs
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    return bound.args, bound.kwargs


class _GraphVmap(BindsAsMethod):
    """The function `vmap` returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        transform_metadata: Mapping[str, Any] | None,
        vmap_kwargs: dict[str, Any],
    ):
        self._call = Call(fun)
        self._in_axes = check_axes(in_axes, "in_axes")
        self._out_axes = check_axes(out_axes, "out_axes")
        self._given_metadata = transform_metadata
        self._metadata = (
            None if transform_metadata is None else TransformMetadata(transform_metadata, "vmap")
        )
        self._vmap_kwargs = vmap_kwargs
        # Read once here: only calls with keyword arguments use it.
        self._signature = signature_or_none(fun)
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args, kwargs = keywords_to_positions(self._signature, args, kwargs)
        # A pytree Module still in its `__init__`: a decorated `__init__` (checked first,
        # as the structure of such a Module is not settled yet).
        if (
            args
            and isinstance(args[0], Module)
            and is_pytree_class(type(args[0]))
            and flat_form(args[0])[1] is None
        ):
            return self._initialise(args[0], args[1:], kwargs)
        call = self._call
        lifted, axes = lift_with_axes(
            "vmap", call, args, kwargs, self._in_axes, "axis_size" in self._vmap_kwargs
        )
        out_axes, metadata = self._out_axes, self._metadata

        def batched(values: list[Any]) -> Any:
            inside = Inside(lifted.graphdef, values)
            # Inside, a mapped Variable's `sharding` metadata names its axes without the
            # one mapped over (as its value has them); it is named again on the way out.
            marked = []
            if metadata is not None:
                for position, leaf in enumerate(argument_leaves(inside)):
                    if isinstance(leaf, Variable) and axes[position] is not None:
                        where = show_argument_path(call, lifted.paths[position])
                        metadata.remove_axis(leaf, axes[position], where)
                        marked.append((leaf, axes[position]))
            out = call.run(inside.tree)
            for leaf, axis in marked:
                metadata.add_axis(leaf, axis)
            check_output_items(out_axes, out, "vmap")
            check_returned_axes("vmap", call, inside, out, axes, out_axes)
            leaves, paths = output_leaves(inside, out)
            leaf_axes = tuple(
                spec_at(out_axes, path, leaf, "vmap")
                for path, leaf in zip(paths, leaves, strict=True)
            )
            if metadata is not None:
                for leaf, axis in zip(leaves, leaf_axes, strict=True):
                    if isinstance(leaf, Variable) and axis is not None:
                        metadata.add_axis(leaf, axis)
            outcome, values = inside.finish(out, structure="fixed", transform="vmap")
            # Argument leaves keep their in_axes; the output's own values are batched at
            # axis 0 (moved to their out_axes after) or not at all.
            mapped, unmapped = split_by_axis(values[outcome.num_leaves :], leaf_axes)
            return values[: outcome.num_leaves], outcome, mapped, unmapped, LeafAxes(leaf_axes)

        try:
            values, outcome, mapped, unmapped, leaf_axes = jax.vmap(
                batched,
                in_axes=(axes,),
                out_axes=(axes, None, 0, None, None),
                **self._vmap_kwargs,
            )(lifted.values)
        except ValueError as error:
            text = str(error)
            if "out_axes" not in text or "None" not in text or "Inconsistent aliasing" in text:
                raise
            raise ValueError(
                "vmap: a value that is not mapped (axis None: a broadcast Variable or array, "
                "or an output with out_axes=None) was given a value that differs across "
                "the batch. Map it (an axis in in_axes, e.g. StateAxes({Param: None, "
                "BatchStat: 0, ...: None})), or compute it from values that are the same "
                "for every example."
            ) from error
        return lifted.apply(outcome, values + join_by_axis(mapped, unmapped, leaf_axes.axes))

    def _initialise(self, module: Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Run a vmapped `__init__`, as Flax NNX does: build one object per example
        inside the map, and give `module` (the one being initialised) their attributes,
        each Variable stacked at the axis `in_axes` gives the object (an int, or per filter
        with a `StateAxes`); `__init__` returns nothing, so `out_axes` plays no part."""
        cls = type(module)
        if vars(module):
            raise TypeError(
                f"pytree_graph.vmap on {cls.__name__}.__init__: the object has attributes "
                f"already ({', '.join(sorted(vars(module)))}), set before the vmapped "
                "`__init__` runs (e.g. by a subclass's `__init__` calling it through "
                "`super()`). Map the `__init__` of the class being built, or vmap a "
                f"function that builds the object: `vmap(lambda *a: {cls.__name__}(*a))`."
            )
        in_axes = self._in_axes
        if isinstance(in_axes, tuple):
            if len(in_axes) != len(args) + 1:
                raise ValueError(
                    f"vmap: in_axes has {len(in_axes)} entries but {cls.__name__}.__init__ "
                    f"was called with {len(args) + 1} positional argument(s), `self` "
                    "included: give one per argument (the first is the axis of the new "
                    "object's Variables)."
                )
            own, rest = in_axes[0], in_axes[1:]
        else:
            own, rest = in_axes, in_axes
        init = self.__wrapped__

        def build(*args: Any, **kwargs: Any) -> Module:
            return construct(cls, init, *args, **kwargs)

        functools.update_wrapper(build, init)
        built = vmap(
            build,
            in_axes=rest,
            out_axes=own,
            transform_metadata=self._given_metadata,
            **self._vmap_kwargs,
        )(*args, **kwargs)
        data_keys = flat_form(built)[1].layout.data_keys
        # Wrapped, so that each attribute keeps the status it got inside.
        for name, value in vars(built).items():
            setattr(module, name, data(value) if name in data_keys else static(value))


def vmap(
    fun: Callable[..., Any] | None = None,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    transform_metadata: Mapping[str, Any] | None = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **vmap_kwargs: Any,
) -> Any:
    """`jax.vmap` for functions of Modules and Variables, with axes chosen per filter.

    Each positional argument is mapped over one axis (an int), not mapped (`None`), or,
    for an argument holding Variables, mapped per leaf with `StateAxes({filter: axis})`:
    e.g. a model's parameters broadcast while its cache is mapped. A keyword argument
    that names a positional parameter is bound to its position and takes its entry, as
    Flax NNX's (`f(x, rngs=r)` under `in_axes=(0, None)` broadcasts `r`); keyword-only
    arguments are mapped over axis 0. The function itself (a Module, a bound method) is
    broadcast.
    Variables written inside are written back with their axis: a mapped Variable gets
    every example's value; a broadcast one must get a value that is the same for all.
    The structure of the objects passed must not change inside (see `jit` for that).
    Objects created inside and returned (e.g. a model built from a batch of keys) come
    back with the batch axis in every Variable, at `out_axes`.

    With `transform_metadata={PARTITION_NAME: "layers"}` the batch axis is named in the
    Variables' `sharding` metadata: inserted at its position in the Variables the
    function creates and returns (so `get_partition_spec` of a stack of layers names
    the layer axis), and taken out of mapped arguments' Variables while it runs.
    Variables without `sharding` metadata are left without it.

    Arguments:
        fun: the function. Omit it to get a decorator.
        in_axes: one spec for every positional argument, or a tuple with one per
            argument; a spec is an int, `None` or a `StateAxes`.
        out_axes: where the batch axis goes in the output: one spec for all of it, or a
            tuple with one per item of a tuple output; a spec is an int, `None` (the
            same for every example) or a `StateAxes` (per filter, for an output
            holding Variables). An object of the arguments returned keeps its
            `in_axes`; `out_axes` giving one of its Variables another axis raises a
            `ValueError` ("Inconsistent aliasing detected", as Flax NNX's).
        transform_metadata: `{PARTITION_NAME: name}`, naming the batch axis in the
            `sharding` metadata (another key names another tuple-valued metadata
            entry, which gets its value inserted likewise, as in Flax NNX).
        graph: `False` for tree mode: `jax.vmap` over the arguments as pytrees, with
            `in_axes`/`out_axes` pytree prefixes as `jax.vmap` takes them (a
            Module-shaped prefix from `prefix(...)` too; `StateAxes` refused). Variables
            written inside come back with their argument's axis; a Variable met twice is
            refused. `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back Variable values
            only (as tree mode). `None` reads `set_graph_updates`.
        **vmap_kwargs: passed on to `jax.vmap` (`axis_name`, `axis_size`,
            `spmd_axis_name`).

    Returns:
        The vectorised function.

    Examples:
        >>> import jax, jax.numpy as jnp
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

        A stack of layers whose sharding metadata names the layer axis:

        >>> from pytree_graph import PARTITION_NAME, get_partition_spec
        >>> class Dense(Module):
        ...     def __init__(self, key):
        ...         self.w = Param(jax.random.normal(key, (2, 2)), sharding=(None, "model"))
        >>> stack = vmap(Dense, transform_metadata={PARTITION_NAME: "layers"})(
        ...     jax.random.split(jax.random.key(0), 3))
        >>> stack.w.value.shape, stack.w.sharding
        ((3, 2, 2), ('layers', None, 'model'))
        >>> tuple(get_partition_spec(stack)["w"].value)
        ('layers', None, 'model')
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        return functools.partial(
            vmap,
            in_axes=in_axes,
            out_axes=out_axes,
            transform_metadata=transform_metadata,
            graph=graph,
            graph_updates=graph_updates,
            **vmap_kwargs,
        )
    check_callable(fun, "vmap")
    if not (graph and graph_updates):
        if transform_metadata:
            raise ValueError(
                "vmap: transform_metadata= names the batch axis in the Variables' metadata, "
                "which graph=False and graph_updates=False do not write back. Pass "
                "graph=True and graph_updates=True to use it."
            )
        return simple_vmap(fun, graph, "vmap", in_axes, out_axes, vmap_kwargs)
    return _GraphVmap(fun, in_axes, out_axes, transform_metadata, vmap_kwargs)
