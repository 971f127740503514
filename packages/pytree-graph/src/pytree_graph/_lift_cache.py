"""Reusing the walk of a call's objects: a repeat call costs a few C-level checks.

Walking an object graph in Python costs about a microsecond per object, too much for
every call of a jitted function. Between two calls with the same objects, though,
usually only Variable values change. So a walk is kept, keyed by the identity of the
objects at the top of the call (held weakly: the entry goes when one of them does), and
reused when checks that read one slot per object find nothing changed:

- every pytree Module's flattened form (`flat_form`) is the very tuple seen last time:
  pytree_module makes a new one on every assignment, so the same tuple means the same
  children and static attributes;
- every `pytree=False` object has the same attribute names, bound to the same objects;
- every list and dict below the top has the same keys and items (by identity);
- every `pytree_module.List` and `Dict` below the top too;
- every Variable has the same type and metadata (its kind).

Then only the Variables' values, and the arrays at the top of the call, are read anew
(through the walk's `LiftPlan`). Graphs holding other pytree nodes, whose mutability no
such check can see, are walked every time. Either way `LiftCache.find` gives a
`LiftedCall` (`_lift`).

The checks of Modules, Variables, `pytree=False` objects and `pytree_module.List`s and
`Dict`s run only when `pytree_module.extend.mutations.count` moved since the last call
(plain lists and dicts change without bumping it, so they are compared on every call,
item by item: a graph holding many of them is cheaper to call with `List`s and `Dict`s
instead, as `pytree_nn.Optimizer` holds its state). So every structural
write, in any package, must end with `pytree_module.extend.touch()`. To prove no writer
forgets, set the environment variable `PYTREE_GRAPH_CHECK_LIFT_CACHE=1` (read once, at
import): every cache hit is then walked again and compared with the cached walk, and a
difference raises `StaleLiftCacheError` naming the stale object (slow; for tests).
"""

import os
import weakref
from itertools import chain
from operator import attrgetter, is_, itemgetter
from typing import Any

from pytree_filter import SHAPED_TYPES, path_text
from pytree_module import Dict, List, Module
from pytree_module.extend import flat_form, is_pytree_class, mutations

from ._array_refs import RefCell
from ._lift import LiftedCall, LiftPlan, lift_once, lift_walked, read_variable_values
from ._static import static_key
from ._traverse import GraphWalk
from ._variables import Variable, value_writes

# Re-walk every cache hit and compare (see the module docstring).
CHECK_HITS = os.environ.get("PYTREE_GRAPH_CHECK_LIFT_CACHE", "") not in ("", "0")

_get_flat = flat_form
_get_variable_flat = attrgetter("_pg_flat")
_second = itemgetter(1)
_ARRAY = object()  # marks an array at the top of a call in a cache key
# Statics compared exactly by `(type, value)`; floats and complex numbers are keyed by
# their bits instead (`0.0 == -0.0`, and NaN is not equal to itself).
_EXACT_STATIC_TYPES = frozenset({bool, int, str, bytes, type(None)})
_MAX_ENTRIES = 256


class _Uncacheable(Exception):
    """The top of the call holds something the cache key cannot describe."""


def _key(value: Any, roots: list[Any], arrays: list[Any]) -> Any:
    """The structure of the top of a call, down to its objects and arrays.

    Objects are collected in `roots` and arrays in `arrays`, in the order the graph
    walk meets them. (Written for speed: it runs on every call of a graph transform.)
    """
    kind = type(value)
    if kind is dict or kind is Dict:
        parts: list[Any] = [kind, tuple(value)]
        items = value.values()
    elif kind is tuple or kind is list or kind is List:
        parts = [kind]
        items = value
    else:
        return _key_of_item(value, roots, arrays)
    return _key_of_items(parts, items, roots, arrays)


def _key_of_items(parts: list[Any], items: Any, roots: list[Any], arrays: list[Any]) -> Any:
    """`parts` (the container's own) followed by the key of each item, as a tuple."""
    append = parts.append
    for item in items:
        kind = type(item)
        if kind in _array_types:
            arrays.append(item)
            append(_ARRAY)
        elif isinstance(item, _GRAPH_NODES):
            roots.append(item)
            append(None)
        elif kind in _EXACT_STATIC_TYPES:
            append((kind, item))
        elif kind is float or kind is complex:
            append(static_key(item))
        else:
            append(_key(item, roots, arrays))
    return tuple(parts)


