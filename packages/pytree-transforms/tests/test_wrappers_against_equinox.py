"""Side by side with Equinox: a Module as `filter_jit`'s function traces once for every
instance of one structure, and wrappers made again compare equal and share compilations."""

import jax
import jax.numpy as jnp
import pytest

eqx = pytest.importorskip("equinox")

import pytree_module as pm  # noqa: E402
import pytree_transforms as pt  # noqa: E402

LIBS = pytest.mark.parametrize("lib", [pt, eqx], ids=["ours", "equinox"])


def _model_class(lib, traces):
    """A Module class of `lib` whose call records each trace."""
    if lib is eqx:

        class Model(eqx.Module):
            w: jax.Array

            def __call__(self, x):
                traces.append(1)
                return jnp.sum(self.w * x)

    else:

        class Model(pm.Module):
            def __init__(self, w):
                self.w = w

            def __call__(self, x):
                traces.append(1)
                return jnp.sum(self.w * x)

    return Model


@LIBS
def test_a_new_instance_as_the_function_traces_once(lib):
    traces = []
    model_class = _model_class(lib, traces)
    outs = [
        float(lib.filter_jit(model_class(jnp.full(2, w)))(jnp.ones(2))) for w in (1.0, 2.0, 3.0)
    ]
    assert outs == [2.0, 4.0, 6.0]
    assert len(traces) == 1
    lib.filter_jit(model_class(jnp.ones(3)))(jnp.ones(3))  # another shape: traced again
    assert len(traces) == 2


@LIBS
@pytest.mark.parametrize(
    "transform", ["filter_vmap", "filter_grad", "filter_value_and_grad", "filter_checkpoint"]
)
def test_jit_of_a_transform_of_a_new_instance_traces_once(lib, transform):
    traces = []
    model_class = _model_class(lib, traces)
    wrap = getattr(lib, transform)
    for w in (1.0, 2.0):
        lib.filter_jit(wrap(model_class(jnp.full(2, w))))(jnp.ones(2))
    assert len(traces) == 1


def _double(x):
    return 2 * x


@LIBS
@pytest.mark.parametrize(
    "transform",
    [
        "filter_jit",
        "filter_vmap",
        "filter_pmap",
        "filter_grad",
        "filter_value_and_grad",
        "filter_checkpoint",
    ],
)
def test_wrappers_made_twice_compare_equal(lib, transform):
    wrap = getattr(lib, transform)
    assert wrap(_double) == wrap(_double)
    assert wrap(_double) != wrap(lambda x: 2 * x)


@LIBS
def test_jit_of_filter_vmap_made_twice_traces_once(lib):
    traces = []

    def f(x):
        traces.append(1)
        return 2 * x

    for _ in range(3):
        lib.filter_jit(lib.filter_vmap(f))(jnp.ones(3))
    assert len(traces) == 1
