"""Flax NNX's update context: `update_context`, `split_context`, `merge_context`.

Code that moves object graphs through a JAX transform by hand (as the graph transforms
do inside) splits and merges four times, and wants the caller's objects updated in
the end, structure and all:

1. outside, `split` the caller's objects (the outer split);
2. inside the transform, `merge` them into new objects (the inner merge);
3. inside, after the function ran, `split` those again (the inner split);
4. outside, `merge` the result (the outer merge): the caller's own objects, updated.

An `UpdateContext` (one per `update_context(tag)`, found by its tag) links the steps.
Step 1 keeps the caller's objects by their index in its walk; step 2 knows which new
object stands for which of them; step 3 records, in the graphdef it returns, the
index of the caller's object each object it walks stands for (its origin: static data,
so a compiled function returns it on every call without running step 2 or 3 again);
step 4 updates the object at each origin in place (`Builder`'s reuse, as `jit` writes
back a changed structure) and builds the rest.

Within one `split_context` (or `merge_context`), several calls share their objects:
a second `split` of an object already split in it gives a graphdef that refers to it
(and no state), and the `merge` of that graphdef in one `merge_context` gives the
object the first merge built.
"""

import contextlib
import functools
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import jax

from ._flat_state import FlatState
from ._graphdef import Builder, GraphDef, merge_leaves
from ._lift import value_of
from ._split_merge import states_of
from ._state import _partition
from ._traverse import GraphWalk, check_graph

F = TypeVar("F", bound=Callable[..., Any])


class _Stacks(threading.local):
    def __init__(self) -> None:
        # tag -> the UpdateContexts open under it, innermost last
        self.contexts: dict[Hashable, list[UpdateContext]] = {}


_STACKS = _Stacks()


class UpdateContext:
    """What links the four steps of one `update_context(tag)` (see `update_context`).

    Made by entering `update_context(tag)`; `current_update_context(tag)` finds it.
    It holds the caller's objects from the outer split until the context ends.

    Attributes:
        tag: the tag it was opened with.
    """

    __slots__ = ("_inner_objects", "_inner_origin", "_outer_objects", "tag")

    def __init__(self, tag: Hashable):
        self.tag = tag
        # The caller's objects, by their index in the outer split (step 1).
        self._outer_objects: list[Any] | None = None
        # id of each object the inner merge (step 2) built -> its outer index; the objects
        # themselves are held so that their ids stay theirs.
        self._inner_origin: dict[int, int] | None = None
        self._inner_objects: list[Any] | None = None

    def __repr__(self) -> str:
        return f"UpdateContext(tag={self.tag!r})"

    def _split_end(self, objects: list[Any]) -> None:
        if self._outer_objects is None:
            self._outer_objects = objects  # step 1
        else:
            self._inner_origin = self._inner_objects = None  # step 3: no longer needed

    def _merge_end(self, objects: list[Any], inner: bool) -> None:
        if inner:  # step 2
            self._inner_objects = objects
            self._inner_origin = {id(obj): i for i, obj in enumerate(objects) if obj is not None}

    def _clear(self) -> None:
        self._outer_objects = self._inner_origin = self._inner_objects = None


class _UpdateGraphDef(GraphDef):
    """The graphdef of an inner split: a `GraphDef` that also records, for each object
    index, the index of the caller's object it stands for (`origins`, -1 for a new one),
    so that the outer merge updates those objects in place."""

    __slots__ = ("origins",)

    def __init__(
        self, root: tuple, paths: tuple, num_objects: int, origins: tuple[int, ...]
    ) -> None:
        super().__init__(root, paths, num_objects)
        self.origins = origins

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self.root, self.paths, self.origins))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, GraphDef):
            return NotImplemented
        return (
            type(other) is _UpdateGraphDef
            and hash(self) == hash(other)
            and self.origins == other.origins
            and self.root == other.root
            and self.paths == other.paths
        )


jax.tree_util.register_static(_UpdateGraphDef)


def current_update_context(tag: Hashable) -> UpdateContext:
    """The innermost open `UpdateContext` of `tag`.

    Arguments:
        tag: the tag given to `update_context`.

    Returns:
        The `UpdateContext`.

    Raises:
        ValueError: no `update_context(tag)` is open (as Flax NNX raises).

    Examples:
        >>> from pytree_graph import current_update_context, update_context
        >>> with update_context("step"):
        ...     current_update_context("step").tag
        'step'
    """
    stack = _STACKS.contexts.get(tag)
    if not stack:
        raise ValueError(
            f"No update context found for tag {tag!r}. Open one around the four split and "
            f"merge steps: `with update_context({tag!r}): ...`."
        )
    return stack[-1]


