"""Specs given per argument (`shard_map`'s `in_specs`, `jit`'s `in_shardings`), resolved to
one spec for each Variable and array of a lifted call; and specs chosen per filter
(`StateSharding`, and `vmap`'s `StateAxes`)."""

from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.sharding import PartitionSpec, Sharding

from pytree_filter import Filter, Path, path_keys, path_text, to_predicate

from ._boundary import Call
from ._graphdef import GraphDef, build
from ._state import State, check_everything_last, show_filter
from ._traverse import GraphWalk
from ._variables import Variable

# A leaf with no entry in a lenient lookup (see `SpecTable.find`).
NO_ENTRY = object()


class PathIn(Filter):
    """Matches the leaves at the given paths exactly (what a `StateAxes` or `StateSharding`
    made from a `State` holds, one per spec)."""

    __slots__ = ("paths",)

    def __init__(self, *paths: Path):
        self.paths = frozenset(paths)

    def __call__(self, path: Path, value: Any) -> bool:
        return path in self.paths

    def __eq__(self, other: object) -> bool:
        return type(other) is PathIn and self.paths == other.paths

    def __hash__(self) -> int:
        return hash(self.paths)

    def __repr__(self) -> str:
        return f"PathIn({', '.join(sorted(map(path_text, self.paths)))})"


class FilterSpecs:
    """Specs chosen per filter for the Variables and arrays of one argument: the base of
    `StateAxes` and `StateSharding`.

    Each leaf takes the spec of the first filter it matches (a Variable type, `...`, a
    predicate on the leaf, a filter object such as `PathContains`, which sees the leaf's
    path within the argument, or a tuple of filters, matching a leaf any of them
    matches).

    Arguments:
        specs: `{filter: spec}`, in order.
    """

    __slots__ = ("_items", "_predicates")

    def __init__(self, specs: Mapping[Any, Any]):
        name = type(self).__name__
        if isinstance(specs, State):
            specs = self._specs_by_path(specs)
        if not isinstance(specs, Mapping) or not specs:
            raise TypeError(
                f"{name} expects a non-empty dict {{filter: spec}}, e.g. "
                f"{name}({{Param: ..., ...: ...}}); got {specs!r}."
            )
        for spec in specs.values():
            self.check_spec(spec)
        check_everything_last(tuple(specs))
        self._items = tuple(specs.items())
        # A tuple of filters is any of them (`to_predicate` reads it so, as Flax NNX does).
        self._predicates = tuple(map(to_predicate, specs))

    def check_spec(self, spec: Any) -> None:
        """Raise `TypeError` for a value that is not a spec (a subclass says which are)."""

    def _specs_by_path(self, specs: State) -> dict[Any, Any]:
        """`{PathIn(paths): spec}` for a State of specs (as Flax NNX makes a `StateAxes` or
        `StateSharding` from one): the paths of each spec, grouped."""
        name = type(self).__name__
        by_spec: dict[Any, list[Path]] = {}
        for path, leaf in specs.flat_state().items():
            spec = leaf.value if isinstance(leaf, Variable) else leaf
            try:
                self.check_spec(spec)
            except TypeError as error:
                raise TypeError(
                    f"{name}: the State gives {spec!r} at {path_text(path)}, but each of its "
                    f"leaves must be a spec ({error}); make it with "
                    "`jax.tree.map(lambda v: spec, state(model))`."
                ) from None
            by_spec.setdefault(spec, []).append(path)
        # The filters match disjoint paths, so their order is free: sorted, for one form.
        groups = sorted(((PathIn(*paths), spec) for spec, paths in by_spec.items()), key=repr)
        return dict(groups)

    def items(self) -> tuple[tuple[Any, Any], ...]:
        """`(filter, spec)` pairs, in order."""
        return self._items

    def spec_of(self, path: Path, leaf: Any, transform: str) -> Any:
        """The spec of the leaf at `path` (within its argument).

        Raises:
            ValueError: no filter matches it.
        """
        for predicate, (_, spec) in zip(self._predicates, self._items, strict=True):
            if predicate(path, leaf):
                return spec
        message = (
            f"{transform}: no filter of {self!r} matches the {type(leaf).__name__} at "
            f"{path_text(path)}. Every Variable and array of the argument needs one: add a "
            "filter for it, or end with `...` for the rest."
        )
        if all(type(f) is PathIn for f, _ in self._items):
            name = type(self).__name__
            message += (
                f" (This {name} was made from a State, which has a spec for each of its paths "
                "only. A Variable reached by several paths, such as a tied weight, is in a "
                f"State once: give specs by filter, e.g. {name}({{Param: ..., ...: ...}}), or "
                "with `prefix(model, ...)`, which covers every path.)"
            )
        raise ValueError(message)

    def show_spec(self, spec: Any) -> str:
        """One spec as `repr` shows it."""
        return repr(spec)

    def __repr__(self) -> str:
        shown = ", ".join(f"{show_filter(f)}: {self.show_spec(s)}" for f, s in self._items)
        return f"{type(self).__name__}({{{shown}}})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._items == other._items

    def __hash__(self) -> int:
        return hash((type(self), self._items))


