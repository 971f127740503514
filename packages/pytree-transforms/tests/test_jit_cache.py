"""filter_jit wrappers built around one function with equal options share compilations."""

import concurrent.futures
import gc
import weakref

import jax.numpy as jnp

from pytree_module import Module
from pytree_transforms import filter_grad, filter_jit


def test_a_wrapper_built_in_a_loop_traces_once(counting):
    fun, traces = counting(lambda x, n: x * n)
    for _ in range(5):
        filter_jit(fun)(jnp.ones(2), 3)  # a static argument: the filtered path
        filter_jit(fun)(jnp.ones(2), jnp.ones(2))  # arrays only: the direct path
    assert len(traces) == 2


def test_equal_options_share_and_other_options_do_not(counting):
    fun, traces = counting(lambda x: x + 1)
    filter_jit(fun, args=(True,))(1)
    filter_jit(fun, args=(True,))(1)
    assert len(traces) == 1
    filter_jit(fun, args=(False,))(1)
    filter_jit(fun, donate="all")(jnp.ones(1))
    filter_jit(fun, inline=True)(jnp.ones(1))
    assert len(traces) == 4


def test_callables_that_compare_equal_share_compilations():
    traces = []

    class Scaled:
        def __init__(self, factor):
            self.factor = factor

        def __call__(self, x):
            traces.append(1)
            return x * self.factor

        def __eq__(self, other):
            return type(other) is Scaled and other.factor == self.factor

        def __hash__(self):
            return hash(self.factor)

    for _ in range(3):
        assert filter_jit(Scaled(2))(jnp.ones(1)).tolist() == [2.0]
    assert len(traces) == 1
    filter_jit(Scaled(3))(jnp.ones(1))
    assert len(traces) == 2


def test_bound_methods_of_one_module_share_compilations():
    traces = []

    class Model(Module):
        def __init__(self, scale=1.0):
            self.w = jnp.ones(2) * scale

        def apply(self, x):
            traces.append(1)
            return self.w * x

    model = Model()
    for _ in range(3):
        filter_jit(model.apply)(jnp.ones(2))
    assert len(traces) == 1
    # Another instance of the same structure: its arrays are inputs, nothing is traced.
    assert filter_jit(Model(3.0).apply)(jnp.ones(2)).tolist() == [3.0, 3.0]
    assert len(traces) == 1


def _dense_class():
    """A new Module class (no compilation of it exists yet) and the list of its traces."""
    traces = []

    class Dense(Module):
        def __init__(self, width, scale=1.0, activation=jnp.tanh):
            self.w = jnp.full(width, scale)
            self.activation = activation

        def __call__(self, x):
            traces.append(1)
            return self.activation(self.w * x)

    return Dense, traces


def test_a_new_instance_of_a_module_as_the_function_traces_once():
    Dense, traces = _dense_class()
    for scale in (1.0, 2.0, 3.0):  # the model after each update: a new instance
        out = filter_jit(Dense(2, scale))(jnp.ones(2))
        assert out.tolist() == jnp.tanh(jnp.full(2, scale)).tolist()  # its own arrays
    assert len(traces) == 1
    # What keys the compilation is the structure: static parts and shapes.
    filter_jit(Dense(2, activation=jnp.sin))(jnp.ones(2))
    assert len(traces) == 2
    filter_jit(Dense(3))(jnp.ones(3))
    assert len(traces) == 3
    # Wrapped again in a transform of the Module (filter_grad's is a pytree of it).
    loss = lambda m, x: jnp.sum(m(x))  # noqa: E731
    for scale in (1.0, 2.0):
        filter_jit(filter_grad(loss))(Dense(2, scale), jnp.ones(2))
    assert len(traces) == 4


def test_wrappers_of_modules_compare_equal_for_the_same_module_only():
    Dense, _ = _dense_class()
    a, b = Dense(2), Dense(2)
    assert filter_jit(a) == filter_jit(a)
    assert hash(filter_jit(a)) == hash(filter_jit(a))
    assert filter_jit(a) != filter_jit(b)  # Modules compare by identity
    assert filter_jit(a) != filter_jit(a, donate="all")
    assert filter_jit(a.__call__) == filter_jit(a.__call__)


def test_the_shared_compilations_keep_no_instance_alive():
    Dense, traces = _dense_class()
    model = Dense(2)
    filter_jit(model)(jnp.ones(2))
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
    # ...and are still found by the next instance.
    before = len(traces)
    filter_jit(Dense(2, 5.0))(jnp.ones(2))
    assert len(traces) == before


def test_filter_jit_of_filter_grad_built_twice_shares_compilations(counting):
    fun, traces = counting(lambda x: jnp.sum(x**2))
    for _ in range(3):
        filter_jit(filter_grad(fun))(jnp.ones(2))
    assert len(traces) == 1


def test_unhashable_functions_get_wrappers_of_their_own():
    class Unhashable:
        __hash__ = None

        def __call__(self, x):
            return x + 1

    fun = Unhashable()
    assert filter_jit(fun)(jnp.ones(1)).tolist() == [2.0]
    assert filter_jit(fun) is not filter_jit(fun)


def test_options_that_are_dicts_are_compared_by_content(counting):
    fun, traces = counting(lambda p: p["x"] + 1)
    for _ in range(2):
        assert filter_jit(fun, args=({"x": True},))({"x": 1}) == 2
    assert len(traces) == 1


def test_functions_are_not_kept_alive_for_ever():
    def make():
        return lambda x: x * 2

    fun = make()
    ref = weakref.ref(fun)
    filter_jit(fun)(jnp.ones(1))
    del fun
    for _ in range(100):  # other functions push it out of the recent ones
        filter_jit(make())
    gc.collect()
    assert ref() is None


def test_one_wrapper_called_from_several_threads_gives_each_its_own_result(counting):
    fun, traces = counting(lambda x, n: x * n)
    jitted = filter_jit(fun)

    def work(n):
        return [float(jitted(jnp.ones(()), n)) for _ in range(20)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(8)))
    assert results == [[float(n)] * 20 for n in range(8)]
    assert 8 <= len(traces) <= 16  # one trace per static value, a few more if threads raced


def test_keyword_options_in_another_order_share_compilations(counting):
    fun, traces = counting(lambda x: x + 1)
    filter_jit(fun, inline=True, keep_unused=True)(jnp.ones(1))
    filter_jit(fun, keep_unused=True, inline=True)(jnp.ones(1))
    assert len(traces) == 1
    grads = filter_grad(fun, holomorphic=False, allow_int=True)
    assert grads == filter_grad(fun, allow_int=True, holomorphic=False)
