"""A jaxpr evaluated with its draws batched gives `eval_jaxpr`'s values, bit for bit, in few
threefry hashes (pytree_nn/_batched_draws.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import subjaxprs

from pytree_nn._batched_draws import Offset, Row, eval_batching_draws
from pytree_nn._flat_draws import drawing_flat, flat_when_eager

THREEFRY = ("random_fold_in", "random_bits", "random_split", "threefry2x32")


def _count(jaxpr, names=THREEFRY) -> int:
    """How many equations of `jaxpr` and the jaxprs inside it bind one of `names`."""
    own = sum(eqn.primitive.name in names for eqn in jaxpr.eqns)
    return own + sum(_count(inner, names) for inner in subjaxprs(jaxpr))


def _batched(fun):
    """`fun`, evaluated from its jaxpr with the draws batched (rows and counters taken)."""

    def run(*args):
        closed = jax.make_jaxpr(fun)(*args)
        results = eval_batching_draws(closed, *jax.tree.leaves(args))
        taken = [r.take() if isinstance(r, Row | Offset) else r for r in results]
        return jax.tree.unflatten(jax.tree.structure(jax.eval_shape(fun, *args)), taken)

    return run


SAMPLERS = {
    "truncated_normal": lambda k, s: jax.random.truncated_normal(k, -2.0, 2.0, s),
    "normal": jax.random.normal,
    "uniform": lambda k, s: jax.random.uniform(k, s, minval=-0.5, maxval=0.5),
}


def _draws(key):
    """Draws as layers make them: keys folded from a counter, samplers of several shapes."""
    out, count = {}, jnp.uint32(0)
    for shape in [(3, 4), (4, 3), (2, 6), (3, 4), (5,), (), (0, 2)]:
        for name, sampler in SAMPLERS.items():
            key_i = flat_when_eager(jax.random.fold_in(key, count))
            out.setdefault(name, []).append(sampler(key_i, shape))
            count = count + 1
    out["bits"] = [jax.random.bits(jax.random.split(key, 3)[1], (7,))]
    return out, count


def _assert_equal(got, expected, atol=0.0):
    for want, have in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        assert want.dtype == have.dtype and want.shape == have.shape
        if atol:
            np.testing.assert_allclose(np.asarray(have), np.asarray(want), rtol=0, atol=atol)
        else:
            np.testing.assert_array_equal(np.asarray(have), np.asarray(want))


def test_batching_changes_no_value_of_a_program():
    key = jax.random.key(7)
    with drawing_flat():
        _assert_equal(jax.jit(_batched(_draws))(key), jax.jit(_draws)(key))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_the_values_are_those_of_eager_draws(jit):
    key = jax.random.key(7)
    (expected, expected_count), batched = _draws(key), _batched(_draws)
    with drawing_flat():
        got, count = (jax.jit(batched) if jit else batched)(key)
    _assert_equal(count, expected_count)
    for name in ("normal", "uniform", "bits"):
        _assert_equal(got[name], expected[name])
    # The same bits; turned into floats in a compiled program, the bounds' `erf` may round
    # differently in the last bit (with or without batching): values of about 1, within two
    # of its ulps.
    _assert_equal(got["truncated_normal"], expected["truncated_normal"], atol=2.5e-7)


def test_draws_of_one_kind_become_one_threefry_hash():
    key = jax.random.key(0)

    def layers(key):
        # 16 keys from a counter, 12 draws in two shapes (as 4 blocks of 3 kernels).
        keys = [jax.random.fold_in(key, i) for i in range(16)]
        return [
            jax.random.truncated_normal(flat_when_eager(k), -2.0, 2.0, (8, 4) if i % 2 else (4, 8))
            for i, k in enumerate(keys[:12])
        ]

    with drawing_flat():
        unbatched = jax.make_jaxpr(layers)(key).jaxpr
        batched = jax.make_jaxpr(_batched(layers))(key).jaxpr
    assert _count(unbatched) == 16 + 12
    # One fold_in, and one draw per sampler call of a shape (the two shapes' samplers are two
    # traced functions).
    assert _count(batched) == 1 + 2


def test_draws_repeated_on_one_key_are_the_same():
    def repeated(key):
        first, second = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
        same = [jax.random.normal(first, (2,)) for _ in range(3)]  # one key for all
        mixed = [jax.random.normal(k, (3,)) for k in (first, second, first, second)]
        splits = [jax.random.key_data(jax.random.split(second)) for _ in range(2)]
        return same, mixed, splits

    key = jax.random.key(4)
    _assert_equal(jax.jit(_batched(repeated))(key), jax.jit(repeated)(key))


def test_a_counters_values_are_one_addition():
    def counted(key, count):
        keys = []
        for _ in range(20):
            keys.append(jax.random.fold_in(key, count))
            count = count + 1
        return [jax.random.key_data(k) for k in keys], count - 3

    key, count = jax.random.key(1), jnp.uint32(4294967290)  # wraps around, as uint32 does
    jaxpr = jax.make_jaxpr(_batched(counted))(key, count).jaxpr
    assert _count(jaxpr, ("add",)) <= 2
    _assert_equal(jax.jit(_batched(counted))(key, count), counted(key, count))


def test_other_higher_order_primitives_are_bound_as_they_are():
    @jax.custom_jvp
    def soft(x):
        return jnp.log1p(jnp.exp(x))

    soft.defjvp(lambda primals, tangents: (soft(primals[0]), tangents[0]))

    def mixed(key, flag):
        a = jax.random.normal(jax.random.fold_in(key, 0), (3,))
        b = jax.lax.cond(flag > 0, lambda: a * 2, lambda: -a)
        c = jax.lax.scan(lambda carry, x: (carry + x, carry), 0.0, b)[1]
        d = soft(jax.random.uniform(jax.random.fold_in(key, 1), (3,)))
        return b, c, d, jax.nn.relu(a)

    key = jax.random.key(2)
    for flag in (1, -1):
        _assert_equal(jax.jit(_batched(mixed))(key, flag), jax.jit(mixed)(key, flag))


def test_effects_keep_their_order():
    seen = []

    def noisy(key):
        for i in range(3):
            jax.debug.callback(lambda i: seen.append(int(i)), i, ordered=True)
            key = jax.random.fold_in(key, i)
        return jax.random.key_data(key)

    expected = noisy(jax.random.key(0))
    seen.clear()
    got = jax.jit(_batched(noisy))(jax.random.key(0))
    jax.effects_barrier()
    assert seen == [0, 1, 2]
    _assert_equal(got, expected)


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_keys_whose_bits_vmap_changes_are_drawn_one_by_one(impl):
    def draws(key):
        keys = [jax.random.fold_in(key, i) for i in range(3)]
        return [jax.random.normal(k, (4,)) for k in keys]

    key = jax.random.key(0, impl=impl)
    _assert_equal(jax.jit(_batched(draws))(key), jax.jit(draws)(key))
