"""Property tests: partitions are disjoint, cover every leaf, and combine back exactly."""

import jax
import jax.numpy as jnp
from hypothesis import given, settings
from hypothesis import strategies as st

from pytree_filter import Not, OfType, PathContains, combine, is_array, partition

keys = st.sampled_from(["a", "b", "w", "bias", "x"])
leaves = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=3),
    st.booleans(),
    st.integers(0, 3).map(lambda n: jnp.arange(n, dtype=jnp.float32)),
)
trees = st.recursive(
    st.one_of(leaves, st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=3),
    ),
    max_leaves=10,
)
filters = st.one_of(
    st.booleans(),
    st.just(is_array),
    st.sampled_from([int, float, str, bool]),
    keys.map(PathContains),
    st.sampled_from([OfType(int), Not(OfType(str)), OfType(str) | PathContains("w")]),
    st.just(...),
)


def prefix_of(tree, draw):
    """A random prefix spec of `tree`: at each node, a filter or the node's own shape."""
    if draw(st.booleans()) or jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)):
        if tree is None:
            return None
        return draw(filters)
    if isinstance(tree, dict):
        return {k: prefix_of(v, draw) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(prefix_of(v, draw) for v in tree)
    return [prefix_of(v, draw) for v in tree]


def same_leaves(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(x is y for x, y in zip(la, lb, strict=True))


@settings(max_examples=150, deadline=None)
@given(trees, st.lists(filters, min_size=1, max_size=3))
def test_combine_partition_roundtrip(tree, specs):
    parts = partition(tree, *specs)
    assert len(parts) == len(specs) + 1
    rebuilt = combine(*parts)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(tree)
    assert same_leaves(rebuilt, tree)
    # Disjoint and covering: every leaf is in exactly one part.
    treedef = jax.tree.structure(tree)
    counts = [0] * treedef.num_leaves
    for part in parts:
        for i, value in enumerate(treedef.flatten_up_to(part)):
            counts[i] += value is not None
    assert counts == [1] * len(counts)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_prefix_specs_roundtrip(data):
    tree = data.draw(trees)
    if tree is None:
        return
    spec = prefix_of(tree, data.draw)
    if spec is None:
        return
    kept, rest = partition(tree, spec)
    assert same_leaves(combine(kept, rest), tree)
