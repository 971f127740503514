"""Layers that draw keys when called hold a stream of their own, forked from the `Rngs` they
are built with: every way of running a model draws the same masks, and no two layers the
same ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_nn import Dropout, Module, MultiHeadAttention, Rngs, RngStream
from pytree_nn._dropout import drop
from pytree_transforms import filter_jit


class TwoDropouts(Module):
    """The documented pattern: one `Rngs` passed to two layers."""

    def __init__(self, rngs):
        self.first = Dropout(0.5, rngs=rngs)
        self.second = Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.first(x), self.second(x)


def forward(model, x):
    return model(x)


def forward_and_model(model, x):
    return model(x), model  # the model whose key counters moved on


X = jnp.arange(1.0, 65.0)


def test_every_style_draws_the_same_masks_on_the_first_step():
    eager = TwoDropouts(Rngs(0))(X)
    styles = {
        "pytree_graph.jit": pg.jit(forward)(TwoDropouts(Rngs(0)), X),
        # The functional style returns the model whose streams moved (a write that is
        # not returned is refused).
        "filter_jit": filter_jit(forward_and_model)(TwoDropouts(Rngs(0)), X)[0],
        "jax.jit": jax.jit(forward)(TwoDropouts(Rngs(0)), X),
    }
    for style, (first, second) in styles.items():
        np.testing.assert_array_equal(first, eager[0], err_msg=style)
        np.testing.assert_array_equal(second, eager[1], err_msg=style)
    # Two layers built from one Rngs draw different masks.
    assert not np.array_equal(eager[0] == 0, eager[1] == 0)


def test_the_styles_agree_step_after_step():
    eager = TwoDropouts(Rngs(0))
    graph = TwoDropouts(Rngs(0))
    tree = TwoDropouts(Rngs(0))
    graph_step = pg.jit(forward)
    tree_step = filter_jit(forward_and_model)
    plain_step = jax.jit(forward_and_model)
    plain = TwoDropouts(Rngs(0))
    seen = set()
    for _ in range(3):
        expected = eager(X)
        tree_out, tree = tree_step(tree, X)
        plain_out, plain = plain_step(plain, X)
        for out in (graph_step(graph, X), tree_out, plain_out):
            np.testing.assert_array_equal(out[0], expected[0])
            np.testing.assert_array_equal(out[1], expected[1])
        seen.add(tuple(np.asarray(expected[0] == 0)))
    assert len(seen) == 3  # a new mask at every step
    assert int(graph.first.rngs.default.count.value) == 3
    assert int(tree.second.rngs.default.count.value) == 3


def test_a_layer_forks_its_stream_from_the_rngs_it_is_given():
    rngs = Rngs(0, dropout=1)
    layer = Dropout(0.5, rngs=rngs)
    # The `dropout` stream gave one key, the root of the layer's stream; the default
    # stream (for parameters) is untouched.
    assert int(rngs.dropout.count.value) == 1 and int(rngs.default.count.value) == 0
    root = Rngs(0, dropout=1).dropout()
    np.testing.assert_array_equal(
        jax.random.key_data(layer.rngs.default.key.value), jax.random.key_data(root)
    )
    assert layer.rngs is not rngs and pg.find_duplicates(TwoDropouts(rngs)) == []
    expected = drop(RngStream(root)(), X, 0.5)
    np.testing.assert_array_equal(layer(X), expected)
    # An RngStream is forked too; the stream given advances by one key.
    stream = Rngs(dropout=1).dropout
    np.testing.assert_array_equal(Dropout(0.5, rngs=stream)(X), expected)
    assert int(stream.count.value) == 1


def test_keys_given_to_the_call_are_used_instead():
    layer = Dropout(0.5, rngs=Rngs(0))
    count = int(layer.rngs.default.count.value)
    expected = drop(Rngs(dropout=3).dropout(), X, 0.5)
    np.testing.assert_array_equal(layer(X, rngs=Rngs(dropout=3)), expected)
    np.testing.assert_array_equal(layer(X, rngs=Rngs(dropout=3).dropout), expected)
    np.testing.assert_array_equal(Dropout(0.5)(X, rngs=3), drop(Rngs(3)(), X, 0.5))
    assert int(layer.rngs.default.count.value) == count  # its own stream was not used


class AttentionTwice(Module):
    def __init__(self, rngs):
        self.first = MultiHeadAttention(2, 4, dropout_rate=0.5, rngs=rngs)
        self.second = MultiHeadAttention(2, 4, dropout_rate=0.5, rngs=rngs)

    def __call__(self, x):
        return self.first(x), self.second(x)


def test_attention_dropout_forks_its_stream_after_the_parameters():
    x = jax.random.normal(jax.random.key(1), (2, 5, 4))
    eager = AttentionTwice(Rngs(0))(x)
    tree_style = filter_jit(forward_and_model)  # returns the model, whose streams moved
    for style in (pg.jit(forward), lambda m, x: tree_style(m, x)[0], jax.jit(forward)):
        out = style(AttentionTwice(Rngs(0)), x)
        # The same masks; compiled and eager matmuls may round differently.
        np.testing.assert_allclose(out[0], eager[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[1], eager[1], rtol=1e-5, atol=1e-6)
    # The parameters are drawn as without dropout; the stream is forked after them.
    model = AttentionTwice(Rngs(0))
    plain = MultiHeadAttention(2, 4, rngs=Rngs(0))
    np.testing.assert_array_equal(model.first.query.kernel.value, plain.query.kernel.value)
    keys = [jax.random.key_data(m.rngs.default.key.value) for m in (model.first, model.second)]
    assert not np.array_equal(*keys)


@pytest.mark.parametrize("rngs", [0, jax.random.key(0)])
def test_seeds_and_keys_give_a_stream_of_the_layers_own(rngs):
    layer = Dropout(0.5, rngs=rngs)
    assert isinstance(layer.rngs, Rngs) and layer.rngs.streams() == ["default"]
    np.testing.assert_array_equal(layer(X), drop(RngStream(Rngs(0)())(), X, 0.5))


def test_a_key_given_as_key_says_to_pass_rngs():
    layer = Dropout(0.5, rngs=Rngs(0))
    with pytest.raises(TypeError, match=r"rngs=\.\.\., not key="):
        layer(jnp.ones(4), key=jax.random.key(0))
