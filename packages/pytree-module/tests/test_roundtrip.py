"""Property tests: any mix of attributes flattens, rebuilds and compares consistently."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pytree_module import Module, tree_equal

names = st.text(alphabet="abcdefghij_", min_size=1, max_size=6).filter(
    lambda n: not n.startswith("_pm") and not (n.startswith("__") and n.endswith("__"))
)
arrays = st.builds(
    lambda shape, fill: jnp.full(shape, fill, dtype=jnp.float32),
    st.lists(st.integers(1, 3), max_size=2).map(tuple),
    st.floats(-10, 10, allow_nan=False, width=32),
)
statics = st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none())
values = st.recursive(
    st.one_of(arrays, statics),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(names, inner, max_size=3)),
    max_leaves=6,
)


class Bag(Module):
    def __init__(self, attributes):
        for name, value in attributes.items():
            setattr(self, name, value)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, values, max_size=5))
def test_flatten_unflatten_roundtrip(attributes):
    bag = Bag(attributes)
    leaves, treedef = jax.tree.flatten(bag)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert type(rebuilt) is Bag
    assert tree_equal(rebuilt, bag)
    assert jax.tree.structure(rebuilt) == treedef
    assert sorted(vars(rebuilt)) == sorted(vars(bag))
    # A second module built from equal values has an equal structure.
    assert jax.tree.structure(Bag(attributes)) == treedef


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(names, values, min_size=1, max_size=5), st.data())
def test_reassignment_keeps_leaves_in_step(attributes, draw):
    bag = Bag(attributes)
    name = draw.draw(st.sampled_from(sorted(attributes)))
    new_value = draw.draw(values)
    try:
        setattr(bag, name, new_value)
    except ValueError:
        return  # refused (e.g. arrays into a static attribute): covered elsewhere
    leaves = jax.tree.leaves(bag)
    expected = jax.tree.leaves([getattr(bag, k) for k in bag._pm_flat[1].layout.data_keys])
    assert len(leaves) == len(expected)
    assert all(a is b for a, b in zip(leaves, expected, strict=True))


def test_numpy_leaves_survive_a_transform():
    bag = Bag({"a": np.arange(3.0), "n": 3})
    out = jax.jit(lambda b: b)(bag)
    assert isinstance(out, Bag) and out.n == 3 and out.a.tolist() == [0.0, 1.0, 2.0]
