"""The machinery shared by the graph transforms in tree mode and with `graph_updates=False`.

Graph mode with structural updates (the default) lifts the arguments as one object graph and
writes back whatever changed, attributes included. The two other modes (Flax NNX 0.12's
"simple" transforms) run the plain JAX transform over the arguments as pytrees:

- tree mode (`graph=False`): each argument is the pytree it already is. Inside, the function
  sees copies (new Variables); the Variables whose value or metadata it changed are returned
  beside its output and written into the caller's Variables, matched by position. Nothing
  else is written back. A Variable met twice (a tied model), or an input Variable returned,
  is refused: a pytree cannot say that two leaves are one cell, so the tie would be lost.
- graph mode without structural updates (`graph=True, graph_updates=False`): the arguments
  are first encoded with `to_tree` (sharing kept, each Variable held once), decoded inside;
  then as tree mode.
"""

import functools
import inspect
import re
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax.sharding import PartitionSpec, Sharding
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from pytree_module.extend import touch
from pytree_transforms.extend import BindsAsMethod

from ._argument_specs import FilterSpecs
from ._boundary import holds_graph_nodes
from ._errors import resolve_argnums
from ._graphdef import check_writable, merge
from ._state import State
from ._static_args import with_static_entries
from ._tree_form import NodeState, from_tree, to_tree
from ._variables import Variable, wrote_values

_set_variable = Variable._pg_flat.__set__  # type: ignore[attr-defined]


# `isinstance(x, Variable)` without a Python frame per node (`is_leaf` runs on every node
# of the arguments, on each call).
_is_variable = Variable.__instancecheck__


def path_text(keypath: tuple, graph: bool = False) -> str:
    """A JAX key path as the user wrote it: `args[0].layer.w`, `kwargs['x']`, `out[1]`.

    With `graph`, the path is one in `to_tree`'s encoding, shown as the object's path: the
    `NodeState`'s `state` left out, and the State's keys shown as attributes."""
    parts = []
    for i, key in enumerate(keypath):
        if graph and key == GetAttrKey("state"):
            continue
        if graph and i > 0 and isinstance(key, DictKey) and isinstance(key.key, str):
            parts.append(f".{key.key}")
        elif graph and i > 0 and isinstance(key, DictKey) and isinstance(key.key, int):
            parts.append(f"[{key.key}]")
        elif isinstance(key, GetAttrKey):
            parts.append(f".{key.name}")
        elif isinstance(key, SequenceKey):
            parts.append(f"[{key.idx}]")
        elif isinstance(key, DictKey):
            # The first key is the group (`args`, `kwargs`, `out`), written as a name.
            parts.append(str(key.key) if i == 0 else f"[{key.key!r}]")
        else:
            parts.append(str(key))
    return "".join(parts).lstrip(".")


def copy_tree(tree: Any) -> Any:
    """`tree` rebuilt: new Modules and new Variables holding the same values."""
    return jax.tree.map(lambda x: x, tree)


def aliasing_error(transform: str, variable: Variable, first: str, second: str) -> ValueError:
    """The error for one Variable met at two paths (inputs, or an input and the output)."""
    name = type(variable).__name__
    return ValueError(
        f"Duplicate {name} found at paths:\n\n  - {first}\n  - {second}\n\n"
        f"pytree_graph.{transform} with graph=False or graph_updates=False does not support "
        "Variable aliasing (duplicate inputs, duplicate outputs, or input Variables returned "
        "as outputs): as a pytree, the two places would become two Variables. Consider the "
        "following options:\n\n"
        "1. Remove the duplicate Variables.\n"
        "2. Create new Variables with pytree_graph.clone() and use those instead.\n"
        f"3. Enable graph mode and graph updates: pytree_graph.{transform}(..., graph=True, "
        "graph_updates=True)\n"
        f"4. Use pytree_graph.compat.{transform}(...) (graph=True and graph_updates=True "
        "by default)"
    )


def variables_of(
    transform: str, groups: dict[str, Any], graph: bool = False
) -> tuple[list[Variable], list[str]]:
    """The Variables of `groups` in flattening order, with their paths; one met twice is
    refused (`aliasing_error`)."""
    variables, paths, _ = _variables_with_roots(transform, groups, graph)
    return variables, paths


def _variables_with_roots(
    transform: str, groups: dict[str, Any], graph: bool = False
) -> tuple[list, list, list]:
    """As `variables_of`, with each Variable's root: `(group, argument position or name)`."""
    seen: dict[int, str] = {}
    variables: list[Variable] = []
    paths: list[str] = []
    roots: list[tuple[Any, Any]] = []
    for keypath, leaf in jax.tree_util.tree_leaves_with_path(groups, is_leaf=_is_variable):
        if not isinstance(leaf, Variable):
            continue
        path = path_text(keypath, graph)
        first = seen.get(id(leaf))
        if first is not None:
            raise aliasing_error(transform, leaf, first, path)
        seen[id(leaf)] = path
        variables.append(leaf)
        paths.append(path)
        key = keypath[1] if len(keypath) > 1 else None
        roots.append((keypath[0].key, getattr(key, "idx", getattr(key, "key", None))))
    return variables, paths, roots


def check_output(
    transform: str, inputs: list[Variable], paths: list[str], out: Any, graph: bool = False
) -> None:
    """Refuse an output holding an input Variable, or one Variable twice."""
    seen = {id(v): p for v, p in zip(inputs, paths, strict=True)}
    for keypath, leaf in jax.tree_util.tree_leaves_with_path({"out": out}, is_leaf=_is_variable):
        if isinstance(leaf, Variable):
            path = path_text(keypath, graph)
            first = seen.get(id(leaf))
            if first is not None:
                raise aliasing_error(transform, leaf, first, path)
            seen[id(leaf)] = path


