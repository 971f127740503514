"""`noinline`: one trace and one compilation of the function for any number of call sites,
the same values as the function itself, and every transform through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module
from pytree_transforms import (
    clear_caches,
    filter_grad,
    filter_jit,
    filter_vmap,
    noinline,
)


def field(params, y):
    for w, b in params:
        y = jnp.tanh(w @ y + b)
    return y


def make_params(width=4, depth=2):
    keys = jax.random.split(jax.random.key(0), depth)
    return [(jax.random.normal(k, (width, width)) / width, jnp.full(width, 0.1)) for k in keys]


def rk_step(vector_field, stages):
    def step(params, y):
        ks = []
        for i in range(stages):
            ks.append(vector_field(params, y + 0.1 * sum(ks) / max(i, 1) if ks else y))
        return y + 0.1 * sum(ks) / stages

    return step


class _BackendCompiles:
    """Counts XLA compilations (JAX reports each one to its monitoring listeners)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.count = 0

    def __call__(self, event, duration, **kwargs):
        if event == self.EVENT:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


@pytest.mark.parametrize("stages", [4, 12])
def test_body_is_traced_and_compiled_once_for_every_call_site(counting, stages):
    clear_caches()
    counted, traces = counting(field)
    step = jax.jit(rk_step(noinline(counted), stages))
    params, y = make_params(), jnp.linspace(-1.0, 1.0, 4)

    text = step.lower(params, y).as_text()
    assert len(traces) == 1
    # The caller's program holds one call per stage and none of the body's operations.
    assert text.count("stablehlo.custom_call") == stages
    assert "tanh" not in text and "dot_general" not in text

    with _BackendCompiles() as compiles:
        out = step(params, y)
    assert compiles.count == 2  # the step's program, and the body's own, once
    assert len(traces) == 1
    np.testing.assert_allclose(out, jax.jit(rk_step(field, stages))(params, y), rtol=1e-6)

    # Another caller with the same input shapes reuses the body's trace and executable.
    with _BackendCompiles() as compiles:
        jax.jit(rk_step(noinline(counted), 3))(params, y)
    assert compiles.count == 1 and len(traces) == 1


def test_same_values_as_the_function_eager_and_jitted():
    params, y = make_params(), jnp.linspace(-1.0, 1.0, 4)
    expected = field(params, y)
    fast = noinline(field)
    np.testing.assert_allclose(fast(params, y), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(fast)(params, y), expected, rtol=1e-6)
    np.testing.assert_allclose(filter_jit(fast)(params, y), expected, rtol=1e-6)


def test_non_array_arguments_are_static_and_key_the_trace(counting):
    counted, traces = counting(lambda x, scale, name: {name: scale * x})
    fast = noinline(counted)
    x = jnp.arange(3.0)
    assert fast(x, 2, "y")["y"].tolist() == [0.0, 2.0, 4.0]
    assert fast(x, 2, "y")["y"].tolist() == [0.0, 2.0, 4.0]
    assert len(traces) == 1
    assert fast(x, 3, "z")["z"].tolist() == [0.0, 3.0, 6.0]
    assert fast(x, 2.0, "y")["y"].tolist() == [0.0, 2.0, 4.0]  # 2.0 is not 2
    assert len(traces) == 3


def test_non_array_outputs_come_back_as_traced():
    fast = noinline(lambda x: (x + 1, "label", 3, None))
    out, label, three, none = filter_jit(fast)(jnp.int32(1))
    assert (int(out), label, three, none) == (2, "label", 3, None)
    assert noinline(lambda: "only static")() == "only static"


def test_dtypes_and_weak_types_are_the_function_s():
    def f(x, i):
        return x * 2, i + 1, x.astype(jnp.bfloat16)

    args = (jnp.asarray(1.0), jnp.int32(3))  # a weakly typed float, a strong int
    for got, want in zip(jax.jit(noinline(f))(*args), jax.jit(f)(*args), strict=True):
        assert jax.typeof(got) == jax.typeof(want)
        assert got.tolist() == want.tolist()


def test_grad_jvp_vmap_and_their_compositions_match_the_function():
    params, y = make_params(), jnp.linspace(-1.0, 1.0, 4)
    ys = jnp.stack([y, 2 * y, -y])
    fast = noinline(field)

    def loss(vector_field):
        return lambda p, y: jnp.sum(rk_step(vector_field, 2)(p, y) ** 2)

    def close(a, b):
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)

    close(jax.grad(loss(fast))(params, y), jax.grad(loss(field))(params, y))
    close(jax.jit(jax.grad(loss(fast), 1))(params, y), jax.grad(loss(field), 1)(params, y))
    close(
        jax.jvp(lambda y: fast(params, y), (y,), (ys[1],)),
        jax.jvp(lambda y: field(params, y), (y,), (ys[1],)),
    )
    close(jax.vmap(fast, (None, 0))(params, ys), jax.vmap(field, (None, 0))(params, ys))
    close(
        jax.jit(jax.vmap(jax.grad(loss(fast), 1), (None, 0)))(params, ys),
        jax.vmap(jax.grad(loss(field), 1), (None, 0))(params, ys),
    )
    close(jax.hessian(loss(fast), 1)(params, y), jax.hessian(loss(field), 1)(params, y))
    close(jax.jacfwd(fast, 1)(params, y), jax.jacfwd(field, 1)(params, y))
    close(filter_grad(loss(fast))(params, y), filter_grad(loss(field))(params, y))
    close(filter_vmap(fast, in_axes=(None, 0))(params, ys), jax.vmap(field, (None, 0))(params, ys))
    # A batch axis other than the first.
    close(jax.vmap(fast, (None, 1))(params, ys.T), jax.vmap(field, (None, 1))(params, ys.T))


