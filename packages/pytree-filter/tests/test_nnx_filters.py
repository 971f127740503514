"""Flax NNX's filter forms: tuples and lists as `Any`, `f(path, value)` functions, and
`PathContains(key, exact=False)`."""

import functools

import jax.numpy as jnp
import pytest

from pytree_filter import (
    Any,
    Nothing,
    OfType,
    PathContains,
    WithTag,
    filter,
    is_array,
    partition,
    to_predicate,
)
from pytree_filter._filters import _takes_path


def test_a_tuple_or_list_is_any_of_its_filters():
    either = to_predicate((int, PathContains("b")))
    assert either == Any(int, PathContains("b"))
    assert either((), 1) and either(("b",), "x") and not either(("a",), "x")
    assert to_predicate([str, PathContains("n")]) == Any(str, PathContains("n"))
    assert to_predicate([[int], (str,)])((), "x")  # nested
    assert not to_predicate(())((), 1) and not to_predicate([])((), 1)  # Any(): nothing


def test_a_tuple_of_types_is_one_of_type():
    types = to_predicate((int, str))
    assert types == OfType((int, str))
    assert types.leaf_types() == (int, str)
    assert to_predicate([int, str]) == types
    assert types((), "x") and not types((), 1.0)


def test_in_filter_and_partition_a_tuple_is_still_a_prefix():
    # There a spec is a prefix pytree: a tuple of filters for a tuple's children.
    assert filter((1, "a"), (True, False)) == (1, None)
    with pytest.raises(ValueError, match="does not match"):
        filter({"a": 1}, (int, str))


def test_two_argument_functions_see_the_path():
    def in_layers(path, value):
        return path[:1] == ("layers",)

    tree = {"layers": [1, 2], "head": 3}
    assert filter(tree, in_layers) == {"layers": [1, 2], "head": None}
    predicate = to_predicate(in_layers)
    assert predicate.needs_path and predicate(("layers", 0), 1)
    assert repr(predicate) == "in_layers"
    assert to_predicate(lambda path, x: x > 1)(("a",), 2)
    first, rest = partition(tree, lambda path, x: path[-1] == 0)
    assert first == {"layers": [1, None], "head": None}
    assert rest == {"layers": [None, 2], "head": 3}


def test_one_argument_functions_see_the_value():
    predicate = to_predicate(is_array)
    assert not predicate.needs_path and predicate((), jnp.ones(1))
    assert to_predicate(lambda x: x == 2)(("a",), 2)
    # An optional second parameter does not make it a path predicate.
    assert to_predicate(lambda x, strict=False: x == 2)(("a",), 2)
    # Signatures of partials and builtins are read too; unreadable ones mean `f(value)`.
    assert to_predicate(functools.partial(lambda limit, x: x > limit, 1))((), 2)
    assert to_predicate(callable)((), len)


def test_the_signature_is_read_once_per_function():
    def deep(path, value):
        return len(path) > 1

    _takes_path.clear()
    to_predicate(deep)
    assert _takes_path[deep] is True
    _takes_path[deep] = False  # what was decided is what every later conversion uses
    assert not to_predicate(deep).needs_path
    _takes_path.clear()


def test_functions_of_other_arities_are_refused():
    with pytest.raises(TypeError, match=r"cannot be a filter: it has 3 required.*f\(path, value\)"):
        to_predicate(lambda a, b, c: True)
    with pytest.raises(TypeError, match="0 required positional"):
        to_predicate(lambda: True)
    with pytest.raises(TypeError, match="0 required positional"):
        to_predicate(lambda *args: True)
    with pytest.raises(TypeError, match=r"keyword-only parameters \['flag'\]"):
        to_predicate(lambda x, *, flag: True)
    with pytest.raises(TypeError, match="cannot be a filter"):
        to_predicate((int, lambda a, b, c: True))


def test_path_contains_substrings():
    loose = PathContains("bias", exact=False)
    assert loose(("layers", 0, "bias_scale"), 1) and loose(("bias",), 1)
    assert not loose(("kernel",), 1)
    assert not PathContains("bias")(("bias_scale",), 1)
    digits = PathContains(1, exact=False)
    assert digits(("layers", 10), 1) and digits(("layer1",), 1) and not digits(("layers", 2), 1)
    assert repr(loose) == "PathContains('bias', exact=False)"
    assert repr(PathContains("bias")) == "PathContains('bias')"
    assert loose != PathContains("bias") and loose == PathContains("bias", exact=False)
    assert hash(loose) == hash(PathContains("bias", exact=False))
    assert filter({"bias": 1, "bias_scale": 2, "w": 3}, loose) == {
        "bias": 1,
        "bias_scale": 2,
        "w": None,
    }
    with pytest.raises(TypeError, match="exact must be True or False"):
        PathContains("bias", exact="no")


def test_a_string_is_a_tag_and_none_is_nothing():
    class Stream:
        def __init__(self, tag):
            self.tag = tag

    dropout = to_predicate("dropout")
    assert dropout == WithTag("dropout") and hash(dropout) == hash(WithTag("dropout"))
    assert repr(dropout) == "WithTag('dropout')"
    assert dropout((), Stream("dropout")) and not dropout((), Stream("params"))
    assert not dropout(("dropout",), 1.0)  # a tag, never a path entry
    assert to_predicate(None) == Nothing() and not to_predicate(None)((), 1)
    either = to_predicate(("params", PathContains("head")))
    assert either((), Stream("params")) and either(("head",), 1) and not either((), 1)
    with pytest.raises(AttributeError, match="immutable"):
        dropout.tag = "params"