class StateSharding(FilterSpecs):
    """Shardings chosen per filter, for one argument of `jit` (`in_shardings`,
    `out_shardings`), as Flax NNX's `nnx.StateSharding`.

    Each Variable and array of the argument takes the sharding of the first filter it
    matches (see `StateAxes` for the filters); end with `...` for the rest.

    As Flax NNX's, it is also made from a `State` of shardings, one per Variable (e.g.
    `jax.tree.map(..., state(model))`, or `State({"kernel": P(None, "a"), "bias": P()})`):
    each path then gets its own (see `StateAxes`).

    Arguments:
        shardings: `{filter: sharding}`, in order, or a `State` whose leaves are the
            shardings; a sharding is a `jax.sharding.Sharding`, a `PartitionSpec` (under
            `jax.set_mesh`, or as a `shard_map` spec), or None (laid out by the compiler).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec
        >>> from pytree_module import Module
        >>> from pytree_graph import BatchStat, Param, StateSharding, jit
        >>> class Norm(Module):
        ...     def __init__(self):
        ...         self.scale = Param(jnp.ones(4))
        ...         self.mean = BatchStat(jnp.zeros(4))
        >>> mesh = Mesh(jax.devices()[:1], ("data",))
        >>> shardings = StateSharding({Param: NamedSharding(mesh, PartitionSpec("data")),
        ...                            ...: None})
        >>> step = jit(lambda m: m.scale.value + m.mean.value, in_shardings=(shardings,))
        >>> step(Norm()).tolist()
        [1.0, 1.0, 1.0, 1.0]
    """

    __slots__ = ()

    def __init__(self, shardings: Mapping[Any, Any]):
        super().__init__(shardings)

    def check_spec(self, spec: Any) -> None:
        if spec is not None and not isinstance(spec, Sharding | PartitionSpec):
            raise TypeError(
                "StateSharding: a sharding must be a jax.sharding.Sharding, a "
                f"PartitionSpec or None, got {spec!r}."
            )


class SpecTable:
    """One argument's spec: a single spec for all its arrays, or one per path.

    Arguments:
        spec: a single spec (what `is_spec` accepts); or the State that
            `get_partition_spec` / `get_named_sharding` gives, a spec per Variable; or a
            pytree prefix of the argument whose leaves are specs (a dict of them for a
            dict of arrays, say).
        is_spec: whether a value is one spec.
        where: what the spec belongs to, for errors (e.g. "in_shardings[0]").
        expected: what a spec may be, for errors.

    Raises:
        TypeError: a leaf of `spec` is not a spec.
    """

    __slots__ = ("by_filter", "by_path", "where")

    def __init__(self, spec: Any, is_spec: Callable[[Any], bool], where: str, expected: str):
        self.where = where
        self.by_path: dict[Path, Any] = {}
        self.by_filter = spec if isinstance(spec, StateSharding) else None
        if self.by_filter is not None:
            return
        if is_spec(spec):  # one spec for the whole argument
            self.by_path[()] = spec
            return
        if isinstance(spec, State):
            items = spec.flat_state().items()
        else:
            flat, _ = jax.tree_util.tree_flatten_with_path(
                spec, is_leaf=lambda x: is_spec(x) or isinstance(x, Variable)
            )
            items = ((path_keys(path), leaf) for path, leaf in flat)
        for path, leaf in items:
            value = leaf.value if isinstance(leaf, Variable) else leaf
            if not is_spec(value):
                raise TypeError(
                    f"{where}: the entry at {path_text(path)} is {value!r}; each entry must "
                    f"be {expected}."
                )
            self.by_path[path] = value

    def find(self, path: Path, leaf: Any, strict: bool = True) -> Any:
        """The spec of the leaf at `path` (relative to the argument): the entry at `path`
        or at the nearest path above it; for a `StateSharding`, that of the first filter
        the leaf matches.

        Raises:
            ValueError: (`strict`) no entry covers `path`; without `strict`, `NO_ENTRY` is
                returned instead.
        """
        if self.by_filter is not None:
            try:
                return self.by_filter.spec_of(path, leaf, self.where)
            except ValueError:
                if strict:
                    raise
                return NO_ENTRY
        for length in range(len(path), -1, -1):
            found = self.by_path.get(path[:length], NO_ENTRY)
            if found is not NO_ENTRY:
                return found
        if not strict:
            return NO_ENTRY
        what = type(leaf).__name__ if isinstance(leaf, Variable) else "value"
        raise ValueError(
            f"{self.where} has no entry for the {what} at {path_text(path)}. "
            "Build a per-Variable spec from the same object it is given for (e.g. "
            "`pytree_graph.get_named_sharding(model, mesh)`, after any change to the "
            "model's structure), or give one spec for the whole argument."
        )


