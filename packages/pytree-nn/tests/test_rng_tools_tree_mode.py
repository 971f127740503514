"""`graph=` / `graph_updates=` on split_rngs, fork_rngs, with_rngs and reseed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_nn import Dropout, Linear, Module, Rngs, fork_rngs, reseed, split_rngs, with_rngs


class Model(Module):
    def __init__(self, rngs):
        self.linear = Linear(2, 3, rngs=rngs)
        self.dropout = Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.linear(x))


@pytest.mark.parametrize("graph", [True, False])
def test_split_rngs(graph):
    rngs = Rngs(params=0, dropout=1)
    result = split_rngs(rngs, splits=5, graph=graph)
    if graph:
        assert rngs.params.key.shape == (5,) and rngs["dropout"].key.shape == (5,)
        result.__exit__(None, None, None)
        assert rngs.params.key.shape == ()
    else:
        assert rngs.params.key.shape == () and rngs["dropout"].key.shape == ()
        assert result.params.key.shape == (5,) and result["dropout"].key.shape == (5,)
        assert result is not rngs


def test_split_rngs_graph_updates_false_copies_in_graph_mode():
    rngs = Rngs(params=0)
    result = split_rngs(rngs, splits=3, only="params", graph_updates=False)
    assert rngs.params.key.shape == () and result.params.key.shape == (3,)
    with pg.set_graph_updates(False):
        result = split_rngs(rngs, splits=2, squeeze=False)
    assert result.params.key.shape == (2,)


@pytest.mark.parametrize("graph", [True, False])
def test_fork_rngs(graph):
    rngs = Rngs(params=0, dropout=1)
    before = jax.random.key_data(rngs.params.key.value)
    result = fork_rngs(rngs, graph=graph)
    if graph:
        # In place: the stream now holds its next key, and the backups put it back.
        assert not np.array_equal(jax.random.key_data(rngs.params.key.value), before)
        assert int(rngs.params.count.value) == 0
        result.__exit__(None, None, None)
        np.testing.assert_array_equal(jax.random.key_data(rngs.params.key.value), before)
    else:
        assert result is not rngs and int(result.params.count.value) == 0
        assert not np.array_equal(jax.random.key_data(result.params.key.value), before)
        np.testing.assert_array_equal(jax.random.key_data(rngs.params.key.value), before)
        assert int(rngs.params.count.value) == 1  # the original gave the copy's key


def test_split_rngs_decorator_tree_mode_passes_copies():
    rngs = Rngs(0)

    @split_rngs(splits=3, graph=False)
    def shapes(r):
        return r.default.key.shape

    assert shapes(rngs) == (3,)
    assert rngs.default.key.shape == ()


def test_shared_stream_refused_in_tree_mode():
    rngs = Rngs(0)
    pair = [rngs, rngs]
    with pytest.raises(ValueError, match="Duplicate"):
        split_rngs(pair, splits=2, graph=False)
    with pytest.raises(ValueError, match="Duplicate"):
        reseed(pair, default=1, graph=False)
    with pytest.raises(ValueError, match="Duplicate"):
        with_rngs(pair, split=2, graph=False)
    split_rngs(pair, splits=2, graph=True).__exit__(None, None, None)


@pytest.mark.parametrize("graph", [True, False])
def test_reseed(graph):
    model = Model(Rngs(params=0, dropout=42))
    x = jnp.ones((1, 2))
    first = model(x)
    reseed(model, graph=graph, dropout=42)
    np.testing.assert_allclose(model(x), first)
