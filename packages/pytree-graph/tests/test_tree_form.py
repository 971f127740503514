"""`to_tree`/`from_tree` and `flatten`/`unflatten`: a graph as a plain pytree, and back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_graph import (
    BatchStat,
    FlatState,
    NodeState,
    Param,
    Variable,
    flatten,
    from_tree,
    split,
    to_tree,
    unflatten,
)
from pytree_module import Module


class Linear(Module):
    def __init__(self, n=2):
        self.w = Param(jnp.ones(n))
        self.count = Variable(jnp.array(0))


class Tied(Module):
    def __init__(self):
        self.encoder = Linear()
        self.decoder = self.encoder
        self.layers = [Linear(3), Linear(4)]
        self.mean = BatchStat(jnp.zeros(1))


class Node(Module, pytree=False):
    def __init__(self, value):
        self.w = Param(jnp.array(value))
        self.other = None


def _cycle():
    a, b = Node(1.0), Node(2.0)
    a.other, b.other = b, a
    return a


def test_flattening_the_tree_gives_each_shared_array_once():
    model = Tied()
    tree = to_tree(model)
    assert isinstance(tree, NodeState)
    # encoder/decoder once: w and count of three Linears, and the mean.
    assert len(jax.tree.leaves(tree)) == 7
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(tree))


def test_round_trip_keeps_sharing_and_gives_new_variables():
    model = Tied()
    again = from_tree(to_tree(model))
    assert type(again) is Tied and again.encoder is again.decoder
    assert again.encoder.w is not model.encoder.w
    np.testing.assert_array_equal(again.layers[1].w.value, model.layers[1].w.value)
    again.encoder.w.value = jnp.zeros(2)
    assert float(model.encoder.w.value.sum()) == 2.0


def test_round_trip_through_jit_with_a_change_inside():
    model = Tied()

    @jax.jit
    def step(tree):
        inner = from_tree(tree)
        inner.encoder.count.value += 1
        inner.decoder.w.value = inner.decoder.w.value * 3
        return to_tree(inner)

    out = from_tree(step(to_tree(model)))
    assert out.encoder is out.decoder
    assert int(out.decoder.count.value) == 1 and out.encoder.w.value.tolist() == [3.0, 3.0]
    assert int(model.encoder.count.value) == 0


def test_tree_map_and_a_second_tree_of_the_same_structure():
    model = Tied()
    grads = jax.tree.map(jnp.ones_like, to_tree(model))
    stepped = jax.tree.map(lambda p, g: p - 0.5 * g, to_tree(model), grads)
    new = from_tree(stepped)
    assert new.decoder.w.value.tolist() == [0.5, 0.5] and new.encoder is new.decoder


def test_outer_structure_is_kept_and_sharing_across_items_too():
    model = Tied()
    # Dict keys flatten in sorted order: "a" holds the shared Linear's Variables.
    tree = to_tree({"a": model, "b": model.encoder, "step": 3, "x": jnp.ones(2)})
    assert tree["step"] == 3 and isinstance(tree["x"], jax.Array)
    assert isinstance(tree["b"], NodeState)
    assert jax.tree.leaves(tree["b"]) == []
    back = from_tree(tree)
    assert back["b"] is back["a"].encoder and back["step"] == 3


def test_a_vmap_prefix_fits_the_outer_structure():
    first, second = to_tree((Linear(), Linear()))
    stacked = jax.tree.map(lambda x: jnp.stack([x, x + 1]), first)

    def apply(tree):
        first, second = from_tree(tree)
        return first.w.value + second.w.value

    out = jax.vmap(apply, in_axes=((0, None),))((stacked, second))
    assert out.shape == (2, 2) and out[1].tolist() == [3.0, 3.0]


def test_cycles_round_trip():
    a = _cycle()
    back = from_tree(jax.jit(lambda t: t)(to_tree(a)))
    assert back.other.other is back and float(back.other.w.value) == 2.0


def test_a_variable_on_its_own():
    w = Param(jnp.ones(2), tag="kernel")
    back = from_tree(to_tree(w))
    assert type(back) is Param and back.tag == "kernel" and back is not w


def test_a_tree_without_graph_nodes_is_unchanged():
    tree = {"x": jnp.ones(1), "n": 2}
    assert to_tree(tree) is tree and from_tree(tree) is tree


def test_from_tree_refuses_parts_of_a_tree_and_mixed_calls():
    model = Tied()
    tree = to_tree([model, model.encoder])
    with pytest.raises(ValueError, match=r"holds 1 of the 2 NodeStates.*missing: \[1\]"):
        from_tree(tree[0])
    with pytest.raises(ValueError, match="different `to_tree` calls"):
        from_tree([to_tree(Linear()), to_tree(Linear())])


def test_flatten_gives_paths_and_the_graphs_own_variables():
    model = Tied()
    graphdef, flat = flatten(model)
    assert graphdef == split(model)[0]
    assert isinstance(flat, FlatState) and len(flat) == 7
    paths = [path for path, _ in flat]
    # Attributes in name order; the shared Linear at its first path.
    assert paths[:2] == [("decoder", "count"), ("decoder", "w")]
    assert flat[1][1] is model.encoder.w
    assert unflatten(graphdef, flat).encoder.w is model.encoder.w


def test_flatten_without_paths_gives_values():
    model = Tied()
    graphdef, values = flatten(model, with_paths=False)
    assert all(isinstance(v, jax.Array) for v in values)
    new = unflatten(graphdef, [v + 1 for v in values])
    assert type(new.encoder.w) is Param and new.encoder is new.decoder
    assert new.layers[0].w.value.tolist() == [2.0, 2.0, 2.0]


def test_flat_state_goes_through_jit_with_static_paths():
    graphdef, flat = flatten(Tied())
    out = jax.jit(lambda f: jax.tree.map(lambda x: x * 2, f))(flat)
    assert isinstance(out, FlatState) and out.paths == flat.paths
    assert unflatten(graphdef, out).decoder.w.value.tolist() == [2.0, 2.0]
    nested = out.to_nested_state()
    assert nested.decoder.w.value.tolist() == [2.0, 2.0]
    assert unflatten(graphdef, nested).layers[1].w.value.shape == (4,)


def test_unflatten_copy_and_errors():
    model = Linear()
    graphdef, flat = flatten(model)
    assert unflatten(graphdef, flat, copy=True).w is not model.w
    with pytest.raises(ValueError, match="1 values for a graphdef of 2 leaves"):
        unflatten(graphdef, [jnp.ones(2)])
    with pytest.raises(TypeError, match="expects a GraphDef first"):
        unflatten(flat, graphdef)
    with pytest.raises(TypeError, match="got a int"):
        unflatten(graphdef, 3)
    with pytest.raises(ValueError, match="Missing paths"):
        unflatten(graphdef, FlatState([("w",)], [jnp.ones(2)]))
    with pytest.raises(ValueError, match="one leaf per path"):
        FlatState([("w",)], [])
