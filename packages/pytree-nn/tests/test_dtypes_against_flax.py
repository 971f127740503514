"""`pytree_nn.dtypes` side by side with Flax NNX's `flax.nnx.nn.dtypes`."""

import jax.numpy as jnp
import pytest

from pytree_nn import dtypes

flax_dtypes = pytest.importorskip("flax.nnx.nn.dtypes")

CASES = [
    ((jnp.ones(2, jnp.bfloat16), jnp.ones(2)), {}),
    ((jnp.ones(2, jnp.int32),), {}),
    ((jnp.ones(2, jnp.int32),), {"inexact": False}),
    ((jnp.ones(2, jnp.uint8), jnp.ones(2, jnp.bfloat16)), {}),
    ((jnp.ones(2, jnp.bool_), None), {}),
    ((jnp.ones(2), 2.0, 3), {}),
    ((jnp.ones(2), None), {"dtype": jnp.float16}),
    ((jnp.ones(2, jnp.complex64), jnp.ones(2, jnp.float16)), {}),
]


@pytest.mark.parametrize(("args", "kwargs"), CASES)
def test_same_dtype_and_values_as_nnx(args, kwargs):
    assert dtypes.canonicalize_dtype(*args, **kwargs) == flax_dtypes.canonicalize_dtype(
        *args, **kwargs
    )
    ours = dtypes.promote_dtype(args, **kwargs)
    theirs = flax_dtypes.promote_dtype(args, **kwargs)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        if b is None:
            assert a is None
        else:
            assert a.dtype == b.dtype and bool((a == b).all())


def test_both_refuse_a_given_integer_dtype_when_inexact():
    with pytest.raises(ValueError):
        flax_dtypes.canonicalize_dtype(jnp.ones(2), dtype=jnp.int32)
    with pytest.raises(ValueError):
        dtypes.canonicalize_dtype(jnp.ones(2), dtype=jnp.int32)