def _top_key(tree: Any, roots: list[Any], arrays: list[Any]) -> Any:
    """`_key` of a call's tree, with the usual call, `(args, {})`, keyed without going
    through the outer tuple and the empty dict (a microsecond less a call)."""
    if type(tree) is not tuple or len(tree) != 2:
        return _key(tree, roots, arrays)
    args, kwargs = tree
    if type(args) is not tuple or type(kwargs) is not dict or kwargs:
        return _key(tree, roots, arrays)
    return _key_of_items([_CALL], args, roots, arrays)


_CALL = object()  # marks `_top_key`'s keys: no `_key` starts with it


def _key_of_item(value: Any, roots: list[Any], arrays: list[Any]) -> Any:
    kind = type(value)
    if kind in _EXACT_STATIC_TYPES:
        return (kind, value)
    if kind is float or kind is complex:
        return static_key(value)
    if isinstance(value, _GRAPH_NODES):
        roots.append(value)
        return None
    if isinstance(value, SHAPED_TYPES):
        _array_types.add(kind)  # its exact type, checked first next time
        arrays.append(value)
        return _ARRAY
    raise _Uncacheable


_GRAPH_NODES = (Module, Variable)
_array_types: set[type] = set()


class StaleLiftCacheError(AssertionError):
    """A cache hit whose cached walk differs from a new walk of the same objects: some
    structural write did not call `pytree_module.extend.touch()`."""


def _check_hit(tree: Any, lifted: LiftedCall) -> None:
    """Walk `tree` again; raise `StaleLiftCacheError` if the cached walk `lifted` was read
    through differs."""
    walk = GraphWalk(record_shared=True)
    graphdef = walk.graphdef(tree)
    cached_objects = lifted.objects
    assert walk.shared_paths is not None
    for index, (now, cached) in enumerate(zip(walk.objects, cached_objects, strict=False)):
        if now is not cached:
            path = path_text(walk.shared_paths[index][0])
            raise StaleLiftCacheError(
                f"Stale lift cache hit: the object at {path} is now a {type(now).__name__}, "
                f"the cached walk had a {type(cached).__name__} there. A write changed the "
                "graph without calling `pytree_module.extend.touch()`."
            )
    cached = lifted.graphdef
    leaves = lifted.leaves
    values = lifted.values
    for path, leaf, value in zip(graphdef.paths, walk.leaves, values, strict=False):
        if (
            isinstance(leaf, Variable)
            and type(leaf._pg_flat[0]) is not RefCell  # its refs are read anew each call
            and leaf._pg_flat[0][0] is not value
        ):
            raise StaleLiftCacheError(
                f"Stale lift cache hit: the Variable at {path_text(path)} holds another value "
                "than the one the cache kept. A write changed its value without calling "
                "`wrote_values()`."
            )
    if graphdef == cached and all(map(is_, walk.leaves, leaves)):
        return
    # Name the first leaf whose path or object differs (or the whole tree, if none does).
    near = next(
        (
            path_text(path)
            for path, was, leaf, cached_leaf in zip(
                graphdef.paths, cached.paths, walk.leaves, leaves, strict=False
            )
            if path != was or leaf is not cached_leaf
        ),
        f"the tree ({type(tree).__name__})",
    )
    raise StaleLiftCacheError(
        f"Stale lift cache hit: the graph changed since the cached walk (structure, static "
        f"attributes or Variable metadata), near {near}. A write changed it without "
        "calling `pytree_module.extend.touch()`."
    )


