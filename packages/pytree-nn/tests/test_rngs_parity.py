"""`Rngs.fork`, `Rngs.split` per stream, `rngs["name"]`, `RngStream(tag=...)` and `RngState`."""

import jax
import numpy as np
import pytest

import pytree_graph as pg
from pytree_nn import Dropout, Linear, Module, RngCount, RngKey, Rngs, RngState, RngStream


def data(key):
    return np.asarray(jax.random.key_data(key))


def counts(rngs):
    return {name: np.asarray(rngs[name].count.value).tolist() for name in rngs.streams()}


# ------------------------------------------------------------------------------- fork


def test_fork_gives_independent_streams_and_advances_each_parent_stream_once():
    rngs = Rngs(0, dropout=1)
    rngs.dropout()
    forked = rngs.fork()
    assert forked is not rngs and forked.streams() == ["default", "dropout"]
    assert counts(rngs) == {"default": 1, "dropout": 2}
    assert counts(forked) == {"default": 0, "dropout": 0}
    # Each forked stream's root key is the key its parent stream gave next.
    again = Rngs(0, dropout=1)
    again.dropout()
    np.testing.assert_array_equal(data(forked.default.key.value), data(again.default()))
    np.testing.assert_array_equal(data(forked.dropout.key.value), data(again.dropout()))
    # The streams are independent: the fork and the parent draw different keys from now on.
    assert not np.array_equal(data(forked.dropout()), data(rngs.dropout()))
    assert forked.dropout.tag == "dropout" and forked.default.tag == "default"


def test_fork_without_a_default_stream_has_none_either():
    forked = Rngs(params=3).fork()
    assert forked.streams() == ["params"]
    with pytest.raises(
        AttributeError, match=r"^No RngStream named 'dropout' found in Rngs, and no default"
    ):
        forked.dropout()


def test_fork_inside_a_graph_transform_advances_the_callers_streams():
    rngs = Rngs(0)
    first = pg.jit(lambda r: r.fork().normal(()))(rngs)
    second = pg.jit(lambda r: r.fork().normal(()))(rngs)
    assert float(first) != float(second) and counts(rngs) == {"default": 2}


# ------------------------------------------------------------------------------ split


def test_split_by_stream_splits_the_named_streams_and_forks_the_rest():
    rngs = Rngs(params=0, dropout=1, noise=2)
    split = rngs.split({"params": 4, "noise": (2, 3)})
    shapes = {name: split[name].key.value.shape for name in split.streams()}
    assert shapes == {"params": (4,), "dropout": (), "noise": (2, 3)}
    assert counts(rngs) == {"params": 1, "dropout": 1, "noise": 1}
    # Split: the parent's next key, split; not split: forked from the parent's next key.
    fresh = Rngs(params=0, dropout=1, noise=2)
    np.testing.assert_array_equal(
        data(split.params.key.value), data(jax.random.split(fresh.params(), 4))
    )
    np.testing.assert_array_equal(data(split.dropout.key.value), data(fresh.dropout()))
    assert [split[name].tag for name in split.streams()] == ["params", "dropout", "noise"]


def test_split_by_stream_with_ellipsis_and_none():
    rngs = Rngs(0, params=1, dropout=2)
    split = rngs.split({"dropout": None, ...: 3})
    assert split.default.key.value.shape == (3,) and split.params.key.value.shape == (3,)
    assert split.dropout.key.value.shape == ()
    only_params = Rngs(0, params=1, dropout=2).split({"params": 2, ...: None})
    assert only_params.default.key.value.shape == () and only_params.params.count.value.shape == (
        2,
    )


def test_split_streams_map_to_distinct_keys():
    many = Rngs(0).split(4)
    draws = pg.vmap(lambda r: r.normal(()))(many)
    assert len(set(np.asarray(draws).tolist())) == 4
    grid = Rngs(0).split((2, 3))
    assert grid.default.count.value.shape == (2, 3)
    # A stack of streams used without mapping gives one key per stream.
    keys = data(grid.default())
    assert keys.shape == (2, 3, 2) and len({tuple(k) for k in keys.reshape(6, 2)}) == 6
    assert np.asarray(grid.default.count.value).tolist() == [[1, 1, 1], [1, 1, 1]]
    nested = pg.vmap(pg.vmap(lambda r: r.normal(())))(grid)
    assert nested.shape == (2, 3) and len(set(np.asarray(nested).ravel().tolist())) == 6


@pytest.mark.parametrize("num", [-1, 1.5, True, "4", None, (), (2, -1), [2]])
def test_split_refuses_a_bad_number_and_leaves_the_streams_as_they_were(num):
    rngs = Rngs(0, dropout=1)
    with pytest.raises(ValueError, match=r"Rngs\.split\(num\).*int >= 0 or a tuple"):
        rngs.split(num)
    with pytest.raises(ValueError, match=r"RngStream 'dropout': split\(num\)"):
        rngs.dropout.split(num)
    assert counts(rngs) == {"default": 0, "dropout": 0}