_PREFIX_LEAF = (PartitionSpec, Sharding)


def _is_prefix_leaf(x: Any) -> bool:
    return x is None or isinstance(x, _PREFIX_LEAF)


def variable_prefixes(prefix: Any, groups: dict[str, Any]) -> list[Any]:
    """The leaf of the prefix tree `prefix` (of `groups`) each Variable of `groups` is under,
    in the order `variables_of` lists them."""
    out: list[Any] = []

    def visit(leaf: Any, subtree: Any) -> None:
        count = sum(isinstance(x, Variable) for x in jax.tree.leaves(subtree, is_leaf=_is_variable))
        out.extend([leaf] * count)

    jax.tree.map(visit, prefix, groups, is_leaf=_is_prefix_leaf)
    return out


class Updates:
    """The Variables a call changed, of one prefix group: a pytree of those Variables, with
    their positions (among the call's input Variables) as static data."""

    __slots__ = ("positions", "variables")

    def __init__(self, positions: tuple[int, ...], variables: list[Variable]):
        self.positions = positions
        self.variables = variables


jax.tree_util.register_pytree_node(
    Updates,
    lambda u: (u.variables, u.positions),
    lambda positions, variables: Updates(positions, list(variables)),
)


def unique_prefixes(prefix: Any, extra: Iterable[Any] = ()) -> list[Any]:
    """The distinct leaves of a prefix tree (`None` counts), with `extra` ones after."""
    found: list[Any] = []
    for leaf in jax.tree.leaves(prefix, is_leaf=_is_prefix_leaf):
        if leaf not in found:
            found.append(leaf)
    for leaf in extra:
        if leaf not in found:
            found.append(leaf)
    return found


def refuse_state_prefixes(
    prefix: Any, option: str, transform: str, also: tuple[type, ...] = ()
) -> None:
    """Refuse `StateAxes`, `StateSharding` (any `FilterSpecs`), or the types `also` (a
    `DiffState`) in a prefix argument: they select Variables of a graph; in tree mode a
    prefix is a pytree prefix of the argument. A Variable is refused too."""
    kinds = (FilterSpecs, Variable, *also)
    stop = lambda x: _is_prefix_leaf(x) or isinstance(x, kinds)  # noqa: E731
    for keypath, leaf in jax.tree_util.tree_leaves_with_path(prefix, is_leaf=stop):
        if isinstance(leaf, Variable):
            raise ValueError(
                f"Found a {type(leaf).__name__} at {path_text(keypath) or 'the top'} of "
                f"`{option}` for pytree_graph.{transform}: a prefix gives one entry for a "
                "whole Variable, not a Variable holding it. Put the entry in place of the "
                "Variable, e.g. `jax.tree.map(lambda v: 0, model, is_leaf=lambda x: "
                "isinstance(x, Variable))`."
            )
        if isinstance(leaf, kinds):
            name = type(leaf).__name__
            how = (
                "every leaf of the arguments in `argnums` is differentiated: pass the part "
                "to differentiate as an argument of its own"
                if option == "argnums"
                else "give a pytree prefix of the argument, e.g. a Module-shaped one with "
                "an entry in place of each Variable"
            )
            raise ValueError(
                f"`{option}` cannot contain `{name}` objects when `graph=False` or "
                "`graph_updates=False`. Consider the following options:\n\n"
                f"1. Remove `{name}` objects from `{option}` (in tree mode, {how}).\n"
                "2. Enable graph mode and graph updates by passing graph=True and "
                f"graph_updates=True: pytree_graph.{transform}(..., graph=True, "
                "graph_updates=True)\n"
                f"3. Use pytree_graph.compat.{transform}(...) instead."
            )


def encode(tree: Any, graph: bool) -> Any:
    """The pytree a transform passes on: `tree` as it is (tree mode), or with each graph
    node replaced by a `NodeState` (graph mode: sharing kept, each Variable held once)."""
    return to_tree(tree) if graph else tree


def _is_node_state(x: Any) -> bool:
    return isinstance(x, NodeState)


def decode_sharing(tree: Any) -> Any:
    """`from_tree` without copying the Variables: inside a transform, the function must
    write into the Variables whose changes are collected."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_node_state)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, NodeState)]
    if not positions:
        return tree
    graphdef = leaves[positions[0]].graphdef
    states = State({leaves[p].index: leaves[p].state for p in positions})
    nodes = merge(graphdef, states)
    for position in positions:
        leaves[position] = nodes[leaves[position].index]
    return treedef.unflatten(leaves)


def decode(tree: Any, graph: bool) -> Any:
    """The transform's output as the caller gets it (graph nodes rebuilt in graph mode)."""
    return from_tree(tree) if graph else tree


