"""Tree mode and `graph_updates=False`, side by side with Flax NNX 0.12: the same snippets
on `nnx` and on `pytree_graph`, comparing results and exception classes."""

import warnings

import jax
import jax.numpy as jnp
import pytest

nnx = pytest.importorskip("flax.nnx")

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402

TREE = {"graph": False}
VALUES_ONLY = {"graph": True, "graph_updates": False}
MODES = [pytest.param(TREE, id="tree"), pytest.param(VALUES_ONLY, id="values_only")]


@pytest.fixture(autouse=True)
def _quiet():
    # NNX 0.12 warns on `.value`; the snippets use it on both libraries.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _classes(lib, base):
    class Counter(base):
        def __init__(self, n=()):
            self.w = lib.Param(jnp.ones((*n, 2)))
            self.count = lib.Variable(jnp.zeros(n))

        def __call__(self, x):
            self.count.value += 1
            return x * self.w.value

    class Tied(base):
        def __init__(self):
            self.encoder = lib.Param(jnp.ones(2))
            self.decoder = self.encoder

    class Floats(base):
        def __init__(self):
            self.w = lib.Param(jnp.array([1.0, 2.0]))
            self.stat = lib.BatchStat(jnp.array(0.0))

        def __call__(self, x):
            self.stat.value = self.stat.value + 1.0
            return (x * self.w.value).sum()

    return Counter, Tied, Floats


LIBS = {"nnx": (nnx, nnx.Module), "pg": (pg, Module)}


def _both(snippet):
    """Run `snippet(lib, Counter, Tied, Floats)` on both libraries: (result or exception
    class) per library."""
    results = {}
    for name, (lib, base) in LIBS.items():
        try:
            results[name] = snippet(lib, *_classes(lib, base))
        except Exception as error:  # compared by class below
            results[name] = error
    return results


def _same_exception(results):
    nnx_error, pg_error = results["nnx"], results["pg"]
    assert isinstance(nnx_error, Exception), nnx_error
    assert type(pg_error) is type(nnx_error), (pg_error, nnx_error)
    return nnx_error, pg_error


@pytest.mark.parametrize("modes", MODES)
def test_jit_writes_values_back_and_not_structure(modes):
    def snippet(lib, Counter, Tied, Floats):
        m = Counter()

        def grow(m, x):
            m.count.value += 1
            m.extra = lib.Param(jnp.zeros(1))
            return x * m.w.value

        f = lib.jit(grow, **modes)
        y = f(m, jnp.ones(2))
        f(m, jnp.ones(2))
        return y.tolist(), float(m.count.value), hasattr(m, "extra")

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == ([1.0, 1.0], 2.0, False)


def test_jit_tree_mode_refuses_a_tied_model_naming_both_paths():
    results = _both(lambda lib, C, Tied, F: lib.jit(lambda t: t.encoder.value, **TREE)(Tied()))
    nnx_error, pg_error = _same_exception(results)
    for error in (nnx_error, pg_error):
        assert "Duplicate" in str(error)
        assert "args[0].decoder" in str(error) and "args[0].encoder" in str(error)


@pytest.mark.parametrize("modes", MODES)
def test_jit_refuses_an_input_variable_returned(modes):
    _same_exception(_both(lambda lib, Counter, T, F: lib.jit(lambda m: m.w, **modes)(Counter())))


def test_jit_values_only_keeps_a_tied_model():
    def snippet(lib, C, Tied, F):
        t = Tied()

        def double(t):
            t.encoder.value = t.encoder.value * 2

        lib.jit(double, **VALUES_ONLY)(t)
        return t.decoder is t.encoder, t.decoder.value.tolist()

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == (True, [2.0, 2.0])


def test_jit_tree_mode_static_argnums():
    def snippet(lib, Counter, T, F):
        return lib.jit(lambda m, k: m.w.value * k, static_argnums=1, **TREE)(Counter(), 3).tolist()

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == [3.0, 3.0]


@pytest.mark.parametrize("modes", MODES)
def test_grad_is_module_shaped(modes):
    def snippet(lib, C, T, Floats):
        m = Floats()
        grads = lib.grad(lambda m, x: m(x), **modes)(m, jnp.array([3.0, 4.0]))
        return (
            type(grads).__name__,
            type(grads.w).__name__,
            grads.w.value.tolist(),
            type(grads.stat).__name__,
            float(grads.stat.value),
            float(m.stat.value),
        )

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == ("Floats", "Param", [3.0, 4.0], "BatchStat", 0.0, 1.0)


