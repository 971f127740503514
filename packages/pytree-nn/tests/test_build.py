"""`build`: a model built by one compiled program is the model eager construction builds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
import pytree_nn as nn
from pytree_nn import Conv, Dropout, Embedding, LayerNorm, Linear, MultiHeadAttention, Rngs


class Tied(nn.Module):
    """A small language model whose head is its embedding (one Variable at two paths)."""

    def __init__(self, vocabulary: int, width: int, *, rngs: Rngs):
        self.embed = Embedding(vocabulary, width, rngs=rngs)
        self.attention = MultiHeadAttention(2, width, rngs=rngs)
        self.norm = LayerNorm(width, rngs=rngs)
        self.conv = Conv(width, width, (3,), rngs=rngs)
        self.mlp = Linear(width, 2 * width, rngs=rngs)
        self.dropout = Dropout(0.5, rngs=rngs)
        self.head = self.embed.embedding

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.dropout(self.attention(self.norm(self.embed(tokens))))
        return x @ self.head.value.T


def _values(model: object) -> dict:
    """Every Variable's value by path, PRNG keys as their data."""

    def plain(value: jax.Array) -> np.ndarray:
        if jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        return np.asarray(value)

    return {path: plain(v.value) for path, v in pg.state(model).flat_state().items()}


def test_build_gives_the_values_of_eager_construction() -> None:
    eager = Tied(11, 8, rngs=Rngs(0, dropout=1))
    built = nn.build(Tied, 11, 8, rngs=Rngs(0, dropout=1))
    assert pg.graphdef(built) == pg.graphdef(eager)
    expected, got = _values(eager), _values(built)
    assert got.keys() == expected.keys()
    for path, value in expected.items():
        assert got[path].dtype == value.dtype and got[path].shape == value.shape, path
        if np.issubdtype(value.dtype, np.floating):
            # The same random bits; XLA may round their turning into floats differently in
            # a compiled program (the last bit, with some JAX versions).
            np.testing.assert_array_max_ulp(got[path], value, maxulp=2)
        else:
            np.testing.assert_array_equal(got[path], value, err_msg=str(path))
    tokens = jnp.arange(6) % 11
    np.testing.assert_allclose(built(tokens), eager(tokens), rtol=1e-5, atol=1e-6)


def test_build_keeps_shared_variables_shared() -> None:
    built = nn.build(Tied, 11, 8, rngs=Rngs(0))
    assert built.head is built.embed.embedding
    assert pg.find_duplicates(built) == pg.find_duplicates(Tied(11, 8, rngs=Rngs(0)))
    # One Variable: a write through one path is seen through the other.
    built.head.value = jnp.zeros_like(built.head.value)
    assert not built.embed.embedding.value.any()


def test_build_advances_the_callers_rngs_as_eager_construction_does() -> None:
    eager_rngs, built_rngs = Rngs(3, dropout=4), Rngs(3, dropout=4)
    Tied(11, 8, rngs=eager_rngs)
    nn.build(Tied, 11, 8, rngs=built_rngs)
    assert _values(built_rngs).keys() == _values(eager_rngs).keys()
    for path, count in _values(eager_rngs).items():
        np.testing.assert_array_equal(_values(built_rngs)[path], count, err_msg=str(path))
    # The next draws agree too: the streams are where eager construction left them.
    np.testing.assert_array_equal(
        jax.random.key_data(built_rngs.params()), jax.random.key_data(eager_rngs.params())
    )


def test_build_reuses_its_program_for_the_same_model() -> None:
    calls = []

    def make(width: int, rngs: Rngs) -> Linear:
        calls.append(width)
        return Linear(width, width, rngs=rngs)

    first = nn.build(make, 3, Rngs(0))
    second = nn.build(make, 3, Rngs(1))
    assert calls == [3]  # traced once; the second build only ran the program
    assert not np.array_equal(first.kernel.value, second.kernel.value)
    eager = Linear(3, 3, rngs=Rngs(1)).kernel.value
    np.testing.assert_array_max_ulp(second.kernel.value, eager, maxulp=2)
    nn.build(make, 4, Rngs(0))  # a new static value: a new program
    assert calls == [3, 4]


def test_build_with_an_int_seed_or_a_key() -> None:
    by_seed = nn.build(Linear, 2, 3, rngs=5)
    by_key = nn.build(Linear, 2, 3, rngs=jax.random.key(5))
    expected = Linear(2, 3, rngs=5).kernel.value
    np.testing.assert_array_max_ulp(by_seed.kernel.value, expected, maxulp=2)
    np.testing.assert_array_max_ulp(by_key.kernel.value, expected, maxulp=2)


def test_build_refuses_what_is_not_callable() -> None:
    with pytest.raises(TypeError, match=r"build takes the function that builds the model"):
        nn.build("Linear", 2, 3)  # type: ignore[arg-type]


def test_build_reports_errors_of_make_with_its_arguments() -> None:
    with pytest.raises(TypeError, match="rngs"):
        nn.build(Linear, 2, 3, rngs=0, not_an_argument=1)