class Inside:
    """A call's inside: copies of the arguments, what their Variables held on entry, and
    the changes to return.

    Used by each transform's pure function: `enter` gives the arguments the function gets,
    `updates` the changed Variables, grouped as `prefixes` says.
    """

    __slots__ = ("copies", "graph", "held", "paths", "prefixes", "roots", "transform", "variables")

    def __init__(self, transform: str, graph: bool):
        self.transform = transform
        self.graph = graph

    def enter(self, args: tuple, kwargs: dict[str, Any], prefix: Any = None) -> tuple:
        """The arguments the function gets. `prefix` (of `{"args": ..., "kwargs": ...}`)
        gives each Variable its group for `updates`."""
        args, kwargs = copy_tree((args, kwargs))
        self.copies = args
        groups = {"args": args, "kwargs": kwargs}
        self.variables, self.paths, self.roots = _variables_with_roots(
            self.transform, groups, self.graph
        )
        self.prefixes = None if prefix is None else variable_prefixes(prefix, groups)
        self.held = [(v._pg_flat[0][0], v._pg_flat[1]) for v in self.variables]
        if self.graph:
            args, kwargs = decode_sharing((args, kwargs))
        return args, kwargs

    def leave(self, out: Any) -> Any:
        """The output, encoded; an input Variable in it is refused."""
        if self.graph:
            out = to_tree(out)
        check_output(self.transform, self.variables, self.paths, out, self.graph)
        return out

    def changed(self) -> list[int]:
        """The positions of the Variables whose value or metadata changed."""
        return [
            i
            for i, (v, (value, kind)) in enumerate(zip(self.variables, self.held, strict=True))
            if v._pg_flat[0][0] is not value or v._pg_flat[1] is not kind
        ]

    def updates(
        self,
        groups: list[Any] = (None,),  # type: ignore[assignment]
        keep: Callable[[int], bool] | None = None,
    ) -> list[Updates]:
        """The changed Variables, one `Updates` per entry of `groups`: a Variable goes to the
        group of its prefix leaf (see `enter`; all in the first group without a prefix).
        `keep(position)` adds unchanged Variables (donated ones)."""
        prefixes = self.prefixes
        positions = self.changed()
        if keep is not None:
            extra = [i for i in range(len(self.variables)) if keep(i)]
            positions = sorted(set(positions).union(extra))
        by_group: list[list[int]] = [[] for _ in groups]
        for i in positions:
            g = 0 if prefixes is None else groups.index(prefixes[i])
            by_group[g].append(i)
        return [Updates(tuple(ps), [self.variables[i] for i in ps]) for ps in by_group]


def apply_updates(variables: list[Variable], updates: Iterable[Updates]) -> None:
    """Write the changed values (and metadata) into the caller's Variables."""
    try:
        for group in updates:
            for position, new in zip(group.positions, group.variables, strict=True):
                write(variables[position], new)
    finally:
        wrote_values()


def write(target: Variable, new: Variable) -> None:
    """Give `target` the value and metadata of `new` (the caller must call `wrote_values`)."""
    check_writable(target)
    values, kind = new._pg_flat
    if target._pg_flat[1] is kind:
        target._pg_flat[0][0] = values[0]
    else:
        _set_variable(target, ([values[0]], kind))
        touch()


def outer_variables(transform: str, graph: bool, args: tuple, kwargs: dict) -> tuple:
    """The arguments as passed on (`encode`d), and the caller's Variables in them (one met
    twice refused)."""
    args, kwargs = encode((args, kwargs), graph)
    # Per call: no paths unless one is needed for the error (the same order as the
    # `{"args": ..., "kwargs": ...}` the pure functions list their Variables in).
    leaves = jax.tree.leaves((args, kwargs), is_leaf=_is_variable)
    variables = [leaf for leaf in leaves if isinstance(leaf, Variable)]
    if len({id(v) for v in variables}) != len(variables):
        variables_of(transform, {"args": args, "kwargs": kwargs}, graph)
    return args, kwargs, variables


class Wrapped(BindsAsMethod):
    """A transformed function that binds like a method as a class attribute."""

    __slots__ = ("__dict__", "_fun")

    def __init__(self, fun: Callable[..., Any]):
        self._fun = fun
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fun(*args, **kwargs)


