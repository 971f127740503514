"""filter_pure_callback: pytrees across the callback boundary, eagerly, jitted and vmapped."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from runtime_checks import assert_check_fails

from pytree_module import Module
from pytree_transforms import filter_jit, filter_pure_callback, filter_vmap


class Scale(Module):
    factor: jax.Array
    label: str


def host_scale(model, x, *, offset):
    assert isinstance(model.factor, np.ndarray) and isinstance(x["v"], np.ndarray)
    assert model.label == "scale" and x["tag"] == "t"
    return {"y": model.factor * x["v"] + offset, "count": np.int32(x["v"].size), "note": "ok"}


def call(model, v, offset=1.0):
    shapes = {
        "y": jax.ShapeDtypeStruct(v.shape, v.dtype),
        "count": jax.ShapeDtypeStruct((), jnp.int32),
        "note": "ok",
    }
    return filter_pure_callback(
        host_scale,
        model,
        {"v": v, "tag": "t"},
        offset=offset,
        result_shape_dtypes=shapes,
        vmap_method="sequential",
    )


def test_eager():
    out = call(Scale(jnp.array(2.0), "scale"), jnp.arange(3.0))
    assert out["y"].tolist() == [1.0, 3.0, 5.0]
    assert isinstance(out["y"], jax.Array)
    assert int(out["count"]) == 3
    assert out["note"] == "ok"


def test_under_jit():
    y = jax.jit(lambda f, v: call(Scale(f, "scale"), v)["y"])(jnp.array(2.0), jnp.arange(3.0))
    assert y.tolist() == [1.0, 3.0, 5.0]
    out = filter_jit(call)(Scale(jnp.array(3.0), "scale"), jnp.ones(2), offset=0.5)
    assert out["y"].tolist() == [3.5, 3.5]
    assert out["note"] == "ok"


def test_under_vmap_sequential():
    calls = []

    def host(x, name):
        calls.append(x.shape)
        return {"sum": np.sum(x).astype(x.dtype), "name": name}

    def f(x):
        spec = {"sum": jax.ShapeDtypeStruct((), x.dtype), "name": "n"}
        return filter_pure_callback(
            host, x, "n", result_shape_dtypes=spec, vmap_method="sequential"
        )

    out = filter_jit(filter_vmap(f))(jnp.arange(6.0).reshape(3, 2))
    assert out["sum"].tolist() == [1.0, 5.0, 9.0]
    assert out["name"] == "n"
    assert calls == [(2,)] * 3


def test_vmap_method_expand_dims():
    def host(x, power):
        return x**power

    def f(x):
        return filter_pure_callback(
            host,
            x,
            2,
            result_shape_dtypes=jax.ShapeDtypeStruct(x.shape, x.dtype),
            vmap_method="expand_dims",
        )

    assert jax.vmap(f)(jnp.arange(3.0)).tolist() == [0.0, 1.0, 4.0]


def test_a_callable_pytree_as_callback():
    class Shift(Module):
        amount: jax.Array

        def __call__(self, x):
            assert isinstance(self.amount, np.ndarray)
            return x + self.amount

    shift = Shift(jnp.array([1.0, 2.0]))
    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    out = jax.jit(lambda s, x: filter_pure_callback(s, x, result_shape_dtypes=spec))(
        shift, jnp.ones(2)
    )
    assert out.tolist() == [2.0, 3.0]


def test_result_dtype_is_cast_within_its_kind():
    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    out = filter_pure_callback(lambda: np.ones(2, np.float64), result_shape_dtypes=spec)
    assert out.dtype == jnp.float32


def test_errors():
    spec = {"y": jax.ShapeDtypeStruct((2,), jnp.float32), "note": "ok"}
    # The result is checked inside the callback, which runs as a program on the default
    # device: on an accelerator the error surfaces when the result is waited for.
    results = [
        (np.ones(2, np.float32), "has structure"),
        ({"y": np.ones(2, np.float32), "note": "other"}, r"at \['note'\] of its result"),
        ({"y": np.ones(3, np.float32), "note": "ok"}, r"at \['y'\] of its result .* float32\[3\]"),
    ]
    for result, match in results:
        call = functools.partial(filter_pure_callback, lambda r=result: r, result_shape_dtypes=spec)
        assert_check_fails(call, match, Exception)
    with pytest.raises(TypeError, match="vmap_method"):
        filter_pure_callback(lambda: 1, result_shape_dtypes=spec, vectorized=True)
    with pytest.raises(TypeError, match="expects a callable"):
        filter_pure_callback(3, result_shape_dtypes=spec)
