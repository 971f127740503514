"""`noinline` side by side with `equinox.internal.noinline` (skipped without Equinox)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")

from pytree_transforms import filter_jit, noinline  # noqa: E402

NOINLINES = [noinline, eqx.internal.noinline]


def same(a, b, weak_types=True):
    """Equal structure, values, dtypes and (unless told otherwise) weak types."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert type(u) is type(v) or (isinstance(u, jax.Array) and isinstance(v, jax.Array))
        if isinstance(u, jax.Array):
            assert u.dtype == v.dtype and u.shape == v.shape
            assert not weak_types or jax.typeof(u).weak_type == jax.typeof(v).weak_type
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


@pytest.fixture
def mlp():
    return eqx.nn.MLP(2, 2, 64, 2, key=jr.key(0))


def test_plain_calls_give_what_equinox_gives():
    ours, theirs = (ni(lambda x: x + 1) for ni in NOINLINES)
    same(ours(1), theirs(1))  # no array: the function is simply called
    same(ours(jnp.array(1)), theirs(jnp.array(1)))
    x = jnp.array(1.0)  # weakly typed
    # Equinox's results lose the weak type under jit; `noinline`'s keep the function's.
    same(eqx.filter_jit(ours)(x), eqx.filter_jit(theirs)(x), weak_types=False)
    same(filter_jit(ours)(x), eqx.filter_jit(theirs)(x), weak_types=False)
    same(filter_jit(ours)(x), x + 1)
    assert not jax.typeof(eqx.filter_jit(theirs)(x)).weak_type


def test_an_equinox_mlp_under_each_transform(mlp):
    x, t = jr.normal(jr.key(1), (2,)), jr.normal(jr.key(2), (2,))
    xs = jr.normal(jr.key(3), (5, 2))
    ours, theirs = (ni(mlp) for ni in NOINLINES)
    for transform, args in [
        (lambda f: f, (x,)),
        (lambda f: lambda xs: jax.vmap(f)(xs), (xs,)),
        (lambda f: lambda x, t: jax.jvp(f, (x,), (t,)), (x, t)),
        (lambda f: jax.grad(lambda x: jnp.sum(f(x))), (x,)),
    ]:
        expected = transform(mlp)(*args)
        for wrapped in (transform(ours), eqx.filter_jit(transform(ours))):
            same(wrapped(*args), expected)
        same(
            eqx.filter_jit(transform(ours))(*args),
            eqx.filter_jit(transform(theirs))(*args),
            weak_types=False,
        )


def test_jit_vmap_grad_of_repeated_calls(mlp):
    def call(f, x):
        return f(x + 1)

    def run(call):
        @jax.jit
        @jax.vmap
        @jax.grad
        def run(x):
            x = x[None]
            y = call(mlp, x)
            z = call(mlp, y)
            w = call(mlp, z)
            (out,) = w[:1] * x
            return out

        return run

    mlp = eqx.nn.MLP(1, 1, 16, 2, key=jr.key(4))
    xs = jnp.array([1.0, 2.0, 3.0])
    expected = run(call)(xs)
    for ni in NOINLINES:
        same(run(ni(call))(xs), expected, weak_types=False)


def test_function_arguments_are_static_as_in_equinox():
    results = []
    for ni in NOINLINES:
        fn = eqx.filter_jit(ni(lambda f, x: f(x[0][0])))
        results.append((fn(lambda x: x + 1, [(1,)]), fn(lambda x: x + 1, ([jnp.array(1)],))))
    same(*results, weak_types=False)


def test_traces_once_where_equinox_traces_twice():
    # Equinox traces the function once for its output shape and once more to compile it;
    # `noinline` compiles the jaxpr it traced for the shape.
    def count_traces(ni):
        traces = []

        @ni
        def fn(x):
            traces.append(1)
            return x * 2

        g = jax.jit(lambda x: fn(x) + fn(x) + fn(x) + fn(x))
        assert g(1).tolist() == 8
        return len(traces)

    assert [count_traces(ni) for ni in NOINLINES] == [1, 2]


@pytest.mark.parametrize("ni", NOINLINES)
def test_swapping_functions_that_share_an_abstract_fn_as_equinox_does(ni):
    traces = {"f": 0, "g": 0, "call": 0}

    def abstract(_, x, y):
        return jnp.broadcast_arrays(x, y)[0]

    def f(x, y):
        traces["f"] += 1
        return x + y

    def g(x, y):
        traces["g"] += 1
        return x * y

    f_fast, g_fast = ni(f, abstract), ni(g, abstract)

    @jax.jit
    def call(fn, x, y):
        traces["call"] += 1
        return fn(x, y)

    same(call(f_fast, 2, 3), jnp.array(5), weak_types=False)
    same(call(g_fast, 2, 3), jnp.array(6), weak_types=False)
    assert traces == {"f": 1, "g": 1, "call": 1}
    x = jnp.float32(0.5)
    grads = [jax.grad(lambda a, fn=fn: call(fn, a, jnp.sin(a)))(x) for fn in (f_fast, g_fast)]
    same(grads[0], 1 + jnp.cos(x))
    same(grads[1], jnp.sin(x) + x * jnp.cos(x))
