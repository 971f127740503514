"""Graph-mode `jit` and `jit_partial` with `static_argnums`, `static_argnames` and
`donate_argnames`: static arguments are hashed and compared with `==` (a new value
traces anew), numbers and names are inferred from each other, and bad options or
values are refused naming the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_module import Module


class Linear(Module):
    def __init__(self, w=None):
        self.w = Param(jnp.ones((2, 2))) if w is None else w

    def __call__(self, x):
        return x @ self.w.value


class Tied(Module):
    """Two layers sharing one Param."""

    def __init__(self):
        shared = Param(jnp.ones((2, 2)))
        self.a = Linear(shared)
        self.b = Linear(shared)


def test_static_argnums_and_argnames_retrace_on_a_new_value_only():
    traces = []

    @pg.jit(static_argnums=1, static_argnames="flag")
    def f(m, n, x, flag=False):
        traces.append((n, flag))
        return m(x) * n if flag else m(x)

    m, x = Linear(), jnp.ones((1, 2))
    assert f(m, 2, x).tolist() == [[2.0, 2.0]]
    f(m, 2, x)
    assert len(traces) == 1
    assert f(m, 3, x, flag=True).tolist() == [[6.0, 6.0]]  # a traced `flag` would raise
    assert traces == [(2, False), (3, True)]
    # A static number passed by keyword is static too (its name is inferred).
    assert f(m, n=3, x=x, flag=True).tolist() == [[6.0, 6.0]]


def test_static_argnames_infer_positions_and_negative_numbers_count_from_the_end():
    traces = []

    def f(m, x, scale):
        traces.append(scale)
        return m(x) * scale

    m, x = Linear(), jnp.ones((1, 2))
    by_name = pg.jit(f, static_argnames="scale")
    by_name(m, x, 2)  # passed by position: static through its name
    by_name(m, x, 2)
    assert traces == [2]
    by_negative = pg.jit(f, static_argnums=-1)
    assert by_negative(m, x, 4).tolist() == [[8.0, 8.0]]
    assert traces == [2, 4]


def test_static_values_are_compared_with_eq_and_hash():
    traces = []

    @pg.jit(static_argnums=1)
    def f(m, shape):
        traces.append(shape)
        return m.w.value.reshape(shape)

    m = Linear()
    assert f(m, (4,)).shape == (4,)
    assert f(m, (4,)).shape == (4,)  # an equal tuple: no new trace
    assert f(m, (1, 4)).shape == (1, 4)
    assert traces == [(4,), (1, 4)]


def test_static_arguments_with_writes_back_and_a_tied_model():
    model = Tied()

    @pg.jit(static_argnames="by")
    def bump(model, by):
        model.a.w.value = model.a.w.value + by
        return model.b(jnp.ones((1, 2)))

    out = bump(model, by=1.0)
    assert out.tolist() == [[4.0, 4.0]]  # the tie holds inside: b sees a's write
    assert model.a.w is model.b.w and model.a.w.value[0, 0] == 2.0
    # Tree mode refuses the tied model loudly.
    with pytest.raises(ValueError, match="Duplicate"):
        pg.jit(bump.__wrapped__, graph=False, static_argnames="by")(model, by=1.0)


def test_unhashable_or_graph_node_statics_are_refused_naming_the_argument():
    f = pg.jit(lambda m, n: m.w.value * len(n), static_argnums=1)
    m = Linear()
    with pytest.raises(ValueError, match=r"static argument 1 \('n'\) is of type list.*tuple"):
        f(m, [1, 2])
    with pytest.raises(ValueError, match=r"static argument 1 \('n'\) is of type ArrayImpl"):
        f(m, jnp.ones(2))
    g = pg.jit(lambda m, x: m(x), static_argnums=0)
    with pytest.raises(ValueError, match=r"static argument 0 \('m'\) is or holds a Module"):
        g(m, jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="static argument 'm' is or holds a Module"):
        pg.jit(lambda x, **kw: x, static_argnames="m")(jnp.ones(2), m=m)
    assert m.w.value.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_bad_static_and_donate_options_are_refused_when_wrapping():
    def f(m, x):
        return x

    with pytest.raises(ValueError, match="static_argnames names 'y', but f has no parameter"):
        pg.jit(f, static_argnames="y")
    with pytest.raises(ValueError, match="static_argnums=2 holds 2, but f takes 2"):
        pg.jit(f, static_argnums=2)
    with pytest.raises(TypeError, match="static_argnames must be a str or a sequence of str"):
        pg.jit(f, static_argnames=1)
    with pytest.raises(TypeError, match="static_argnums must be an int or a tuple of ints"):
        pg.jit(f, static_argnums="x")
    with pytest.raises(ValueError, match="argument 1 is both static and donated"):
        pg.jit(f, static_argnums=1, donate_argnames="x")
    with pytest.raises(ValueError, match="donate_argnames names 'z'"):
        pg.jit(f, donate_argnames="z")


def test_donate_argnames_donates_that_arguments_variables_and_keeps_them_live():
    model = Tied()

    @pg.jit(donate_argnames="model")
    def step(model, x):
        return model.a(x)  # writes nothing: the donated Variable still gets a live value

    assert step(model, jnp.ones((1, 2))).tolist() == [[2.0, 2.0]]
    assert model.a.w.value.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert step(model=model, x=jnp.ones((1, 2))).tolist() == [[2.0, 2.0]]  # by keyword too
    assert model.a.w is model.b.w and model.b.w.value[0, 0] == 1.0


def test_none_for_an_option_is_jax_jits_default_not_given():
    # jax.jit's defaults are None: passing them on (e.g. from a wrapper) changes nothing.
    for graph in (True, False):
        f = pg.jit(
            lambda x, n: x * n,
            static_argnums=None,
            static_argnames=None,
            donate_argnums=None,
            donate_argnames=None,
            graph=graph,
        )
        assert f(jnp.ones(2), 3.0).tolist() == [3.0, 3.0]
    model = Tied()
    step = pg.jit(lambda model, x: model.a(x), donate_argnums=None, donate_argnames="model")
    assert step(model, jnp.ones((1, 2))).tolist() == [[2.0, 2.0]]
    assert model.a.w is model.b.w


def test_lowered_with_statics_compiles_for_those_statics_only():
    f = pg.jit(lambda m, n: m.w.value * n, static_argnums=1)
    m = Linear()
    compiled = f.lower(m, 2).compile()
    assert compiled(m, 2).tolist() == [[2.0, 2.0], [2.0, 2.0]]
    with pytest.raises(ValueError, match="lowered for arguments of another structure"):
        compiled(m, 3)
    traced = f.trace(m, 3)
    assert traced.lower().compile()(m, 3)[0, 0] == 3.0


def test_in_shardings_have_no_entry_for_static_arguments():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    f = pg.jit(lambda m, n, x: m(x) * n, static_argnums=1, in_shardings=(replicated, replicated))
    assert f(Linear(), 2, jnp.ones((1, 2))).tolist() == [[4.0, 4.0]]
    step = pg.jit_partial(
        lambda m, n, x: m(x) * n, Linear(), static_argnums=1, in_shardings=(None, replicated)
    )
    assert step(2, jnp.ones((1, 2))).tolist() == [[4.0, 4.0]]


def test_a_jitted_init_takes_static_argnums_counting_self():
    traces = []

    class Made(Module):
        @pg.jit(static_argnums=(1, 2))
        def __init__(self, n, use_bias, *, key):
            traces.append(n)
            self.w = Param(jax.random.normal(key, (n,)))
            if use_bias:  # a Python branch on a static argument
                self.b = Param(jnp.zeros(n))
            self.n = n

    made = Made(2, True, key=jax.random.key(0))
    assert made.w.value.shape == (2,) and made.n == 2 and isinstance(made.n, int)
    assert isinstance(made.w.value, jax.Array) and hasattr(made, "b")
    Made(2, True, key=jax.random.key(1))
    assert traces == [2]  # the same static values: compiled once
    assert not hasattr(Made(3, False, key=jax.random.key(0)), "b") and traces == [2, 3]


def test_a_jitted_init_refuses_self_as_static_and_shardings():
    class Made(Module):
        @pg.jit(static_argnums=(0, 1))
        def __init__(self, n):
            self.w = Param(jnp.ones(n))

    with pytest.raises(
        ValueError, match=r"Made.__init__: `static_argnums` names argument 0, `self`"
    ):
        Made(2)

    class Laid(Module):
        @pg.jit(in_shardings=None, out_shardings=None)
        def __init__(self, n):
            self.w = Param(jnp.ones(n))

    with pytest.raises(TypeError, match="does not take `in_shardings`"):
        Laid(2)


# ------------------------------------------------------------------------ jit_partial


def _step(model, x, scale, flag=False):
    model.a.w.value = model.a.w.value + 1
    out = model.b(x)
    return out * scale if flag else out


def test_jit_partial_static_argnames_and_numbers_count_the_bound_arguments_first():
    model = Tied()
    traces = []

    def step(model, x, scale, flag=False):
        traces.append((scale, flag))
        return _step(model, x, scale, flag)

    f = pg.jit_partial(step, model, static_argnames=("scale", "flag"))
    x = jnp.ones((1, 2))
    assert f(x, 2).tolist() == [[4.0, 4.0]]
    assert f(x, 2).tolist() == [[6.0, 6.0]]  # the tie holds: b reads a's write
    assert f(x, 3, flag=True).tolist() == [[24.0, 24.0]]
    assert traces == [(2, False), (3, True)]
    assert model.a.w is model.b.w and model.a.w.value[0, 0] == 4.0
    g = pg.jit_partial(step, model, static_argnums=(2, 3))
    assert g(x, 1, True).tolist() == [[10.0, 10.0]]


def test_jit_partial_donate_argnames_and_bad_statics():
    model = Tied()
    f = pg.jit_partial(_step, model, donate_argnames=("model", "x"), static_argnums=2)
    assert f(jnp.ones((1, 2)), 1).tolist() == [[4.0, 4.0]]
    assert f(x=jnp.ones((1, 2)), scale=1).tolist() == [[6.0, 6.0]]
    assert model.b.w.value[0, 0] == 3.0
    with pytest.raises(TypeError, match="argument 0 is bound, so it cannot be static"):
        pg.jit_partial(_step, model, static_argnames="model")
    with pytest.raises(TypeError, match="argument 0 is bound, so it cannot be static"):
        pg.jit_partial(_step, model, static_argnums=0, graph=False)
    with pytest.raises(ValueError, match=r"static argument 2 \('scale'\) is of type list"):
        f(jnp.ones((1, 2)), [1])
    with pytest.raises(ValueError, match="donate_argnames names 'y'"):
        pg.jit_partial(_step, model, donate_argnames="y")


def test_cached_partial_keeps_the_static_options_of_its_jit():
    model = Tied()
    traces = []

    @pg.jit(static_argnums=2)
    def step(model, x, scale):
        traces.append(scale)
        return model.a(x) * scale

    f = pg.cached_partial(step, model)
    f(jnp.ones((1, 2)), 2)
    f(jnp.ones((1, 2)), 2)
    assert f(jnp.ones((1, 2)), 3).tolist() == [[6.0, 6.0]]
    assert traces == [2, 3]
