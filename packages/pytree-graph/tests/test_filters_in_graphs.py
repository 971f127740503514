"""Flax NNX's filter forms in the graph API: tuples and lists of filters, and
`f(path, value)` functions, in `split`, `state` and `StateAxes`."""

import jax.numpy as jnp

from pytree_graph import BatchStat, Cache, Param, StateAxes, split, state, vmap
from pytree_module import Module


class Block(Module):
    def __init__(self):
        self.kernel = Param(jnp.ones((2, 2)))
        self.bias = Param(jnp.zeros(2))
        self.mean = BatchStat(jnp.zeros(2))
        self.cache = Cache(jnp.zeros(2))


def test_split_with_a_tuple_of_types():
    _, stats, rest = split(Block(), (BatchStat, Cache), ...)
    assert set(stats.flat_state()) == {("mean",), ("cache",)}
    assert set(rest.flat_state()) == {("kernel",), ("bias",)}
    _, same, _ = split(Block(), [BatchStat, Cache], ...)
    assert set(same.flat_state()) == set(stats.flat_state())


def test_state_with_a_path_function_and_a_mixed_tuple():
    block = Block()
    kernels = state(block, lambda path, v: path[-1] == "kernel")
    assert set(kernels.flat_state()) == {("kernel",)}
    mixed = state(block, (Cache, lambda path, v: path == ("bias",)))
    assert set(mixed.flat_state()) == {("cache",), ("bias",)}


def test_state_axes_with_a_tuple_key():
    class Stats(Module):
        def __init__(self):
            self.w = Param(jnp.ones(3))
            self.count = BatchStat(jnp.arange(4.0))
            self.cache = Cache(jnp.arange(4.0))

    stats = Stats()
    axes = StateAxes({(BatchStat, Cache): 0, ...: None})

    @vmap(in_axes=(axes,))
    def total(m):
        return jnp.sum(m.w.value) + m.count.value + m.cache.value

    assert jnp.array_equal(total(stats), 3.0 + 2 * jnp.arange(4.0))
