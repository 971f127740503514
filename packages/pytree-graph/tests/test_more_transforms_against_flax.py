"""Side by side with Flax NNX: vjp, jvp, custom_vjp, checkify, DiffState (runs in the
bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import checkify as ck  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_filter import PathContains  # noqa: E402
from pytree_module import Module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


class Ours(Module):
    def __init__(self):
        self.w = pg.Param(jnp.array([1.0, 2.0]))
        self.head = pg.Param(jnp.array(0.5))
        self.calls = pg.Variable(jnp.array(0))

    def __call__(self, x):
        self.calls.value += 1
        return jnp.sin(self.w.value * x).sum() * self.head.value


class Theirs(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.array([1.0, 2.0]))
        self.head = nnx.Param(jnp.array(0.5))
        self.calls = nnx.Variable(jnp.array(0))

    def __call__(self, x):
        self.calls[...] += 1
        return jnp.sin(self.w[...] * x).sum() * self.head[...]


X = jnp.array([0.3, -0.7])


def test_vjp_same_cotangents_and_one_write():
    ours, theirs = Ours(), Theirs()
    out, vjp_fn = pg.vjp(lambda m, x: m(x), ours, X)
    their_out, their_vjp = nnx.vjp(lambda m, x: m(x), theirs, X, graph=False)
    (g, g_x), (their_g, their_g_x) = vjp_fn(jnp.array(1.0)), their_vjp(jnp.array(1.0))
    np.testing.assert_allclose(out, their_out)
    np.testing.assert_allclose(g["w"].value, their_g.w[...], rtol=1e-6)
    np.testing.assert_allclose(g["head"].value, their_g.head[...], rtol=1e-6)
    np.testing.assert_allclose(g_x, their_g_x, rtol=1e-6)
    # NNX gives the whole Module as cotangent (the integer Variable a float0); ours a
    # State of the differentiable Variables.
    assert "calls" not in g
    assert int(ours.calls.value) == int(theirs.calls[...]) == 1


def test_jvp_same_tangent_out():
    ours, theirs = Ours(), Theirs()
    dw = jnp.array([1.0, -1.0])
    out, tangent = pg.jvp(lambda m, x: m(x), (ours, X), ({"w": dw}, None))
    their_tangent_model = jax.tree.map(jnp.zeros_like, theirs)
    their_tangent_model.w[...] = dw
    their_tangent_model.calls = nnx.Variable(np.zeros((), jax.dtypes.float0))
    their_out, their_tangent = nnx.jvp(
        lambda m, x: m(x), (theirs, X), (their_tangent_model, jnp.zeros(2)), graph=False
    )
    np.testing.assert_allclose(out, their_out)
    np.testing.assert_allclose(tangent, their_tangent, rtol=1e-6)
    assert int(ours.calls.value) == int(theirs.calls[...]) == 1


def test_custom_vjp_gradient_clipping_same_gradient():
    @pg.custom_vjp
    def ours_f(m, x):
        return m(x)

    def ours_fwd(m, x):
        return ours_f(m, x), (m, x)

    def ours_bwd(res, g):
        _, g = g  # graph mode: (inputs_g, out_g); NNX's graph_updates=False: out_g alone
        m, x = res
        gw = jnp.clip(g * jnp.cos(m.w.value * x) * x * m.head.value, -0.1, 0.1)
        return {"w": gw}, None

    ours_f.defvjp(ours_fwd, ours_bwd)

    @nnx.custom_vjp(graph_updates=False)
    def their_f(m, x):
        return m(x)

    def their_fwd(m, x):
        return their_f(m, x), (m, x)

    def their_bwd(res, g):
        m, x = res
        m_g = jax.tree.map(jnp.zeros_like, m)
        m_g.w[...] = jnp.clip(g * jnp.cos(m.w[...] * x) * x * m.head[...], -0.1, 0.1)
        m_g.calls = nnx.Variable(np.zeros((), jax.dtypes.float0))
        return m_g, jnp.zeros_like(x)

    their_f.defvjp(their_fwd, their_bwd)
    grads = pg.grad(ours_f)(Ours(), X)
    their_grads = nnx.grad(their_f)(Theirs(), X)
    np.testing.assert_allclose(grads["w"].value, their_grads.w[...], rtol=1e-6)
    np.testing.assert_allclose(grads["head"].value, 0.0)


def test_diff_state_same_gradients():
    select = PathContains("head")
    grads = pg.grad(lambda m, x: m(x), argnums=pg.DiffState(0, select))(Ours(), X)
    their_grads = nnx.grad(lambda m, x: m(x), argnums=nnx.DiffState(0, nnx.PathContains("head")))(
        Theirs(), X
    )
    assert list(grads) == list(their_grads) == ["head"]
    np.testing.assert_allclose(grads["head"].value, their_grads["head"][...], rtol=1e-6)


def test_checkify_same_error_and_write_back():
    ours, theirs = Ours(), Theirs()

    def f(m, x):
        ck.check(x.sum() > 0, "sum must be positive")
        return m(x)

    error, out = pg.checkify(f)(ours, X)
    their_error, their_out = nnx.checkify(f)(theirs, X)
    assert error.get() == their_error.get()
    np.testing.assert_allclose(out, their_out)
    assert int(ours.calls.value) == int(theirs.calls[...]) == 1


def test_make_jaxpr_same_equations():
    jaxpr = pg.make_jaxpr(lambda m, x: m(x))(Ours(), X)
    their_jaxpr = nnx.make_jaxpr(lambda m, x: m(x), graph_updates=False)(Theirs(), X)
    names = [e.primitive.name for e in jaxpr.eqns]
    their_names = [e.primitive.name for e in their_jaxpr.eqns]
    assert [n for n in names if n != "add"] == [n for n in their_names if n != "add"]


def test_custom_vjp_graph_mode_same_inputs_g_and_gradients():
    """Graph mode's `bwd` gets `(inputs_g, out_g)` in both; the cotangent of a Variable the
    function wrote, used after the call, reaches `bwd` through `inputs_g`; the output may
    return the Module passed in."""

    def make(lib, module_cls, read):
        class Acc(module_cls):
            def __init__(self):
                self.w = lib.Param(jnp.array(2.0))
                self.total = lib.Param(jnp.array(0.0))

        @lib.custom_vjp
        def f(m, x):
            m.total.value = read(m.total) + read(m.w) * x
            return jnp.sin(x), m

        def f_fwd(m, x):
            return f(m, x), (read(m.w), x)

        def f_bwd(res, g):
            (m_g, _), (out_g, _) = g
            w, x = res
            total_g = read(m_g["total"])
            m_g["w"].value = total_g * x
            return m_g, total_g * w + out_g * jnp.cos(x)

        f.defvjp(f_fwd, f_bwd)

        def loss(m, x):
            y, m2 = f(m, x)
            assert m2 is m
            return y + 3.0 * read(m.total)

        return Acc(), loss

    ours, our_loss = make(pg, Module, lambda v: v.value)
    theirs, their_loss = make(nnx, nnx.Module, lambda v: v[...])
    x = jnp.array(0.5)
    g, g_x = pg.grad(our_loss, argnums=(0, 1))(ours, x)
    their_g, their_g_x = nnx.grad(their_loss, argnums=(0, 1))(theirs, x)
    np.testing.assert_allclose(g["w"].value, their_g["w"][...], rtol=1e-6)
    np.testing.assert_allclose(g["total"].value, their_g["total"][...], rtol=1e-6)
    np.testing.assert_allclose(g_x, their_g_x, rtol=1e-6)
    np.testing.assert_allclose(ours.total.value, theirs.total[...])
