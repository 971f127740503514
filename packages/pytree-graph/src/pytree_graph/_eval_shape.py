"""Abstract models: `eval_shape` (`jax.eval_shape` for functions of object graphs), and
`abstract_with_sharding` and `get_abstract_model`, which give an abstract model's
`ShapeDtypeStruct`s the shardings its metadata says (what a sharded checkpoint restore
needs)."""

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from ._boundary import Call, Inside
from ._graph_mode import resolve_modes
from ._graphdef import GraphDef
from ._lift import lift_once
from ._sharding import _is_graph, get_named_sharding, spec_of
from ._split_merge import split
from ._state import State
from ._traverse import iter_graph
from ._tree_transforms import simple_eval_shape
from ._variables import Variable, is_variable, missing_mesh_axes, wrote_values


def eval_shape(
    fun: Callable[..., Any],
    *args: Any,
    graph: bool | None = None,
    graph_updates: bool | None = None,
    **kwargs: Any,
) -> Any:
    """The output of `fun(*args, **kwargs)` with shapes and dtypes only, computing nothing.

    As `jax.eval_shape`, but the output may hold Modules and Variables: they come back
    holding `jax.ShapeDtypeStruct`s. This is how to see the parameters a model would have
    without allocating them. The objects passed in are left as they are. A Variable made
    with a `mesh` (`Param(x, sharding=..., mesh=mesh)`, or from a `with_partitioning`
    initializer given one) holds a `ShapeDtypeStruct` with its `NamedSharding`;
    `abstract_with_sharding` gives the others theirs.

    Arguments:
        fun: the function.
        *args: its positional arguments (may hold Modules and Variables).
        graph: `False` for tree mode: `jax.eval_shape` over the arguments as pytrees (a
            Variable met twice, or an input Variable returned, is refused). `None` reads
            `set_graph_mode`. (Named `graph`, it cannot be a keyword argument of `fun`.)
        graph_updates: `False`: graph mode's sharing, then as tree mode. `None` reads
            `set_graph_updates`.
        **kwargs: its keyword arguments.

    Returns:
        The output, with every array replaced by a `jax.ShapeDtypeStruct`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, eval_shape
        >>> class Linear(Module):
        ...     def __init__(self, n):
        ...         self.w = Param(jnp.ones((n, n)))
        >>> eval_shape(lambda: Linear(1000)).w.value
        ShapeDtypeStruct(shape=(1000, 1000), dtype=float32)
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if not (graph and graph_updates):
        out = simple_eval_shape(fun, graph, args, kwargs)
    else:
        out = _graph_eval_shape(fun, args, kwargs)
    for _, node in iter_graph(out):
        if isinstance(node, Variable) and "mesh" in node.metadata:
            _give_sharding(node, node.metadata["mesh"])
    return out


def _graph_eval_shape(fun: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    call = Call(fun)
    lifted = lift_once(call.tree(args, kwargs))

    def pure(values: list[Any]) -> Any:
        inside = Inside(lifted.graphdef, values)
        # New objects throughout, the arguments' included: the output holds no array,
        # and the caller's objects keep theirs.
        return inside.finish(call.run(inside.tree), structure="new_objects")

    outcome, values = jax.eval_shape(pure, lifted.values)
    return lifted.apply(outcome, values)


def _give_sharding(variable: Variable, mesh: Any) -> None:
    """Put the sharding the metadata says into the `ShapeDtypeStruct` a Variable holds."""
    if _unsharded(variable):
        # Stored as it is: a `set_value` override is for values, not their shapes.
        value = _sharded(variable._pg_flat[0][0], mesh, spec_of(variable))
        variable._pg_flat[0][0] = value
        wrote_values()


def _sharded(value: jax.ShapeDtypeStruct, mesh: Mesh, spec: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(
        value.shape, value.dtype, sharding=NamedSharding(mesh, spec), weak_type=value.weak_type
    )


def abstract_with_sharding(tree: Any, mesh: Mesh | None = None) -> Any:
    """Give every `jax.ShapeDtypeStruct` of an abstract model the `NamedSharding` its
    Variable's `sharding` metadata says, as Flax NNX's `nnx.abstract_with_sharding`
    (`nnx.as_abstract`).

    An abstract model (from `eval_shape`) or its State, so filled in, is the target that
    restores a checkpoint straight into sharded arrays (`orbax.checkpoint`'s
    `StandardCheckpointer().restore(path, state(abstract))`), and tells the shardings
    to compile a step for. Logical names are mapped by the `axis_rules` in force.

    Arguments:
        tree: an abstract model (filled in place, as `shard` does), or a State or other
            pytree holding Variables (a new one is returned).
        mesh: the device mesh. Without it, each Variable's own `mesh` metadata is used,
            and Variables without one are left as they are.

    Returns:
        `tree` itself for an object graph; the new State or pytree otherwise.

    Raises:
        ValueError: the `sharding` metadata names an axis the mesh does not have (nothing
            is changed).

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, abstract_with_sharding, eval_shape
        >>> class Dense(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones((4, 8)), sharding=(None, "model"))
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
        >>> abstract = abstract_with_sharding(eval_shape(Dense), mesh)
        >>> abstract.w.value.sharding.spec == PartitionSpec(None, "model")
        True
    """
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(
            f"abstract_with_sharding: mesh must be a jax.sharding.Mesh or None, got "
            f"{type(mesh).__name__}."
        )
    if _is_graph(tree):
        variables = [v for _, v in iter_graph(tree) if isinstance(v, Variable)]
        for variable in variables:  # every check first, so that nothing is half-changed
            _check_axes(variable, mesh)
        for variable in variables:
            if mesh is not None or "mesh" in variable.metadata:
                _give_sharding(variable, variable.metadata["mesh"] if mesh is None else mesh)
        return tree
    if mesh is not None:
        # A State or pytree: its bare `ShapeDtypeStruct`s are replicated, as `shard` does.
        shardings = get_named_sharding(tree, mesh)
        return jax.tree.map(_with_sharding, tree, shardings, is_leaf=is_variable)
    for leaf in jax.tree.leaves(tree, is_leaf=is_variable):
        if isinstance(leaf, Variable):
            _check_axes(leaf, None)
    return jax.tree.map(_own_mesh, tree, is_leaf=is_variable)


def _unsharded(variable: Variable) -> bool:
    value = variable._pg_flat[0][0]
    return isinstance(value, jax.ShapeDtypeStruct) and value.sharding is None


def _check_axes(variable: Variable, mesh: Mesh | None) -> None:
    if mesh is None:
        mesh = variable.metadata.get("mesh")
    if mesh is None or not _unsharded(variable):
        return
    missing = missing_mesh_axes(spec_of(variable), mesh)
    if missing:
        raise ValueError(
            f"abstract_with_sharding: a {type(variable).__name__}'s `sharding` metadata "
            f"{variable.metadata.get('sharding')!r} names mesh axes {sorted(missing)}, which "
            f"the mesh does not have (its axes: {list(mesh.axis_names)}). Use the mesh's "
            "axis names, or map logical names to them with `pytree_graph.axis_rules`."
        )


def _with_sharding(leaf: Any, sharding: Any) -> Any:
    if isinstance(leaf, Variable):
        return leaf.replace(_with_sharding(leaf._pg_flat[0][0], sharding.value))
    if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
        return jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=sharding, weak_type=leaf.weak_type
        )
    return leaf


def _own_mesh(leaf: Any) -> Any:
    if not isinstance(leaf, Variable) or "mesh" not in leaf.metadata or not _unsharded(leaf):
        return leaf
    return leaf.replace(_sharded(leaf._pg_flat[0][0], leaf.metadata["mesh"], spec_of(leaf)))


def get_abstract_model(
    make: Callable[..., Any], mesh: Mesh, *args: Any, graph: bool | None = None, **kwargs: Any
) -> tuple[GraphDef, State]:
    """The structure and abstract state of the model `make(*args, **kwargs)` would build,
    each `jax.ShapeDtypeStruct` with its `NamedSharding` on `mesh`, computing nothing; as
    Flax NNX's `nnx.get_abstract_model`.

    The state is the target to restore a sharded checkpoint into
    (`StandardCheckpointer().restore(path, abstract_state)`), after which
    `merge(graphdef, restored)` is the model, its arrays laid out on `mesh`.

    Arguments:
        make: builds the model (a Module class, or any function returning a graph).
        mesh: the device mesh whose axis names the `sharding` metadata uses.
        *args: `make`'s positional arguments.
        graph: `False` to split the model in tree mode (see `split`: a Variable shared
            in it raises); `None` reads `set_graph_mode`.
        **kwargs: its keyword arguments.

    Returns:
        `(graphdef, state)`, as `split` gives them.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, get_abstract_model
        >>> class Dense(Module):
        ...     def __init__(self, n):
        ...         self.w = Param(jnp.ones((n, 8)), sharding=(None, "model"))
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
        >>> graphdef, abstract = get_abstract_model(Dense, mesh, 4)
        >>> w = abstract["w"].value
        >>> w.shape, w.sharding.spec == PartitionSpec(None, "model")
        ((4, 8), True)
    """
    if isinstance(make, Mesh) or not callable(make):
        raise TypeError(
            f"get_abstract_model takes the function that builds the model first, got "
            f"{type(make).__name__}: get_abstract_model(Model, mesh, *args)."
        )
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"get_abstract_model: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}."
        )
    graphdef, abstract = split(eval_shape(make, *args, **kwargs), graph=graph)
    return graphdef, abstract_with_sharding(abstract, mesh)
