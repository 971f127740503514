"""`vmap` binds a keyword argument that names a positional parameter to its position, as
Flax NNX's transforms do, so it takes that parameter's entry of `in_axes`."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import Param, StateAxes
from pytree_module import Module


def test_keyword_argument_takes_its_parameters_entry_of_in_axes():
    def f(x, scale):
        return x * scale

    mapped = pg.vmap(f, in_axes=(0, None))
    # `scale` has no batch axis: broadcast by its in_axes entry, though given by keyword.
    out = mapped(jnp.arange(3.0), scale=jnp.array([10.0, 20.0]).sum())
    assert out.tolist() == [0.0, 30.0, 60.0]
    # By keyword and by position: the same.
    assert mapped(jnp.arange(3.0), jnp.array(30.0)).tolist() == out.tolist()
    # A keyword argument whose entry maps it: mapped.
    both = pg.vmap(f, in_axes=(None, 0))(jnp.array(2.0), scale=jnp.arange(3.0))
    assert both.tolist() == [0.0, 2.0, 4.0]


def test_keyword_only_arguments_keep_axis_zero():
    def f(x, *, shift):
        return x + shift

    out = pg.vmap(f, in_axes=(None,))(jnp.array(1.0), shift=jnp.arange(3.0))
    assert out.tolist() == [1.0, 2.0, 3.0]


def test_vmapped_init_takes_rngs_by_keyword():
    class Stack(Module):
        @pg.vmap(in_axes=(StateAxes({Param: 0, ...: None}), 0))
        def __init__(self, key):
            self.w = Param(jax.random.normal(key, (2,)))

    keys = jax.random.split(jax.random.key(0), 4)
    by_keyword = Stack(key=keys)
    by_position = Stack(keys)
    assert by_keyword.w.value.shape == (4, 2)
    assert jnp.array_equal(by_keyword.w.value, by_position.w.value)


def test_mismatch_still_named_after_binding():
    mapped = pg.vmap(lambda x, y: x + y, in_axes=(0,))
    with pytest.raises(ValueError, match="in_axes has 1 entries but the function was called"):
        mapped(jnp.arange(3.0), y=jnp.arange(3.0))
    # A call that does not fit the signature reaches the function, which names the problem.
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        pg.vmap(lambda x: x, in_axes=(0,))(jnp.arange(3.0), z=1)
