"""`Rngs.fork(split=...)` and `RngStream.fork(split=...)`: Flax NNX's older spelling of
`split`, accepted as NNX accepts it."""

import jax
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param, StateAxes
from pytree_nn import Dropout, Linear, Rngs, RngState, RngStream


def keys(stream):
    return np.asarray(jax.random.key_data(stream.key.value))


def test_rngs_fork_split_is_split():
    forked = Rngs(0, dropout=1).fork(split={"dropout": 4, ...: None})
    split = Rngs(0, dropout=1).split({"dropout": 4, ...: None})
    assert forked.dropout.key.value.shape == (4,) and forked.default.key.value.shape == ()
    for name in ("default", "dropout"):
        np.testing.assert_array_equal(keys(forked[name]), keys(split[name]))
    assert Rngs(0).fork(split=(2, 3)).default.key.value.shape == (2, 3)


def test_rngs_fork_split_advances_one_key_per_stream_and_maps_over_vmap():
    rngs = Rngs(0)
    initial = keys(rngs.default)
    axes = StateAxes({(Param, RngState): 0, ...: None})

    @pg.vmap(in_axes=(axes,), out_axes=axes)
    def create(rngs):
        return Linear(3, 3, rngs=rngs), Dropout(0.5, rngs=rngs)

    linear, dropout = create(rngs.fork(split=5))
    assert linear.kernel.value.shape == (5, 3, 3)
    assert dropout.rngs.default.key.value.shape == (5,)
    assert int(rngs.default.count.value) == 1
    np.testing.assert_array_equal(keys(rngs.default), initial)


def test_stream_fork_split_is_split():
    a, b = RngStream(3), RngStream(3)
    np.testing.assert_array_equal(keys(a.fork(split=2)), keys(b.split(2)))
    assert int(a.count.value) == 1


def test_fork_split_bad_values_raise_and_leave_the_streams_as_they_were():
    rngs = Rngs(0, dropout=1)
    with pytest.raises(ValueError, match=r"no stream called 'noise'.*e\.g\. rngs\.split"):
        rngs.fork(split={"noise": 2})
    with pytest.raises(ValueError, match=r"number of splits must be an int >= 0"):
        rngs.fork(split=-1)
    with pytest.raises(ValueError, match=r"number of splits must be an int >= 0"):
        RngStream(0).fork(split="2")
    assert int(rngs.default.count.value) == 0 and int(rngs.dropout.count.value) == 0
