"""The four leaf predicates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_filter import is_array, is_array_like, is_inexact_array, is_inexact_array_like


class HasJaxArray:
    def __init__(self, value):
        self.value = value

    def __jax_array__(self):
        return jnp.asarray(self.value)


CASES = [
    # value, is_array, is_array_like, is_inexact_array, is_inexact_array_like
    (jnp.zeros(2), True, True, True, True),
    (jnp.zeros(2, jnp.int32), True, True, False, False),
    (jnp.zeros(2, jnp.bfloat16), True, True, True, True),
    (jnp.zeros(2, jnp.complex64), True, True, True, True),
    (np.zeros(2), True, True, True, True),
    (np.float32(1.0), True, True, True, True),
    (np.int8(1), True, True, False, False),
    (1.0, False, True, False, True),
    (1j, False, True, False, True),
    (1, False, True, False, False),
    (True, False, True, False, False),
    ("text", False, False, False, False),
    (None, False, False, False, False),
    (jnp.float32, False, False, False, False),
    (HasJaxArray(1.0), False, True, False, True),
    (HasJaxArray(1), False, True, False, False),
]


@pytest.mark.parametrize("value, array, array_like, inexact, inexact_like", CASES)
def test_predicates(value, array, array_like, inexact, inexact_like):
    assert is_array(value) is array
    assert is_array_like(value) is array_like
    assert is_inexact_array(value) is inexact
    assert is_inexact_array_like(value) is inexact_like


def test_tracers_are_arrays():
    seen = []

    @jax.jit
    def f(x, n):
        seen.append(
            (is_array(x), is_inexact_array(x), is_inexact_array(n), is_inexact_array_like(x))
        )
        seen.append((is_array_like(x), is_inexact_array_like(n)))
        return x

    f(jnp.ones(2), jnp.ones(2, jnp.int32))
    assert seen == [(True, True, False, True), (True, False)]


def test_partition_mask_agrees_with_the_predicate_inside_and_outside_traces():
    from pytree_filter import partition

    tree = [jnp.ones(1), 1.0, "s", np.zeros(1), np.int8(1), None]
    kept, _ = partition(tree, is_array)
    assert [x is not None for x in kept] == [True, False, False, True, True, False]

    @jax.jit
    def f(x):
        inner, rest = partition([x, 2.0], is_array)
        assert inner[1] is None and rest[0] is None
        return inner[0]

    assert f(jnp.ones(2)).shape == (2,)
