"""check_module: structure checks on demand."""

import jax.numpy as jnp
import pytest

from pytree_module import Module, check_module, static


class Inner(Module):
    def __init__(self):
        self.shapes = static([1, 2])
        self.w = jnp.ones(1)


class Outer(Module):
    def __init__(self):
        self.blocks = [Inner(), Inner()]


def test_clean_module_passes():
    check_module(Outer())


def test_arrays_put_in_a_static_list_behind_the_modules_back_are_found_with_their_path():
    outer = Outer()
    with pytest.raises(TypeError, match=r"Inner.shapes is static"):
        outer.blocks[1].shapes.append(jnp.ones(1))
    outer.blocks[1].__dict__["shapes"] = [1, jnp.ones(1)]
    with pytest.raises(ValueError, match=r"at \.blocks\[1\]\.shapes\).*holds arrays"):
        check_module(outer)


def test_attribute_set_behind_the_modules_back():
    inner = Inner()
    inner.__dict__["sneaky"] = 1
    with pytest.raises(ValueError, match=r"'sneaky'.*no status"):
        check_module(inner)


def test_check_module_rejects_non_modules():
    with pytest.raises(TypeError, match="expects a Module"):
        check_module({"a": 1})


def test_leaves_changed_behind_the_modules_back():
    inner = Inner()
    inner.__dict__["w"] = jnp.zeros(1)
    with pytest.raises(ValueError, match="out of step"):
        check_module(inner)
    inner.w = jnp.zeros(1)  # a normal assignment brings them back in step
    check_module(inner)
