"""`pytree_nn.dtypes`: the dtype a layer computes in, with Flax NNX's signatures."""

import jax.numpy as jnp
import pytest

from pytree_nn import dtypes


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ((jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.float32)), jnp.float32),
        ((jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.bfloat16)), jnp.bfloat16),
        ((jnp.ones(2, jnp.int32),), jnp.float32),  # integers: at least float32
        ((jnp.ones(2, jnp.int8), jnp.ones(2, jnp.float16)), jnp.float16),
        ((jnp.ones(2, jnp.bool_),), jnp.float32),
        ((jnp.ones(2, jnp.complex64), jnp.ones(2)), jnp.complex64),
        ((jnp.ones(2, jnp.float16), None), jnp.float16),  # None ignored
    ],
)
def test_inferred_dtype_is_the_promoted_one_made_inexact(arrays, expected):
    assert dtypes.canonicalize_dtype(*arrays) == expected
    promoted = dtypes.promote_dtype(arrays)
    assert isinstance(promoted, tuple) and len(promoted) == len(arrays)
    for given, value in zip(arrays, promoted, strict=True):
        if given is None:
            assert value is None
        else:
            assert value.dtype == expected
            assert bool((value == 1).all())


def test_inexact_false_keeps_integers():
    assert dtypes.canonicalize_dtype(jnp.ones(2, jnp.int32), inexact=False) == jnp.int32
    (x,) = dtypes.promote_dtype((jnp.arange(3, dtype=jnp.int8),), inexact=False)
    assert x.dtype == jnp.int8


def test_a_given_dtype_wins_and_python_values_are_cast():
    x, y, bias = dtypes.promote_dtype((jnp.ones(2), 3.0, None), dtype=jnp.bfloat16)
    assert x.dtype == y.dtype == jnp.bfloat16 and bias is None
    assert float(y) == 3.0
    assert dtypes.canonicalize_dtype(jnp.ones(2, jnp.int32), dtype=jnp.float16) == jnp.float16


def test_errors_name_the_fix():
    with pytest.raises(
        ValueError, match=r"Dtype must be inexact: int32 .*give a floating dtype.*inexact=False"
    ):
        dtypes.canonicalize_dtype(jnp.ones(2), dtype=jnp.int32)
    with pytest.raises(ValueError, match=r"nothing to infer a dtype from.*give dtype="):
        dtypes.canonicalize_dtype(None)
    with pytest.raises(
        TypeError, match=r"one tuple, e.g. promote_dtype\(\(x, kernel\)\); got a list"
    ):
        dtypes.promote_dtype([jnp.ones(2)])
