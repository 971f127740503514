"""`shard_map` for functions of object graphs: each device runs the function on its own
shard of the model's Variables, and what it writes comes back sharded the same way."""

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from pytree_transforms.extend import BindsAsMethod

from ._aliases import check_one_spec, lift_recording_aliases
from ._argument_specs import PerArgumentSpecs
from ._boundary import Call, Inside, holds_graph_nodes
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._sharding import spec_of
from ._tree_transforms import simple_shard_map


class _GraphShardMap(BindsAsMethod):
    """The function `shard_map` returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        mesh: Any,
        in_specs: Any,
        out_specs: Any,
        shard_map_kwargs: dict[str, Any],
    ):
        self._call = Call(fun)
        self._in_specs = PerArgumentSpecs(
            "shard_map",
            "in_specs",
            in_specs,
            lambda spec: isinstance(spec, PartitionSpec),
            "a PartitionSpec (build a spec per Variable with "
            "`pytree_graph.get_partition_spec(argument)`)",
        )
        self._mesh = mesh
        self._out_specs = out_specs
        self._kwargs = shard_map_kwargs
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._call
        lifted, walk = lift_recording_aliases(call.tree(args, kwargs))

        def spec_at(path: tuple, leaf: Any) -> Any:
            return self._in_specs.for_leaves(call, [path], [leaf], len(args), spec_of)[0]

        check_one_spec(
            "shard_map",
            "in_specs",
            call,
            walk,
            spec_at,
            "Give it the same PartitionSpec wherever it is reached, or pass separate objects.",
        )
        specs = self._in_specs.for_leaves(
            call, lifted.paths, lifted.leaves, len(args), of_function=spec_of
        )

        def per_device(values: list[Any]) -> Any:
            inside = Inside(lifted.graphdef, values)
            out = call.run(inside.tree)
            if holds_graph_nodes(out):
                raise TypeError(
                    "shard_map: the function returned a Module or Variable; inside "
                    "shard_map, change the objects passed in place (the changes are "
                    "written back) and return arrays."
                )
            outcome, values = inside.finish(None, structure="fixed", transform="shard_map")
            return values, outcome, out

        values, outcome, out = jax.shard_map(
            per_device,
            mesh=self._mesh,
            in_specs=(specs,),
            out_specs=(specs, PartitionSpec(), self._out_specs),
            **self._kwargs,
        )(lifted.values)
        lifted.apply(outcome, values)
        return out


def shard_map(
    fun: Callable[..., Any] | None = None,
    *,
    mesh: Mesh | None = None,
    in_specs: Any,
    out_specs: Any,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **shard_map_kwargs: Any,
) -> Any:
    """`jax.shard_map` for functions of Modules and Variables: each device runs `fun` on
    its own shard of every array, and Variables written inside come back sharded.

    Each positional argument gets a spec in `in_specs`: a `PartitionSpec` (for every array
    of that argument), or, for an argument holding Modules or Variables, the State of
    specs `get_partition_spec(argument)` gives, so each Variable is split as its
    `sharding` metadata says (any pytree prefix of an argument, with PartitionSpecs at its
    leaves, works too). The function itself, when it is a Module or a method
    bound to one, is split by its metadata. Inside, `fun` sees each shard (a Variable
    split over "model" on 4 devices holds a quarter of the array) and communicates with
    collectives such as `jax.lax.psum` over the mesh's axis names. Variables it writes
    are written back with the spec they came in with; a replicated one (spec `P()`) must
    get the same value on every device. The objects' structure must not change inside.

    Arguments:
        fun: the function; it returns arrays (not Modules). Omit it to get a decorator.
        mesh: the device mesh (None: the mesh set with `jax.set_mesh`).
        in_specs: one spec for every positional argument, or a tuple with one per
            argument.
        out_specs: the specs of the output, as for `jax.shard_map`.
        graph: `False` for tree mode: `jax.shard_map` over the arguments as pytrees
            (`in_specs` a pytree prefix of them, PartitionSpecs at its leaves;
            `StateSharding` refused); Variables written come back with their argument's
            spec; a Variable met twice is refused; the output may hold new Modules.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back values only.
            `None` reads `set_graph_updates`.
        **shard_map_kwargs: passed on to `jax.shard_map` (`axis_names`, `check_vma`).

    Returns:
        The function, mapped over the mesh's devices.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, get_partition_spec, shard_map
        >>> class Dense(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones((4, 2)), sharding=("model", None))
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
        >>> dense = Dense()
        >>> def forward(model, x):  # x and w split along the contracted axis: sum them up
        ...     return jax.lax.psum(x @ model.w.value, "model")
        >>> specs = (get_partition_spec(dense), P(None, "model"))
        >>> f = shard_map(forward, mesh=mesh, in_specs=specs, out_specs=P())
        >>> f(dense, jnp.ones((3, 4))).tolist()
        [[4.0, 4.0], [4.0, 4.0], [4.0, 4.0]]
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        return functools.partial(
            shard_map,
            mesh=mesh,
            in_specs=in_specs,
            out_specs=out_specs,
            graph=graph,
            graph_updates=graph_updates,
            **shard_map_kwargs,
        )
    check_callable(fun, "shard_map")
    if mesh is not None and not isinstance(mesh, Mesh | jax.sharding.AbstractMesh):
        raise TypeError(f"shard_map: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
    if not (graph and graph_updates):
        options = {"mesh": mesh, **shard_map_kwargs} if mesh is not None else shard_map_kwargs
        return simple_shard_map(fun, graph, in_specs, out_specs, options)
    return _GraphShardMap(fun, mesh, in_specs, out_specs, shard_map_kwargs)