class Checks:
    """What a walk met, recorded so that a later call can check nothing changed.

    It implements `_traverse.WalkObserver`: the GraphWalk calls `variable`, `module`,
    `array` and `container` as it goes.
    """

    def __init__(self, roots: list[Any]):
        self.cacheable = True
        self.root_number = {id(r): n for n, r in reversed(list(enumerate(roots)))}
        self.modules: list[Module] = []  # pytree Modules below the top, and their flats
        self.flats: list[Any] = []
        self.plain: list[tuple[Any, tuple, tuple]] = []  # pytree=False objects below
        self.containers: list[tuple[Any, Any, tuple]] = []  # lists and dicts below
        self.watched: list[tuple[Any, Any, tuple]] = []  # Lists and Dicts below
        self.variables: list[Variable] = []  # Variables below the top, and their kinds
        self.kinds: list[Any] = []
        self.root_checks: list[tuple[int, Any]] = []  # (root number, what it held)
        self.root_objects: list[tuple[int, int]] = []  # (root number, object index)
        self.root_variables: list[tuple[int, int]] = []  # (root number, leaf position)
        self.variable_positions: list[int] = []
        self.top_arrays: list[int] = []  # leaf positions of the arrays at the top
        self.inner_arrays: list[int] = []  # leaf positions of the other arrays

    def _root(self, obj: Any, index: int, depth: int) -> int | None:
        number = self.root_number.get(id(obj)) if depth == 0 else None
        if number is not None:
            self.root_objects.append((number, index))
        return number

    def variable(self, variable: Variable, index: int, position: int, depth: int) -> None:
        number = self._root(variable, index, depth)
        if number is None:
            self.variables.append(variable)
            self.kinds.append(variable._pg_flat[1])
            self.variable_positions.append(position)
        else:
            self.root_checks.append((number, variable._pg_flat[1]))
            self.root_variables.append((number, position))

    def module(self, module: Module, index: int, depth: int) -> None:
        if is_pytree_class(type(module)):
            held = flat_form(module)
        else:
            attributes = vars(module)
            held = (tuple(attributes), tuple(attributes.values()))
        number = self._root(module, index, depth)
        if number is not None:
            self.root_checks.append((number, held))
        elif is_pytree_class(type(module)):
            self.modules.append(module)
            self.flats.append(held)
        else:
            self.plain.append((module, *held))

    def array(self, position: int, depth: int) -> None:
        (self.inner_arrays if depth else self.top_arrays).append(position)

    def container(self, container: Any, depth: int) -> None:
        if depth:
            kind = type(container)
            keys = tuple(container) if kind is dict or kind is Dict else None
            values = tuple(container.values()) if keys is not None else tuple(container)
            held = self.containers if kind is dict or kind is list else self.watched
            held.append((container, keys, values))


class CachedWalk:
    """A walk kept for reuse: the checks that tell whether a new call may reuse it, and its
    plan (`jit_partial` keeps one for its bound objects)."""

    __slots__ = (
        "__weakref__",
        "checks",
        "container_items",
        "container_keys",
        "container_sizes",
        "containers",
        "dicts",
        "epoch",
        "one_sequence",
        "plan",
        "refs",
        "sequences",
        "values_read",
    )

    def __init__(self, walk: GraphWalk, checks: Checks, graphdef: Any):
        self.checks = checks
        # The lists and dicts, compared on each call as three flat sequences (their sizes,
        # the dicts' keys, and all their items), so that the comparison runs in C.
        dicts = [(c, keys, items) for c, keys, items in checks.containers if keys is not None]
        sequences = [(c, items) for c, keys, items in checks.containers if keys is None]
        self.dicts = [c for c, _, _ in dicts]
        self.sequences = [c for c, _ in sequences]
        self.containers = self.dicts + self.sequences
        self.container_sizes = [len(items) for _, _, items in dicts] + [
            len(items) for _, items in sequences
        ]
        self.container_keys = [key for _, keys, _ in dicts for key in keys]
        self.container_items = [item for _, _, items in dicts for item in items] + [
            item for _, items in sequences for item in items
        ]
        self.one_sequence = not self.dicts and len(self.sequences) == 1
        self.epoch = mutations.count
        self.plan = LiftPlan(
            walk,
            graphdef,
            checks.variable_positions,
            checks.root_variables,
            checks.top_arrays,
            checks.inner_arrays,
            checks.root_objects,
        )
        self.refs: tuple = ()
        # `(stamp, values)` of the last read of the Variables' values (see `lifted`); None
        # where array-backed Variables are walked: writes into their refs (inside a
        # `jax.jit`, say) draw no stamp.
        array_backed = any(
            isinstance(leaf, Variable) and type(leaf._pg_flat[0]) is RefCell for leaf in walk.leaves
        )
        self.values_read: tuple[int, list[Any]] | None = None if array_backed else (0, [])

    def lifted(self, roots: list[Any], arrays: list[Any]) -> LiftedCall | None:
        """The lifted call with these roots and top arrays, or None if anything changed
        since the walk."""
        if [ref() for ref in self.refs] != roots:  # identity: Modules and Variables
            return None
        if not self.unchanged(roots):
            return None
        return LiftedCall(self.plan, roots, arrays, self.variable_values(roots))

    def variable_values(self, roots: list[Any]) -> list[Any]:
        """The Variables' values (`read_variable_values`), read again only where a value was
        written since the last read.

        A model called again and again without training, as in evaluation or generation,
        has them read once (`wrote_values` stamps every write). The stamp is taken before
        reading, so a write during the read makes the next call read again. Array-backed
        Variables are read each call: writes into their refs draw no stamp.
        """
        held = self.values_read
        if held is None:
            return read_variable_values(self.plan, roots)
        stamp = value_writes.last
        if held[0] != stamp:
            held = self.values_read = (stamp, read_variable_values(self.plan, roots))
        return held[1]

    def unchanged(self, roots: list[Any]) -> bool:
        """Whether the objects walked, reached from these roots, are as they were then."""
        if self.epoch != mutations.count:
            # Some object changed somewhere since the last check: were they ours?
            if not self._unchanged(roots):
                return False
            self.epoch = mutations.count
        # Lists and dicts change without telling anyone: always compare them.
        return not self.containers or self.same_containers()

    def same_containers(self) -> bool:
        """Whether the plain lists and dicts walked hold what they held then (the same
        sizes, keys and items, by identity)."""
        if self.one_sequence:  # the usual case: one list of layers
            (sequence,) = self.sequences
            items = self.container_items
            return len(sequence) == len(items) and all(map(is_, sequence, items))
        if list(map(len, self.containers)) != self.container_sizes:
            return False
        if not self.dicts:
            return all(map(is_, chain.from_iterable(self.sequences), self.container_items))
        return list(chain.from_iterable(self.dicts)) == self.container_keys and all(
            map(
                is_,
                chain(
                    chain.from_iterable(map(dict.values, self.dicts)),
                    chain.from_iterable(self.sequences),
                ),
                self.container_items,
            )
        )

    def _unchanged(self, roots: list[Any]) -> bool:
        checks = self.checks
        for number, held in checks.root_checks:
            root = roots[number]
            if isinstance(root, Variable):
                if root._pg_flat[1] is not held:
                    return False
            elif is_pytree_class(type(root)):
                if flat_form(root) is not held:
                    return False
            elif not _same_attributes(root, held):
                return False
        if not all(map(is_, map(_get_flat, checks.modules), checks.flats)):
            return False
        if not all(map(is_, map(_second, map(_get_variable_flat, checks.variables)), checks.kinds)):
            return False
        if not all(_same_items(*held) for held in checks.watched):
            return False
        return all(_same_attributes(obj, (names, values)) for obj, names, values in checks.plain)


