"""Keys for ensembles and scanned layers: split, fork, reseed and restore the `RngStream`s
of a whole graph (a model, an `Rngs`, the arguments of a function), as Flax NNX's
`split_rngs`, `fork_rngs`, `reseed`, `with_rngs` and `restore_rngs`."""

import functools
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp

import pytree_graph as pg
from pytree_filter import Path, path_text, to_predicate

from ._rngs import RngStream, _as_key, _check_num

Splits = int | tuple[int, ...]
Backup = tuple[RngStream, jax.Array, jax.Array]


class _Missing:
    """No node given: the function is used as a decorator."""

    def __repr__(self) -> str:
        return "<no node>"


_MISSING: Any = _Missing()


class _Lineage:
    """The keys a stream drew from one root key: the furthest count the stream had reached
    on it when it last moved to another key (None: it never did).

    A restore puts a root key back; the count it puts back is at least this one, so a
    stream restored twice, or restored out of order, never draws a key it drew before.
    """

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count: Any = None

    def leave(self, count: jax.Array) -> None:
        """The stream moves to another key, having drawn up to `count` on this one."""
        if self.count is None:
            self.count = count
        elif self.count.shape == count.shape:  # else a stale lineage (see below): kept
            self.count = jnp.maximum(self.count, count)

    def resume(self, count: jax.Array) -> jax.Array:
        """The count to restore: `count`, or further on if the stream got further since."""
        if self.count is None or self.count.shape != count.shape:
            return count
        return jnp.maximum(self.count, count)


# The lineage each stream is on now, for the streams the tools here have changed: kept
# outside the stream (which is a pytree: an attribute would be part of its structure).
# A stream whose key was changed otherwise (reseed, an assignment) may point to the wrong
# lineage: a restore then only skips counts, as `leave` and `resume` only ever go up.
_LINEAGES: "weakref.WeakKeyDictionary[RngStream, _Lineage]" = weakref.WeakKeyDictionary()


def _lineage(stream: RngStream) -> _Lineage:
    lineage = _LINEAGES.get(stream)
    if lineage is None:
        lineage = _LINEAGES[stream] = _Lineage()
    return lineage


class _Backup(tuple):
    """One stream's backup, `(stream, key, count)`, with the lineage of that key."""

    lineage: _Lineage


class SplitBackups:
    """What `split_rngs` and `fork_rngs` changed: each stream with the key and count to put
    back. `restore_rngs(backups)` puts them back; so does leaving a `with` block.

    The counts put back are those after the one key each stream gave for the split or
    fork, so the streams go on from there and never repeat a key they handed out. Restored
    again (or after a later split's backups were restored), a stream goes on from the
    furthest count it reached on that key, not from the count saved.

    Examples:
        >>> from pytree_nn import Rngs, split_rngs
        >>> rngs = Rngs(0)
        >>> with split_rngs(rngs, splits=3) as backups:
        ...     rngs.default.key.value.shape, len(backups)
        ((3,), 1)
        >>> rngs.default.key.value.shape, int(rngs.default.count.value)
        ((), 1)
    """

    __slots__ = ("backups",)

    def __init__(self, backups: Iterable[Backup]):
        self.backups = tuple(backups)

    def __iter__(self) -> Iterator[Backup]:
        return iter(self.backups)

    def __len__(self) -> int:
        return len(self.backups)

    def __enter__(self) -> "SplitBackups":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        restore_rngs(self)

    def __repr__(self) -> str:
        tags = ", ".join(repr(stream.tag) for stream, *_ in self.backups)
        return f"SplitBackups([{tags}])"


