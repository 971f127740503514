"""`iter_modules`, `iter_children` and `recursive_map`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_graph import (
    Param,
    Variable,
    find_duplicates,
    iter_children,
    iter_modules,
    recursive_map,
)
from pytree_module import Module


class Linear(Module):
    def __init__(self, n=2):
        self.w = Param(jnp.ones(n))
        self.n = n


class Block(Module):
    def __init__(self):
        self.first = Linear()
        self.second = self.first
        self.layers = [Linear(3), Linear(4)]
        self.scale = Param(jnp.ones(()))


class Node(Module, pytree=False):
    def __init__(self, child=None):
        self.child = child
        self.p = Param(jnp.zeros(1))


def _names(pairs):
    return [(path, type(m).__name__) for path, m in pairs]


def test_iter_modules_yields_every_module_once_children_first():
    block = Block()
    found = list(iter_modules(block))
    assert _names(found) == [
        (("first",), "Linear"),
        (("layers", 0), "Linear"),
        (("layers", 1), "Linear"),
        ((), "Block"),
    ]
    assert found[0][1] is block.first and found[-1][1] is block


def test_iter_modules_walks_pytree_false_objects_and_containers():
    inner = Node()
    outer = Node(inner)
    assert _names(iter_modules([outer, Linear()])) == [
        ((0, "child"), "Node"),
        ((0,), "Node"),
        ((1,), "Linear"),
    ]
    assert next(iter(iter_modules(outer)))[1] is inner


def test_iter_modules_refuses_a_single_value_when_called():
    with pytest.raises(TypeError, match="iter_modules expects an object graph"):
        iter_modules(jnp.ones(2))


def test_iter_children_yields_direct_module_attributes_only():
    block = Block()
    children = list(iter_children(block))
    # Shared under two names: yielded under each. The list and the Param are not Modules.
    assert [key for key, _ in children] == ["first", "second"]
    assert children[0][1] is children[1][1] is block.first
    assert [key for key, _ in iter_children(block.layers)] == [0, 1]
    assert [key for key, _ in iter_children({"a": Linear(), "b": 1})] == ["a"]
    assert [key for key, _ in iter_children(Node(Node()))] == ["child"]
    assert list(iter_children(Linear())) == []


def test_iter_children_refuses_what_has_no_attributes_when_called():
    with pytest.raises(TypeError, match=r"iter_children expects a Module.*got 1\.0, of type float"):
        iter_children(1.0)


def test_recursive_map_calls_fn_bottom_up_on_every_node_once():
    seen = []

    def record(path, value):
        seen.append((path, type(value).__name__))
        return value

    recursive_map(record, Block())
    # `second` is `first`: mapped once. `n` is a static field of a pytree Module, so part
    # of the structure, not a node.
    assert seen == [
        (("first", "w"), "Param"),
        (("first",), "Linear"),
        (("layers", 0, "w"), "Param"),
        (("layers", 0), "Linear"),
        (("layers", 1, "w"), "Param"),
        (("layers", 1), "Linear"),
        (("layers",), "list"),
        (("scale",), "Param"),
        ((), "Block"),
    ]


def test_recursive_map_builds_a_new_graph_keeping_sharing():
    block = Block()
    new = recursive_map(lambda path, value: value, block)
    assert new is not block and new.first is not block.first
    assert new.first is new.second
    assert find_duplicates(new) == [[("first",), ("second",)]]
    # Variables are passed as they are: the new graph holds the same ones.
    assert new.first.w is block.first.w


def test_recursive_map_replaces_variables_and_leaves_the_input_alone():
    block = Block()

    def double(path, value):
        return value.replace(value.value * 2) if isinstance(value, Variable) else value

    new = recursive_map(double, block)
    np.testing.assert_array_equal(new.layers[1].w.value, np.full(4, 2.0))
    np.testing.assert_array_equal(block.layers[1].w.value, np.ones(4))
    assert new.first.w is new.second.w and new.first.w is not block.first.w


def test_fn_sees_the_new_children_and_its_result_takes_the_nodes_place():
    class Identity(Module):
        pass

    def swap(path, value):
        if isinstance(value, Linear) and value.n == 3:
            return Identity()
        if type(value) is list:
            assert isinstance(value[0], Identity)
        return value

    new = recursive_map(swap, Block())
    assert [type(m).__name__ for m in new.layers] == ["Identity", "Linear"]
    assert recursive_map(lambda path, value: path, Block()) == ()


def test_recursive_map_rebuilds_pytree_false_objects_and_arrays():
    node = Node(Node())
    new = recursive_map(
        lambda path, value: value + 1 if isinstance(value, jax.Array) else value,
        {"node": node, "x": jnp.zeros(2)},
    )
    assert type(new["node"]) is Node and new["node"] is not node
    assert type(new["node"].child) is Node and new["node"].child is not node.child
    assert new["node"].child.child is None
    np.testing.assert_array_equal(new["x"], [1.0, 1.0])


def test_recursive_map_refuses_a_cycle():
    node = Node()
    node.child = node
    with pytest.raises(ValueError, match=r"recursive_map found a cycle: the Node at .*child"):
        recursive_map(lambda path, value: value, node)


def test_recursive_map_refuses_a_fn_that_is_not_callable():
    with pytest.raises(TypeError, match=r"expects a function `fn\(path, value\)`.*Block"):
        recursive_map(Block(), lambda path, value: value)