def test_grad_values_only_keeps_a_tied_model():
    def snippet(lib, C, Tied, F):
        loss = lambda t: (t.encoder.value * t.decoder.value).sum()  # noqa: E731
        grads = lib.grad(loss, **VALUES_ONLY)(Tied())
        return type(grads).__name__, grads.decoder is grads.encoder, grads.encoder.value.tolist()

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == ("Tied", True, [2.0, 2.0])


def test_grad_values_only_refuses_a_variable_in_a_differentiated_and_another_argument():
    def snippet(lib, C, Tied, F):
        t = Tied()
        return lib.grad(lambda t, w: (t.encoder.value * w.value).sum(), **VALUES_ONLY)(t, t.encoder)

    nnx_error, pg_error = _same_exception(_both(snippet))
    assert "Inconsistent aliasing" in str(nnx_error) and "Inconsistent aliasing" in str(pg_error)


def test_grad_tree_mode_refuses_a_tied_model():
    _same_exception(
        _both(lambda lib, C, Tied, F: lib.grad(lambda t: t.encoder.value.sum(), **TREE)(Tied()))
    )


@pytest.mark.parametrize("modes", MODES)
def test_value_and_grad_with_aux(modes):
    def snippet(lib, C, T, Floats):
        m = Floats()
        (loss, aux), grads = lib.value_and_grad(lambda m: (m(2.0), 7), has_aux=True, **modes)(m)
        return float(loss), aux, grads.w.value.tolist()

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == (6.0, 7, [2.0, 2.0])


def test_prefix_refusals():
    for snippet in (
        lambda lib, *_: lib.grad(lambda m: 0.0, argnums=lib.DiffState(0, lib.Param), **TREE),
        lambda lib, *_: lib.vmap(lambda m: m, in_axes=(lib.StateAxes({...: 0}),), **TREE),
    ):
        nnx_error, pg_error = _same_exception(_both(snippet))
        assert "cannot contain" in str(nnx_error) and "cannot contain" in str(pg_error)


@pytest.mark.parametrize("modes", MODES)
def test_vmap_writes_back_with_the_axis(modes):
    def snippet(lib, Counter, T, F):
        m = Counter((4,))
        y = lib.vmap(lambda m, x: m(x), **modes)(m, jnp.ones((4, 2)))
        return y.shape, m.count.value.tolist()

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == ((4, 2), [1.0] * 4)


def test_vmap_broadcast_write_of_a_batched_value_raises():
    def snippet(lib, Counter, T, F):
        def f(m, x):
            m.count.value = x.sum()
            return x

        return lib.vmap(f, in_axes=(None, 0), **TREE)(Counter(), jnp.ones((4, 2)))

    _same_exception(_both(snippet))


@pytest.mark.parametrize("modes", MODES)
def test_scan_carry_and_broadcast(modes):
    def snippet(lib, Counter, T, F):
        c = Counter()

        @lib.scan(in_axes=(lib.Carry, None, 0), out_axes=(lib.Carry, 0), **modes)
        def step(x, c, xi):
            c.count.value += 1
            return x + xi, x

        total, xs = step(jnp.array(0.0), c, jnp.arange(4.0))
        return float(total), xs.tolist(), float(c.count.value)

    results = _both(snippet)
    assert results["pg"] == results["nnx"]


@pytest.mark.parametrize("modes", MODES)
def test_scan_scanned_writes_are_stacked(modes):
    def snippet(lib, Counter, T, F):
        m = Counter((3,))

        @lib.scan(in_axes=(lib.Carry, 0), out_axes=lib.Carry, **modes)
        def forward(x, m):
            return m(x)

        y = forward(jnp.ones(2), m)
        return y.tolist(), m.count.value.tolist()

    results = _both(snippet)
    assert results["pg"] == results["nnx"]


@pytest.mark.parametrize("modes", MODES)
def test_loop_identity_errors(modes):
    for snippet in (
        lambda lib, Counter, T, F: lib.fori_loop(0, 2, lambda i, m: Counter(), Counter(), **modes),
        lambda lib, Counter, T, F: lib.scan(
            lambda c, x: (Counter(), x),
            in_axes=(lib.Carry, 0),
            out_axes=(lib.Carry, 0),
            **modes,
        )(Counter(), jnp.arange(3.0)),
    ):
        nnx_error, pg_error = _same_exception(_both(snippet))
        assert "Variable identity must be preserved across iterations" in str(nnx_error)
        assert "Variable identity must be preserved across iterations" in str(pg_error)


@pytest.mark.parametrize("modes", MODES)
def test_loops_write_the_carry_back(modes):
    def snippet(lib, Counter, T, F):
        m = Counter()

        def body(i, m):
            m.count.value += i
            return m

        out = lib.fori_loop(0, 4, body, m, **modes)
        first = float(m.count.value)

        def add(m):
            m.count.value += 5
            return m

        lib.while_loop(lambda m: m.count.value < 20, add, m, **modes)
        return out.count is m.count, first, float(m.count.value)

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == (True, 6.0, 21.0)


