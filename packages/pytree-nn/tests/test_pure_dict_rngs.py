"""Pure dicts (`to_pure_dict`, `replace_by_pure_dict`, `update`) of models holding `Rngs`: their
typed PRNG keys round-trip, as keys or as their data, and the streams go on alike."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_nn import Dropout, Linear, Module, Rngs


class Noisy(Module):
    def __init__(self, seed):
        self.linear = Linear(4, 4, rngs=seed)
        self.dropout = Dropout(0.5, rngs=Rngs(seed))

    def __call__(self, x):
        return self.dropout(self.linear(x))


def _is_key(value):
    return jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)


def _draws(model, count=3):
    return [np.asarray(model(jnp.ones((2, 4)))) for _ in range(count)]


def _assert_same_stream(a, b):
    for x, y in zip(_draws(a), _draws(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _moved_on(seed=0):
    model = Noisy(seed)
    _draws(model, 2)
    return model


def test_to_pure_dict_keeps_typed_keys_and_replace_writes_them_back():
    saved = _moved_on()
    pure = pg.to_pure_dict(pg.state(saved))
    key = pure["dropout"]["rngs"]["default"]["key"]
    assert _is_key(key)  # as Flax NNX's to_pure_dict
    model = Noisy(1)
    pg.replace_by_pure_dict(pg.state(model), pure)
    assert _is_key(model.dropout.rngs.default.key.value)
    _assert_same_stream(saved, model)

    method = Noisy(2)
    pg.state(method).replace_by_pure_dict(pure)
    _assert_same_stream(_moved_on(), method)

    updated = Noisy(3)
    pg.update(updated, pure)
    _assert_same_stream(_moved_on(), updated)


def test_key_data_stands_for_the_keys():
    """A format without key dtypes saves `jax.random.key_data`; it is taken back in the
    keys' place and wrapped with their implementation."""
    saved = _moved_on()
    data = jax.tree.map(
        lambda v: jax.random.key_data(v) if _is_key(v) else v,
        pg.to_pure_dict(pg.state(saved)),
    )
    model = Noisy(1)
    pg.replace_by_pure_dict(pg.state(model), data)
    key = model.dropout.rngs.default.key.value
    assert _is_key(key) and jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0))
    _assert_same_stream(saved, model)
    partial = Noisy(0)  # the same weights, its stream not moved on: only that is written
    pg.update(partial, {"dropout": data["dropout"]})
    _assert_same_stream(_moved_on(), partial)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (jnp.zeros(3, jnp.uint32), r"uint32\[3\] where the State has PRNG keys key<fry>\[\]"),
        (jnp.zeros(2, jnp.float32), r"float32\[2\] where the State has PRNG keys"),
        (jax.random.key(0, impl="rbg"), r"dtype key<rbg> where the State has key<fry>"),
        (jax.random.split(jax.random.key(0), 2), r"shape \(2,\) where the State has \(\)"),
    ],
    ids=["data-shape", "data-dtype", "impl", "key-shape"],
)
def test_what_cannot_be_the_keys_is_refused_and_changes_nothing(value, message):
    model = Noisy(0)
    before = np.asarray(jax.random.key_data(model.dropout.rngs.default.key.value))
    kernel = model.linear.kernel.value
    pure = pg.to_pure_dict(pg.state(model))
    pure["linear"]["kernel"] = jnp.zeros_like(kernel)
    pure["dropout"]["rngs"]["default"]["key"] = value
    for write in (
        lambda: pg.replace_by_pure_dict(pg.state(model), pure),
        lambda: pg.update(model, pure),
    ):
        with pytest.raises(ValueError, match=r"at \.dropout\.rngs\.default\.key: " + message):
            write()
        after = jax.random.key_data(model.dropout.rngs.default.key.value)
        np.testing.assert_array_equal(after, before)
        assert model.linear.kernel.value is kernel
