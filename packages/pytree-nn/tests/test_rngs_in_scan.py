"""Rngs in `scan`: a stream scanned over (split keys) gives each step its own key; a
broadcast stream gives every step the same key (recurrent dropout's one mask) and moves on
once, so the next call draws new keys."""

import jax

import pytree_graph as pg
import pytree_nn as pn
from pytree_graph import Carry, StateAxes


def test_a_broadcast_rng_stream_gives_every_step_the_same_key_then_moves_on():
    rngs = pn.Rngs(params=jax.random.split(jax.random.key(0), 3), dropout=1)

    @pg.scan(in_axes=(Carry, StateAxes({"params": 0, ...: None})), length=3)
    def draw(_, rngs):
        return (), (rngs.params(), rngs.dropout())

    _, (params, dropout) = draw((), rngs)
    params, dropout = jax.random.key_data(params), jax.random.key_data(dropout)
    assert not (params[0] == params[1]).all() and (dropout[0] == dropout[2]).all()
    assert int(rngs.dropout.count.value) == 1  # the next call draws a new key
    _, (_, again) = draw((), rngs)
    assert not (jax.random.key_data(again)[0] == dropout[0]).all()