class SimpleJit(BindsAsMethod):
    """`jit` in tree mode, or in graph mode without structural updates: `jax.jit` over the
    arguments as pytrees (see the module docstring)."""

    def __init__(self, fun: Callable[..., Any], graph: bool, jit_kwargs: dict[str, Any]):
        self._fun = fun
        self._graph = graph
        jit_kwargs = dict(jit_kwargs)
        in_shardings = jit_kwargs.get("in_shardings")
        out_shardings = jit_kwargs.get("out_shardings")
        refuse_state_prefixes(in_shardings, "in_shardings", "jit")
        refuse_state_prefixes(out_shardings, "out_shardings", "jit")
        # Numbers and names, each inferred from the other through `fun`'s signature (the
        # pure function `jax.jit` sees takes `*args, **kwargs`, so it cannot infer them).
        for option in ("static", "donate"):
            argnums = jit_kwargs.pop(f"{option}_argnums", None)
            argnames = jit_kwargs.pop(f"{option}_argnames", None)
            if argnums is not None or argnames is not None:
                positions, names = resolve_argnums(fun, argnums, argnames, option, "jit")
                jit_kwargs[f"{option}_argnums"] = tuple(sorted(positions))
                jit_kwargs[f"{option}_argnames"] = tuple(sorted(names))
        self._donate = frozenset(jit_kwargs.get("donate_argnums", ()))
        self._donate_names = frozenset(jit_kwargs.get("donate_argnames", ()))
        # `in_shardings` has no entry for a static argument: the pure function's prefix has.
        static = sorted(jit_kwargs.get("static_argnums", ()))
        prefix = with_static_entries(in_shardings, static)
        sharded = "in_shardings" in jit_kwargs
        self._groups = unique_prefixes(prefix, (None,)) if sharded else [None]
        self._prefix = {"args": prefix, "kwargs": None} if sharded else None
        if sharded:
            jit_kwargs["out_shardings"] = (out_shardings, list(self._groups))
        self._jitted = jax.jit(self._pure, **jit_kwargs)
        functools.update_wrapper(self, fun, updated=())

    def _pure(self, *args: Any, **kwargs: Any) -> tuple[Any, list[Updates]]:
        inside = Inside("jit", self._graph)
        args, kwargs = inside.enter(args, kwargs, self._prefix)
        out = inside.leave(self._fun(*args, **kwargs))
        keep = None
        if self._donate or self._donate_names:
            # A donated Variable the function left as it was still needs a live value.
            keep = self._donated_keep(inside)
        return out, inside.updates(self._groups, keep)

    def _donated_keep(self, inside: Inside) -> Callable[[int], bool]:
        def keep(position: int) -> bool:
            group, key = inside.roots[position]
            return key in (self._donate if group == "args" else self._donate_names)

        return keep

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, variables = outer_variables("jit", self._graph, args, kwargs)
        out, updates = self._jitted(*args, **kwargs)
        apply_updates(variables, updates)
        return decode(out, self._graph)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The output's shapes and dtypes, without running (as `jax.jit(f).eval_shape`)."""
        args, kwargs, _ = outer_variables("jit", self._graph, args, kwargs)
        out, _ = self._jitted.eval_shape(*args, **kwargs)
        return decode(out, self._graph)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(...).lower` over the arguments as pytrees (the program also returns the
        Variables it changes; a compiled program does not write them back)."""
        args, kwargs, _ = outer_variables("jit", self._graph, args, kwargs)
        return self._jitted.lower(*args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(...).trace` over the arguments as pytrees."""
        args, kwargs, _ = outer_variables("jit", self._graph, args, kwargs)
        return self._jitted.trace(*args, **kwargs)


def _node_states(tree: Any) -> dict[int, Any]:
    """The States of the `NodeState`s in `tree`, by node index."""
    leaves = jax.tree.leaves(tree, is_leaf=_is_node_state)
    return {leaf.index: leaf.state for leaf in leaves if isinstance(leaf, NodeState)}


def decode_part(tree: Any, encoded: Any) -> Any:
    """`from_tree` for a tree holding only some of the `NodeState`s of `encoded` (the
    gradients of some arguments): the others' States are taken from `encoded`, so that the
    graph can be built, and left out of the result."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_node_state)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, NodeState)]
    if not positions:
        return tree
    graphdef = leaves[positions[0]].graphdef
    states = _node_states(encoded)
    states.update({leaves[p].index: leaves[p].state for p in positions})
    nodes = merge(graphdef, State(states), copy=True)
    for position in positions:
        leaves[position] = nodes[leaves[position].index]
    return treedef.unflatten(leaves)


def simple_grad(
    fun: Callable[..., Any],
    graph: bool,
    transform: str,
    argnums: Any,
    has_aux: bool,
    return_value: bool,
    grad_kwargs: dict[str, Any],
    refused: tuple[type, ...] = (),
) -> Callable[..., Any]:
    """`grad` / `value_and_grad` in tree mode or with `graph_updates=False`: `jax.grad` over
    the arguments as pytrees; the gradient of a Module is Module-shaped (the same class,
    its Variables holding the gradients of their values)."""
    refuse_state_prefixes(argnums, "argnums", transform, also=refused)

    def pure(*args: Any, **kwargs: Any) -> Any:
        inside = Inside(transform, graph)
        args, kwargs = inside.enter(args, kwargs)
        out = inside.leave(fun(*args, **kwargs))
        updates = inside.updates()
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    f"{transform}(has_aux=True): the function must return a pair "
                    f"(value, aux), got {type(out).__name__}."
                )
            loss, aux = out
            return loss, (updates, aux)
        return out, (updates, None)

    transformed = (jax.value_and_grad if return_value else jax.grad)(
        pure, argnums=argnums, has_aux=True, **grad_kwargs
    )

    @functools.wraps(fun)
    def gradient(*args: Any, **kwargs: Any) -> Any:
        if graph:
            _refuse_differentiated_aliases(transform, argnums, args, kwargs)
        encoded_args, kwargs, variables = outer_variables(transform, graph, args, kwargs)
        result = transformed(*encoded_args, **kwargs)
        if return_value:
            (value, (updates, aux)), grads = result
        else:
            grads, (updates, aux) = result
        apply_updates(variables, updates)
        if graph:
            grads = decode_part(grads, encoded_args)
            aux = from_tree(aux)
        if return_value:
            return ((value, aux) if has_aux else value), grads
        return (grads, aux) if has_aux else grads

    return Wrapped(gradient)


def _refuse_differentiated_aliases(transform: str, argnums: Any, args: tuple, kwargs: dict) -> None:
    """With `graph_updates=False` the arguments keep their sharing, but `jax.grad` gives a
    Variable one gradient per differentiated argument: one shared between a differentiated
    argument and another cannot be, as Flax NNX refuses it ("Inconsistent aliasing")."""
    holders = sum(1 for value in (*args, *kwargs.values()) if holds_graph_nodes(value))
    if holders < 2:  # the common call, `grad(loss)(model, x, y)`: nothing to compare
        return
    positions = {argnums} if isinstance(argnums, int) else set(argnums)
    differentiated = tuple(i in positions or i - len(args) in positions for i in range(len(args)))
    try:
        to_tree({"args": args, "kwargs": kwargs}, prefix={"args": differentiated, "kwargs": False})
    except ValueError as error:
        raise ValueError(
            f"{transform} (graph_updates=False): {error} Here True is a differentiated "
            "argument (argnums) and False another: a Variable in both would need two "
            "gradients. Pass it in one argument only, or use graph_updates=True, where "
            "the tied Variable gets one gradient."
        ) from None


_BATCHED_UPDATE = re.compile(r"out_axes\[1\]\[(\d+)\]\[<flat index (\d+)>\]")


