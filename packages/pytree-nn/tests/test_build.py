"""`build`: a model built by one compiled program is the model eager construction builds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import subjaxprs

import pytree_graph as pg
import pytree_nn as nn
from pytree_nn import Conv, Dropout, Embedding, LayerNorm, Linear, MultiHeadAttention, Rngs
from pytree_nn._flat_draws import drawing_flat


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


class Drawn(nn.Module):
    """Parameters from the three samplers initializers use, in blocks of one shape each."""

    def __init__(self, blocks: int, width: int, *, rngs: Rngs):
        normal, uniform = nn.initializers.normal(0.5), nn.initializers.uniform(0.5)
        self.blocks = [
            [
                Linear(width, 2 * width, kernel_init=normal, bias_init=uniform, rngs=rngs),
                Linear(2 * width, width, rngs=rngs),  # truncated normal (lecun_normal)
                Embedding(3 * width, width, rngs=rngs),
            ]
            for _ in range(blocks)
        ]


def _threefry_count(jaxpr) -> int:
    """How many threefry hashes a program holds (jaxprs inside it included)."""
    names = ("random_fold_in", "random_bits", "random_split", "threefry2x32")
    own = sum(eqn.primitive.name in names for eqn in jaxpr.eqns)
    return own + sum(_threefry_count(inner) for inner in subjaxprs(jaxpr))


def test_build_batches_the_draws_into_few_threefry_hashes() -> None:
    def eager(key):
        return pg.state(Drawn(4, 8, rngs=Rngs(key)))

    def built(key):
        return pg.state(nn.build(Drawn, 4, 8, rngs=Rngs(key)))

    key = jax.random.key(0)
    # Eagerly, a fold_in per key (5 a block) and a draw per drawn parameter (4 a block).
    assert _threefry_count(jax.make_jaxpr(eager)(key).jaxpr) == 4 * 5 + 4 * 4
    # Built: one fold_in for all keys, one draw per sampler and shape.
    assert _threefry_count(jax.make_jaxpr(built)(key).jaxpr) == 1 + 4


def test_build_draws_the_values_of_the_unbatched_program_exactly() -> None:
    @jax.jit
    def unbatched(key):
        with drawing_flat():  # as `build` draws
            return pg.state(Drawn(4, 8, rngs=Rngs(key)))

    built = nn.build(Drawn, 4, 8, rngs=Rngs(5))
    expected = unbatched(jax.random.key(5)).flat_state()
    for path, value in _values(built).items():
        np.testing.assert_array_equal(value, expected[path].value, err_msg=str(path))
    # Eager construction draws the same bits; XLA may turn them into floats differently in
    # a compiled program (the last bit, with some JAX versions).
    for path, value in _values(Drawn(4, 8, rngs=Rngs(5))).items():
        np.testing.assert_allclose(_values(built)[path], value, rtol=0, atol=2.5e-7)


class Stores(nn.Module):
    """A model that keeps the `Rngs` it is given, and one submodule at two places."""

    def __init__(self, *, rngs: Rngs):
        self.rngs = rngs
        self.first = Linear(2, 2, rngs=rngs)
        self.again = self.first


def test_build_keeps_a_stored_rngs_the_callers_and_a_stored_module_shared() -> None:
    rngs = Rngs(0)
    built = nn.build(Stores, rngs=rngs)
    assert built.rngs is rngs
    assert built.again is built.first
    assert int(rngs.default.count.value) == 2  # the kernel's key and the bias's
    eager = Stores(rngs=Rngs(0))
    np.testing.assert_array_equal(built.first.kernel.value, eager.first.kernel.value)


class Branches(nn.Module):
    """A constructor that draws inside `cond` and calls a `custom_jvp` function."""

    def __init__(self, flag: jax.Array, *, rngs: Rngs):
        key = rngs.params()
        self.scale = pg.Param(
            jax.lax.cond(
                flag > 0,
                lambda k: jax.random.normal(k, (3,)),
                lambda k: jax.random.uniform(k, (3,)),
                key,
            )
        )
        self.soft = pg.Param(jax.nn.softplus(jax.random.normal(rngs.params(), (2,))))
        self.relu = pg.Param(jax.nn.relu(self.scale.value))


@pytest.mark.parametrize("flag", [1, -1])
def test_build_runs_a_constructor_with_cond_and_custom_jvp(flag: int) -> None:
    built = nn.build(Branches, jnp.asarray(flag), rngs=Rngs(2))
    eager = Branches(jnp.asarray(flag), rngs=Rngs(2))
    for path, value in _values(eager).items():
        np.testing.assert_allclose(_values(built)[path], value, rtol=0, atol=2.5e-7)
