"""`view`, `with_attributes` and `set_attributes`: switching Modules' modes."""

import jax
import jax.numpy as jnp
import pytest

from pytree_graph import Param, grad, set_attributes, state, update, view, with_attributes
from pytree_module import Module


class Dropout(Module):
    def __init__(self):
        self.deterministic = False


class Norm(Module):
    def __init__(self):
        self.use_running_average = False
        self.scale = Param(jnp.ones(2))


class Cached(Module):
    def __init__(self):
        self.decode = False
        self.cache_size = 0

    def set_view(self, decode=None, max_length=None):
        if decode is not None:
            self.decode = decode
        if max_length is not None:
            self.cache_size = max_length


class Frozen(Module, frozen=True):
    deterministic: bool = False


class Block(Module):
    def __init__(self):
        self.dropout = Dropout()
        self.norm = Norm()
        self.again = self.norm
        self.w = Param(jnp.ones(2))

    def __call__(self, x):
        return x * self.w.value * self.norm.scale.value


def test_view_sets_attributes_on_new_modules_sharing_the_variables():
    block = Block()
    evaluating = view(block, deterministic=True, use_running_average=True)
    assert evaluating is not block and evaluating.dropout is not block.dropout
    assert evaluating.dropout.deterministic and evaluating.norm.use_running_average
    assert not block.dropout.deterministic and not block.norm.use_running_average
    assert evaluating.w is block.w and evaluating.norm.scale is block.norm.scale
    assert evaluating.again is evaluating.norm


def test_training_through_a_view_trains_the_original():
    block = Block()
    training = view(block, deterministic=False)
    grads = grad(lambda m: m(jnp.ones(2)).sum())(training)
    update(training, jax.tree.map(lambda p, g: p - g, state(training, Param), grads))
    assert block.w.value.tolist() == [0.0, 0.0] and block.norm.scale.value.tolist() == [0.0, 0.0]


def test_view_only_and_raise_if_not_found():
    block = Block()
    only = view(block, only=Dropout, deterministic=True)
    assert only.dropout.deterministic
    with pytest.raises(
        ValueError,
        match=r"^Unused keys found in nnx.view: \['foo'\]"
        r".*no selected Module has the attribute\(s\) \['foo'\]",
    ):
        view(block, foo=1)
    with pytest.raises(ValueError, match="use_running_average"):
        view(block, only=Dropout, use_running_average=True)
    assert view(block, foo=1, raise_if_not_found=False).dropout is not block.dropout


def test_view_calls_set_view_with_the_arguments_it_takes():
    class Model(Module):
        def __init__(self):
            self.attention = Cached()
            self.dropout = Dropout()

    model = Model()
    decoding = view(model, decode=True, max_length=16, deterministic=True)
    assert decoding.attention.decode and decoding.attention.cache_size == 16
    assert decoding.dropout.deterministic and not model.attention.decode
    # `with_attributes` does not use set_view: `max_length` is no attribute.
    with pytest.raises(ValueError, match="max_length"):
        with_attributes(model, max_length=16)


def test_with_attributes():
    block = Block()
    new = with_attributes(block, only=Norm, use_running_average=True)
    assert new.norm.use_running_average and not block.norm.use_running_average
    assert new.norm.scale is block.norm.scale and not new.dropout.deterministic


def test_set_attributes_in_place_with_filters():
    block = Block()
    assert set_attributes(block, deterministic=True, use_running_average=True) is None
    assert block.dropout.deterministic and block.norm.use_running_average
    set_attributes(block, Norm, use_running_average=False)
    assert not block.norm.use_running_average and block.dropout.deterministic
    set_attributes(block, lambda path, m: path == ("dropout",), deterministic=False)
    assert not block.dropout.deterministic


def test_set_attributes_checks_everything_before_writing():
    block = Block()
    with pytest.raises(ValueError, match=r"\['foo'\]"):
        set_attributes(block, deterministic=True, foo=1)
    assert not block.dropout.deterministic

    class WithFrozen(Module):
        def __init__(self):
            self.dropout = Dropout()
            self.frozen = Frozen()

    holder = WithFrozen()
    with pytest.raises(ValueError, match=r"Frozen at \.frozen has \['deterministic'\] but is"):
        set_attributes(holder, deterministic=True)
    assert not holder.dropout.deterministic
    set_attributes(holder, Dropout, deterministic=True)
    assert holder.dropout.deterministic
    set_attributes(block, deterministic=True, foo=2, raise_if_not_found=False)
    assert block.dropout.deterministic and not hasattr(block.dropout, "foo")
