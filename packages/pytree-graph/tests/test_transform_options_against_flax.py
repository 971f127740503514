"""Transform options side by side with Flax NNX 0.12's: graph `jit` and `jit_partial` with
static and donated argument names, `vjp`/`jvp` as decorators, `pmap`'s `out_axes` as a
`StateAxes`, `StateAxes` from a State, and `prefix(..., graph=False)`."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402

W = np.array([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32)  # each model copies it


class Ours(Module):
    def __init__(self):
        self.w = pg.Param(jnp.array(W))
        self.s = pg.BatchStat(jnp.arange(3.0))

    def __call__(self, x):
        return x @ self.w.value


class Theirs(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.array(W))
        self.s = nnx.BatchStat(jnp.arange(3.0))

    def __call__(self, x):
        return x @ self.w[...]


LIBS = [(pg, Ours), (nnx, Theirs)]
X = jnp.array([[1.0, 2.0]])


def _value(v):
    return v.value if isinstance(v, pg.Variable) else v[...]


@pytest.mark.parametrize("graph", [True, False])
def test_jit_static_argnums_and_argnames_trace_alike(graph):
    def run(lib, Model):
        traces = []

        @lib.jit(static_argnums=1, static_argnames="flag", graph=graph)
        def f(m, n, x, flag=False):
            traces.append((n, flag))
            return m(x) * n if flag else m(x)

        m = Model()
        outs = [f(m, 2, X), f(m, 2, X), f(m, 3, X, flag=True), f(m, 3, X, flag=True)]
        return [np.asarray(o) for o in outs], traces

    (ours, our_traces), (theirs, their_traces) = (run(*lib) for lib in LIBS)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b)
    assert our_traces == their_traces == [(2, False), (3, True)]


@pytest.mark.parametrize("bad", [[1, 2], jnp.ones(2)])
def test_jit_refuses_unhashable_statics_alike(bad):
    for lib, Model in LIBS:
        f = lib.jit(lambda m, n: jnp.sum(X), static_argnums=1)
        # Both raise ValueError (as jax.jit does); ours names the argument.
        with pytest.raises(ValueError, match=r"(?i)hashable"):
            f(Model(), bad)


def test_jit_refuses_a_module_given_static_alike():
    for lib, Model in LIBS:
        f = lib.jit(lambda m, x: m(x), static_argnums=0)
        with pytest.raises(ValueError):
            f(Model(), X)


def test_jit_donate_argnames_and_bad_names_alike():
    for lib, Model in LIBS:
        m = Model()
        f = lib.jit(lambda m, x: m(x), donate_argnames="m")
        np.testing.assert_allclose(f(m, X), X @ W)
        np.testing.assert_allclose(_value(m.w), W)  # still readable
        with pytest.raises(ValueError, match="zz"):
            lib.jit(lambda m: m, donate_argnames="zz")(Model())


def test_jit_partial_static_argnames_with_one_bound_argument_alike():
    def run(lib, Model):
        traces = []

        def step(m, x, scale, flag=False):
            traces.append((scale, flag))
            return m(x) * scale if flag else m(x)

        f = lib.jit_partial(step, Model(), static_argnames=("scale", "flag"), graph=False)
        outs = [f(X, 2), f(X, 2), f(X, 3, flag=True)]
        return [np.asarray(o) for o in outs], traces

    ours_graph = pg.jit_partial(lambda m, x, scale: m(x) * scale, Ours(), static_argnums=2)(X, 3)
    (ours, our_traces), (theirs, their_traces) = (run(*lib) for lib in LIBS)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b)
    assert our_traces == their_traces == [(2, False), (3, True)]
    np.testing.assert_allclose(ours_graph, theirs[2])


def _loss(m, x):
    return jnp.sum(m(x) ** 2)


def test_vjp_and_jvp_decorators_alike():
    ours_m, theirs_m = Ours(), Theirs()
    # NNX's vjp/jvp take tree mode or graph mode without updates; ours takes both.
    their_out, their_fn = nnx.vjp(_loss, graph=False)(theirs_m, X)
    for graph in (True, False):
        out, vjp_fn = pg.vjp(_loss, graph=graph)(ours_m, X)
        np.testing.assert_allclose(out, their_out)
        np.testing.assert_allclose(vjp_fn(jnp.array(1.0))[1], their_fn(jnp.array(1.0))[1])
    their_aux = nnx.vjp(has_aux=True, graph=False)(lambda m, x: (_loss(m, x), 7))(theirs_m, X)
    our_aux = pg.vjp(has_aux=True)(lambda m, x: (_loss(m, x), 7))(ours_m, X)
    assert their_aux[2] == our_aux[2] == 7
    their_tangent = jax.tree.map(jnp.zeros_like, theirs_m)
    _, their_t = nnx.jvp(_loss, graph=False)((theirs_m, X), (their_tangent, jnp.ones_like(X)))
    our_tangent = jax.tree.map(jnp.zeros_like, pg.state(ours_m))
    _, our_t = pg.jvp(_loss)((ours_m, X), (our_tangent, jnp.ones_like(X)))
    np.testing.assert_allclose(our_t, their_t)


def test_pmap_out_axes_state_axes_alike():
    n = jax.local_device_count()
    shapes = []
    for lib, Model in LIBS:
        make = lib.pmap(
            lambda x, Model=Model: Model(), out_axes=lib.StateAxes({lib.Param: None, ...: 0})
        )
        m = make(jnp.arange(float(n)))
        shapes.append((_value(m.w).shape, _value(m.s).shape))
    assert shapes[0] == shapes[1] == ((2, 2), (n, 3))


def test_state_axes_from_a_state_alike():
    outs = []
    for lib, Model in LIBS:
        m = Model()
        axes = jax.tree.map(lambda v: 0 if v.shape == (3,) else None, lib.state(m))
        f = lib.vmap(lambda m: m.s[...] * m.w[...].sum(), in_axes=(lib.StateAxes(axes),))
        outs.append(np.asarray(f(m)))
    np.testing.assert_allclose(outs[0], outs[1])


def test_tree_mode_prefix_alike():
    prefixes = []
    for lib, _ in LIBS:
        d = {"a": lib.Param(jnp.array(2.0)), "b": lib.BatchStat(jnp.arange(5.0))}
        prefixes.append(lib.prefix(d, {lib.Param: None, lib.BatchStat: 0}, graph=False))
        np.testing.assert_allclose(
            jax.vmap(lambda d: d["a"][...] * d["b"][...], in_axes=(prefixes[-1],))(d),
            [0.0, 2.0, 4.0, 6.0, 8.0],
        )
    assert prefixes[0] == prefixes[1] == {"a": None, "b": 0}
