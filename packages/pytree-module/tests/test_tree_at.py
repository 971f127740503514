"""tree_at: out-of-place updates."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, field, tree_at


class Layer(Module, frozen=True):
    weight: jax.Array
    bias: jax.Array | None
    name: str = field(static=True, default="layer")


def test_replace_a_leaf_of_a_frozen_module():
    layer = Layer(jnp.ones(2), jnp.zeros(2))
    new = tree_at(lambda m: m.weight, layer, jnp.full(2, 5.0))
    assert new.weight.tolist() == [5.0, 5.0]
    assert layer.weight.tolist() == [1.0, 1.0]
    assert new.name == "layer" and new is not layer


def test_replace_several_nodes_and_replace_fn():
    tree = {"a": [1, 2, 3], "b": (4, 5)}
    out = tree_at(lambda t: (t["a"][0], t["b"]), tree, (10, "x"))
    assert out == {"a": [10, 2, 3], "b": "x"}
    out = tree_at(lambda t: [t["a"][1], t["a"][2]], tree, replace_fn=lambda v: v * 100)
    assert out["a"] == [1, 200, 300]


def test_replace_a_subtree_and_a_submodule():
    outer = {"layer": Layer(jnp.ones(1), None), "other": 1}
    new = tree_at(lambda t: t["layer"], outer, "replaced")
    assert new == {"layer": "replaced", "other": 1}


def test_replace_none():
    layer = Layer(jnp.ones(1), None)
    # A single None is unambiguous...
    new = tree_at(lambda m: m.bias, layer, jnp.zeros(1))
    assert new.bias.tolist() == [0.0]
    # ...but None is a shared object: with two, `is_leaf` tells them apart.
    pair = [layer, Layer(jnp.ones(1), None)]
    with pytest.raises(ValueError, match="is_leaf"):
        tree_at(lambda t: t[0].bias, pair, jnp.zeros(1))
    new = tree_at(lambda t: t[0].bias, pair, jnp.zeros(1), is_leaf=lambda x: x is None)
    assert new[0].bias.tolist() == [0.0] and new[1].bias is None


def test_static_attributes_are_not_nodes():
    layer = Layer(jnp.ones(1), None)
    with pytest.raises(ValueError, match="not a node of the pytree"):
        tree_at(lambda m: m.name, layer, "other")


def test_argument_errors():
    with pytest.raises(ValueError, match="exactly one"):
        tree_at(lambda t: t[0], [1])
    with pytest.raises(ValueError, match="exactly one"):
        tree_at(lambda t: t[0], [1], 2, replace_fn=lambda x: x)
    with pytest.raises(ValueError, match="tuple or list of 2"):
        tree_at(lambda t: (t[0], t[1]), [1, 2], 3)
    with pytest.raises(TypeError, match="`where` must be a function, got 0"):
        tree_at(0, [1], 2)
    with pytest.raises(TypeError, match="`replace_fn` must be a function, got 2"):
        tree_at(lambda t: t[0], [1], replace_fn=2)
    with pytest.raises(ValueError, match="more than once"):
        tree_at(lambda t: (t[0], t[0]), [1, 2], (3, 4))


def test_works_under_jit():
    @jax.jit
    def f(layer):
        return tree_at(lambda m: m.weight, layer, layer.weight * 2)

    assert f(Layer(jnp.ones(2), None)).weight.tolist() == [2.0, 2.0]


class Chain(Module, frozen=True):
    layers: list
    pair: tuple


def test_a_list_or_tuple_node_is_replaced_whole():
    chain = Chain([jnp.ones(1), jnp.ones(2)], (1, 2))
    longer = tree_at(lambda m: m.layers, chain, [jnp.zeros(1), jnp.zeros(2), jnp.zeros(3)])
    assert [x.shape for x in longer.layers] == [(1,), (2,), (3,)]
    shorter = tree_at(lambda m: m.layers, chain, [jnp.zeros(4)])
    assert [x.shape for x in shorter.layers] == [(4,)]
    swapped = tree_at(lambda m: m.pair, chain, ("a", "b"))
    assert swapped.pair == ("a", "b") and chain.pair == (1, 2)
    doubled = tree_at(lambda m: m.pair, chain, replace_fn=lambda pair: pair * 2)
    assert doubled.pair == (1, 2, 1, 2)
    assert tree_at(lambda t: t, [1, 2], [3]) == [3]


def test_a_new_tuple_of_nodes_still_means_several_nodes():
    chain = Chain([jnp.ones(1), jnp.ones(2)], (1, 2))
    both = tree_at(lambda m: (m.layers, m.pair), chain, ([], ()))
    assert both.layers == [] and both.pair == ()
    firsts = tree_at(lambda m: [m.layers[0], m.pair[0]], chain, ("w", "p"))
    assert firsts.layers[0] == "w" and firsts.pair == ("p", 2)
    with pytest.raises(ValueError, match="returned 2 nodes"):
        tree_at(lambda m: (m.layers, m.pair), chain, [1, 2, 3])


class Pair(Module):
    def __init__(self, left, right):
        self.left = left
        self.right = right


class Box(Module):
    def __init__(self, w):
        self.w = w
        self.items = [w * 2, w * 3]


def test_sharing_survives_and_a_replacement_changes_the_place_where_picked():
    # A tied model: `shared` is held at two places; `other` holds its own Box.
    shared = Box(jnp.ones(2))
    model = {"pair": Pair(shared, shared), "other": Box(jnp.zeros(1))}
    # An unrelated replacement keeps the tie (JAX's own tree_map would untie it).
    out = tree_at(lambda t: t["other"].w, model, jnp.full(1, 7.0))
    assert out["pair"].left is out["pair"].right
    assert out["pair"].left is not shared and out["other"].w.tolist() == [7.0]
    # Inside the shared object: one object changed, seen through both paths.
    out = tree_at(lambda t: t["pair"].right.w, model, jnp.full(2, 5.0))
    assert out["pair"].left is out["pair"].right
    assert out["pair"].left.w.tolist() == [5.0, 5.0]
    # Also through a list inside it, whichever path `where` takes.
    out = tree_at(lambda t: t["pair"].right.items[1], model, "x")
    assert out["pair"].left is out["pair"].right and out["pair"].left.items[1] == "x"
    # The shared object itself, at one place: that place only, like `pair.right = new`.
    out = tree_at(lambda t: t["pair"].right, model, "new")
    assert out["pair"].right == "new" and isinstance(out["pair"].left, Box)
    # The input is unchanged.
    assert shared.w.tolist() == [1.0, 1.0] and shared.items[1].tolist() == [3.0, 3.0]


def test_replace_fn_gets_a_copy_sharing_with_the_rest():
    shared = Box(jnp.ones(1))
    model = Pair(Pair(shared, 1.0), shared)
    out = tree_at(lambda m: m.left, model, replace_fn=lambda inner: inner)
    assert out.left.left is out.right and out.right is not shared


def test_one_place_reached_by_two_paths_is_refused():
    shared = Box(jnp.ones(1))
    model = Pair(shared, shared)
    with pytest.raises(ValueError, match="one position of the pytree"):
        tree_at(lambda m: (m.left.w, m.right.w), model, (jnp.zeros(1), jnp.ones(1)))


def test_empty_tuples_are_told_apart_by_position():
    # As in Equinox: `()` is one object in Python, but `where` picked a position.
    assert tree_at(lambda t: t[0], [(), ()], "hello") == ["hello", ()]
    assert tree_at(lambda t: t[0][0], [((),), ()], "x") == [("x",), ()]
    assert tree_at(lambda t: (t[0], t[1]), [(), ()], ("a", "b")) == ["a", "b"]
    assert tree_at(lambda t: t[1], [(), ()], replace_fn=lambda x: (x, x)) == [(), ((), ())]


def test_where_that_looks_into_a_leaf_says_what_to_do():
    with pytest.raises(
        TypeError,
        match=r"indexes `\[0\]` into the leaf f32\[3\].*pytree itself is a single leaf.*x: x",
    ):
        tree_at(lambda x: x[0], jnp.ones(3), 5.0)
    with pytest.raises(AttributeError, match=r"reads `.weight` of the leaf.*replace_fn="):
        tree_at(lambda x: x.weight, jnp.ones(3), 5.0)
    with pytest.raises(TypeError, match=r"computes \(`__add__`\) with the leaf 1"):
        tree_at(lambda t: t["a"] + 1, {"a": 1}, 5)
    with pytest.raises(TypeError, match=r"iterates over the leaf"):
        tree_at(lambda t: tuple(t["a"]), {"a": jnp.ones(2)}, 5)
    with pytest.raises(ValueError, match="returned 3, which is not a node of the pytree"):
        tree_at(lambda t: 3, {"a": 1}, 5)
    # The whole leaf is a node: it can be replaced.
    assert tree_at(lambda x: x, jnp.ones(3), 5.0) == 5.0
    assert tree_at(lambda x: x, jnp.ones(2), replace_fn=lambda x: x.at[0].set(0.0)).tolist() == [
        0.0,
        1.0,
    ]
