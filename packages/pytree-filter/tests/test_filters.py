"""Filter objects: matching, composition, hashing, conversion and errors."""

import jax.numpy as jnp
import pytest

from pytree_filter import (
    All,
    Any,
    Everything,
    Filter,
    Not,
    Nothing,
    OfType,
    PathContains,
    WithTag,
    filter,
    is_array,
    is_inexact_array,
    to_predicate,
)


def test_basic_filters():
    assert Everything()(("a",), 1) and not Nothing()(("a",), 1)
    assert OfType(int)((), 1) and not OfType(int)((), "x")
    assert OfType((int, str))((), "x")
    assert PathContains("bias")(("layers", 0, "bias"), 1)
    assert not PathContains("bias")(("bias_scale",), 1)
    assert PathContains(0)(("layers", 0), 1)


def test_composition_and_operators():
    f = OfType(float) | PathContains("n")
    assert f == Any(OfType(float), PathContains("n"))
    assert f((), 1.0) and f(("n",), 1) and not f(("m",), 1)
    g = OfType(float) & ~PathContains("skip")
    assert g == All(OfType(float), Not(PathContains("skip")))
    assert g(("w",), 1.0) and not g(("skip",), 1.0)


def test_filters_are_hashable_value_objects_and_immutable():
    assert {OfType(int), OfType(int), PathContains("a"), PathContains("a")} == {
        OfType(int),
        PathContains("a"),
    }
    assert Any(int, str) == Any(OfType(int), OfType(str))
    assert Any(int) != All(int)
    assert repr(Any(int, PathContains("b"))) == "Any(OfType(<class 'int'>), PathContains('b'))"
    with pytest.raises(AttributeError, match="immutable"):
        OfType(int).type = str


def test_to_predicate_accepts_every_form():
    assert to_predicate(True)((), object()) and not to_predicate(False)((), 1)
    assert to_predicate(...)((), 1)
    assert to_predicate(int)((), 3)
    assert to_predicate(is_array)((), jnp.ones(1))
    f = PathContains("x")
    assert to_predicate(f) is f


def test_leaf_types_collect_through_composites():
    assert Any(int, Not(str), PathContains("a")).leaf_types() == (int, str)
    assert Everything().leaf_types() == ()


def test_needs_path():
    assert not OfType(int).needs_path and PathContains("a").needs_path
    assert Any(int, PathContains("a")).needs_path and not Any(int, float).needs_path
    assert Not(PathContains("a")).needs_path


def test_unsupported_filters_say_what_is_accepted():
    with pytest.raises(TypeError, match=r"Unsupported filter 3 of type int.*prefix pytree"):
        to_predicate(3)
    with pytest.raises(TypeError, match=r"WithTag expects the tag as a str"):
        WithTag(0)
    with pytest.raises(TypeError, match="class or a tuple of classes"):
        OfType("int")
    with pytest.raises(TypeError, match="hashable"):
        PathContains([1])
    with pytest.raises(TypeError, match="Unsupported filter"):
        Any(int, 2)


def test_custom_filter_subclass():
    class Short(Filter):
        needs_path = False

        def __call__(self, path, value):
            return isinstance(value, str) and len(value) < 3

    assert filter(["ab", "abcd", 1], Short()) == ["ab", None, None]
    assert filter(["ab", "abcd"], ~Short()) == [None, "abcd"]


def test_plain_predicates_and_types_compose_on_either_side():
    tree = {"a": [jnp.ones(1), jnp.ones(1)], "n": [1, 2], "s": "x"}
    no_first = is_inexact_array & ~PathContains(0)
    assert no_first == All(is_inexact_array, Not(PathContains(0)))
    assert filter(tree, no_first) == {"a": [None, tree["a"][1]], "n": [None, None], "s": None}
    first_or_array = PathContains(0) | is_array
    assert first_or_array == Any(PathContains(0), is_array)
    assert filter(tree, first_or_array) == {"a": tree["a"], "n": [1, None], "s": None}
    reversed_or = is_array | PathContains(0)
    assert filter(tree, reversed_or) == filter(tree, first_or_array)
    assert filter(tree, int | OfType(str)) == {"a": [None, None], "n": [1, 2], "s": "x"}
    assert filter(tree, int & ~OfType(bool)) == filter(tree, int)
    not_str_but_callable = ~OfType(str) & callable
    assert filter([len, "f", 1], not_str_but_callable) == [len, None, None]


def test_composed_filters_stay_hashable_and_equal_by_value():
    assert hash(is_inexact_array & ~PathContains(0)) == hash(is_inexact_array & ~PathContains(0))
    assert {PathContains(0) | is_array, PathContains(0) | is_array} == {PathContains(0) | is_array}
    assert (is_array | PathContains(0)).leaf_types() == ()
    assert (str | Not(PathContains(0))).leaf_types() == (str,)


def test_composing_with_a_non_filter_on_the_left_names_it():
    assert ("w" & PathContains(0)) == All(WithTag("w"), PathContains(0))  # a str is a tag
    with pytest.raises(TypeError, match="Unsupported filter 3"):
        3 | PathContains(0)
