"""filter_pmap across (fake) CPU devices."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module
from pytree_transforms import filter_pmap

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


def test_errors():
    with pytest.raises(TypeError, match="static_broadcasted_argnums"):
        filter_pmap(lambda x: x, static_broadcasted_argnums=0)
    with pytest.raises(TypeError, match="expects a function"):
        filter_pmap(3)
