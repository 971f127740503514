"""filter_jit keys static values by type and value, recursively: `1`, `1.0` and `True` (and
`0.0` and `-0.0`) never share a compilation."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module, field
from pytree_transforms import filter_jit
from pytree_transforms._static_key import needs_static_key, static_key


def test_an_int_then_an_equal_float_gives_the_float_result():
    f = filter_jit(lambda n, x: x * 0 + n)
    x = jnp.ones(2, jnp.int32)
    assert f(1, x).dtype == jnp.int32
    assert f(1.0, x).dtype == jnp.float32


def test_true_is_not_one():
    f = filter_jit(lambda flag, x: x + (100 if flag is True else 1))
    x = jnp.zeros(1, jnp.int32)
    assert f(1, x).tolist() == [1]
    assert f(True, x).tolist() == [100]


def test_minus_zero_is_not_zero():
    f = filter_jit(lambda z, x: x + math.copysign(1.0, z))
    assert f(0.0, jnp.zeros(1)).tolist() == [1.0]
    assert f(-0.0, jnp.zeros(1)).tolist() == [-1.0]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (frozenset({1}), frozenset({1.0})),
        (np.float32(0.0), np.float32(-0.0)),
        (1 + 0j, 1.0),
        (complex(0.0, 0.0), complex(0.0, -0.0)),
    ],
)
def test_static_leaves_of_other_types_or_signs_retrace(first, second, counting):
    fun, traces = counting(lambda s, x: (x, s))
    f = filter_jit(fun, default=lambda v: isinstance(v, jnp.ndarray))
    _, out = f(first, jnp.ones(1))
    assert out is first or out == first
    _, out = f(second, jnp.ones(1))
    assert str(out) == str(second)  # not the first value, returned from its compilation
    assert len(traces) == 2


def test_containers_of_statics_are_keyed_by_their_elements_types(counting):
    # A prefix spec of `False` holds a whole tuple static, as one leaf.
    fun, traces = counting(lambda shape, x: (x, shape))
    f = filter_jit(fun, args=(False,))
    _, out = f((1, 2), jnp.ones(1))
    assert out == (1, 2)
    _, out = f((1.0, 2), jnp.ones(1))
    assert type(out[0]) is float
    _, out = f((True, 2), jnp.ones(1))
    assert out[0] is True
    assert len(traces) == 3


def test_equal_statics_still_share_one_compilation(counting):
    fun, traces = counting(lambda s, flag, name, x: x * s)
    f = filter_jit(fun)
    for _ in range(3):
        f(2.0, True, "a", jnp.ones(1))
        f(-0.0, False, "b", jnp.ones(1))
    f(float("nan"), False, "b", jnp.ones(1))
    f(float("nan"), False, "b", jnp.ones(1))  # another NaN object: still the same key
    assert len(traces) == 3


def test_module_static_fields_of_another_type_retrace():
    class Scale(Module):
        factor: float = field(static=True)

        def __call__(self, x):
            return x * 0 + self.factor

    f = filter_jit(lambda m, x: m(x))
    x = jnp.ones(1, jnp.int32)
    assert f(Scale(1), x).dtype == jnp.int32
    assert f(Scale(1.0), x).dtype == jnp.float32


def test_a_nan_of_the_other_sign_retraces(counting):
    # NaNs are compared by their bits: one NaN equals another with the same bits (no retrace),
    # but the sign of a NaN reaches the traced function (`copysign`), so it is another key.
    fun, traces = counting(lambda z, x: x + math.copysign(1.0, z))
    f = filter_jit(fun)
    nan = float("nan")
    assert f(nan, jnp.zeros(1)).tolist() == [1.0]
    assert f(-nan, jnp.zeros(1)).tolist() == [-1.0]
    assert f(float("nan"), jnp.zeros(1)).tolist() == [1.0]
    assert len(traces) == 2


@pytest.mark.parametrize(
    "value",
    [
        1,
        True,
        "a",
        b"a",
        None,
        len,
        np.int32(3),
        0.5,
        np.float64(0.5),
        np.float32(0.5),
        1j,
        (1,),
        [1],
        {"a": 1},
        {1},
        frozenset({1}),
    ],
    ids=repr,
)
def test_values_not_keyed_by_contents_are_keyed_as_they_are(value):
    # filter_jit passes static leaves of the other types to JAX as they are: they must be
    # exactly the values `static_key` keys as `(type, value)`.
    if not needs_static_key([type(value)]):
        assert static_key(value) == (type(value), value)
    else:
        assert static_key(value) != (type(value), value)