def _broadcast_write_error(
    transform: str, error: ValueError, traced: list, groups: list[Any]
) -> ValueError:
    """JAX's error for a mapped value at an unmapped output, naming the Variable when the
    output is a write into a Variable of a broadcast argument."""
    found = _BATCHED_UPDATE.search(str(error))
    if found is None or not traced:
        return error
    group, index = int(found.group(1)), int(found.group(2))
    try:
        path = traced[0][group][index]
    except IndexError:
        return error
    return ValueError(
        f"{transform}: the function wrote a value that differs across the mapped axis into "
        f"the Variable at {path}, of an argument with in_axes {groups[group]!r} (not mapped "
        "over that axis): it would have to hold one value per example. Map the argument "
        f"(in_axes 0 for it), or write it outside the {transform}. ({error})"
    )


def simple_vmap(
    fun: Callable[..., Any],
    graph: bool,
    transform: str,
    in_axes: Any,
    out_axes: Any,
    vmap_kwargs: dict[str, Any],
    mapper: Callable[..., Any] = jax.vmap,
) -> Callable[..., Any]:
    """`vmap` (or `pmap`, with `mapper=jax.pmap`) in tree mode or with
    `graph_updates=False`: the JAX transform over the arguments as pytrees. Variables
    written inside come back with their argument's axis (keyword arguments: 0); one of a
    broadcast (`None`) argument must get a value that is the same for every example."""
    refuse_state_prefixes(in_axes, "in_axes", transform)
    refuse_state_prefixes(out_axes, "out_axes", transform)
    groups = unique_prefixes(in_axes, (0,))
    prefix = {"args": in_axes, "kwargs": 0}
    traced: list[list[list[str]]] = []  # the paths of each group's updates, last traced

    def pure(*args: Any, **kwargs: Any) -> Any:
        inside = Inside(transform, graph)
        args, kwargs = inside.enter(args, kwargs, prefix)
        out = inside.leave(fun(*args, **kwargs))
        updates = inside.updates(groups)
        traced[:] = [[[inside.paths[p] for p in u.positions] for u in updates]]
        return out, updates

    mapped = mapper(pure, in_axes=in_axes, out_axes=(out_axes, list(groups)), **vmap_kwargs)

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args, kwargs, variables = outer_variables(transform, graph, args, kwargs)
        try:
            out, updates = mapped(*args, **kwargs)
        except ValueError as error:
            raise _broadcast_write_error(transform, error, traced, groups) from error
        apply_updates(variables, updates)
        return decode(out, graph)

    return Wrapped(wrapper)


def simple_wrap(
    fun: Callable[..., Any],
    graph: bool,
    transform: str,
    jax_transform: Callable[..., Any],
    checked: bool = False,
    **options: Any,
) -> Wrapped:
    """A JAX transform that keeps the function's signature (`jax.checkpoint`,
    `checkify`...) in tree mode or with `graph_updates=False`: the function's Variable
    writes are returned beside its output and written back."""

    def pure(*args: Any, **kwargs: Any) -> Any:
        inside = Inside(transform, graph)
        args, kwargs = inside.enter(args, kwargs)
        out = inside.leave(fun(*args, **kwargs))
        return out, inside.updates()

    transformed = jax_transform(pure, **options)

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args, kwargs, variables = outer_variables(transform, graph, args, kwargs)
        result = transformed(*args, **kwargs)
        # checkify returns `(error, result)`: the error is passed on beside the output.
        error, (out, updates) = result if checked else (None, result)
        apply_updates(variables, updates)
        out = decode(out, graph)
        return (error, out) if checked else out

    return Wrapped(wrapper)


def simple_eval_shape(fun: Callable[..., Any], graph: bool, args: tuple, kwargs: dict) -> Any:
    """`eval_shape` in tree mode or with `graph_updates=False`: `jax.eval_shape` over the
    arguments as pytrees; nothing is written back."""

    def pure(*args: Any, **kwargs: Any) -> Any:
        inside = Inside("eval_shape", graph)
        args, kwargs = inside.enter(args, kwargs)
        return inside.leave(fun(*args, **kwargs))

    args, kwargs, _ = outer_variables("eval_shape", graph, args, kwargs)
    return decode(jax.eval_shape(pure, *args, **kwargs), graph)


def simple_branches(
    transform: str, graph: bool, branches: list[Callable[..., Any]], operands: tuple
) -> tuple[list[Callable[..., Any]], tuple, list[Variable]]:
    """`cond` / `switch` in tree mode or with `graph_updates=False`: the branches as pure
    functions of the operands (each returning every Variable of the operands, so that
    their outputs have one structure), the operands passed on, and the caller's
    Variables to write into."""

    def branch(fun: Callable[..., Any]) -> Callable[..., Any]:
        def pure(*operands: Any) -> Any:
            inside = Inside(transform, graph)
            operands, _ = inside.enter(operands, {})
            out = inside.leave(fun(*operands))
            return out, inside.updates(keep=lambda _: True)

        return pure

    operands, _, variables = outer_variables(transform, graph, operands, {})
    return [branch(f) for f in branches], operands, variables


def finish_branches(graph: bool, variables: list[Variable], result: Any) -> Any:
    """The output of `cond` / `switch`, after writing the Variables back."""
    out, updates = result
    apply_updates(variables, updates)
    return decode(out, graph)


def check_same_variables(
    transform: str, before: list[Variable], paths: list[str], after: Any
) -> None:
    """Refuse a loop body whose returned carry does not hold the Variables it was given,
    in the same places (a pytree carry cannot say where a new one came from)."""
    now = [
        leaf for leaf in jax.tree.leaves(after, is_leaf=_is_variable) if isinstance(leaf, Variable)
    ]
    if len(now) != len(before) or any(a is not b for a, b in zip(before, now, strict=False)):
        where = next(
            (p for p, a, b in zip(paths, before, now, strict=False) if a is not b),
            "args[0] (the carry's structure changed)",
        )
        if where.startswith("args[0]"):
            where = "carry" + where.removeprefix("args[0]")
        raise ValueError(
            f"pytree_graph.{transform}: Variable identity must be preserved across "
            f"iterations: the body returned another Variable at {where}. Return the carry "
            "it was given, with its Variables written in place (`v.value = ...`), not new "
            "Variables or Modules."
        )


