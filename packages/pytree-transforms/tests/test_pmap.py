"""filter_pmap across (fake) CPU devices."""

import gc
import weakref

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module
from pytree_transforms import filter_pmap, if_array

N = jax.local_device_count()


def test_split_broadcast_and_static():
    traces = []

    @filter_pmap(args=(0, None))
    def f(x, y, scale):
        traces.append(1)
        return x * y * scale, "done"

    out, label = f(jnp.ones((N, 3)), jnp.full(3, 2.0), 3)
    assert out.shape == (N, 3) and float(out[0, 0]) == 6.0 and label == "done"
    f(jnp.ones((N, 3)), jnp.full(3, 2.0), 3)
    assert len(traces) == 1  # cached
    f(jnp.ones((N, 3)), jnp.full(3, 2.0), 4)
    assert len(traces) == 2  # static input changed


def test_collectives_and_modules():
    class Scale(Module):
        def __init__(self):
            self.s = jnp.full((N,), 2.0)
            self.label = "scale"

    @filter_pmap(axis_name="devices")
    def mean_scaled(model, x):
        return jax.lax.pmean(model.s * x, "devices")

    out = mean_scaled(Scale(), jnp.arange(float(N)))
    assert jnp.allclose(out, jnp.full(N, 2.0 * (N - 1) / 2))


@pytest.mark.skipif(N < 2, reason="needs several devices")
def test_several_devices():
    out = filter_pmap(lambda x: x + jax.lax.axis_index("i"), axis_name="i")(jnp.zeros(N))
    assert out.tolist() == list(range(N))


def test_no_mapped_input_with_axis_size():
    out = filter_pmap(lambda x: x * 2, in_axes=None, axis_size=1)(jnp.ones(2))
    assert out.shape == (1, 2) and out.tolist() == [[2.0, 2.0]]
    assert filter_pmap(lambda: 1.5, axis_size=1, out_axes=0)().tolist() == [1.5]


def test_outputs_given_an_axis_are_broadcast_along_it():
    out = filter_pmap(lambda x: (x, 1.5, jnp.ones(2)), out_axes=0)(jnp.ones(N))
    assert out[1].tolist() == [1.5] * N and out[2].shape == (N, 2)


def test_wrappers_around_one_function_share_compilations():
    traces = []

    def double(x):
        traces.append(1)
        return x * 2

    for _ in range(3):
        assert filter_pmap(double)(jnp.ones(N)).tolist() == [2.0] * N
    assert len(traces) == 1
    filter_pmap(double, out_axes=if_array(0))(jnp.ones(N))  # an equal `out_axes`
    assert len(traces) == 1
    filter_pmap(double, axis_name="i")(jnp.ones(N))  # other options: compiled again
    assert len(traces) == 2
    for _ in range(2):
        filter_pmap(double, devices=jax.local_devices()[:N])(jnp.ones(N))
    assert len(traces) == 3

    class Unhashable:
        __hash__ = None

        def __call__(self, leaf):
            return 0

    # Options that cannot key a cache get a cache per wrapper.
    for _ in range(2):
        filter_pmap(double, out_axes=Unhashable())(jnp.ones(N))
    assert len(traces) == 5


def test_compilation_cache_does_not_keep_the_function_alive():
    def double(x):
        return x * 2

    wrapper = filter_pmap(double)
    wrapper(jnp.ones(N))
    ref = weakref.ref(double)
    del double, wrapper
    gc.collect()
    assert ref() is None


def test_errors():
    with pytest.raises(TypeError, match="static_broadcasted_argnums"):
        filter_pmap(lambda x: x, static_broadcasted_argnums=0)
    with pytest.raises(TypeError, match="expects a function"):
        filter_pmap(3)
    with pytest.raises(ValueError, match="number of devices to run on is unknown"):
        filter_pmap(lambda x: x, in_axes=None)(jnp.ones(2))
    with pytest.raises(TypeError, match=r"axis_size=\.\.\.\) must be a positive int"):
        filter_pmap(lambda x: x, axis_size=0)
    with pytest.raises(
        ValueError, match=r"args\[0\] is an array of shape \(\), which has no axis 0"
    ):
        filter_pmap(lambda x: x)(jnp.array(1.0))