def _same_items(container: Any, keys: tuple | None, values: tuple) -> bool:
    """Whether a list or dict holds the same keys and items (by identity) as recorded."""
    if keys is None:
        return len(container) == len(values) and all(map(is_, container, values))
    return tuple(container) == keys and all(map(is_, container.values(), values))


def _same_attributes(obj: Any, held: tuple[tuple, tuple]) -> bool:
    names, values = held
    attributes = vars(obj)
    return tuple(attributes) == names and all(map(is_, attributes.values(), values))


class LiftCache:
    """Makes `LiftedCall`s, reusing the walk of earlier calls with the same objects."""

    def __init__(self) -> None:
        self._entries: dict[Any, CachedWalk] = {}

    def find(self, tree: Any) -> LiftedCall:
        """The lifted call of `tree`: from a cached walk where one still fits, else from
        a new walk (cached when the checks can watch it)."""
        return self._find(tree)[0]

    def find_args(self, args: tuple) -> "tuple[LiftedCall, LastCall | None]":
        """`find((args, {}))`, and the `LastCall` that matches the next call with the same
        objects to this one without building the cache key (None where the top of the
        call holds more than Modules, Variables and arrays)."""
        lifted, entry, key = self._find((args, {}))
        return lifted, _last_call(entry, key, len(args))

    def _find(self, tree: Any) -> tuple[LiftedCall, "CachedWalk | None", Any]:
        """`find`, with the cached walk used (None where the call is not cached) and its key."""
        roots: list[Any] = []
        arrays: list[Any] = []
        try:
            key = (_top_key(tree, roots, arrays), tuple(map(id, roots)))
        except _Uncacheable:
            return lift_once(tree), None, None
        except RecursionError:
            # The top of the call is a list or dict that holds itself: the walk of
            # `lift_once` names where (the key above has no objects to stop at).
            return lift_once(tree), None, None
        entry = self._entries.get(key)
        if entry is not None:
            lifted = entry.lifted(roots, arrays)
            if lifted is not None:
                if CHECK_HITS:
                    _check_hit(tree, lifted)
                return lifted, entry, key
        return self._walk(key, tree, roots, arrays)

    def _walk(
        self, key: Any, tree: Any, roots: list[Any], arrays: list[Any]
    ) -> tuple[LiftedCall, "CachedWalk | None", Any]:
        checks = Checks(roots)
        walk = GraphWalk(checks=checks)
        graphdef = walk.graphdef(tree)
        if not checks.cacheable:
            return lift_walked(walk, graphdef), None, None
        entry = CachedWalk(walk, checks, graphdef)
        self._store(key, entry, roots)
        # Read through the entry's plan, as the calls after this one will be: a jitted
        # function then gets its inputs in the same form (and order) every time.
        return LiftedCall(entry.plan, roots, arrays), entry, key

    def _store(self, key: Any, entry: CachedWalk, roots: list[Any]) -> None:
        entries = self._entries
        entry_ref = weakref.ref(entry)

        def forget(_: Any) -> None:
            # A root is gone: its id may be reused, and the entry holds its children.
            if entries.get(key) is entry_ref():
                entries.pop(key, None)

        entry.refs = tuple(weakref.ref(r, forget) for r in roots)
        if len(entries) >= _MAX_ENTRIES:
            # `None`: another thread may have dropped the oldest entry first.
            entries.pop(next(iter(entries)), None)
        entries[key] = entry


