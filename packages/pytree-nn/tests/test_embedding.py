"""Embedding: lookup and attend against jnp.take and matmul."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_nn import Embedding, Module, Rngs, initializers


@pytest.fixture(autouse=True)
def full_float32_matmuls():
    """Compare at float32 accuracy on every backend (GPUs may default to TF32 matmuls)."""
    with jax.default_matmul_precision("float32"):
        yield


def table(num_embeddings=7, features=3):
    embed = Embedding(num_embeddings, features, rngs=0)
    values = np.random.default_rng(0).standard_normal((num_embeddings, features))
    embed.embedding.value = jnp.asarray(values, jnp.float32)
    return embed


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)], ids=["scalar", "vector", "3d"])
def test_lookup_matches_take_for_any_index_shape(shape):
    embed = table()
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 7, shape), jnp.int32)
    out = embed(ids)
    assert out.shape == (*shape, 3)
    np.testing.assert_array_equal(out, jnp.take(embed.embedding.value, ids, axis=0))
    np.testing.assert_array_equal(out, np.asarray(embed.embedding.value)[np.asarray(ids)])


def test_index_types_negative_and_out_of_range_indices():
    embed = table()
    values = embed.embedding.value
    for ids in ([0, 6], np.array([0, 6], np.uint8), jnp.array([0, 6], jnp.int16), 6):
        np.testing.assert_array_equal(embed(ids), values[jnp.asarray(ids)])
    np.testing.assert_array_equal(embed(jnp.array([-1])), values[-1:])  # from the end
    assert bool(jnp.isnan(embed(jnp.array([7]))).all())  # past the end: NaN, not an error
    assert embed(jnp.array([1, 2])).dtype == jnp.float32


def test_attend_is_the_tied_output_projection():
    embed = table()
    query = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5, 3)), jnp.float32)
    scores = embed.attend(query)
    assert scores.shape == (2, 5, 7)
    expected = jnp.einsum("btf,vf->btv", query, embed.embedding.value)
    np.testing.assert_allclose(scores, expected, atol=1e-6)
    np.testing.assert_allclose(embed.attend(query[0, 0]), expected[0, 0], atol=1e-6)  # unbatched
    # Each vector scores highest against itself when the table is orthonormal.
    eye = Embedding(3, 3, embedding_init=lambda key, shape, dtype: jnp.eye(3, dtype=dtype), rngs=0)
    assert eye.attend(eye(jnp.arange(3))).argmax(-1).tolist() == [0, 1, 2]


def test_dtypes():
    half = Embedding(7, 3, dtype=jnp.bfloat16, rngs=0)
    assert half.embedding.value.dtype == jnp.float32
    assert half(jnp.array([1])).dtype == jnp.bfloat16
    assert half.attend(jnp.ones(3)).dtype == jnp.bfloat16
    stored_half = Embedding(7, 3, param_dtype=jnp.bfloat16, rngs=0)
    assert stored_half.embedding.value.dtype == jnp.bfloat16
    assert stored_half(jnp.array([1])).dtype == jnp.bfloat16
    assert stored_half.attend(jnp.ones(3)).dtype == jnp.float32  # promoted with the query
    np.testing.assert_allclose(
        stored_half.attend(jnp.ones(3)),
        jnp.ones(3) @ stored_half.embedding.value.astype(jnp.float32).T,
        rtol=1e-6,
    )


def test_initialisation():
    big = Embedding(1000, 16, rngs=0).embedding.value
    assert big.shape == (1000, 16)
    assert abs(float(big.std()) - 1 / math.sqrt(16)) < 0.01  # variance 1 / features
    assert abs(float(big.mean())) < 0.01
    ones = Embedding(4, 2, embedding_init=initializers.ones, rngs=0)
    assert ones(jnp.array(3)).tolist() == [1.0, 1.0]
    assert jnp.array_equal(
        Embedding(5, 2, rngs=Rngs(params=3)).embedding.value,
        Embedding(5, 2, rngs=Rngs(params=3)).embedding.value,
    )


def test_tied_weights_get_gradients_from_both_uses():
    class TinyLM(Module):
        def __init__(self):
            self.embed = table()

        def __call__(self, ids):
            return self.embed.attend(jnp.tanh(self.embed(ids)))

    model = TinyLM()
    ids = jnp.array([[1, 2, 3]])
    grads = pg.grad(lambda m: jnp.sum(m(ids) ** 2))(model)
    emb = model.embed.embedding.value

    def loss(e):
        return jnp.sum((jnp.tanh(e[ids]) @ e.T) ** 2)

    np.testing.assert_allclose(grads["embed"]["embedding"].value, jax.grad(loss)(emb), atol=1e-5)
    assert isinstance(model.embed.embedding, Param)
    np.testing.assert_allclose(pg.jit(lambda m, x: m(x))(model, ids), model(ids), atol=1e-6)


def test_errors():
    embed = table()
    with pytest.raises(TypeError, match=r"Embedding expects integer indices, got .* float32"):
        embed(jnp.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="integer indices, got an array of dtype bool"):
        embed(jnp.array([True]))
    with pytest.raises(
        ValueError, match=r"Embedding.attend expects .* features=3, got .* \(2, 4\)"
    ):
        embed.attend(jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="num_embeddings must be an int >= 0, got -1"):
        Embedding(-1, 3, rngs=0)
    with pytest.raises(ValueError, match=r"features must be an int >= 0, got 2\.5"):
        Embedding(4, 2.5, rngs=0)
    with pytest.raises(TypeError, match="Embedding needs `rngs=`"):
        Embedding(4, 3)
