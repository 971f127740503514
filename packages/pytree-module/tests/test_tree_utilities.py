"""tree_equal(typematch=), tree_check, tree_flatten_one_level and tree_pformat's options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import (
    Module,
    field,
    tree_check,
    tree_equal,
    tree_flatten_one_level,
    tree_pformat,
    tree_pprint,
)


class Linear(Module):
    def __init__(self, n=2):
        self.weight = jnp.ones((n, n))
        self.bias = jnp.zeros(n)


class Stack(Module):
    def __init__(self, layers):
        self.layers = layers


class Settings(Module):
    name: str = field(static=True, default="s")


# tree_equal(typematch=...)


def test_typematch_tells_python_scalars_apart():
    assert tree_equal([1, 1.0, True], [1.0, True, 1])
    assert not tree_equal([1], [1.0], typematch=True)
    assert not tree_equal([1], [True], typematch=True)
    assert tree_equal([1, 2.0, "a", None], [1, 2.0, "a", None], typematch=True)


def test_typematch_tells_numpy_and_jax_arrays_apart():
    host, device = np.ones(2, np.float32), jnp.ones(2)
    assert tree_equal(host, device)
    assert not tree_equal(host, device, typematch=True)
    assert tree_equal(host, np.ones(2, np.float32), typematch=True)
    assert tree_equal(device, jnp.ones(2), typematch=True)
    assert not tree_equal(np.float32(1.0), np.array(1.0, np.float32), typematch=True)


def test_typematch_still_compares_values_structures_and_tolerances():
    assert not tree_equal(jnp.ones(2), jnp.zeros(2), typematch=True)
    assert not tree_equal([1], (1,), typematch=True)
    assert tree_equal(jnp.ones(2), jnp.ones(2) + 1e-4, typematch=True, atol=1e-3)
    assert tree_equal(Linear(), Linear(), typematch=True)
    assert tree_equal(Linear(), typematch=True)


def test_typematch_counts_tracers_as_jax_arrays():
    concrete = jnp.ones(2)
    answers = []

    def compare(x):
        answers.append(tree_equal(x, concrete, typematch=True))
        answers.append(tree_equal(x, np.ones(2, np.float32), typematch=True))
        return x.sum()

    jax.jit(compare)(jnp.ones(2))
    jax.grad(compare)(jnp.ones(2))
    jax.vmap(compare)(jnp.ones((3, 2)))
    # Against the concrete array: a traced boolean (the values decide), never a static False.
    assert all(answer is not False for answer in answers[0::2])
    # Against a NumPy array: False, as for the concrete array the tracer stands for.
    assert all(answer is False for answer in answers[1::2])
    assert jax.jit(lambda x: tree_equal(x, concrete, typematch=True))(jnp.ones(2))
    assert not jax.jit(lambda x: tree_equal(x, concrete, typematch=True))(jnp.zeros(2))


@pytest.mark.parametrize("bad", [1, 0, "yes", None, np.bool_(True)])
def test_typematch_must_be_a_bool(bad):
    with pytest.raises(TypeError, match=r"tree_equal\(typematch=\.\.\.\) must be True or False"):
        tree_equal([1], [1], typematch=bad)
    with pytest.raises(TypeError, match="typematch"):
        tree_equal([1], typematch=bad)


def test_trees_stay_positional_and_options_keyword_only():
    assert tree_equal([1], [1], [1], typematch=True)
    # A bool after the trees is one more tree, not `typematch`: `True == 1`.
    assert tree_equal(1, 1, True) is True
    assert tree_equal(1, 1, True, typematch=True) is False


# tree_flatten_one_level


def test_one_level_of_containers():
    assert tree_flatten_one_level({"a": 3, "b": (1, 2)}) == (
        [3, (1, 2)],
        jax.tree.structure({"a": 0, "b": 0}),
    )
    assert tree_flatten_one_level([[1], [2, 3]]) == ([[1], [2, 3]], jax.tree.structure([0, 0]))
    assert tree_flatten_one_level(((),)) == ([()], jax.tree.structure((0,)))


def test_one_level_of_none_and_leaves():
    assert tree_flatten_one_level(None) == ([], jax.tree.structure(None))
    assert tree_flatten_one_level([None]) == ([None], jax.tree.structure([0]))
    for leaf in (4, "text", jnp.ones(2)):
        children, treedef = tree_flatten_one_level(leaf)
        assert children == [leaf] or children[0] is leaf
        assert treedef == jax.tree.structure(0)


def test_one_level_of_a_module_rebuilds_it():
    model = Stack([Linear(), Linear(3)])
    children, treedef = tree_flatten_one_level(model)
    assert children == [model.layers]
    rebuilt = jax.tree.unflatten(treedef, children)
    assert type(rebuilt) is Stack and rebuilt.layers is model.layers
    assert tree_flatten_one_level(Settings())[0] == []


def test_one_level_of_a_custom_node():
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

    jax.tree_util.register_pytree_node(
        Pair, lambda p: ((p.a, p.b), None), lambda _, children: Pair(*children)
    )
    inner = [1, 2]
    children, treedef = tree_flatten_one_level(Pair(inner, 3))
    assert children[0] is inner and children[1] == 3
    assert treedef.num_leaves == 2


def test_a_node_holding_itself_is_an_error_naming_where():
    loop = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match=r"the list passed holds itself at \[1\]"):
        tree_flatten_one_level(loop)
    # Holding itself deeper down is beyond one level: that is tree_check's to find.
    outer, inner = [], []
    outer.append(inner)
    inner.append(outer)
    assert tree_flatten_one_level(outer)[0] == [inner]


# tree_check


def test_a_tree_of_distinct_nodes_passes():
    assert tree_check(Stack([Linear(), Linear()])) is None
    assert tree_check([[1], [1]]) is None
    assert tree_check({"a": jnp.ones(2), "b": {"c": (1, 2)}}) is None


def test_repeated_leaves_and_childless_nodes_pass():
    array, empty, settings = jnp.ones(2), [], Settings()
    tree_check([array, array, 1, 1, "s", "s"])
    tree_check([empty, empty, None, None, (), ()])
    tree_check([settings, settings])


def test_a_shared_module_names_both_paths():
    shared = Linear()
    with pytest.raises(
        ValueError,
        match=r"the same Linear object is at \.layers\[0\] and at \.layers\[2\]\..*jax\.jit",
    ):
        tree_check(Stack([shared, Linear(), shared]))


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (
            lambda shared: {"a": shared, "b": shared},
            r"same list object is at \['a'\] and at \['b'\]",
        ),
        (lambda shared: (shared, [shared]), r"same list object is at \[0\] and at \[1\]\[0\]"),
    ],
)
def test_a_shared_container_names_both_paths(tree, message):
    with pytest.raises(ValueError, match=message):
        tree_check(tree([1.0]))


def test_a_container_of_only_none_still_counts():
    # It has a child (None), so JAX would rebuild two lists from it.
    shared = [None]
    with pytest.raises(ValueError, match="same list object"):
        tree_check([shared, shared])


def test_a_cycle_names_where_the_node_is_and_where_it_recurs():
    loop = []
    loop.append(loop)
    with pytest.raises(
        ValueError, match=r"the list at the top level contains itself again at \[0\]"
    ):
        tree_check(loop)
    outer = [1]
    outer.append({"back": outer})
    with pytest.raises(
        ValueError, match=r"the list at \['a'\] contains itself again at \['a'\]\[1\]\['back'\]"
    ):
        tree_check({"a": outer})


def test_a_cycle_through_a_module():
    model = Stack([Linear()])
    model.layers.append(model)
    with pytest.raises(ValueError, match=r"Stack at the top level contains itself again at "):
        tree_check(model)


def test_a_deep_tree_does_not_reach_the_recursion_limit():
    tree = []
    for _ in range(5000):
        tree = [tree, 1]
    tree_check(tree)


def test_temporary_children_built_by_flatten_are_not_repeats():
    # Each flatten builds new tuples; once dropped, their ids could come back for the next.
    class Fresh:
        def __init__(self, items):
            self.items = items

    jax.tree_util.register_pytree_node(
        Fresh, lambda f: ((tuple(f.items), tuple(f.items)), None), lambda _, c: Fresh(list(c[0]))
    )
    tree_check([Fresh([1, 2]) for _ in range(50)])


# tree_pformat / tree_pprint options


def test_struct_as_array():
    struct = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    assert tree_pformat(struct) == "f32[2,3]"
    assert tree_pformat({"s": struct}, struct_as_array=True) == "{'s': f32[2,3]}"
    assert (
        tree_pformat({"s": struct}, struct_as_array=False)
        == "{'s': ShapeDtypeStruct(shape=(2, 3), dtype=float32)}"
    )
    # Without short arrays nothing is shortened, as arrays are not.
    assert tree_pformat(struct, short_arrays=False) == (
        "ShapeDtypeStruct(shape=(2, 3), dtype=float32)"
    )
    # Arrays are not affected.
    assert tree_pformat(jnp.ones(2), struct_as_array=False) == "f32[2]"


def test_truncate_leaf_shortens_any_object_it_accepts():
    model = Stack([Linear(), Linear()])
    assert (
        tree_pformat(model, truncate_leaf=lambda x: isinstance(x, Linear))
        == "Stack(layers=[Linear(...), Linear(...)])"
    )
    assert tree_pformat(model, truncate_leaf=lambda x: isinstance(x, list)) == (
        "Stack(layers=list(...))"
    )
    assert tree_pformat(model, truncate_leaf=lambda x: x is model) == "Stack(...)"
    assert tree_pformat({"a": 1}, truncate_leaf=lambda x: isinstance(x, int)) == "{'a': int(...)}"
    # It comes before arrays are shortened, and sees every object.
    assert tree_pformat([jnp.ones(2)], truncate_leaf=lambda x: isinstance(x, jax.Array)) == (
        f"[{type(jnp.ones(2)).__name__}(...)]"
    )


def test_existing_output_is_unchanged_by_default():
    tree = {"a": jnp.zeros((3, 4)), "f": jax.nn.relu, "k": jax.random.key(0)}
    assert tree_pformat(tree) == "{'a': f32[3,4], 'f': <function relu>, 'k': key<fry>[]}"
    assert repr(Linear()) == "Linear(bias=f32[2], weight=f32[2,2])"


def test_pprint_takes_the_same_options(capsys):
    struct = jax.ShapeDtypeStruct((2,), jnp.int32)
    layer = Linear()
    tree_pprint([struct, layer], struct_as_array=False, truncate_leaf=lambda x: x is layer)
    assert capsys.readouterr().out == "[ShapeDtypeStruct(shape=(2,), dtype=int32), Linear(...)]\n"


@pytest.mark.parametrize("function", [tree_pformat, tree_pprint])
def test_wrong_option_types_name_the_option(function):
    name = function.__name__
    with pytest.raises(TypeError, match=rf"{name}\(truncate_leaf=\.\.\.\) must be a function"):
        function([1], truncate_leaf=True)
    with pytest.raises(TypeError, match=rf"{name}\(struct_as_array=\.\.\.\) must be True or False"):
        function([1], struct_as_array="yes")