def leaves_of(graphdef: GraphDef, values: list[Any]) -> list[Any]:
    """The Variables and arrays of a graph built from `graphdef` and `values` (in leaf
    order): what a filter of a `StateSharding` is tested on, while tracing."""
    walk = GraphWalk()
    walk.graphdef(build(graphdef, values))
    return walk.leaves


class PerArgumentSpecs:
    """Per-argument specs of a transform, as one table per positional argument.

    Arguments:
        transform: the transform's name, for errors (e.g. "shard_map").
        option: the option's name (e.g. "in_specs").
        specs: one spec for every positional argument, or a tuple (or list) with one each.
        is_spec: whether a value is one spec.
        expected: what a spec may be, for errors.
    """

    __slots__ = ("_tables", "expected", "is_spec", "option", "specs", "transform")

    def __init__(
        self,
        transform: str,
        option: str,
        specs: Any,
        is_spec: Callable[[Any], bool],
        expected: str,
    ):
        self.transform = transform
        self.option = option
        self.specs = tuple(specs) if type(specs) in (list, tuple) else specs
        self.is_spec = is_spec
        self.expected = expected
        self._tables: dict[int, SpecTable] = {}

    @property
    def by_filter(self) -> bool:
        """Whether a spec is chosen per filter (a `StateSharding`): finding it needs the
        leaves, not only their paths."""
        specs = self.specs if isinstance(self.specs, tuple) else (self.specs,)
        return any(isinstance(spec, StateSharding) for spec in specs)

    def table(self, argument: Any, num_args: int) -> SpecTable:
        """The table of positional argument `argument` of a call with `num_args` of them.

        Raises:
            TypeError: `argument` is a keyword argument's name.
            ValueError: a tuple of specs does not have one per positional argument.
        """
        if isinstance(argument, str):
            raise TypeError(
                f"{self.transform}: keyword argument {argument!r} holds arrays; pass arrays "
                f"positionally, each with its spec in {self.option}."
            )
        if isinstance(self.specs, tuple):
            if len(self.specs) != num_args:
                raise ValueError(
                    f"{self.transform}: {self.option} has {len(self.specs)} entries but the "
                    f"function was called with {num_args} positional argument(s); give one "
                    "spec each."
                )
            spec, where = self.specs[argument], f"{self.option}[{argument}]"
        else:
            spec, where = self.specs, self.option
        table = self._tables.get(argument)
        if table is None:
            table = self._tables[argument] = SpecTable(spec, self.is_spec, where, self.expected)
        return table

    def for_leaves(
        self,
        call: Call,
        paths: Any,
        leaves: Any | None,
        num_args: int,
        of_function: Callable[[Any], Any],
        strict: bool = True,
    ) -> list[Any]:
        """The spec of each leaf of a lifted call, given its path in the call's tree.

        Arguments:
            call: how the function is called (which argument a path is in).
            paths: each leaf's path.
            leaves: the leaves (Variables or arrays), for errors and `of_function`; None
                where only their values are at hand (inside a trace).
            num_args: how many positional arguments the call has.
            of_function: the spec of a leaf of the function itself (a Module, or a method
                bound to one), which no argument's spec covers.
            strict: raise for a leaf no spec covers; otherwise its spec is `NO_ENTRY`.
        """
        specs = []
        leaves = [None] * len(paths) if leaves is None else leaves
        for path, leaf in zip(paths, leaves, strict=True):
            argument, relative = call.split_path(path)
            if argument is None:
                specs.append(of_function(leaf))
            elif isinstance(argument, str) and not strict:
                specs.append(NO_ENTRY)
            else:
                specs.append(self.table(argument, num_args).find(relative, leaf, strict))
        return specs
