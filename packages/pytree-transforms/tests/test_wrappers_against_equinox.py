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
def test_filter_pmap_of_a_new_instance_compiles_no_more(lib):
    traces = []
    model_class = _model_class(lib, traces)
    n = jax.local_device_count()
    lib.filter_pmap(model_class(jnp.full(2, 1.0)))(jnp.ones((n, 2)))
    first = len(traces)  # Equinox traces its first call twice
    for w in (2.0, 3.0):
        out = lib.filter_pmap(model_class(jnp.full(2, w)))(jnp.ones((n, 2)))
        assert out.tolist() == [2 * w] * n
    assert len(traces) == first


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


def _closure_to_pytree(lib):
    return lib.closure_to_pytree if lib is pt else eqx.internal.closure_to_pytree


def _make_update(lr):
    rate = jnp.asarray(lr)
    count = 3

    def update(params):
        return params - rate * params * count

    return update


@LIBS
def test_closure_to_pytree_makes_captured_arrays_leaves(lib):
    converted = _closure_to_pytree(lib)({"update": _make_update(0.5), "n": 1})
    arrays = [x.tolist() for x in jax.tree.leaves(converted) if isinstance(x, jax.Array)]
    assert arrays == [0.5]
    assert 3 in jax.tree.leaves(converted)  # captured numbers are leaves too
    assert converted["update"](jnp.ones(2)).tolist() == [-0.5, -0.5]


@LIBS
def test_filter_jit_of_converted_closures_traces_once(lib):
    traces = []

    @lib.filter_jit
    def apply(update, params):
        traces.append(1)
        return update(params)

    outs = [
        apply(_closure_to_pytree(lib)(_make_update(lr)), jnp.ones(1)).tolist() for lr in (0.25, 0.5)
    ]
    assert outs == [[0.25], [-0.5]]
    assert len(traces) == 1


@LIBS
def test_closure_convert_out_struct(lib):
    converted = lib.filter_closure_convert(
        lambda x, tag: ({"y": 2 * x, "tag": tag}, x.astype(jnp.int32)), jnp.ones(3), "t"
    )
    out = converted.out_struct
    assert out[0]["tag"] == "t"
    assert (out[0]["y"].shape, out[0]["y"].dtype) == ((3,), jnp.float32)
    assert (out[1].shape, out[1].dtype) == ((3,), jnp.int32)
    (x, tag), kwargs = converted.in_struct
    assert ((x.shape, x.dtype), tag, kwargs) == (((3,), jnp.float32), "t", {})