def restore_rngs(backups: Iterable[tuple[Any, ...]], /) -> None:
    """Put back the keys (and counts) that `split_rngs` or `fork_rngs` replaced.

    A restore never sends a stream back to a key it drew: restoring the same backups
    twice, or the backups of nested splits out of order, puts back each stream's key (and
    so its shape), with the furthest count the stream reached on that key. (Flax NNX's
    `restore_rngs` puts back the saved count, so there such a stream repeats keys.)

    Arguments:
        backups: what `split_rngs(node, ...)` or `fork_rngs(node)` returned (or any
            iterable of `(stream, key)` or `(stream, key, count)`, whose counts are put
            back as they are).

    Examples:
        >>> from pytree_nn import Rngs, fork_rngs, restore_rngs
        >>> rngs = Rngs(0)
        >>> backups = fork_rngs(rngs)  # rngs now draws from a forked key
        >>> restore_rngs(backups)
        >>> int(rngs.default.count.value)  # back on its own key, one key further on
        1
    """
    try:
        entries = list(backups)
    except TypeError:
        raise TypeError(
            "restore_rngs expects what split_rngs or fork_rngs returned (a SplitBackups, or "
            f"an iterable of (stream, key, count)), got {type(backups).__name__} "
            f"{backups!r:.60}: backups = split_rngs(model, splits=n); ...; "
            "restore_rngs(backups)."
        ) from None
    for entry in entries:
        if not (
            isinstance(entry, tuple) and len(entry) in (2, 3) and isinstance(entry[0], RngStream)
        ):
            raise TypeError(
                "restore_rngs expects what split_rngs or fork_rngs returned (an iterable of "
                f"(stream, key, count)), got an entry {entry!r}."
            )
    for entry in entries:
        stream, key, *count = entry
        lineage = getattr(entry, "lineage", None)
        current = _LINEAGES.get(stream)
        if current is not None:
            current.leave(stream.count.value)
        stream.key.value = key
        if count:
            stream.count.value = count[0] if lineage is None else lineage.resume(count[0])
        if lineage is not None:
            _LINEAGES[stream] = lineage
        else:
            _LINEAGES.pop(stream, None)


# ------------------------------------------------------------------------- selecting streams


class _Selector:
    """Which streams a filter selects: by name (a str), or by a filter that matches both of
    a stream's Variables (its `key` and its `count`, at their paths), or any of a list."""

    def __init__(self, spec: Any, where: str):
        self.spec = spec
        parts = list(spec) if isinstance(spec, list | tuple) else [spec]
        self.names = frozenset(p for p in parts if isinstance(p, str))
        try:
            self.predicates = tuple(to_predicate(p) for p in parts if not isinstance(p, str))
        except TypeError as error:
            raise TypeError(
                f"{where}: {error} A stream is selected by its name (a str such as "
                "'dropout'), a filter on its RngKey and RngCount Variables (RngState, "
                "PathContains('layers'), ...), `...` for all, or a list of those."
            ) from None
        self.catch_all = spec is Ellipsis or spec is True

    def __call__(self, path: Path, stream: RngStream) -> bool:
        if stream.tag in self.names:
            return True
        return any(
            p((*path, "key"), stream.key) and p((*path, "count"), stream.count)
            for p in self.predicates
        )


def _streams(node: Any, graph: bool | None = True) -> list[tuple[Path, RngStream]]:
    """Every `RngStream` of `node`, each shared one once, in `iter_graph`'s order."""
    return [
        (path, value)
        for path, value in pg.iter_graph(node, graph=graph)
        if isinstance(value, RngStream)
    ]


def _in_place_mode(graph: bool | None, graph_updates: bool | None) -> bool:
    """Whether `split_rngs` / `fork_rngs` change `node` (graph mode with graph updates,
    Flax NNX's rule) rather than return a changed copy."""
    if graph is None:
        graph = pg.set_graph_mode.current_value()
    if graph_updates is None:
        graph_updates = pg.set_graph_updates.current_value()
    return bool(graph) and bool(graph_updates)


def _copied(node: Any, plan: Callable[[Path, RngStream], Any], graph: bool | None) -> Any:
    """A copy of `node` (as `recursive_map` makes it) in which each stream for which
    `plan(path, stream)` gives a function of its next key is a new stream of that key."""

    def new_stream(path: Path, value: Any) -> Any:
        if not isinstance(value, RngStream):
            return value
        new_key = plan(path, value)
        return value if new_key is None else RngStream(new_key(value()), tag=value.tag)

    return pg.recursive_map(new_stream, node, graph=graph)


def _check_names(
    selectors: Iterable[_Selector], streams: list[tuple[Path, RngStream]], where: str
) -> None:
    """A stream name that names no stream of the graph is a typo, and a graph with no
    stream at all the wrong argument: say so, change nothing. Only where the graph is
    given: a decorator is written once for the arguments of any call, so there (as in
    NNX) a stream it names that a call's arguments lack is simply not changed."""
    if not streams:
        raise ValueError(
            f"{where}: `node` holds no RngStream, so there is nothing to split or fork. Pass "
            "the Rngs, or a model (or pytree) holding one, e.g. "
            f"{where}(rngs, ...) with rngs = Rngs(0); a layer built without keys to draw "
            "later (such as Linear) keeps none."
        )
    tags = sorted({stream.tag for _, stream in streams})
    for selector in selectors:
        unknown = sorted(selector.names.difference(tags))
        if unknown:
            raise ValueError(
                f"{where}: no stream called {', '.join(map(repr, unknown))} in the graph; its "
                f"streams are {tags}. A stream's name is its tag (`Rngs(dropout=0)` makes a "
                "stream 'dropout'; a layer forks the one it draws from, keeping its name)."
            )


