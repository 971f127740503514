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