def test_grad_through_scan_and_checkpoint():
    fast = noinline(lambda c, x: (c * jnp.cos(x) + x, jnp.sum(c)))

    def loss(xs):
        c, ys = jax.lax.scan(fast, jnp.ones(3), xs)
        return jnp.sum(c) + jnp.sum(ys)

    def reference(xs):
        c, ys = jax.lax.scan(lambda c, x: (c * jnp.cos(x) + x, jnp.sum(c)), jnp.ones(3), xs)
        return jnp.sum(c) + jnp.sum(ys)

    xs = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(jax.grad(loss)(xs), jax.grad(reference)(xs), rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(jax.checkpoint(loss))(xs), jax.grad(reference)(xs), rtol=1e-6
    )


def test_integer_inputs_and_outputs_under_grad():
    fast = noinline(lambda x, n: (x * n, n + 1))

    def loss(x):
        y, m = fast(x, jnp.int32(3))
        return jnp.sum(y) * m

    assert jax.grad(loss)(jnp.ones(2)).tolist() == [12.0, 12.0]
    assert jax.jit(jax.grad(loss))(jnp.ones(2)).tolist() == [12.0, 12.0]


class Scale(Module):
    weight: jax.Array

    def __call__(self, x):
        return self.weight * x

    @noinline
    def twice(self, x):
        return 2 * self.weight * x


def test_a_module_s_arrays_are_inputs(counting):
    model = Scale(jnp.array([1.0, 2.0]))
    fast = noinline(model)
    call = filter_jit(lambda m, x: m(x))
    assert call(fast, jnp.ones(2)).tolist() == [1.0, 2.0]
    # The wrapper is a pytree whose children are the Module's: a new weight is an input.
    assert jax.tree.leaves(fast)[0] is model.weight
    assert call(noinline(Scale(jnp.array([3.0, 4.0]))), jnp.ones(2)).tolist() == [3.0, 4.0]
    assert model.twice(jnp.ones(2)).tolist() == [2.0, 4.0]
    grad = jax.grad(lambda m: jnp.sum(m.twice(jnp.ones(2))))(model)
    assert grad.weight.tolist() == [2.0, 2.0]


def test_wrappers_of_one_function_are_equal_and_share_a_caller_s_trace(counting):
    def f(x):
        return x + 1

    assert noinline(f) == noinline(f) and hash(noinline(f)) == hash(noinline(f))
    assert noinline(f) != noinline(lambda x: x + 1)
    counted, traces = counting(lambda g, x: g(x))
    caller = filter_jit(counted)
    caller(noinline(f), jnp.ones(2))
    caller(noinline(f), jnp.ones(2))
    assert len(traces) == 1


def test_clear_caches_traces_again(counting):
    counted, traces = counting(lambda x: x + 1)
    fast = noinline(counted)
    fast(jnp.ones(2))
    fast(jnp.ones(2))
    assert len(traces) == 1
    clear_caches()
    fast(jnp.ones(2))
    assert len(traces) == 2


def test_refuses_what_is_not_callable():
    with pytest.raises(TypeError, match=r"noinline expects a function as `fn`.*noinline\(f\)"):
        noinline(jnp.ones(2))


def test_refuses_an_unhashable_static_argument_naming_it():
    class Unhashable:
        __hash__ = None

    fast = noinline(lambda x, options: x)
    with pytest.raises(TypeError, match=r"args\[1\]\[0\] is Unhashable.*not hashable"):
        fast(jnp.ones(2), [Unhashable()])


def test_refuses_a_closure_over_a_traced_value():
    @jax.jit
    def outer(y):
        return noinline(lambda x: x + y)(jnp.ones(2))

    with pytest.raises(ValueError, match=r"traced outside it.*pass that array as an argument"):
        outer(jnp.ones(2))
    # Closing over a concrete array is fine: it is a constant of the compiled function.
    z = jnp.arange(2.0)
    assert jax.jit(lambda x: noinline(lambda x: x + z)(x))(jnp.ones(2)).tolist() == [1.0, 2.0]


def test_nested_calls_cond_under_vmap_and_linear_transpose():
    inner = noinline(lambda x: jnp.sin(x) * x)
    outer = noinline(lambda x: inner(x) + inner(2 * x))

    def reference(x):
        return jnp.sin(x) * x + jnp.sin(2 * x) * 2 * x

    x = jnp.linspace(0.0, 1.0, 4)
    np.testing.assert_allclose(
        jax.jit(jax.grad(lambda x: outer(x).sum()))(x),
        jax.grad(lambda x: reference(x).sum())(x),
        rtol=1e-6,
    )
    # `lax.cond` with a batched predicate runs both branches on every element.
    branch = jax.vmap(lambda p, x: jax.lax.cond(p, outer, lambda x: -x, x))
    out = jax.jit(branch)(jnp.array([True, False]), jnp.ones((2, 4)))
    np.testing.assert_allclose(out[0], reference(jnp.ones(4)), rtol=1e-6)
    assert out[1].tolist() == [-1.0] * 4
    (transposed,) = jax.linear_transpose(noinline(lambda x: 3 * x), jnp.ones(2))(jnp.ones(2))
    assert transposed.tolist() == [3.0, 3.0]