def simple_loop_body(
    transform: str, graph: bool, body: Callable[..., Any], with_index: bool
) -> Callable[..., Any]:
    """A loop body over the carry as a pytree (tree mode, or `graph_updates=False`): the
    carry's Variables, written in place and returned, carry the values."""

    def pure(*args: Any) -> Any:
        *index, val = args
        inside = Inside(transform, graph)
        (val,), _ = inside.enter((val,), {})
        out = body(*index, val) if with_index else body(val)
        if graph:
            out = to_tree(out)
        check_same_variables(transform, inside.variables, inside.paths, out)
        return out

    return pure


def simple_loop_cond(graph: bool, cond: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`while_loop`'s condition over the carry as a pytree."""

    def pure(val: Any) -> Any:
        val = copy_tree(val)
        return cond(decode_sharing(val) if graph else val)

    return pure


def loop_init(transform: str, graph: bool, init_val: Any) -> Any:
    """The carry passed to the JAX loop (a Variable met twice refused)."""
    init = encode(init_val, graph)
    variables_of(transform, {"init_val": init}, graph)
    return init


def loop_result(graph: bool, init: Any, final: Any) -> Any:
    """The loop's result: the caller's Variables of the carry, holding the final values."""

    def one(before: Any, after: Any) -> Any:
        if isinstance(before, Variable):
            write(before, after)
            return before
        return after

    try:
        out = jax.tree.map(one, init, final, is_leaf=_is_variable)
    finally:
        wrote_values()
    return decode_sharing(out) if graph else out


def _leaf_prefixes(prefix: Any, tree: Any, stop: Callable[[Any], bool]) -> list[Any]:
    """The leaf of `prefix` above each leaf of `tree` (Variables are leaves)."""
    out: list[Any] = []

    def visit(leaf: Any, subtree: Any) -> None:
        out.extend([leaf] * len(jax.tree.leaves(subtree, is_leaf=_is_variable)))

    jax.tree.map(visit, prefix, tree, is_leaf=stop)
    return out


def _move_axis(leaf: Any, source: int, destination: int) -> Any:
    if source == destination:
        return leaf
    return jax.tree.map(lambda a: jax.numpy.moveaxis(a, source, destination), leaf)


def simple_scan(
    fun: Callable[..., Any],
    graph: bool,
    in_axes: Any,
    out_axes: Any,
    scan_kwargs: dict[str, Any],
) -> Wrapped:
    """`scan` (the form with `in_axes`) in tree mode or with `graph_updates=False`, as
    Flax NNX's: `jax.lax.scan` over the arguments as pytrees. The `Carry` argument's
    Variables must come back in the `Carry` output (Variable identity preserved); scanned
    arguments' Variables written inside come back stacked along their axis; broadcast
    (`None`) arguments are carried through the loop, so their Variables' last values are
    written back."""
    from ._carry import Carry  # imports nothing of this module; here to keep the top light

    refuse_state_prefixes(in_axes, "in_axes", "scan")
    refuse_state_prefixes(out_axes, "out_axes", "scan")
    was_carry = in_axes is Carry
    if was_carry:
        in_axes = (Carry,)
    carry_index = in_axes.index(Carry) if isinstance(in_axes, tuple) and Carry in in_axes else None
    out_is_tuple = isinstance(out_axes, tuple)
    carry_out_index = out_axes.index(Carry) if out_is_tuple and Carry in out_axes else None
    stop = lambda x: x is None or x is Carry  # noqa: E731

    def split_out(out: Any) -> tuple[Any, Any]:
        if carry_index is None:
            return None, out
        if not out_is_tuple:
            return out, None
        if not isinstance(out, tuple) or len(out) != len(out_axes):
            raise ValueError(
                f"scan: out_axes={out_axes!r} describes a tuple of {len(out_axes)} outputs, "
                f"but the function returned {type(out).__name__}."
            )
        ys = tuple(None if i == carry_out_index else y for i, y in enumerate(out))
        return out[carry_out_index], ys

    def wrapper(*args: Any) -> Any:
        if was_carry and len(args) != 1:
            raise ValueError(
                "scan: with in_axes=Carry, the function must take exactly one argument, "
                f"got {len(args)} arguments."
            )
        axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
        if len(axes) != len(args):
            raise ValueError(
                f"scan: in_axes={in_axes!r} gives {len(axes)} axes for {len(args)} arguments."
            )
        carry = args[carry_index] if carry_index is not None else None
        others = tuple(a for i, a in enumerate(args) if i != carry_index)
        other_axes = tuple(a for i, a in enumerate(axes) if i != carry_index)
        carry, others = encode(carry, graph), encode(others, graph)
        variables, _ = variables_of("scan", {"carry": carry, "args": others}, graph)
        leaves, treedef = jax.tree_util.tree_flatten(others, is_leaf=_is_variable)
        leaf_axes = _leaf_prefixes(other_axes, others, stop)
        broadcast = [i for i, ax in enumerate(leaf_axes) if ax is None]
        scanned = [i for i, ax in enumerate(leaf_axes) if ax is not None]
        xs = [_move_axis(leaves[i], leaf_axes[i], 0) for i in scanned]
        # Positions (among `variables`: the arguments' first, "args" < "carry") of the
        # leaves that are Variables.
        offsets = {}
        count = 0
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Variable):
                offsets[i] = count
                count += 1
        groups = sorted({leaf_axes[i] for i in scanned if isinstance(leaves[i], Variable)})

        def body(state: Any, x: list[Any]) -> Any:
            carry, bcast = copy_tree(state)
            x = copy_tree(x)
            carry_vars, carry_paths = variables_of("scan", {"carry": carry}, graph)
            held = [(v._pg_flat[0][0], v._pg_flat[1]) for v in x if isinstance(v, Variable)]
            step = [None] * len(leaves)
            for i, leaf in zip(broadcast, bcast, strict=True):
                step[i] = leaf
            for i, leaf in zip(scanned, x, strict=True):
                step[i] = leaf
            step_args = list(treedef.unflatten(step))
            if graph:
                step_args = list(decode_sharing(tuple(step_args)))
                carry = decode_sharing(carry)
            if carry_index is not None:
                step_args.insert(carry_index, carry)
            carry_out, ys = split_out(fun(*step_args))
            if graph:
                carry_out, ys = to_tree(carry_out), to_tree(ys)
            check_same_variables("scan", carry_vars, carry_paths, carry_out)
            inputs = carry_vars + [v for v in step if isinstance(v, Variable)]
            check_output("scan", inputs, ["carry"] * len(inputs), ys, graph)
            updates = []
            scanned_vars = [
                (i, leaf) for i, leaf in zip(scanned, x, strict=True) if isinstance(leaf, Variable)
            ]
            for axis in groups:
                positions, changed = [], []
                for (i, v), (value, kind) in zip(scanned_vars, held, strict=True):
                    if leaf_axes[i] == axis and (
                        v._pg_flat[0][0] is not value or v._pg_flat[1] is not kind
                    ):
                        positions.append(offsets[i])
                        changed.append(v)
                updates.append(Updates(tuple(positions), changed))
            return (carry_out, bcast), (ys, updates)

        bcast = [leaves[i] for i in broadcast]
        (carry_out, final_bcast), (ys, updates) = jax.lax.scan(
            body, (carry, bcast), xs, **scan_kwargs
        )
        for axis, group in zip(groups, updates, strict=True):
            group.variables = [_move_axis(v, 0, axis) for v in group.variables]
        apply_updates(variables, updates)
        try:
            for before, after in zip(bcast, final_bcast, strict=True):
                if isinstance(before, Variable):
                    write(before, after)
        finally:
            wrote_values()
        if ys is not None:
            ys = jax.tree.map(
                lambda ax, y: None if ax is Carry else _move_axis(y, 0, ax),
                out_axes,
                ys,
                is_leaf=stop,
            )
        ys = decode(ys, graph)
        if carry_index is None:
            return ys
        carry = loop_result(graph, carry, carry_out)
        if not out_is_tuple:
            return carry
        return tuple(carry if i == carry_out_index else y for i, y in enumerate(ys))

    functools.update_wrapper(wrapper, fun)
    return Wrapped(wrapper)