def _rules(rules: Any, where: str) -> list[tuple[_Selector, Splits | None]]:
    """`{filter: splits}` (or a bare splits for every stream) as checked `(selector, splits)`
    pairs, in order: the first that selects a stream applies to it."""
    if rules is None:
        return []
    if not isinstance(rules, Mapping):
        rules = {...: rules}
    checked = []
    for spec, num in rules.items():
        checked.append((_Selector(spec, where), None if num is None else _check_num(num, where)))
    return checked


def _first(rules: list[tuple[_Selector, Any]], path: Path, stream: RngStream) -> Any:
    for rule in rules:
        if rule[0](path, stream):
            return rule
    return None


# -------------------------------------------------------------------------- new keys


def _split_keys(key: jax.Array, splits: Splits) -> jax.Array:
    """`splits` keys from each of `key`'s, stacked along new leading axes: the shape is
    `(*splits, *key.shape)`, so a stream already split for one map splits for another."""
    shape = splits if isinstance(splits, tuple) else (splits,)
    split = functools.partial(jax.random.split, num=shape)
    for _ in range(key.ndim):
        split = jax.vmap(split)
    keys = split(key)
    return jnp.moveaxis(keys, tuple(range(key.ndim, keys.ndim)), tuple(range(len(shape))))


def _set_key(stream: RngStream, key: jax.Array) -> None:
    stream.key.value = key
    stream.count.value = jnp.zeros(key.shape, jnp.uint32)


def _in_place(node: Any, plan: Callable[[Path, RngStream], Any]) -> SplitBackups:
    """Give each stream `plan(path, stream)` (a function of its next key, or None: leave it),
    every plan made before any stream changes; the backups to undo it."""
    plans = [(stream, plan(path, stream)) for path, stream in _streams(node)]
    backups = []
    for stream, new_key in plans:
        if new_key is not None:
            lineage = _lineage(stream)
            key = stream()
            lineage.leave(stream.count.value)
            backup = _Backup((stream, stream.key.value, stream.count.value))
            backup.lineage = lineage
            backups.append(backup)
            _set_key(stream, new_key(key))
            _LINEAGES[stream] = _Lineage()
    return SplitBackups(backups)


