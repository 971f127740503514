"""Shared test helpers: a custom pytree node type, standing in for a Variable."""

import jax
import pytest


@jax.tree_util.register_pytree_with_keys_class
class Box:
    """A pytree node holding one value, with metadata in the treedef."""

    def __init__(self, value, tag="param"):
        self.value = value
        self.tag = tag

    def tree_flatten_with_keys(self):
        return ((jax.tree_util.GetAttrKey("value"), self.value),), self.tag

    def tree_flatten(self):
        return (self.value,), self.tag

    @classmethod
    def tree_unflatten(cls, tag, children):
        return cls(children[0], tag)

    def __eq__(self, other):
        return type(other) is Box and other.tag == self.tag and other.value == self.value

    def __hash__(self):
        return hash((Box, self.tag))

    def __repr__(self):
        return f"Box({self.value!r}, {self.tag!r})"


@pytest.fixture
def box_type():
    return Box
