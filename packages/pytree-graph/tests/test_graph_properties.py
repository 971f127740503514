"""Property tests: random object graphs, with sharing and cycles, survive split and merge.

A graph is drawn as a spec (plain tuples, so hypothesis can shrink and print it), then
built: pytree `Node`s and `pytree=False` `GraphNode`s whose attributes hold Variables
(fresh or shared), arrays, static values, other nodes and lists of those. Only a
`GraphNode` may point back to a node made before it (or to itself), so every cycle passes
through a `GraphNode`, as the graph functions require.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytree_graph import (
    BatchStat,
    Param,
    State,
    Variable,
    clone,
    find_duplicates,
    graphdef,
    iter_graph,
    merge,
    split,
    state,
    update,
)
from pytree_module import Module


class Node(Module):
    """A pytree Module: must not be on a cycle."""

    def __init__(self, attributes):
        for name, value in attributes.items():
            setattr(self, name, value)


class GraphNode(Module, pytree=False):
    """A graph node: may be on cycles and point back to any node."""

    def __init__(self, attributes):
        for name, value in attributes.items():
            setattr(self, name, value)


# ------------------------------------------------------------------------------ specs
#
# A graph spec is `(variables, nodes)`:
#   variables: `(cls, values, tag)` per Variable of a pool that attributes pick from, so
#       that two picks of one Variable share it;
#   nodes: `(cls, attributes)` per node, node 0 being the root; attributes are
#       `(name, item, late)`, `late` meaning "assigned after every node is made".
# Items: `("variable", k)`, `("array", values)`, `("static", v)`, `("node", j)` and
# `("list", items)`.

# Small integers, so `x + 1` is exact in float32.
array_values = st.one_of(
    st.integers(-100, 100),
    st.lists(st.integers(-100, 100), min_size=1, max_size=3).map(tuple),
)
variable_specs = st.tuples(
    st.sampled_from([Param, BatchStat]),
    array_values,
    st.sampled_from([None, "x", ("a", 1)]),  # metadata `tag`, None for no metadata
)
statics = st.one_of(st.integers(-3, 3), st.text(alphabet="xyz", max_size=2), st.none())
names = st.text(alphabet="abcdef", min_size=1, max_size=2)


def item_specs(num_variables: int, targets: list[int]) -> st.SearchStrategy:
    """Items for one attribute; `targets` are the nodes this attribute may refer to."""
    leaf_items = [
        st.tuples(st.just("variable"), st.integers(0, num_variables - 1)),
        st.tuples(st.just("array"), array_values),
        st.tuples(st.just("static"), statics),
    ]
    if targets:
        # Twice, so that references (the point of these tests) are drawn often.
        leaf_items += [st.tuples(st.just("node"), st.sampled_from(targets))] * 2
    leaf = st.one_of(*leaf_items)
    return st.one_of(leaf, st.tuples(st.just("list"), st.lists(leaf, max_size=3).map(tuple)))


def referenced(item: tuple) -> list[int]:
    """The nodes an item refers to."""
    if item[0] == "node":
        return [item[1]]
    if item[0] == "list":
        return [j for sub in item[1] for j in referenced(sub)]
    return []


@st.composite
def graph_specs(draw: Any, max_nodes: int = 5) -> tuple:
    """Specs of graphs of 1 to `max_nodes` nodes (see above), for `build`."""
    num_nodes = draw(st.integers(1, max_nodes))
    classes = draw(
        st.lists(st.sampled_from([Node, GraphNode]), min_size=num_nodes, max_size=num_nodes)
    )
    variables = tuple(draw(st.lists(variable_specs, min_size=1, max_size=3)))
    attributes: list[list[tuple]] = [[] for _ in range(num_nodes)]
    # A spanning tree (each node below an earlier one), so that every node is reachable.
    for i in range(1, num_nodes):
        parent = draw(st.integers(0, i - 1))
        attributes[parent].append((f"child{i}", ("node", i), draw(st.booleans())))
    for i, cls in enumerate(classes):
        later = list(range(i + 1, num_nodes))
        # Pointing back to node i or before may close a cycle: only a GraphNode may do it.
        targets = list(range(num_nodes)) if cls is GraphNode else later
        for name in draw(st.lists(names, unique=True, max_size=3)):
            item = draw(item_specs(len(variables), targets))
            # Back references are assigned late: their targets may not exist yet.
            late = draw(st.booleans()) or any(j <= i for j in referenced(item))
            attributes[i].append((name, item, late))
    nodes = tuple((cls, tuple(attrs)) for cls, attrs in zip(classes, attributes, strict=True))
    return variables, nodes


def build(spec: tuple) -> Any:
    """The graph a spec describes (a new one at each call)."""
    variable_specs_, node_specs = spec
    variables = [
        cls(jnp.asarray(values, jnp.float32), **({} if tag is None else {"tag": tag}))
        for cls, values, tag in variable_specs_
    ]
    nodes: list[Any] = [None] * len(node_specs)

    def make(item: tuple) -> Any:
        kind, arg = item
        if kind == "variable":
            return variables[arg]
        if kind == "array":
            return jnp.asarray(arg, jnp.float32)
        if kind == "static":
            return arg
        if kind == "node":
            return nodes[arg]
        return [make(sub) for sub in arg]

    # Last node first: the attributes given to __init__ only refer to later nodes.
    late = []
    for i in reversed(range(len(node_specs))):
        cls, attributes = node_specs[i]
        now = {}
        for name, item, is_late in attributes:
            if is_late:
                late.append((i, name, item))
            else:
                now[name] = make(item)
        nodes[i] = cls(now)
    # Then the rest, as assignments to live instances (cycles are closed here).
    for i, name, item in late:
        setattr(nodes[i], name, make(item))
    return nodes[0]


# ---------------------------------------------------------------------------- helpers


def assert_arrays_equal(expected: Any, actual: Any, where: tuple) -> None:
    assert isinstance(actual, jax.Array), f"{where}: not an array: {actual!r}"
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, where
    assert np.array_equal(np.asarray(expected), np.asarray(actual)), where


def assert_same_graph(original: Any, copy: Any, expect: Any = lambda x: x) -> dict[int, Any]:
    """Walk two graphs in step and check they have the same shape.

    Same types, static values, Variable metadata and values (`copy`'s values being
    `expect` of `original`'s), and the same sharing: matched Modules and Variables form a
    one-to-one map, so two paths meet at one object in `original` iff they do in `copy`.

    Returns:
        The map, `{id(object of original): object of copy}`.
    """
    matched: dict[int, Any] = {}
    matched_back: dict[int, Any] = {}

    def walk(a: Any, b: Any, path: tuple) -> None:
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        if isinstance(a, Module | Variable):
            if id(a) in matched or id(b) in matched_back:
                # Met before on another path: it must be met with the same partner.
                assert matched.get(id(a)) is b and matched_back.get(id(b)) is a, (
                    f"sharing differs at {path}"
                )
                return  # and not walked again (cycles)
            matched[id(a)] = b
            matched_back[id(b)] = a
        if isinstance(a, Variable):
            assert dict(a.metadata) == dict(b.metadata), path
            assert_arrays_equal(expect(a.value), b.value, path)
        elif isinstance(a, Module):
            assert sorted(vars(a)) == sorted(vars(b)), path
            for name in sorted(vars(a)):
                walk(vars(a)[name], vars(b)[name], (*path, name))
        elif isinstance(a, list):
            assert len(a) == len(b), path
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, (*path, i))
        elif isinstance(a, jax.Array):
            assert_arrays_equal(expect(a), b, path)
        else:
            assert a == b, f"{path}: static {a!r} vs {b!r}"

    walk(original, copy, ())
    return matched


def assert_states_equal(expected: Any, actual: Any) -> None:
    """Same paths (in any order), leaf types, Variable metadata and values."""
    expected, actual = expected.flat_state(), actual.flat_state()
    assert expected.keys() == actual.keys()
    for path, leaf in expected.items():
        other = actual[path]
        assert type(leaf) is type(other), path
        if isinstance(leaf, Variable):
            assert dict(leaf.metadata) == dict(other.metadata), path
            leaf, other = leaf.value, other.value
        assert_arrays_equal(leaf, other, path)


def graph_objects(node: Any) -> list[Any]:
    """Every Module and Variable of a graph, once each (arrays are not identity-tracked)."""
    return [v for _, v in iter_graph(node) if isinstance(v, Module | Variable)]


def matches(leaf: Any, filters: tuple) -> bool:
    """Whether `split` would put `leaf` in the State of one of `filters`."""
    return any(f is ... or isinstance(leaf, f) for f in filters)


# ----------------------------------------------------------------------------- tests


@settings(max_examples=60, deadline=None)
@given(graph_specs())
def test_merge_of_split_rebuilds_the_same_graph(spec):
    g = build(spec)
    gdef, st_ = split(g)
    # merge places the State's Variables (those of `g`) in new Modules ...
    rebuilt = merge(gdef, st_)
    matched = assert_same_graph(g, rebuilt)
    for original, new in matched.items():
        assert (original == id(new)) == isinstance(new, Variable)
    # ... and with copy=True nothing of the original is reused.
    copy = merge(gdef, st_, copy=True)
    matched = assert_same_graph(g, copy)
    assert not {id(v) for v in matched.values()} & matched.keys()
    # Every object of `g` is reached by the walk, and only those.
    assert sorted(matched) == sorted(id(v) for v in graph_objects(g))
    assert find_duplicates(copy) == find_duplicates(g)
    assert [p for p, _ in iter_graph(copy)] == [p for p, _ in iter_graph(g)]
    assert_same_graph(g, clone(g))


@settings(max_examples=60, deadline=None)
@given(graph_specs())
def test_graphdefs_are_stable(spec):
    g = build(spec)
    gdef, st_ = split(g)
    again = graphdef(merge(gdef, st_))
    assert again == gdef and hash(again) == hash(gdef)
    assert split(g)[0] == gdef and graphdef(g) == gdef
    # Structure is all a graphdef holds: a second graph from the same spec has the same.
    other = graphdef(build(spec))
    assert other == gdef and hash(other) == hash(gdef)


filter_sets = st.sampled_from(
    [
        (Param, BatchStat),
        (BatchStat, Param),
        (Param, ...),
        (BatchStat, ...),
        (Param, BatchStat, ...),
        (Param,),
        (BatchStat,),
    ]
)


@settings(max_examples=60, deadline=None)
@given(graph_specs(), filter_sets)
def test_split_with_filters(spec, filters):
    g = build(spec)
    gdef, whole = split(g)
    flat = whole.flat_state()
    unmatched = [path for path, leaf in flat.items() if not matches(leaf, filters)]
    if unmatched:
        # The error names the first leaf no filter matches (in the State's order).
        with pytest.raises(ValueError, match="No filter matched") as info:
            split(g, *filters)
        assert f"at path {unmatched[0]}" in str(info.value)
        return
    filtered_gdef, *parts = split(g, *filters)
    assert filtered_gdef == gdef and len(parts) == len(filters)
    # Each leaf lands in the State of the first filter it matches.
    for path, leaf in flat.items():
        first = next(k for k, f in enumerate(filters) if matches(leaf, (f,)))
        assert path in parts[first].flat_state(), (path, first)
    assert sum(len(part.flat_state()) for part in parts) == len(flat)
    for states in (parts, parts[::-1]):
        copy = merge(gdef, *states)
        assert_same_graph(g, copy)
        assert_states_equal(whole, state(copy))


@settings(max_examples=60, deadline=None)
@given(graph_specs(), st.booleans())
def test_update_writes_every_value_once(spec, filtered):
    g = build(spec)
    before = clone(g)
    objects = graph_objects(g)
    _, *parts = split(g, Param, ...) if filtered else split(g)
    new_parts = [jax.tree.map(lambda x: x + 1, part) for part in parts]
    update(g, *new_parts)
    # Written in place: the same Modules and Variables, shared as before ...
    assert [id(v) for v in graph_objects(g)] == [id(v) for v in objects]
    # ... and every path sees the new value, shared Variables included.
    assert_same_graph(before, g, expect=lambda x: x + 1)
    assert_states_equal(State.merge(*new_parts), state(g))


@settings(max_examples=25, deadline=None)
@given(graph_specs(max_nodes=4))
def test_split_merge_inside_jit(spec):
    g = build(spec)
    gdef, st_ = split(g)
    out = jax.jit(lambda gd, s: split(merge(gd, s))[1])(gdef, st_)
    assert_states_equal(st_, out)
    assert list(out.flat_state()) == list(st_.flat_state())  # in the same order, too
    assert_same_graph(g, merge(gdef, out))


@settings(max_examples=25, deadline=None)
@given(graph_specs(max_nodes=4))
def test_jit_keeps_the_graph_and_writes_back(spec):
    """Through `pytree_graph.jit`: the same structure and sharing inside, and every
    Variable and array written inside lands in the caller's objects."""
    import pytree_graph

    g = build(spec)
    before = clone(g)
    objects = graph_objects(g)
    seen = []

    @pytree_graph.jit
    def bump(inner):
        seen.append(inner)
        # Inside: a graph of the same structure (types, statics, sharing, cycles).
        assert graphdef(inner) == graphdef(before)
        assert find_duplicates(inner) == find_duplicates(before)
        # Every Variable and array + 1 (shared Variables appear once: bumped once).
        update(inner, jax.tree.map(lambda x: x + 1, state(inner)))
        return inner

    for round_ in (1, 2):  # the second call reuses the cached walk and the compiled code
        out = bump(g)
        assert out is g
        assert [id(v) for v in graph_objects(g)] == [id(v) for v in objects]
        assert_same_graph(before, g, expect=lambda x, r=round_: x + r)
    assert len(seen) == 1