def _decorator(
    where: str, transform: Callable[[Any], Any], in_place: bool, f: Callable[..., Any]
) -> Callable[..., Any]:
    """`f` with the streams of its arguments changed by `transform` for each call: in place
    and put back after the call, or (`in_place=False`) in copies of the arguments."""
    if not callable(f):
        raise TypeError(
            f"{where} without a node is a decorator: it takes a function, got {f!r}. To "
            f"change the streams of a model, pass it first: {where}(model, ...)."
        )

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not in_place:
            args, kwargs = transform((args, kwargs))
            return f(*args, **kwargs)
        with transform((args, kwargs)):
            return f(*args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------- public functions


def split_rngs(
    node: Any = _MISSING,
    /,
    *,
    splits: Splits,
    only: Any = ...,
    squeeze: bool = False,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """Split, in place, every selected `RngStream` of `node` into `splits` streams stacked
    along a new leading axis, ready for `pytree_graph.vmap` or `pytree_graph.scan`; as
    Flax NNX's `nnx.split_rngs`.

    Each stream gives one key, which is split in `splits` (`jax.random.split`): the
    stream's key becomes that stack, its count a stack of zeros. A stream already split
    (shape `s`) becomes one of shape `(*splits, *s)`. Without `node`, it is a decorator:
    the streams of every argument (positional and keyword) of the function are split for
    the call, and put back after it.

    Arguments:
        node: a Module, an `Rngs`, an `RngStream`, or any pytree or list of them.
        splits: how many streams: an int, or a tuple for a stack of that shape.
        only: which streams: a stream name (`"params"`), a filter on the streams' RngKey
            and RngCount Variables (`RngState`, `PathContains("layers")`), a list of
            those, or `...` (all; the default). A name no stream of `node` has is an
            error (a typo); the decorator leaves such streams alone, as NNX.
        squeeze: with `splits=1`, drop the new axis (the stream is forked).
        graph: `False` for tree mode (`node` walked as a pytree: a stream reached twice
            raises); `None` reads `pytree_graph.set_graph_mode`.
        graph_updates: with `False` (or in tree mode), `node` is left as it is and a
            copy with the new streams is returned (each stream of `node` gives the one
            key its copy's come from), as Flax NNX does; `None` reads
            `pytree_graph.set_graph_updates`.

    Returns:
        A `SplitBackups`: `restore_rngs(backups)`, or leaving `with split_rngs(...):`,
        puts the streams back, each one key further on than before. Without `node`, a
        decorator. Not in place (`graph=False` or `graph_updates=False`): the copy.

    Raises:
        ValueError: `splits` is not a count or shape; `only` names a stream `node` does
            not have; `squeeze=True` with `splits` other than 1. Nothing is changed.

    Examples:
        >>> import pytree_graph as pg
        >>> from pytree_nn import Linear, Rngs, split_rngs
        >>> rngs = Rngs(0)
        >>> with split_rngs(rngs, splits=4):
        ...     ensemble = pg.vmap(lambda r: Linear(2, 3, rngs=r))(rngs)
        >>> ensemble.kernel.value.shape, rngs.default.key.value.shape
        ((4, 2, 3), ())
        >>> @split_rngs(splits=4)
        ... @pg.vmap
        ... def create(rngs):
        ...     return Linear(2, 3, rngs=rngs)
        >>> create(Rngs(0)).kernel.value.shape
        (4, 2, 3)
    """
    where = "split_rngs"
    splits = _check_num(splits, f"{where}(splits=...)")
    selector = _Selector(only, f"{where}(only=...)")
    if squeeze and splits != 1:
        raise ValueError(
            f"{where}(squeeze=True) drops the new axis, which only splits=1 allows; got "
            f"splits={splits!r}. Use squeeze=False to keep a stack of {splits}."
        )

    in_place = _in_place_mode(graph, graph_updates)

    decorating = node is _MISSING

    def transform(node: Any) -> Any:
        if not decorating:
            _check_names([selector], _streams(node, graph), where)

        def plan(path: Path, stream: RngStream) -> Any:
            if not selector(path, stream):
                return None
            if squeeze:
                return lambda key: _split_keys(key, 1)[0]
            return lambda key: _split_keys(key, splits)

        return _in_place(node, plan) if in_place else _copied(node, plan, graph)

    if node is _MISSING:
        return functools.partial(_decorator, where, transform, in_place)
    return transform(node)


def fork_rngs(
    node: Any = _MISSING,
    /,
    *,
    split: Any = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """Fork, in place, the `RngStream`s of `node`: each one's key becomes its next key and
    its count 0, so what draws from it now gets keys no one drew before; as Flax NNX's
    `nnx.fork_rngs`. Without `node`, a decorator (for the arguments of each call).

    Arguments:
        node: a Module, an `Rngs`, an `RngStream`, or any pytree or list of them.
        split: None (the default): fork every stream. An int or tuple: fork every stream
            and split it in that many (as `split_rngs`). A dict `{selector: splits}`:
            each stream takes the first entry that selects it (a stream name, a filter
            on its Variables, or `...`), whose value is the splits or None (forked, not
            split); the streams no entry selects are left as they are.
        graph: `False` for tree mode (`node` walked as a pytree: a stream reached twice
            raises); `None` reads `pytree_graph.set_graph_mode`.
        graph_updates: with `False` (or in tree mode), `node` is left as it is and a
            copy with the new streams is returned (each stream of `node` gives the one
            key its copy's come from), as Flax NNX does; `None` reads
            `pytree_graph.set_graph_updates`.

    Returns:
        A `SplitBackups` for `restore_rngs` (or a `with` block); without `node`, a
        decorator. Not in place (`graph=False` or `graph_updates=False`): the copy.

    Raises:
        ValueError: a split is not a count or shape, or a name no stream has. Nothing is
            changed.

    Examples:
        >>> from pytree_nn import Rngs, fork_rngs
        >>> rngs = Rngs(params=0, dropout=1)
        >>> with fork_rngs(rngs, split={"params": 4}):
        ...     rngs.params.key.value.shape, rngs.dropout.key.value.shape
        ((4,), ())
    """
    where = "fork_rngs"
    rules = _rules({...: None} if split is None else split, f"{where}(split=...)")

    in_place = _in_place_mode(graph, graph_updates)

    decorating = node is _MISSING

    def transform(node: Any) -> Any:
        if not decorating:
            _check_names([selector for selector, _ in rules], _streams(node, graph), where)

        def plan(path: Path, stream: RngStream) -> Any:
            rule = _first(rules, path, stream)
            if rule is None:
                return None
            num = rule[1]
            return (lambda key: key) if num is None else (lambda key: _split_keys(key, num))

        return _in_place(node, plan) if in_place else _copied(node, plan, graph)

    if node is _MISSING:
        return functools.partial(_decorator, where, transform, in_place)
    return transform(node)


def with_rngs(
    node: Any = _MISSING,
    /,
    *,
    split: Any = None,
    fork: Any = None,
    broadcast: Any = None,
    only: Any = ...,
    graph: bool | None = None,
) -> Any:
    """A copy of `node` whose `RngStream`s are split, broadcast or forked by rules, as Flax
    NNX's `nnx.with_rngs`. `node` keeps its streams (each gives the one key the copy's is
    made from); the rest of the graph (Modules rebuilt, Variables shared) is as
    `pytree_graph.recursive_map` makes it. Without `node`, a decorator: each call gets
    copies of its arguments.

    A stream takes the first entry that selects it in each of `split`, `broadcast` and
    `fork`. When it is selected by more than one of the three, an entry naming it (not
    `...`) wins; two such entries are an error. A stream no rule selects is kept as it is.

    Arguments:
        node: a Module, an `Rngs`, an `RngStream`, or any pytree or list of them.
        split: an int or tuple (every stream), or `{selector: splits}`: the stream becomes
            `splits` independent streams stacked along new leading axes (a value of None:
            kept as it is).
        fork: a selector, or a list of them: the stream is forked (a new stream whose key
            is its next key).
        broadcast: as `split`, but the streams stacked are copies of one new stream (the
            same keys in every slice).
        only: which streams the rules may touch (a selector; all by default).
        graph: `False` for tree mode (`node` walked as a pytree, as
            `pytree_graph.recursive_map(..., graph=False)`); `None` reads
            `pytree_graph.set_graph_mode`.

    A selector is a stream name (`"params"`), a filter on the stream's RngKey and RngCount
    Variables (`RngState`, `PathContains(...)`), a list of those, or `...`.

    Returns:
        The copy; without `node`, a decorator.

    Raises:
        ValueError: a stream matches two specific rules, a split is not a count or shape,
            or a name no stream has. Nothing is changed.

    Examples:
        >>> from pytree_nn import Rngs, with_rngs
        >>> rngs = Rngs(params=0, dropout=1)
        >>> new = with_rngs(rngs, split={"params": 4}, fork=...)
        >>> new.params.key.value.shape, new.dropout.key.value.shape
        ((4,), ())
        >>> int(rngs.params.count.value), rngs.params.key.value.shape  # rngs advanced
        (1, ())
    """
    where = "with_rngs"
    split_rules = _rules(split, f"{where}(split=...)")
    broadcast_rules = _rules(broadcast, f"{where}(broadcast=...)")
    forks = [] if fork is None else fork if isinstance(fork, list | tuple) else [fork]
    fork_rules = [(_Selector(spec, f"{where}(fork=...)"), None) for spec in forks]
    selector = _Selector(only, f"{where}(only=...)")
    selectors = [selector, *(rule[0] for rule in (*split_rules, *broadcast_rules, *fork_rules))]

    def decide(path: Path, stream: RngStream) -> tuple[str, Splits | None]:
        """What the rules do to one stream: ("split" | "broadcast" | "fork" | "keep", num)."""
        if not selector(path, stream):
            return "keep", None
        found = {
            kind: rule
            for kind, rules in (
                ("split", split_rules),
                ("broadcast", broadcast_rules),
                ("fork", fork_rules),
            )
            if (rule := _first(rules, path, stream)) is not None
        }
        specific = {kind: rule for kind, rule in found.items() if not rule[0].catch_all}
        if len(specific) > 1:
            matches = "; ".join(f"{kind} by {rule[0].spec!r}" for kind, rule in specific.items())
            raise ValueError(
                f"{where}: RngStream at path {path_text(path)} matches multiple rules: the "
                f"stream {stream.tag!r} is selected by more than one rule ({matches}). Select "
                "each stream with one rule, e.g. split={'params': 4}, fork=... (`...` gives "
                "way to a named rule)."
            )
        kind, (_, num) = next(iter((specific or found).items()), ("keep", (None, None)))
        return ("keep", None) if kind != "fork" and num is None else (kind, num)

    def new_stream(path: Path, value: Any) -> Any:
        if not isinstance(value, RngStream):
            return value
        kind, num = decide(path, value)
        if kind == "keep":
            return value
        key = value()
        if kind == "split":
            key = _split_keys(key, num)
        elif kind == "broadcast":
            shape = num if isinstance(num, tuple) else (num,)
            key = jnp.broadcast_to(key, (*shape, *key.shape))
        return RngStream(key, tag=value.tag)

    decorating = node is _MISSING

    def transform(node: Any) -> Any:
        streams = _streams(node, graph)
        if not decorating:
            _check_names(selectors, streams, where)
        for path, stream in streams:  # every clash found before any stream draws
            decide(path, stream)
        return pg.recursive_map(new_stream, node, graph=graph)

    if node is _MISSING:
        return functools.partial(_decorator, where, transform, False)
    return transform(node)


def reseed(
    node: Any,
    /,
    *,
    graph: bool | None = None,
    policy: Literal["scalars_only", "match_shape"]
    | Callable[[Path, jax.Array, tuple[int, ...]], jax.Array] = "scalars_only",
    **stream_keys: Any,
) -> None:
    """Start the named streams of `node` afresh from new seeds, counts at 0, as Flax NNX's
    `nnx.reseed`: `reseed(model, dropout=42)` makes a model built with
    `Rngs(dropout=42)` draw its dropout masks from the start again.

    The streams called `name` (their tag) take, in `iter_graph` order, the keys
    `Rngs(name=seed)` gives one after the other: the same keys layers get when they fork
    that stream as they are built (in that order).

    Arguments:
        node: a Module, an `Rngs`, an `RngStream`, or any pytree or list of them.
        graph: `False` for tree mode (a stream reached twice raises); `None` reads
            `pytree_graph.set_graph_mode`. The streams are changed in place either way.
        policy: for a stream whose key is a stack (split for vmap or scan):
            `"scalars_only"` (the default) raises; `"match_shape"` splits the new key to
            the stack's shape; or a function `(path, key, shape) -> keys`.
        **stream_keys: stream name to its new seed (an int or a PRNG key).

    Raises:
        ValueError: a name that no stream of `node` has (Flax NNX ignores it), a stacked
            stream under `"scalars_only"`, or an unknown policy. Nothing is changed.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Dropout, Rngs, reseed
        >>> dropout = Dropout(0.5, rngs=Rngs(dropout=42))
        >>> first = dropout(jnp.ones(4))
        >>> reseed(dropout, dropout=42)
        >>> bool((dropout(jnp.ones(4)) == first).all())
        True
    """
    where = "reseed"
    if policy == "scalars_only":
        policy = _scalars_only
    elif policy == "match_shape":
        policy = _match_shape
    elif not callable(policy):
        raise ValueError(
            f'{where}(policy=...) must be "scalars_only", "match_shape" or a function '
            f"(path, key, shape) -> keys, got {policy!r}."
        )
    seeds = {
        name: RngStream(_as_key(seed, f"{where}({name}=...)"), tag=name)
        for name, seed in stream_keys.items()
    }
    streams = _streams(node, graph)
    _check_names([_Selector(list(seeds), where)], streams, where)
    new_keys = [
        (stream, policy(path, seeds[stream.tag](), stream.key.value.shape))
        for path, stream in streams
        if stream.tag in seeds
    ]
    for stream, key in new_keys:
        _set_key(stream, _as_key(key, f"{where}(policy=...) result"))
        _LINEAGES.pop(stream, None)  # started afresh: what it drew before is not counted


def _scalars_only(path: Path, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if shape != ():
        raise ValueError(
            f"reseed: the stream at {path_text(path)} holds a stack of keys of shape "
            f"{shape} (split for vmap or scan). Pass policy='match_shape' to split the new "
            "key to that shape, or a function (path, key, shape) -> keys."
        )
    return key


def _match_shape(path: Path, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return key if shape == () else _split_keys(key, shape)
