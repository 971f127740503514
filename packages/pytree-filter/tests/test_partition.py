"""filter, partition and combine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_filter import (
    Any,
    OfType,
    PathContains,
    combine,
    filter,
    is_array,
    is_inexact_array,
    partition,
)


def mlp_like():
    return {
        "layers": [{"w": jnp.ones((2, 2)), "b": jnp.zeros(2), "act": "relu"} for _ in range(2)],
        "steps": 3,
        "scale": 0.5,
    }


def test_filter_with_a_predicate_and_inverse():
    tree = mlp_like()
    arrays = filter(tree, is_array)
    assert arrays["steps"] is None and arrays["layers"][0]["act"] is None
    assert arrays["layers"][1]["w"] is tree["layers"][1]["w"]
    others = filter(tree, is_array, inverse=True)
    assert others["steps"] == 3 and others["layers"][0]["w"] is None


def test_replace_value():
    assert filter([1, "a"], int, replace=0) == [1, 0]
    assert partition([1, "a"], int, replace=-1) == ([1, -1], [-1, "a"])


def test_bool_filters():
    assert filter([1, 2], True) == [1, 2]
    assert filter([1, 2], False) == [None, None]


def test_prefix_filter_spec_applies_to_subtrees():
    tree = {"a": [1, 2], "b": (3, "x")}
    spec = {"a": False, "b": (True, lambda x: isinstance(x, str))}
    assert filter(tree, spec) == {"a": [None, None], "b": (3, "x")}


def test_prefix_spec_filter_objects_see_full_paths():
    tree = {"enc": {"w": 1, "b": 2}, "dec": {"w": 3, "b": 4}}
    spec = {"enc": PathContains("w"), "dec": True}
    assert filter(tree, spec) == {"enc": {"w": 1, "b": None}, "dec": {"w": 3, "b": 4}}


def test_partition_several_specs_first_match_wins():
    tree = {"a": 1, "b": 2.0, "c": "s", "d": jnp.ones(1)}
    ints, floats, rest = partition(tree, int, Any(float, int))
    assert ints == {"a": 1, "b": None, "c": None, "d": None}
    assert floats == {"a": None, "b": 2.0, "c": None, "d": None}
    assert rest["c"] == "s" and rest["d"] is tree["d"] and rest["a"] is None


def test_combine_inverts_partition():
    tree = mlp_like()
    parts = partition(tree, is_inexact_array, OfType(str))
    assert len(parts) == 3
    rebuilt = combine(*parts)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(tree)
    assert all(a is b for a, b in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(tree), strict=True))


def test_of_type_selects_whole_nodes(box_type):
    tree = {"p": box_type(jnp.ones(2)), "s": box_type(1, "stat"), "x": jnp.zeros(1)}
    params, rest = partition(tree, OfType(box_type))
    assert params["p"] is tree["p"] and params["s"] is tree["s"] and params["x"] is None
    assert rest["p"] is None and rest["x"] is tree["x"]
    assert combine(params, rest) == tree
    assert combine(rest, params) == tree
    # Without OfType the Box is a node and its value is the leaf.
    arrays = filter(tree, is_array)
    assert isinstance(arrays["p"], box_type) and arrays["p"].value is tree["p"].value


def test_node_type_with_a_custom_predicate(box_type):
    tree = [box_type(1, "param"), box_type(2, "stat")]
    params = filter(tree, OfType(box_type) & (lambda b: b.tag == "param"))
    assert params == [tree[0], None]


def test_is_leaf():
    tree = {"a": (1, 2), "b": 3}
    out = filter(tree, lambda x: isinstance(x, tuple), is_leaf=lambda x: isinstance(x, tuple))
    assert out == {"a": (1, 2), "b": None}


def test_none_is_structure_and_survives():
    tree = {"a": None, "b": 1}
    assert combine(*partition(tree, int)) == tree


def test_prefix_mismatch_says_where():
    tree = {"a": [1, 2], "b": 3}
    with pytest.raises(ValueError, match=r"at \['a'\]: the spec has children \[.*\]"):
        filter(tree, {"a": [True, True, True], "b": True})
    with pytest.raises(ValueError, match="top level: the spec has a list, the pytree a dict"):
        filter(tree, [True])
    with pytest.raises(ValueError, match=r"at \['a'\]: the spec has a tuple, the pytree a list"):
        filter(tree, {"a": (True, True), "b": True})


def test_none_is_nothing_as_in_flax_nnx():
    assert filter([1, 2], None) == [None, None]
    assert filter({"a": 1, "b": 2}, {"a": None, "b": True}) == {"a": None, "b": 2}
    assert partition({"a": 1}, None) == ({"a": None}, {"a": 1})


def test_a_string_is_a_tag():
    class Tagged:
        def __init__(self, tag):
            self.tag = tag

    tree = [Tagged("params"), Tagged("dropout"), 3]
    kept = filter(tree, "dropout", is_leaf=lambda x: isinstance(x, Tagged))
    assert [getattr(x, "tag", x) for x in kept] == [None, "dropout", None]


def test_bad_specs():
    with pytest.raises(ValueError, match="the spec has a dict, the pytree a list"):
        filter([1], {"a": "x"})
    with pytest.raises(TypeError, match="Unsupported filter 3"):
        filter([1], 3)
    with pytest.raises(TypeError, match="at least one filter spec"):
        partition([1])
    with pytest.raises(TypeError, match="at least one pytree"):
        combine()


def test_combine_conflicting_structures():
    with pytest.raises(ValueError, match="disagree on structure"):
        combine({"a": [1, None]}, {"a": (None, 2, 3)})


def test_works_with_numpy_and_inside_jit():
    tree = {"a": np.ones(2), "b": "x"}

    @jax.jit
    def f(arrays):
        return jax.tree.map(lambda x: x * 2, arrays)

    arrays, static = partition(tree, is_array)
    out = combine(f(arrays), static)
    assert out["b"] == "x" and out["a"].tolist() == [2.0, 2.0]


def test_flatten_with_mask(box_type):
    from pytree_filter import flatten_with_mask

    tree = {"p": box_type(jnp.ones(1)), "n": 3, "w": jnp.zeros(1)}
    leaves, mask, treedef = flatten_with_mask(tree, OfType(box_type))
    assert leaves[mask.index(True)] is tree["p"]
    assert treedef.unflatten(leaves) == tree or treedef.unflatten(leaves)["p"] is tree["p"]
    leaves, mask, _ = flatten_with_mask(tree, {"p": False, "n": True, "w": is_array})
    assert [bool(m) for m in mask] == [True, False, True]


def test_partition_and_filter_take_filter_spec_by_keyword():
    tree = mlp_like()
    assert jax.tree.leaves(partition(tree, filter_spec=is_array)) == jax.tree.leaves(
        partition(tree, is_array)
    )
    arrays, rest = partition(tree, filter_spec=is_array, replace=0)
    assert arrays["steps"] == 0 and rest["layers"][0]["w"] == 0
    assert filter(tree, filter_spec=is_array)["steps"] is None


def test_partition_refuses_specs_by_position_and_keyword():
    with pytest.raises(TypeError, match=r"both by position and as `filter_spec=`"):
        partition([1], int, filter_spec=str)