class _UpdateContextManager:
    """`update_context(tag)`: a context manager, and a decorator of a function that runs
    within the context."""

    __slots__ = ("tag",)

    def __init__(self, tag: Hashable):
        self.tag = tag

    def __enter__(self) -> UpdateContext:
        ctx = UpdateContext(self.tag)
        _STACKS.contexts.setdefault(self.tag, []).append(ctx)
        return ctx

    def __exit__(self, *exc: object) -> None:
        stack = _STACKS.contexts[self.tag]
        stack.pop()._clear()
        if not stack:
            del _STACKS.contexts[self.tag]

    def __call__(self, fun: F) -> F:
        @functools.wraps(fun)
        def within_update_context(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fun(*args, **kwargs)

        return within_update_context  # type: ignore[return-value]


def update_context(tag: Hashable) -> _UpdateContextManager:
    """Open an `UpdateContext`: four `split`/`merge` calls across a JAX transform that
    update the caller's objects in place, structure and all, as Flax NNX's.

    The four calls, each in its own `split_context(tag)` or `merge_context(tag, inner)`:

    1. outside the transform, `split` the objects;
    2. inside, `merge` them (`merge_context(tag, inner=True)`): new objects;
    3. inside, after the work, `split` those;
    4. outside, `merge` what the transform returned (`merge_context(tag, inner=False)`):
       the objects split in step 1, updated in place to what step 3 split (new values,
       attributes added or removed, new or swapped submodules, sharing), and returned.

    Objects made inside (not from step 2's) come out new. What the graph transforms do
    for you (`pytree_graph.jit`, ...) this does by hand, for code that calls JAX's own
    transforms.

    Arguments:
        tag: any hashable naming the context; `split_context` and `merge_context` find
            the context by it (the innermost open one of that tag).

    Returns:
        A context manager (whose `with` gives the `UpdateContext`), also usable as a
        decorator: the function runs within the context.

    Examples:
        >>> import jax
        >>> from pytree_module import Module
        >>> from pytree_graph import merge_context, split_context, update_context
        >>> class Counter(Module, pytree=False):
        ...     pass
        >>> counter = Counter()
        >>> @jax.jit
        ... def add_attribute(graphdef, state):
        ...     with merge_context("example", inner=True) as ctx:
        ...         inner = ctx.merge(graphdef, state)
        ...     inner.steps = 1  # a new static attribute
        ...     with split_context("example") as ctx:
        ...         return ctx.split(inner)
        >>> with update_context("example"):
        ...     with split_context("example") as ctx:
        ...         graphdef, state = ctx.split(counter)
        ...     graphdef, state = add_attribute(graphdef, state)
        ...     with merge_context("example", inner=False) as ctx:
        ...         out = ctx.merge(graphdef, state)
        >>> out is counter, counter.steps
        (True, 1)
    """
    return _UpdateContextManager(tag)


class SplitContext:
    """The `split` of one `split_context`: splits that share their objects.

    Attributes:
        tag: the update context's tag, or None.
    """

    __slots__ = ("_ctx", "_index", "_objects", "tag")

    def __init__(self, tag: Hashable | None, ctx: UpdateContext | None):
        self.tag = tag
        self._ctx = ctx
        self._index: dict[int, int] = {}
        self._objects: list[Any] = []

    def split(self, node: Any, *filters: Any) -> tuple[Any, ...]:
        """Split `node` as `pytree_graph.split` does (graph mode), sharing objects with
        the other splits of this context: an object split before in it is referred to
        by the graphdef, and its state is not given again.

        Arguments:
            node: a Module, a Variable, or a list, tuple or dict holding them.
            *filters: optional filters, as `split` takes them (exhaustive).

        Returns:
            `(graphdef, state)`, or `(graphdef, state_1, ..., state_n)` with n filters.

        Raises:
            TypeError: `node` is a single value, or the context has ended.
            ValueError: a leaf matches no filter.
        """
        graphdef, paths, leaves = self._walk(node, "split")
        return (graphdef, *states_of(paths, leaves, filters, exhaustive=True))

    def flatten(self, node: Any, *filters: Any, with_paths: bool = True) -> tuple[Any, ...]:
        """`split`, with the leaves flat: `FlatState`s (or bare values), as
        `pytree_graph.flatten` gives them.

        Arguments:
            node: a Module, a Variable, or a list, tuple or dict holding them.
            *filters: optional filters (exhaustive), one `FlatState` each.
            with_paths: with False, the leaves' values as a list (no filters then).

        Returns:
            `(graphdef, flat_state, ...)`, or `(graphdef, values)` with
            `with_paths=False`.

        Raises:
            ValueError: filters with `with_paths=False`, or a leaf matching no filter.
        """
        if filters and not with_paths:
            raise ValueError(
                "SplitContext.flatten: filters need with_paths=True (the values alone "
                "cannot be told apart by path)."
            )
        graphdef, paths, leaves = self._walk(node, "flatten")
        if not with_paths:
            return graphdef, [value_of(leaf) for leaf in leaves]
        if not filters:
            return graphdef, FlatState(paths, leaves)
        parts = _partition(dict(zip(paths, leaves, strict=True)), filters, exhaustive=True)
        return (graphdef, *(FlatState(tuple(part), list(part.values())) for part in parts[:-1]))

    def _walk(self, node: Any, method: str) -> tuple[GraphDef, tuple, list[Any]]:
        if self._objects is None:
            raise TypeError(
                f"SplitContext.{method}: the split_context({self.tag!r}) it belongs to has "
                f"ended. Call `{method}` inside the `with` block."
            )
        walk = GraphWalk()
        # One numbering of objects for every split of the context: an object met again
        # is a reference to its first split.
        walk.index = self._index
        walk.objects = self._objects
        root = walk.visit(node, ())
        paths = tuple(walk.paths)
        ctx = self._ctx
        if ctx is not None and ctx._outer_objects is not None:
            origin = ctx._inner_origin or {}
            origins = tuple(origin.get(id(obj), -1) for obj in self._objects)
            graphdef: GraphDef = _UpdateGraphDef(root, paths, len(self._objects), origins)
        else:
            graphdef = GraphDef(root, paths, len(self._objects))
        check_graph(graphdef, node, f"SplitContext.{method}")
        return graphdef, paths, walk.leaves


class MergeContext:
    """The `merge` of one `merge_context`: merges that share their objects.

    Attributes:
        tag: the update context's tag, or None.
        inner: whether this is the merge inside the transform (step 2), outside (step
            4), or None without a tag.
    """

    __slots__ = ("_ctx", "_objects", "inner", "tag")

    def __init__(self, tag: Hashable | None, inner: bool | None, ctx: UpdateContext | None):
        self.tag = tag
        self.inner = inner
        self._ctx = ctx
        self._objects: list[Any] | None = []

    def merge(self, graphdef: GraphDef, state: Any, /, *states: Any) -> Any:
        """Build the graph of `graphdef` from the States, as `pytree_graph.merge` does
        (with copies of their Variables), sharing objects with the other merges of this
        context. In the outer merge of an update context (step 4), the caller's objects
        that the inner split recorded are updated in place and returned.

        Arguments:
            graphdef: a graphdef from a `SplitContext.split`.
            state: its State (the Variable itself for a lone Variable).
            *states: the other States, with filters.

        Returns:
            The graph.

        Raises:
            TypeError: `graphdef` is not a GraphDef, or the context has ended.
            ValueError: the States do not match the graphdef; or, in the outer merge,
                no outer split happened in this update context.
        """
        self._check_open("merge")
        if not isinstance(graphdef, GraphDef):
            raise TypeError(
                f"MergeContext.merge expects a GraphDef first (from a split), got "
                f"{type(graphdef).__name__}."
            )
        return self._build(graphdef, merge_leaves(graphdef, (state, *states), "MergeContext.merge"))

    def unflatten(self, graphdef: GraphDef, flat_state: Any, /, *flat_states: Any) -> Any:
        """`merge` from what `SplitContext.flatten` gave: `FlatState`s, or a list of
        values in the graphdef's leaf order.

        Arguments:
            graphdef: a graphdef from a `SplitContext.flatten`.
            flat_state: a `FlatState`, or a list of values.
            *flat_states: the other `FlatState`s, with filters.

        Returns:
            The graph.

        Raises:
            TypeError: `graphdef` is not a GraphDef, or the context has ended.
            ValueError: the leaves do not match the graphdef (paths or count), or a list
                comes with more.
        """
        self._check_open("unflatten")
        if not isinstance(graphdef, GraphDef):
            raise TypeError(
                f"MergeContext.unflatten expects a GraphDef first (from a flatten), got "
                f"{type(graphdef).__name__}."
            )
        if isinstance(flat_state, list):
            if flat_states or len(flat_state) != graphdef.num_leaves:
                raise ValueError(
                    f"MergeContext.unflatten: a list of values must be the only state and "
                    f"hold the graphdef's {graphdef.num_leaves} leaves, got "
                    f"{len(flat_state)} values and {len(flat_states)} more states."
                )
            return self._build(graphdef, flat_state)
        flat: dict[Any, Any] = {}
        for part in (flat_state, *flat_states):
            if not isinstance(part, FlatState):
                raise TypeError(
                    f"MergeContext.unflatten expects FlatStates (or one list of values), "
                    f"got a {type(part).__name__}."
                )
            flat.update(part)
        if set(flat) != set(graphdef.paths) or len(flat) != graphdef.num_leaves:
            raise ValueError(
                "MergeContext.unflatten: the FlatStates do not hold exactly the graphdef's "
                f"paths: expected {list(graphdef.paths)}, got {list(flat)}."
            )
        return self._build(graphdef, [flat[path] for path in graphdef.paths])

    def _check_open(self, method: str) -> None:
        if self._objects is None:
            raise TypeError(
                f"MergeContext.{method}: the merge_context({self.tag!r}) it belongs to has "
                f"ended. Call `{method}` inside the `with` block."
            )

    def _build(self, graphdef: GraphDef, values: list[Any]) -> Any:
        objects = self._objects
        assert objects is not None
        if len(objects) < graphdef.num_objects:
            objects.extend([None] * (graphdef.num_objects - len(objects)))
        reuse: dict[int, Any] = {}
        ctx = self._ctx
        if ctx is not None and self.inner is False and type(graphdef) is _UpdateGraphDef:
            outer = ctx._outer_objects
            if outer is None:
                raise ValueError(
                    f"merge_context({self.tag!r}, inner=False): this graphdef comes from "
                    "an inner split (step 3), but no outer split (step 1) happened in this "
                    f"update_context({self.tag!r}): split the objects in a "
                    f"split_context({self.tag!r}) first, in the same update_context."
                )
            reuse = {
                index: outer[origin]
                for index, origin in enumerate(graphdef.origins)
                if origin >= 0 and objects[index] is None
            }
        return Builder(values, objects, copy=True, reuse=reuse).visit(graphdef.root)


def _open(tag: Hashable | None, step: str) -> UpdateContext | None:
    if tag is None:
        return None
    try:
        return current_update_context(tag)
    except ValueError:
        raise ValueError(
            f"{step}: no update context found for tag {tag!r}. Open one first: "
            f"`with update_context({tag!r}): ...` around the four steps."
        ) from None


@contextlib.contextmanager
def split_context(tag: Hashable | None = None) -> Iterator[SplitContext]:
    """A context whose `split` calls share their objects; with a tag, a step of the
    `update_context(tag)` open: the outer split (step 1) the first time, the inner
    split (step 3) after it.

    Arguments:
        tag: the tag of an open `update_context`, or None for splits that only share
            objects.

    Yields:
        A `SplitContext`; call its `split` as `pytree_graph.split`.

    Raises:
        ValueError: `tag` is given and no `update_context(tag)` is open.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, split_context
        >>> shared = Param(jnp.ones(2))
        >>> with split_context() as ctx:
        ...     _, first = ctx.split([shared])
        ...     _, second = ctx.split([shared])
        >>> len(first), len(second)  # the second split refers to the first's Variable
        (1, 0)
    """
    ctx = _open(tag, "split_context")
    split = SplitContext(tag, ctx)
    try:
        yield split
    finally:
        objects = split._objects
        split._objects = split._index = None  # type: ignore[assignment]
        if ctx is not None:
            ctx._split_end(objects)


@contextlib.contextmanager
def merge_context(tag: Hashable | None = None, inner: bool | None = None) -> Iterator[MergeContext]:
    """A context whose `merge` calls share their objects; with a tag, a step of the
    `update_context(tag)` open: the inner merge (`inner=True`, step 2) or the outer
    merge (`inner=False`, step 4), which updates and returns the objects of the outer
    split.

    Arguments:
        tag: the tag of an open `update_context`, or None.
        inner: with a tag, True inside the transform, False outside (required).

    Yields:
        A `MergeContext`; call its `merge` as `pytree_graph.merge`.

    Raises:
        ValueError: `tag` is given without `inner`, or no `update_context(tag)` is
            open, or (`inner=True`) no outer split happened in it yet.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param, merge_context, split_context
        >>> shared = Param(jnp.ones(2))
        >>> with split_context() as ctx:
        ...     parts = [ctx.split([shared]), ctx.split([shared])]
        >>> with merge_context() as ctx:
        ...     a, b = (ctx.merge(*part) for part in parts)
        >>> a[0] is b[0]
        True
    """
    if tag is not None and inner is None:
        raise ValueError(
            f"merge_context({tag!r}): `inner` must be given with a tag: True for the "
            "merge inside the transform (step 2), False for the one outside (step 4)."
        )
    ctx = _open(tag, "merge_context")
    if ctx is not None and inner and ctx._outer_objects is None:
        raise ValueError(
            f"merge_context({tag!r}, inner=True): no outer split (step 1) happened in "
            f"this update_context({tag!r}). Split the objects in a "
            f"split_context({tag!r}) before the transform."
        )
    merge = MergeContext(tag, inner, ctx)
    try:
        yield merge
    finally:
        objects = merge._objects
        merge._objects = None
        if ctx is not None and objects is not None:
            ctx._merge_end(objects, bool(inner))
