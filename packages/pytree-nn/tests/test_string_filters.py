"""String filters (Flax NNX's tags) and `None` inside the graph API and transforms."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_filter import PathContains, WithTag
from pytree_nn import Linear, Module, RngCount, RngKey, Rngs, split_rngs


class Noisy(Module):
    def __init__(self, rngs):
        self.linear = Linear(2, 2, rngs=rngs)
        self.rngs = rngs

    def __call__(self, x):
        return self.linear(x) + jax.random.normal(self.rngs.dropout(), x.shape)


def test_stream_state_carries_the_stream_name_as_tag():
    rngs = Rngs(0, dropout=1)
    assert rngs.dropout.key.tag == "dropout" and rngs.dropout.count.tag == "dropout"
    assert rngs.default.key.tag == "default"
    # split and fork keep it, on the new streams' Variables too
    assert rngs.dropout.split(2).key.tag == "dropout"
    assert rngs.dropout.fork().count.tag == "dropout"


def test_state_and_split_by_tag():
    model = Noisy(Rngs(0, dropout=1))
    dropout = pg.state(model, "dropout")
    expected = [("rngs", "dropout", "count"), ("rngs", "dropout", "key")]
    assert sorted(dropout.flat_state()) == expected
    assert all(isinstance(v, RngKey | RngCount) for v in dropout.flat_state().values())
    _, params, streams, rest = pg.split(model, pg.Param, ("dropout", "default"), ...)
    assert len(params.flat_state()) == 2 and len(streams.flat_state()) == 4
    assert len(rest.flat_state()) == 0
    # a string is never a path entry: 'linear' is an attribute name, not a tag
    assert len(pg.state(model, "linear").flat_state()) == 0
    assert len(pg.state(model, PathContains("linear")).flat_state()) == 2


def test_none_selects_nothing():
    model = Noisy(Rngs(0, dropout=1))
    assert len(pg.state(model, None).flat_state()) == 0
    _, nothing, everything = pg.split(model, None, ...)
    assert len(nothing.flat_state()) == 0
    assert len(everything.flat_state()) == len(pg.state(model).flat_state())


def test_state_axes_keyed_by_stream_name():
    model = Noisy(Rngs(0, dropout=1))
    split_rngs(model, splits=3, only="dropout")
    assert model.rngs.dropout.key.value.shape == (3,)
    assert model.rngs.default.key.value.shape == ()

    @pg.vmap(in_axes=(pg.StateAxes({"dropout": 0, ...: None}), None))
    def forward(model, x):
        return model(x)

    out = forward(model, jnp.ones(2))
    assert out.shape == (3, 2)
    assert not jnp.allclose(out[0], out[1])  # each row its own dropout key


def test_diff_state_with_a_string_differentiates_nothing_float():
    model = Noisy(Rngs(0, dropout=1))

    def loss(model):
        return model.linear(jnp.ones(2)).sum()

    grads = pg.grad(loss, argnums=pg.DiffState(0, pg.Param))(model)
    assert sorted(grads.flat_state()) == [("linear", "bias"), ("linear", "kernel")]
    # the stream's state is integer and key typed: selected by tag, it has no gradient
    with pytest.raises(TypeError, match=r"RngCount at \.rngs\.dropout\.count .* no gradient"):
        pg.grad(loss, argnums=pg.DiffState(0, "dropout"))(model)


def test_tagged_variable_made_by_hand():
    marked = pg.Param(jnp.ones(2), tag="lora")
    plain = pg.Param(jnp.ones(2))
    assert WithTag("lora")((), marked) and not WithTag("lora")((), plain)