def test_split_by_stream_refuses_unknown_names_and_bad_numbers_before_advancing():
    rngs = Rngs(0, dropout=1)
    with pytest.raises(ValueError, match=r"no stream called 'params', 'noise'.*\['default'"):
        rngs.split({"params": 2, "noise": 2, "dropout": 2})
    with pytest.raises(ValueError, match=r"Rngs\.split\(\{'dropout': \.\.\.\}\).*got -2"):
        rngs.split({"default": 2, "dropout": -2})
    with pytest.raises(ValueError, match=r"Rngs\.split\(\{'default': \.\.\.\}\).*got 'x'"):
        rngs.split({...: "x"})
    assert counts(rngs) == {"default": 0, "dropout": 0}


# --------------------------------------------------------------------------- indexing


def test_indexing_is_attribute_access():
    rngs = Rngs(0, dropout=1)
    assert rngs["dropout"] is rngs.dropout and rngs["default"] is rngs.default
    assert rngs["params"] is rngs.default  # no "params" stream: the default one
    assert rngs["split"] is rngs.default  # a method's name is not a stream's
    only_params = Rngs(params=0)
    with pytest.raises(KeyError, match=r"No RngStream named 'dropout'.*streams: \['params'\]"):
        only_params["dropout"]
    with pytest.raises(
        AttributeError, match=r"No RngStream named 'dropout'.*streams: \['params'\]"
    ):
        only_params.dropout  # noqa: B018


@pytest.mark.parametrize("index", [0, None, ("params",), slice(None)])
def test_indexing_needs_a_stream_name(index):
    with pytest.raises(TypeError, match=r"Rngs\[\.\.\.\] takes a stream name \(a str\)"):
        Rngs(0, params=1)[index]


# -------------------------------------------------------------------------------- tag


def test_streams_carry_their_name_as_a_tag():
    rngs = Rngs(0, dropout=1)
    assert rngs.default.tag == "default" and rngs.dropout.tag == "dropout"
    assert "tag='dropout'" in repr(rngs.dropout)
    stream = RngStream(3, tag="noise")
    assert stream.split(2).tag == "noise" and stream.fork().tag == "noise"
    assert RngStream(3).tag == "default"
    # A stream given to an Rngs is used as it is (shared), tag and all.
    assert Rngs(stream).default is stream
    with pytest.raises(TypeError, match=r"RngStream\(tag=\.\.\.\) must be a str"):
        RngStream(0, tag=1)
    with pytest.raises(TypeError, match=r"RngStream\(tag='noise'\): expected an int seed"):
        RngStream("zero", tag="noise")


def test_method_names_cannot_name_streams():
    for name in ("fork", "split", "streams"):
        with pytest.raises(ValueError, match=f"cannot be called '{name}'"):
            Rngs(**{name: 0})


# ---------------------------------------------------------------------------- RngState


def test_rng_state_selects_every_stream_variable_in_a_model():
    assert issubclass(RngKey, RngState) and issubclass(RngCount, RngState)

    class Net(Module):
        def __init__(self, rngs):
            self.linear = Linear(2, 2, rngs=rngs)
            self.dropout = Dropout(0.5, rngs=rngs)

    net = Net(Rngs(0))
    rng_state = pg.state(net, RngState)
    assert sorted(rng_state.flat_state()) == [
        ("dropout", "rngs", "default", "count"),
        ("dropout", "rngs", "default", "key"),
    ]
    _, rng_part, params = pg.split(net, RngState, ...)
    assert sorted(params.flat_state()) == [("linear", "bias"), ("linear", "kernel")]
    assert {type(v) for v in rng_part.flat_state().values()} == {RngKey, RngCount}


def test_broadcast_repeats_one_key_split_gives_many():
    stream = RngStream(0, tag="noise")
    stack = stream.broadcast((2, 3))
    assert stack.key.value.shape == (2, 3) and stack.count.value.shape == (2, 3)
    assert stack.tag == "noise" and stack.key.tag == "noise"
    data = jax.random.key_data(stack.key.value).reshape(6, -1)
    assert bool((data == data[0]).all())
    assert int(stream.count.value) == 1  # the stream advanced by one key

    rngs = Rngs(params=1, dropout=2, noise=3)
    out = rngs.broadcast({"params": 5, "dropout": None, ...: (2, 5)})
    assert out.params.key.value.shape == (5,)
    assert out.dropout.key.value.shape == () and out.dropout is not rngs.dropout
    assert out.noise.key.value.shape == (2, 5)
    assert Rngs(0).broadcast(None).default.key.value.shape == ()

    @jax.vmap
    def draw(rngs):
        return jax.random.normal(rngs.default(), ())

    same = draw(Rngs(0).broadcast(4))
    differ = draw(Rngs(0).split(4))
    assert bool((same == same[0]).all()) and not bool((differ == differ[0]).all())


def test_broadcast_refuses_bad_sizes_and_names():
    rngs = Rngs(0, dropout=1)
    with pytest.raises(ValueError, match=r"Rngs.broadcast\(num\)"):
        rngs.broadcast(-1)
    with pytest.raises(ValueError, match=r"no stream called 'noise'"):
        rngs.broadcast({"noise": 2})
    assert int(rngs.default.count.value) == 0  # nothing advanced
