"""`view_info` and the layers' `set_view` methods (what `view` sets)."""

import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_nn import BatchNorm, Dropout, Linear, LSTMCell, Module, MultiHeadAttention, Rngs


class Block(Module):
    def __init__(self, din, dout, *, rngs):
        self.linear = Linear(din, dout, rngs=rngs)
        self.bn = BatchNorm(dout, rngs=rngs)
        self.dropout = Dropout(0.2, rngs=rngs)
        self.rngs = rngs


def test_each_class_once_sorted_with_its_arguments():
    model = [Block(4, 8, rngs=Rngs(0)), Block(8, 2, rngs=Rngs(1))]
    info = pg.view_info(model)
    assert info.count("BatchNorm:") == 1 and info.count("Dropout:") == 1
    assert info.index("BatchNorm:") < info.index("Dropout:")
    assert "  deterministic: bool | None = None\n    if True, disables dropout masking." in info
    assert "  use_running_average: bool | None = None" in info


def test_only_selects_modules():
    block = Block(4, 8, rngs=Rngs(0))
    assert "Dropout:" in pg.view_info(block, only=Dropout)
    assert "BatchNorm:" not in pg.view_info(block, only=Dropout)
    assert pg.view_info(block, only=LSTMCell) == ""


def test_custom_set_view_and_one_without_docstring():
    class Documented(Module):
        def set_view(self, arg1: bool | None = None, arg2: int | None = None, **kwargs):
            """Example set_view docstring.

            Args:
              arg1: The first argument.
              arg2: The second argument.
                This has two lines.
            """

    class Bare(Module):
        def set_view(self, flag=None):
            pass

    assert pg.view_info(Documented()) == (
        f"{Documented.__qualname__}:\n  arg1: bool | None = None\n    The first argument.\n"
        "  arg2: int | None = None\n    The second argument.\n    This has two lines."
    )
    assert pg.view_info(Bare()) == f"{Bare.__qualname__}:\n  set_view(self, flag=None)"


def test_view_goes_through_set_view_and_leaves_rngs_alone():
    block = Block(4, 8, rngs=Rngs(0))
    before = int(block.rngs.default.count.value)
    evaluating = pg.view(block, deterministic=True, use_running_average=True)
    assert evaluating.dropout.deterministic and evaluating.bn.use_running_average
    assert not block.dropout.deterministic and not block.bn.use_running_average
    # an Rngs answers any attribute with its default stream: never taken for a set_view
    assert int(block.rngs.default.count.value) == before


def test_attention_set_view_makes_the_cache_when_sized():
    attention = MultiHeadAttention(2, 8, rngs=Rngs(0))
    decoding = pg.view(attention, decode=True, batch_size=1, max_length=5)
    assert decoding.decode and decoding.cached_key.value.shape == (1, 5, 2, 4)
    assert attention.cached_key is None
    out = decoding(jnp.ones((1, 1, 8)))
    assert out.shape == (1, 1, 8) and int(decoding.cache_index.value) == 1
    later = pg.view(attention, decode=True)  # no size: init_cache is left to the caller
    assert later.decode and later.cached_key is None
    with pytest.raises(TypeError, match="'max_length' must be given with batch_size"):
        pg.view(attention, decode=True, batch_size=1)
