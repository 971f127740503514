"""`Rngs.fork`, `Rngs.split`, `rngs["name"]`, stream tags and `RngState` against Flax NNX.

Runs in the bench environment only (it has flax); elsewhere the module is skipped. Both
libraries derive keys the same way (the root key folded in with a counter), so the keys
are compared exactly.
"""

import jax
import numpy as np
import pytest
from distribution_args import DISTRIBUTION_ARGS

import pytree_graph as pg
import pytree_nn as pnn

nnx = pytest.importorskip("flax.nnx")


def data(key):
    return np.asarray(jax.random.key_data(key))


def root_key(stream):
    return stream.key.value if isinstance(stream, pnn.RngStream) else stream.key[...]


def count(stream):
    return np.asarray(
        stream.count.value if isinstance(stream, pnn.RngStream) else stream.count[...]
    ).tolist()


def pair(**streams):
    return pnn.Rngs(**streams), nnx.Rngs(**streams)


def test_fork_draws_the_same_keys_and_advances_the_parent_alike():
    ours, theirs = pair(default=0, dropout=1)
    ours.dropout(), theirs.dropout()
    our_fork, their_fork = ours.fork(), theirs.fork()
    assert sorted(our_fork.streams()) == sorted(their_fork)
    for name in ("default", "dropout"):
        assert count(ours[name]) == count(theirs[name]) == (2 if name == "dropout" else 1)
        assert count(our_fork[name]) == count(their_fork[name]) == 0
        for _ in range(2):
            np.testing.assert_array_equal(data(our_fork[name]()), data(their_fork[name]()))
        np.testing.assert_array_equal(data(ours[name]()), data(theirs[name]()))


@pytest.mark.parametrize("num", [3, (2, 3)])
def test_split_by_number_gives_the_same_stacked_keys(num):
    ours, theirs = pair(params=0, dropout=1)
    our_split, their_split = ours.split(num), theirs.split(num)
    for name in ("params", "dropout"):
        np.testing.assert_array_equal(
            data(root_key(our_split[name])), data(root_key(their_split[name]))
        )
        assert count(ours[name]) == count(theirs[name]) == 1


def test_split_by_stream_splits_the_named_streams_as_nnx():
    ours, theirs = pair(params=0, dropout=1, noise=2)
    # NNX takes the first entry that matches a stream, ours the stream's own name before
    # `...`: with `...` last, the two agree.
    sizes = {"params": 4, "dropout": None, ...: (2, 3)}
    our_split, their_split = ours.split(sizes), theirs.split(sizes)
    for name in ("params", "noise"):
        np.testing.assert_array_equal(
            data(root_key(our_split[name])), data(root_key(their_split[name]))
        )
    # A stream left unsplit: NNX's split copies it (same root key, count back at 0, so the
    # copy repeats keys the parent drew); ours forks it, as NNX's `RngStream.fork` does.
    assert root_key(their_split.dropout).shape == root_key(our_split.dropout).shape == ()
    expected = nnx.Rngs(dropout=1).dropout.fork()
    np.testing.assert_array_equal(data(root_key(our_split.dropout)), data(root_key(expected)))


def test_indexing_falls_back_to_the_default_stream_as_nnx():
    ours, theirs = pair(default=0, dropout=1)
    assert ours["dropout"].tag == theirs["dropout"].tag == "dropout"
    assert ours["params"].tag == theirs["params"].tag == "default"
    np.testing.assert_array_equal(data(ours["params"]()), data(theirs["params"]()))
    ours, theirs = pair(params=0)
    for rngs in (ours, theirs):
        with pytest.raises(KeyError, match="'dropout'"):
            rngs["dropout"]


def test_stream_tags_and_rng_state_select_the_same_variables():
    our_stream, their_stream = pnn.RngStream(3, tag="noise"), nnx.RngStream(3, tag="noise")
    assert our_stream.tag == their_stream.tag
    assert our_stream.fork().tag == their_stream.fork().tag == "noise"
    ours, theirs = pair(default=0, dropout=1)
    our_paths = sorted(pg.state(ours, pnn.RngState).flat_state())
    their_paths = sorted(path for path, _ in nnx.to_flat_state(nnx.state(theirs, nnx.RngState)))
    assert our_paths == their_paths


def nnx_distributions():
    """The `jax.random` samplers that NNX's `Rngs` has as methods."""
    return sorted(
        name
        for name in dir(nnx.Rngs)
        if getattr(getattr(nnx.Rngs, name), "__wrapped__", None) is getattr(jax.random, name, 0)
    )


def test_every_distribution_shortcut_of_nnx_is_here():
    names = nnx_distributions()
    assert len(names) > 30  # (the discovery above found them)
    assert sorted(DISTRIBUTION_ARGS) == names
    for name in names:
        assert callable(getattr(pnn.Rngs, name)) and callable(getattr(pnn.RngStream, name))


@pytest.mark.parametrize("name", sorted(DISTRIBUTION_ARGS))
def test_distribution_shortcuts_draw_as_nnxs(name):
    args = DISTRIBUTION_ARGS[name]
    ours, theirs = pair(default=0, dropout=1)
    for _ in range(2):  # the first and second keys of the default stream
        np.testing.assert_array_equal(getattr(ours, name)(*args), getattr(theirs, name)(*args))
    np.testing.assert_array_equal(
        getattr(ours.dropout, name)(*args), getattr(theirs.dropout, name)(*args)
    )
    assert count(ours.default) == count(theirs.default) == 2


@pytest.mark.parametrize("num", [3, (2, 3), {"default": 4, "dropout": None}, {...: (2,)}])
def test_broadcast_gives_nnxs_keys(num):
    ours, theirs = pair(default=0, dropout=1)
    ours_b, theirs_b = ours.broadcast(num), theirs.broadcast(num)
    for name in ("default", "dropout"):
        our_key, their_key = ours_b[name].key.value, theirs_b[name].key[...]
        assert our_key.shape == their_key.shape
        if our_key.shape:  # a broadcast stream: the same repeated key as NNX's
            np.testing.assert_array_equal(
                jax.random.key_data(our_key), jax.random.key_data(their_key)
            )
    assert count(ours.default) == count(theirs.default) == 1