def simple_vjp(fun: Callable[..., Any], graph: bool, primals: tuple, has_aux: bool) -> tuple:
    """`vjp` in tree mode or with `graph_updates=False`: `jax.vjp` over the primals as
    pytrees. `vjp_fn` returns one cotangent per primal, a Module's Module-shaped."""

    def pure(*primals: Any) -> Any:
        inside = Inside("vjp", graph)
        primals, _ = inside.enter(primals, {})
        out = inside.leave(fun(*primals))
        if has_aux:
            out, aux = _pair("vjp", out)
            return out, (inside.updates(), aux)
        return out, (inside.updates(), None)

    encoded, _, variables = outer_variables("vjp", graph, primals, {})
    out, pullback, (updates, aux) = jax.vjp(pure, *encoded, has_aux=True)
    apply_updates(variables, updates)

    def vjp_fn(cotangent: Any) -> tuple:
        cotangents = pullback(to_tree(cotangent) if graph else cotangent)
        return decode_part(cotangents, encoded) if graph else cotangents

    out, aux = decode(out, graph), decode(aux, graph)
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def simple_jvp(
    fun: Callable[..., Any], graph: bool, primals: tuple, tangents: tuple, has_aux: bool
) -> tuple:
    """`jvp` in tree mode or with `graph_updates=False`: `jax.jvp` over the primals and
    tangents as pytrees (a Module's tangent is Module-shaped)."""

    def pure(*primals: Any) -> Any:
        inside = Inside("jvp", graph)
        primals, _ = inside.enter(primals, {})
        out = inside.leave(fun(*primals))
        aux = None
        if has_aux:
            out, aux = _pair("jvp", out)
        return (out, inside.updates()), aux

    encoded, _, variables = outer_variables("jvp", graph, tuple(primals), {})
    encoded_tangents = encode(tuple(tangents), graph)
    variables_of("jvp", {"tangents": encoded_tangents}, graph)
    (out, updates), (tangent_out, _), aux = jax.jvp(pure, encoded, encoded_tangents, has_aux=True)
    apply_updates(variables, updates)
    out, tangent_out, aux = decode(out, graph), decode(tangent_out, graph), decode(aux, graph)
    return (out, tangent_out, aux) if has_aux else (out, tangent_out)


def _pair(transform: str, out: Any) -> tuple[Any, Any]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"{transform}(has_aux=True): the function must return a pair (out, aux), got "
            f"{type(out).__name__}."
        )
    return out


