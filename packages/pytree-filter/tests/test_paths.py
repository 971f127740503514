"""Key paths normalised to plain keys."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from pytree_filter import ARRAY_TYPES, SHAPED_TYPES, is_array, path_keys, path_text


def test_every_key_kind(box_type):
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Point:
        x: float
        y: float

    tree = {"a": [Point(1.0, 2.0), (3,)], "b": box_type(4)}
    paths = [path_keys(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    assert paths == [("a", 0, "x"), ("a", 0, "y"), ("a", 1, 0), ("b", "value")]


def test_flattened_index_keys_and_unknown_entries():
    @jax.tree_util.register_pytree_node_class
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def tree_flatten(self):
            return (self.a, self.b), None

        @classmethod
        def tree_unflatten(cls, _, children):
            return cls(*children)

    paths = [path_keys(p) for p, _ in jax.tree_util.tree_flatten_with_path(Pair(1, 2))[0]]
    assert paths == [(0,), (1,)]
    assert path_keys(("raw",)) == ("raw",)


def test_path_text_reads_plain_keys_as_attributes_and_indices() -> None:
    assert path_text(("layers", 0, "w")) == ".layers[0].w"
    assert path_text(("a b", 1.5, None)) == "['a b'][1.5][None]"
    assert path_text(()) == "the top level"
    assert path_text((), root="(root)") == "(root)"


def test_path_text_prints_jax_key_paths_as_keystr_does() -> None:
    tree = {"w": [1, (2, 3)], "not ident": 4}
    for key_path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        assert path_text(key_path) == jax.tree_util.keystr(key_path)
    mixed = (GetAttrKey("layers"), SequenceKey(0), DictKey("w"), "b")
    assert path_text(mixed) == ".layers[0]['w'].b"


def test_array_types_are_what_is_array_accepts() -> None:
    shape = jax.ShapeDtypeStruct((2,), jnp.float32)
    for value in (jnp.zeros(2), np.zeros(2), np.float32(1)):
        assert is_array(value) and isinstance(value, ARRAY_TYPES)
        assert isinstance(value, SHAPED_TYPES)
    assert not is_array(shape) and not isinstance(shape, ARRAY_TYPES)
    assert isinstance(shape, SHAPED_TYPES)
    assert not isinstance(1.0, SHAPED_TYPES)


@pytest.mark.parametrize("bad", [5, "layers", None, {"a": 1}])
def test_path_text_refuses_what_is_not_a_path(bad):
    with pytest.raises(
        TypeError, match=r"path_text expects a path.*got .*A single key is a path of one"
    ):
        path_text(bad)
    assert path_text(["layers", 0]) == ".layers[0]"
