"""Corners of the graph functions and transforms: popping plain arrays, cycles through
lists and dicts, `vmap` on `__init__`, and the checks of `State` and `donate_argnums`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_filter import PathContains
from pytree_module import List, Module

# ------------------------------------------------------------------- pop of plain arrays


class Holder(Module):
    def __init__(self):
        self.w = pg.Param(jnp.ones(2))
        self.a = jnp.zeros(3)
        self.d = {"x": jnp.ones(1), "y": pg.Param(jnp.ones(1))}


class GraphHolder(Module, pytree=False):
    def __init__(self):
        self.w = pg.Param(jnp.ones(2))
        self.a = jnp.zeros(3)


@pytest.mark.parametrize("cls", [Holder, GraphHolder])
def test_pop_removes_a_plain_array_attribute(cls):
    node = cls()
    popped = pg.pop(node, PathContains("a"))
    assert list(popped) == ["a"]
    np.testing.assert_array_equal(popped["a"], np.zeros(3))
    assert not hasattr(node, "a")
    assert isinstance(node.w, pg.Param)  # the rest stays


def test_pop_removes_a_plain_array_from_a_dict_and_only_at_the_matched_path():
    node = Holder()
    node.b = node.a  # the same array at two paths: arrays have no identity in the graph
    popped = pg.pop(node, PathContains("x"))
    assert list(popped["d"]) == ["x"]
    assert list(node.d) == ["y"]
    popped = pg.pop(node, PathContains("a"))
    assert not hasattr(node, "a") and node.b.shape == (3,)


def test_pop_of_a_plain_array_in_a_list_is_refused_and_changes_nothing():
    node = Holder()
    node.items = [jnp.ones(1), jnp.ones(2)]
    with pytest.raises(ValueError, match=r"the array at \.items\[0\] is inside a list"):
        pg.pop(node, PathContains(0))
    assert len(node.items) == 2 and hasattr(node, "a")


# ------------------------------------------------------------------ cycles through lists


class Node(Module, pytree=False):
    def __init__(self, value):
        self.w = pg.Param(jnp.array(value))
        self.children = []


class TreeNode(Module):
    def __init__(self, value):
        self.w = pg.Param(jnp.array(value))
        self.children = []


def _check_cycle(a):
    graphdef, state = pg.split(a)
    assert graphdef == pg.graphdef(a)
    new = pg.merge(graphdef, state)
    assert new is not a and new.children[0].children[0] is new
    assert float(new.children[0].w.value) == 2.0
    copy = pg.clone(a)
    assert copy.children[0].children[0] is copy and copy.children[0].w is not a.children[0].w
    assert {path for path, _ in pg.iter_graph(a)} == {
        ("children", 0, "w"),
        ("children", 0),
        ("w",),
        (),
    }


@pytest.mark.parametrize("container", [list, List])
def test_a_cycle_through_lists_of_graph_objects_splits_merges_and_walks(container):
    a, b = Node(1.0), Node(2.0)
    a.children = container([b])
    b.children = container([a])
    _check_cycle(a)
    with pytest.raises(ValueError, match=r"recursive_map found a cycle: the Node at "):
        pg.recursive_map(lambda path, value: value, a)


def test_a_list_that_holds_its_graph_object_splits_from_the_list_too():
    a = Node(1.0)
    top = [a]
    a.children = top
    new = pg.merge(*pg.split(top))
    assert new[0].children[0] is new[0]


def _self_lists():
    plain = []
    plain.append(plain)
    yield "plain", plain, r"the list at \[0\]"
    outer, inner = [], []
    outer.append(inner)
    inner.append(outer)
    yield "list-list", outer, r"the list at \[0\]\[0\]"
    table = {}
    table["me"] = table
    yield "dict", table, r"the dict at \.me"
    held = List()
    held.append(held)
    yield "List", held, r"the List at \[0\]"
    node = Node(1.0)
    node.children.append(node.children)
    yield "in a graph object", node, r"the list at \.children\[0\]"
    module = TreeNode(1.0)
    module.children.append(module.children)
    yield "in a pytree Module", module, r"the list at \.children\[0\]"


@pytest.mark.parametrize(
    "function",
    [
        pg.split,
        pg.graphdef,
        pg.state,
        pg.clone,
        pg.find_duplicates,
        lambda node: list(pg.iter_graph(node)),
        lambda node: pg.jit(lambda n: None)(node),
    ],
    ids=["split", "graphdef", "state", "clone", "find_duplicates", "iter_graph", "jit"],
)
@pytest.mark.parametrize("case", list(_self_lists()), ids=lambda case: case[0])
def test_a_list_or_dict_that_holds_itself_gets_a_clear_error(function, case):
    _, node, where = case
    # (jit names the path in its arguments: `[0][0]` is its first positional one)
    kind, path = where.split(" at ")
    pattern = rf"cycle through {kind} at (\[0\]\[0\])?{path}: it holds itself"
    with pytest.raises(ValueError, match=pattern):
        function(node)


@pytest.mark.parametrize("case", list(_self_lists()), ids=lambda case: case[0])
def test_recursive_map_names_a_list_or_dict_that_holds_itself(case):
    _, node, where = case
    with pytest.raises(ValueError, match=rf"recursive_map found a cycle: {where} holds itself"):
        pg.recursive_map(lambda path, value: value, node)


def test_a_cycle_of_pytree_modules_through_lists_gets_the_module_cycle_error():
    a, b = TreeNode(1.0), TreeNode(2.0)
    a.children = [b]
    b.children = [a]
    with pytest.raises(ValueError, match=r"cycle through TreeNode at \.children\[0\]\.children"):
        pg.split(a)
    with pytest.raises(ValueError, match=r"cycle through TreeNode"):
        list(pg.iter_graph(a))


# ------------------------------------------------------------------------ vmap __init__


KEYS = jax.random.split(jax.random.key(0), 4)


class Stack(Module):
    @pg.vmap(in_axes=(pg.StateAxes({pg.Param: 0, pg.BatchStat: None}), 0))
    def __init__(self, key):
        self.w = pg.Param(jax.random.normal(key, (3, 2)))
        self.mean = pg.BatchStat(jnp.zeros(2))
        self.size = 3

    @pg.scan(in_axes=(pg.StateAxes({pg.Param: 0, pg.BatchStat: None}), pg.Carry), out_axes=pg.Carry)
    def __call__(self, x):
        return x @ self.w.value[:2]


def test_vmap_on_init_stacks_the_variables_at_their_axes():
    stack = Stack(KEYS)
    assert stack.w.value.shape == (4, 3, 2) and stack.mean.value.shape == (2,)
    for i, key in enumerate(KEYS):
        np.testing.assert_array_equal(stack.w.value[i], jax.random.normal(key, (3, 2)))
    assert stack.size == 3  # statics keep their status
    assert jax.tree.leaves(stack) == [stack.mean.value, stack.w.value]
    assert stack(jnp.ones(2)).shape == (2,)


def test_vmap_on_init_with_an_int_axis_and_under_a_function_of_the_keys():
    class Block(Module):
        @pg.vmap(in_axes=(1, 0))
        def __init__(self, key):
            self.w = pg.Param(jax.random.normal(key, (3,)))

    assert Block(KEYS).w.value.shape == (3, 4)
    built = pg.vmap(lambda key: Block(key[None]), in_axes=0)(KEYS)  # nested: a vmap inside
    assert built.w.value.shape == (4, 3, 1)


def test_walks_see_a_module_while_its_init_runs():
    seen = {}

    class Probe(Module):
        def __init__(self):
            self.w = pg.Param(jnp.ones(2))
            seen["paths"] = [path for path, _ in pg.iter_graph(self)]
            seen["state"] = pg.state(self)
            with pytest.raises(TypeError, match=r"Probe in this GraphDef was split while"):
                pg.merge(*pg.split(self))

    Probe()
    assert seen["paths"] == [("w",), ()] and list(seen["state"]) == ["w"]


def test_vmap_on_init_errors():
    class Late(Module):
        def __init__(self, key):
            self.early = 1
            self._build(key)

        @pg.vmap(in_axes=(0, 0))
        def _build(self, key):
            self.w = pg.Param(jax.random.normal(key, (2,)))

    with pytest.raises(TypeError, match=r"vmap on Late.__init__: the object has attributes"):
        Late(KEYS)

    class Wrong(Module):
        @pg.vmap(in_axes=(0, 0, 0))
        def __init__(self, key):
            self.w = pg.Param(jax.random.normal(key, (2,)))

    with pytest.raises(ValueError, match=r"in_axes has 3 entries but Wrong.__init__ was called"):
        Wrong(KEYS)


# ------------------------------------------------------------------ argument checks


def test_state_refuses_what_is_not_a_mapping():
    for bad in (5, "w", [("w", 1)]):
        with pytest.raises(TypeError, match=r"State expects a mapping .* got .* \(of type"):
            pg.State(bad)
    assert list(pg.State()) == [] and list(pg.State({"a": {"b": 1}})["a"]) == ["b"]


class Model(Module):
    def __init__(self):
        self.w = pg.Param(jnp.ones(2))


def step(model, x):
    return model.w.value * x


@pytest.mark.parametrize("make", ["jit", "jit_partial"])
def test_donate_argnums_is_checked_when_the_transform_is_made(make):
    def transform(donate):
        if make == "jit":
            return pg.jit(step, donate_argnums=donate)
        return pg.jit_partial(step, Model(), donate_argnums=donate)

    for bad in (5, (0, 7), -3):
        with pytest.raises(
            ValueError, match=rf"{make}: donate_argnums=.* but step takes 2 positional .* 0 to 1"
        ):
            transform(bad)
    for bad in ("x", 1.5, True, (0, "a")):  # None is jax.jit's default: not given
        with pytest.raises(TypeError, match=rf"{make}: donate_argnums must be an int or a tuple"):
            transform(bad)


def test_a_negative_donate_argnum_counts_from_the_end():
    def train(model, x):
        model.w.value = model.w.value + x
        return x * 2

    model = Model()
    w, x = model.w.value, jnp.ones(2)
    pg.jit_partial(train, model, donate_argnums=-1)(x)  # x, not the bound model
    assert x.is_deleted() and not w.is_deleted()


def test_donate_argnums_of_a_function_of_any_number_of_arguments():
    def total(*args):
        return sum(a.w.value.sum() for a in args)

    assert float(pg.jit(total, donate_argnums=(0,))(Model(), Model())) == 4.0
    with pytest.raises(ValueError, match=r"counted from the end, but the function takes any"):
        pg.jit(total, donate_argnums=-1)
