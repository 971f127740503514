"""Key paths normalised to plain keys."""

import dataclasses

import jax

from pytree_filter import path_keys


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
