"""filter_jit's calls whose static leaves are functions, strings or ints: each value of them
gets a `jax.jit` of its own (JAX then hashes no static argument per call). What a user sees
must not change: one trace per value, the right result for each, errors naming the leaf."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module
from pytree_transforms import filter_jit


class Layer(Module):
    """Equinox style: the activation is a data field, a static (non-array) leaf."""

    weight: jax.Array
    activation: object


def _apply(layer, x):
    return layer.activation(x * layer.weight)


def test_each_activation_traces_once_and_gives_its_own_result(counting):
    fun, traces = counting(_apply)
    jitted = filter_jit(fun)
    x = jnp.array([-1.0, 2.0])
    relu, tanh = Layer(jnp.ones(2), jax.nn.relu), Layer(jnp.ones(2), jnp.tanh)
    for _ in range(3):
        assert jitted(relu, x).tolist() == [0.0, 2.0]
        assert jnp.allclose(jitted(tanh, x), jnp.tanh(x))
    assert len(traces) == 2


def test_many_static_values_all_work_and_each_traces_once(counting):
    # More values than get a `jax.jit` of their own: the rest go through the static
    # argument, with the same results and the same trace counts.
    fun, traces = counting(lambda x, name, times: x * len(name) * times)
    jitted = filter_jit(fun)
    names = [f"n{'x' * i}" for i in range(12)]
    for _ in range(2):
        for i, name in enumerate(names):
            assert float(jitted(jnp.array(1.0), name, i + 1)) == len(name) * (i + 1)
    assert len(traces) == len(names)


def test_ints_and_bools_of_equal_value_still_trace_apart(counting):
    # `1 == True` in Python: the plan's static types tell them apart, so a bool and an int
    # never share a compilation.
    fun, traces = counting(lambda x, flag: x + (10 if flag is True else 1))
    jitted = filter_jit(fun)
    assert float(jitted(jnp.array(0.0), 1)) == 1.0
    assert float(jitted(jnp.array(0.0), True)) == 10.0
    assert float(jitted(jnp.array(0.0), 1)) == 1.0
    assert len(traces) == 2


def test_an_unhashable_static_leaf_is_named():
    class Unhashable:
        __hash__ = None

        def __eq__(self, other):  # equal to everything: the diagnosis must not use ==
            return True

    jitted = filter_jit(lambda x, option: x + 1)
    with pytest.raises(TypeError, match=r"the leaf at args\[1\] is static .* Unhashable"):
        jitted(jnp.ones(2), Unhashable())


def test_a_retrace_for_a_new_static_value_is_explained(caplog):
    from pytree_transforms import explain_retraces

    jitted = filter_jit(lambda x, mode: x * (2 if mode == "double" else 3))
    with explain_retraces():
        jitted(jnp.ones(1), "double")
        jitted(jnp.ones(1), "triple")
    assert "'double' -> 'triple'" in caplog.text