class LastCall:
    """What a jit keeps of its last call, to match the next one by identity alone.

    A call whose arguments are only Modules, Variables and arrays matches when it passes the
    same objects at the same places, unchanged since, and arrays of a known exact type where
    arrays were: then the jitted function's inputs are read without building the lift
    cache's key, and without a `LiftedCall` (made only to write back or to name an error).
    The cached walk is held weakly (it holds the objects' children, which must not outlive
    the objects), and each object by a weak reference.

    Arguments:
        entry: the cached walk of the call.
        pattern: per argument, the weak reference to its object, or None for an array.
    """

    __slots__ = ("_entry", "_pattern")

    def __init__(self, entry: CachedWalk, pattern: tuple["weakref.ref | None", ...]):
        self._entry = weakref.ref(entry)
        self._pattern = pattern

    def inputs(self, args: tuple) -> list[Any] | None:
        """The values a jitted call takes for `args` (as `LiftedCall.jit_inputs()` gives
        them), or None where `args` do not match the last call. Written for speed: it runs
        on every call of a jitted function."""
        entry = self._entry()
        pattern = self._pattern
        if entry is None or len(args) != len(pattern):
            return None
        roots: list[Any] = []
        arrays: list[Any] = []
        # Lengths compared above: a strict zip would only cost time (a quarter microsecond).
        for value, ref in zip(args, pattern):  # noqa: B905
            if ref is None:
                if type(value) not in _array_types:
                    return None
                arrays.append(value)
            elif value is ref():
                roots.append(value)
            else:
                return None
        if not entry.unchanged(roots):
            return None
        inputs = [*entry.variable_values(roots), *arrays, *entry.plan.inner_arrays]
        if CHECK_HITS:
            _check_hit((args, {}), self.lifted(args, inputs))
        return inputs

    def lifted(self, args: tuple, inputs: list[Any]) -> LiftedCall:
        """The lifted call of `args`, which `inputs` (from `inputs(args)`) matched."""
        entry = self._entry()
        assert entry is not None  # `inputs` found it, and `args` hold its objects alive
        roots: list[Any] = []
        arrays: list[Any] = []
        for value, ref in zip(args, self._pattern, strict=True):
            (arrays if ref is None else roots).append(value)
        return LiftedCall(entry.plan, roots, arrays, inputs=inputs)


def _last_call(entry: CachedWalk | None, key: Any, count: int) -> LastCall | None:
    """The `LastCall` of a call of `count` arguments keyed `key`, or None where its top holds
    more than Modules, Variables and arrays (its key is then needed to match it)."""
    if entry is None:
        return None
    parts = key[0]
    if len(parts) != count + 1 or parts[0] is not _CALL:
        return None
    refs = iter(entry.refs)
    pattern = []
    for part in parts[1:]:
        if part is None:
            pattern.append(next(refs))
        elif part is _ARRAY:
            pattern.append(None)
        else:
            return None
    return LastCall(entry, tuple(pattern))


lift_cache = LiftCache()
