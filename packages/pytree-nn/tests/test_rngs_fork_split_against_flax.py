"""`Rngs.fork(split=...)` and `RngStream.fork(split=...)` give the same keys as Flax NNX's
(runs in the bench environment, which has flax)."""

import warnings

import jax
import numpy as np
import pytest

from pytree_nn import Rngs, RngStream

nnx = pytest.importorskip("flax.nnx")


def keys(stream):
    key = stream.key
    return np.asarray(jax.random.key_data(key.value if hasattr(key, "value") else key[...]))


@pytest.mark.parametrize("split", [3, (2, 2), {"dropout": 4, ...: None}])
def test_rngs_fork_split_same_keys(split):
    ours = Rngs(0, dropout=1).fork(split=split)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # NNX deprecates the spelling
        theirs = nnx.Rngs(default=0, dropout=1).fork(split=split)
    for name in ("default", "dropout"):
        np.testing.assert_array_equal(keys(ours[name]), keys(theirs[name]))


def test_stream_fork_split_same_keys():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = nnx.RngStream(5, tag="default").fork(split=3)
    np.testing.assert_array_equal(keys(RngStream(5).fork(split=3)), keys(theirs))