@pytest.mark.parametrize("modes", MODES)
def test_cond_and_switch(modes):
    def snippet(lib, Counter, T, F):
        m = Counter()
        skip = lambda m, x: x  # noqa: E731
        y = lib.cond(True, lambda m, x: m(x), skip, m, jnp.ones(2), **modes)
        lib.switch(1, [skip, lambda m, x: m(x)], m, jnp.ones(2), **modes)
        return y.tolist(), float(m.count.value)

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == ([1.0, 1.0], 2.0)


def test_cond_tree_mode_refuses_a_tied_operand():
    snippet = lambda lib, C, Tied, F: lib.cond(  # noqa: E731
        True, lambda t: None, lambda t: None, Tied(), **TREE
    )
    _same_exception(_both(snippet))


@pytest.mark.parametrize("modes", MODES)
def test_remat_and_eval_shape(modes):
    def snippet(lib, Counter, T, Floats):
        m = Floats()
        value = float(lib.remat(lambda m: m(2.0), **modes)(m))
        shape = lib.eval_shape(lambda: Counter((3,)), **modes).w.value.shape
        return value, float(m.stat.value), tuple(shape)

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == (6.0, 1.0, (3, 2))


def test_eval_shape_refuses_an_input_variable_returned():
    _same_exception(
        _both(lambda lib, Counter, T, F: lib.eval_shape(lambda m: m, Counter(), **TREE))
    )


def test_set_graph_mode_is_read_when_the_transform_is_built():
    def snippet(lib, Counter, Tied, F):
        with lib.set_graph_mode(False):
            f = lib.jit(lambda t: t.encoder.value)
        try:
            f(Tied())
        except ValueError:
            return "refused"
        return "ran"

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == "refused"


def test_compat_namespace_is_graph_mode():
    def snippet(lib, Counter, Tied, F):
        with lib.set_graph_mode(False):
            t = Tied()
            lib.compat.jit(lambda t: t.encoder.value)(t)
            return float(jax.numpy.sum(t.decoder.value))

    results = _both(snippet)
    assert results["pg"] == results["nnx"] == 2.0


@pytest.mark.parametrize("modes", MODES)
def test_vjp_and_jvp(modes):
    def snippet(lib, C, T, Floats):
        m = Floats()
        out, vjp_fn = lib.vjp(lambda m, x: m(x), m, jnp.array([3.0, 4.0]), **modes)
        grads, gx = vjp_fn(jnp.array(1.0))
        tangent = jax.tree.map(jnp.ones_like, Floats())
        primal, t = lib.jvp(
            lambda m, x: m(x), (m, jnp.array([3.0, 4.0])), (tangent, jnp.zeros(2)), **modes
        )
        return (
            float(out),
            type(grads).__name__,
            grads.w.value.tolist(),
            gx.tolist(),
            float(primal),
            float(t),
            float(m.stat.value),
        )

    results = _both(snippet)
    expected = (11.0, "Floats", [3.0, 4.0], [1.0, 2.0], 11.0, 7.0, 2.0)
    assert results["pg"] == results["nnx"] == expected


@pytest.mark.parametrize("modes", MODES)
def test_custom_vjp(modes):
    def snippet(lib, C, T, F):
        class Foo(C.__mro__[1]):
            def __init__(self):
                self.x = lib.Param(jnp.array(1.0))
                self.y = lib.Param(jnp.array(2.0))
                self.z = lib.BatchStat(jnp.array(1.0))

        @lib.custom_vjp(**modes)
        def f(m):
            m.z.value = m.z.value * 2.0
            return jnp.sin(m.x.value) * m.y.value

        def f_fwd(m):
            return f(m), (jnp.cos(m.x.value), jnp.sin(m.x.value), m)

        def f_bwd(res, g):
            cos_x, sin_x, m = res
            m_g = jax.tree.map(jnp.zeros_like, m)
            m_g.x.value = cos_x * g * m.y.value
            m_g.y.value = sin_x * g
            return (m_g,)

        f.defvjp(f_fwd, f_bwd)
        m = Foo()
        value = float(f(m))
        grads = lib.grad(f, **modes)(m)
        return (
            round(value, 5),
            type(grads).__name__,
            round(float(grads.x.value), 5),
            round(float(grads.y.value), 5),
            float(m.z.value),
        )

    results = _both(snippet)
    assert results["pg"] == results["nnx"]
    assert results["pg"][1:] == ("Foo", 1.08060, 0.84147, 4.0)
