"""`view_info` side by side with Flax NNX (bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import pytree_graph as pg  # noqa: E402
import pytree_nn as pn  # noqa: E402


def test_the_same_listing_for_dropout_and_batchnorm():
    ours = [pn.BatchNorm(8, rngs=pn.Rngs(0)), pn.Dropout(0.2, rngs=pn.Rngs(0))]
    theirs = [nnx.BatchNorm(8, rngs=nnx.Rngs(0)), nnx.Dropout(0.2, rngs=nnx.Rngs(0))]
    assert pg.view_info(ours) == nnx.view_info(nnx.List(theirs))


def test_the_same_listing_for_a_custom_set_view():
    def make(base):
        class Block(base):
            def set_view(self, arg1: bool | None = None, arg2: int | None = None, **kwargs):
                """Example.

                Args:
                  arg1: The first argument.
                  arg2: The second argument.
                    This has two lines.
                """

        Block.__qualname__ = "Block"
        return Block()

    assert pg.view_info(make(pn.Module)) == nnx.view_info(make(nnx.Module))