class SimplePartial(BindsAsMethod):
    """`jit_partial` in tree mode or with `graph_updates=False`: the tree-mode `jit` with its
    first arguments bound (passed, and checked, on every call)."""

    def __init__(self, jitted: SimpleJit, partial_args: tuple):
        self._jitted = jitted
        self._partial_args = partial_args
        functools.update_wrapper(self, jitted._fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._jitted(*self._partial_args, *args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(...).lower` for these per-call arguments."""
        return self._jitted.lower(*self._partial_args, *args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(...).trace` for these per-call arguments."""
        return self._jitted.trace(*self._partial_args, *args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The output's shapes and dtypes for these per-call arguments."""
        return self._jitted.eval_shape(*self._partial_args, *args, **kwargs)


def simple_shard_map(
    fun: Callable[..., Any],
    graph: bool,
    in_specs: Any,
    out_specs: Any,
    options: dict[str, Any],
) -> Wrapped:
    """`shard_map` in tree mode or with `graph_updates=False`: `jax.shard_map` over the
    arguments as pytrees (`in_specs` a pytree prefix of them). Variables written inside
    come back with their argument's spec."""
    refuse_state_prefixes(in_specs, "in_specs", "shard_map")
    refuse_state_prefixes(out_specs, "out_specs", "shard_map")
    groups = unique_prefixes(in_specs)
    prefix = {"args": in_specs, "kwargs": None}

    def pure(*args: Any) -> Any:
        inside = Inside("shard_map", graph)
        args, _ = inside.enter(args, {}, prefix)
        out = inside.leave(fun(*args))
        return out, inside.updates(groups)

    mapped = jax.shard_map(pure, in_specs=in_specs, out_specs=(out_specs, list(groups)), **options)

    @functools.wraps(fun)
    def wrapper(*args: Any) -> Any:
        args, _, variables = outer_variables("shard_map", graph, args, {})
        out, updates = mapped(*args)
        apply_updates(variables, updates)
        return decode(out, graph)

    return Wrapped(wrapper)


class _Slot:
    """In `custom_vjp`'s residuals, the place of an argument's Variable: no leaves, its
    position (among the call's Variables) as static data."""

    __slots__ = ("position",)

    def __init__(self, position: int):
        self.position = position


jax.tree_util.register_pytree_node(_Slot, lambda s: ((), s.position), lambda p, _: _Slot(p))


def _is_slot(x: Any) -> bool:
    return isinstance(x, _Slot)


def _takes_updates_g(bwd: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(bwd).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "updates_g" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class SimpleCustomVjp(BindsAsMethod):
    """`custom_vjp` in tree mode or with `graph_updates=False`, as Flax NNX's: `jax.custom_vjp`
    over the arguments as pytrees. `bwd` returns one cotangent per differentiated
    argument, a Module's Module-shaped; declaring `updates_g`, it also gets the
    cotangents of the Variables the function wrote (tree mode)."""

    def __init__(self, fun: Callable[..., Any], graph: bool, nondiff_argnums: tuple):
        self._fun = fun
        self._graph = graph
        self._nondiff = tuple(sorted(nondiff_argnums))
        self._custom = jax.custom_vjp(self._pure, nondiff_argnums=self._nondiff)
        functools.update_wrapper(self, fun, updated=())

    def _pure(self, *args: Any) -> Any:
        inside = Inside("custom_vjp", self._graph)
        args, _ = inside.enter(args, {})
        return inside.leave(self._fun(*args)), inside.updates()

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """Give the function its forward and backward rules.

        Arguments:
            fwd: called with the function's arguments, returns `(out, residuals)`.
            bwd: called as `bwd(*nondiff_args, residuals, out_cotangent)`; returns a tuple
                with one cotangent per other positional argument (a Module's
                Module-shaped). With a keyword parameter `updates_g` (tree mode), it also
                gets the arguments' structure with the cotangent of each Variable the
                function wrote in its place and None elsewhere.
        """
        graph = self._graph
        takes_updates_g = _takes_updates_g(bwd)
        if graph and takes_updates_g:
            raise ValueError(
                "custom_vjp: a `bwd` taking `updates_g` needs tree mode (graph=False); "
                "with graph_updates=False the written Variables' cotangents are not given. "
                "Drop the parameter, or pass graph=False."
            )

        def pure_fwd(*args: Any) -> Any:
            inside = Inside("custom_vjp", graph)
            decoded, _ = inside.enter(args, {})
            out, residual = fwd(*decoded)
            if graph:
                out, residual = to_tree(out), to_tree(residual)
            check_output("custom_vjp", inside.variables, inside.paths, out, graph)
            counter = iter(range(len(inside.variables)))
            masked = jax.tree.map(
                lambda x: _Slot(next(counter)) if isinstance(x, Variable) else None,
                inside.copies,
                is_leaf=_is_variable,
            )
            return (out, inside.updates()), (residual, masked)

        def pure_bwd(*args: Any) -> Any:
            *nondiff, (residual, masked), (out_g, updates_g) = args
            if graph:
                nondiff, residual, out_g = from_tree((nondiff, residual, out_g))
            kwargs = {}
            if takes_updates_g:
                written = {}
                for group in updates_g:
                    written.update(zip(group.positions, group.variables, strict=True))
                kwargs["updates_g"] = jax.tree.map(
                    lambda s: written.get(s.position) if isinstance(s, _Slot) else None,
                    masked,
                    is_leaf=_is_slot,
                )
            result = bwd(*nondiff, residual, out_g, **kwargs)
            return to_tree(result) if graph else result

        self._custom.defvjp(pure_fwd, pure_bwd)

    def __call__(self, *args: Any) -> Any:
        args, _, variables = outer_variables("custom_vjp", self._graph, args, {})
        out, updates = self._custom(*args)
        apply_updates(variables, updates)
        return decode(out, self._graph)
