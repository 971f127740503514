"""Tree mode (`graph=False`) and `graph_updates=False` on the graph transforms (as Flax
NNX 0.12's): Variable values written back, structure not, aliasing refused naming both
paths, Module-shaped gradients, prefix refusals, the switches as defaults."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import checkify as ck

import pytree_graph as pg
from pytree_graph import BatchStat, Carry, Param, StateAxes, Variable
from pytree_module import Dict, Module

TREE = {"graph": False}
VALUES_ONLY = {"graph": True, "graph_updates": False}
SIMPLE_MODES = [pytest.param(TREE, id="tree"), pytest.param(VALUES_ONLY, id="values_only")]


class Counter(Module):
    def __init__(self, n=()):
        self.w = Param(jnp.ones((*n, 2)))
        self.count = Variable(jnp.zeros(n))

    def __call__(self, x):
        self.count.value += 1
        return x * self.w.value


class Tied(Module):
    def __init__(self):
        self.encoder = Param(jnp.ones(2))
        self.decoder = self.encoder


class Floats(Module):
    def __init__(self):
        self.w = Param(jnp.array([1.0, 2.0]))
        self.stat = BatchStat(jnp.array(0.0))

    def __call__(self, x):
        self.stat.value = self.stat.value + 1.0
        return (x * self.w.value).sum()


def grow(m, x):
    m.count.value += 1
    m.extra = Param(jnp.zeros(1))  # a structural change: never written back here
    return x * m.w.value


# ------------------------------------------------------------------------------ jit


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_jit_writes_variable_values_back_and_not_structure(modes):
    m = Counter()
    f = pg.jit(grow, **modes)
    assert f(m, jnp.ones(2)).tolist() == [1.0, 1.0]
    f(m, jnp.ones(2))
    assert float(m.count.value) == 2.0
    assert not hasattr(m, "extra")


def test_jit_graph_mode_still_writes_structure_back():
    m = Counter()
    pg.jit(grow)(m, jnp.ones(2))
    assert float(m.count.value) == 1.0 and hasattr(m, "extra")


def test_jit_tree_mode_refuses_a_tied_model_naming_both_paths():
    with pytest.raises(ValueError, match="Duplicate Param") as info:
        pg.jit(lambda t: t.encoder.value, graph=False)(Tied())
    message = str(info.value)
    assert "args[0].decoder" in message and "args[0].encoder" in message
    assert "pytree_graph.jit(..., graph=True, graph_updates=True)" in message
    assert "pytree_graph.compat.jit" in message


def test_jit_tree_mode_refuses_a_variable_passed_twice():
    v = Param(jnp.ones(2))
    with pytest.raises(ValueError, match=r"args\[0\][\s\S]*args\[1\]"):
        pg.jit(lambda a, b: a.value + b.value, graph=False)(v, v)


@pytest.mark.parametrize("modes", [{}, VALUES_ONLY])
def test_jit_a_tied_model_works_in_graph_mode_and_stays_tied(modes):
    t = Tied()

    def double(t):
        t.encoder.value = t.encoder.value * 2

    pg.jit(double, **modes)(t)
    pg.jit(double, **modes)(t)
    assert t.decoder is t.encoder
    assert t.decoder.value.tolist() == [4.0, 4.0]


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_jit_refuses_an_input_variable_returned(modes):
    m = Counter()
    with pytest.raises(ValueError, match=r"Duplicate Param[\s\S]*args\[0\]\.w[\s\S]* out"):
        pg.jit(lambda m: m.w, **modes)(m)


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_jit_returns_new_modules(modes):
    out = pg.jit(lambda: Counter(), **modes)()
    assert isinstance(out, Counter) and out.w.value.tolist() == [1.0, 1.0]


def test_jit_tree_mode_takes_static_argnums_and_donate_argnames():
    m = Counter()
    f = pg.jit(lambda m, k: m.w.value * k, graph=False, static_argnums=1)
    assert f(m, 3).tolist() == [3.0, 3.0]


def test_jit_tree_mode_infers_static_numbers_from_names_and_back():
    m = Counter()

    def f(m, k, flag=False):
        return m.w.value * k if flag else m.w.value

    # `flag` passed by position is static through its name (a traced bool would raise).
    by_name = pg.jit(f, graph=False, static_argnames="flag")
    assert by_name(m, 2.0, True).tolist() == [2.0, 2.0]
    by_number = pg.jit(f, graph=False, static_argnums=2)
    assert by_number(m, 2.0, flag=True).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="static_argnames names 'nope'"):
        pg.jit(f, graph=False, static_argnames="nope")


def test_jit_tree_mode_donation_keeps_the_callers_variables_alive():
    m = Counter()
    f = pg.jit(lambda m, x: x * m.w.value, graph=False, donate_argnums=0)
    f(m, jnp.ones(2))
    assert m.w.value.tolist() == [1.0, 1.0]  # donated, written back: still readable


def test_jit_tree_mode_metadata_changes_are_written_back():
    m = Counter()

    def tag(m):
        m.w.set_metadata(tag="seen")

    pg.jit(tag, graph=False)(m)
    assert m.w.metadata["tag"] == "seen"


def test_jit_tree_mode_refuses_state_sharding_in_shardings():
    with pytest.raises(ValueError, match="`in_shardings` cannot contain `StateSharding`"):
        pg.jit(lambda m: m, graph=False, in_shardings=(pg.StateSharding({...: None}),))


def test_jit_tree_mode_decorator_form_and_method_binding():
    class Model(Module):
        def __init__(self):
            self.count = Variable(jnp.array(0))

        @pg.jit(graph=False)
        def step(self):
            self.count.value += 1

    m = Model()
    m.step()
    m.step()
    assert int(m.count.value) == 2


# ------------------------------------------------------------------------ switches


def test_set_graph_mode_switches_the_default_when_the_transform_is_built():
    m = Counter()
    with pg.set_graph_mode(False):
        f = pg.jit(grow)
        with pytest.raises(ValueError, match="Duplicate"):
            pg.jit(lambda t: t.encoder.value)(Tied())
    f(m, jnp.ones(2))  # built in tree mode: stays in tree mode
    assert float(m.count.value) == 1.0 and not hasattr(m, "extra")
    pg.jit(grow)(m, jnp.ones(2))
    assert hasattr(m, "extra")


def test_set_graph_updates_switches_the_default():
    m = Counter()
    with pg.set_graph_updates(False):
        pg.jit(grow)(m, jnp.ones(2))
        t = Tied()
        pg.jit(lambda t: t.encoder.value)(t)  # sharing allowed
    assert float(m.count.value) == 1.0 and not hasattr(m, "extra")


# ----------------------------------------------------------------------- autodiff


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_grad_is_module_shaped_and_writes_back(modes):
    m = Floats()
    grads = pg.grad(lambda m, x: m(x), **modes)(m, jnp.array([3.0, 4.0]))
    assert type(grads) is Floats
    assert type(grads.w) is Param and grads.w.value.tolist() == [3.0, 4.0]
    assert type(grads.stat) is BatchStat  # every inexact leaf, as jax.grad
    assert float(m.stat.value) == 1.0


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_value_and_grad_with_aux(modes):
    m = Floats()
    (loss, aux), grads = pg.value_and_grad(lambda m: (m(2.0), {"n": 1}), has_aux=True, **modes)(m)
    assert float(loss) == 6.0 and aux == {"n": 1}
    assert grads.w.value.tolist() == [2.0, 2.0]


def test_grad_tree_mode_refuses_diff_state_and_wrt():
    with pytest.raises(ValueError, match="`argnums` cannot contain `DiffState`"):
        pg.grad(lambda m: 0.0, argnums=pg.DiffState(0, Param), graph=False)
    with pytest.raises(ValueError, match="wrt=BatchStat selects Variables"):
        pg.grad(lambda m: 0.0, wrt=BatchStat, graph=False)


def test_grad_tree_mode_refuses_a_tied_model_and_values_only_keeps_it():
    loss = lambda t: (t.encoder.value * t.decoder.value).sum()  # noqa: E731
    with pytest.raises(ValueError, match="Duplicate"):
        pg.grad(loss, graph=False)(Tied())
    grads = pg.grad(loss, **VALUES_ONLY)(Tied())
    assert type(grads) is Tied and grads.decoder is grads.encoder
    assert grads.encoder.value.tolist() == [2.0, 2.0]


def test_grad_values_only_refuses_a_variable_shared_by_a_differentiated_argument_and_another():
    t = Tied()
    other = Dict(shared=t.encoder)
    loss = lambda t, o: (t.encoder.value * o.shared.value).sum()  # noqa: E731
    with pytest.raises(ValueError, match=r"(?s)Inconsistent aliasing.*\.args\[0\]\.decoder: True"):
        pg.grad(loss, **VALUES_ONLY)(t, other)
    with pytest.raises(ValueError, match=r"\.kwargs\.o\.shared: False"):
        pg.grad(loss, **VALUES_ONLY)(t, o=other)
    assert t.encoder.value.tolist() == [1.0, 1.0]  # nothing written
    # Both differentiated: the shared Variable is one input, so one (total) gradient, at
    # both places (as Flax NNX gives).
    g_t, g_o = pg.grad(loss, argnums=(0, 1), **VALUES_ONLY)(t, other)
    assert g_t.encoder is g_o.shared and g_t.encoder.value.tolist() == [2.0, 2.0]


def test_grad_values_only_of_a_non_module_argument():
    t = Tied()
    g = pg.grad(lambda t, x: (t.encoder.value * x).sum(), argnums=1, **VALUES_ONLY)(t, jnp.ones(2))
    assert g.tolist() == [1.0, 1.0]


# --------------------------------------------------------------------------- vmap


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_vmap_writes_back_with_the_arguments_axis(modes):
    m = Counter((4,))
    y = pg.vmap(lambda m, x: m(x), **modes)(m, jnp.ones((4, 2)))
    assert y.shape == (4, 2) and m.count.value.tolist() == [1.0] * 4


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_vmap_broadcast_write_of_a_batched_value_is_an_error_naming_the_variable(modes):
    m = Counter()

    def f(m, x):
        m.count.value = x.sum()
        return x

    with pytest.raises(ValueError, match=r"count, of an argument with in_axes None"):
        pg.vmap(f, in_axes=(None, 0), **modes)(m, jnp.ones((4, 2)))
    assert float(m.count.value) == 0.0


def test_vmap_broadcast_write_of_an_unbatched_value_is_written():
    m = Counter()
    pg.vmap(lambda m, x: m(x), in_axes=(None, 0), graph=False)(m, jnp.ones((4, 2)))
    assert float(m.count.value) == 1.0


def test_vmap_tree_mode_takes_a_module_shaped_prefix():
    m = Counter((4,))
    m.w = Param(jnp.ones(2))  # shared by every example
    prefix = Counter()
    prefix.w, prefix.count = None, 0  # in place of each Variable, its axis
    y = pg.vmap(lambda m, x: m(x), in_axes=(prefix, 0), graph=False)(m, jnp.ones((4, 2)))
    assert y.shape == (4, 2) and m.count.value.tolist() == [1.0] * 4


def test_vmap_tree_mode_refuses_state_axes_and_transform_metadata():
    with pytest.raises(ValueError, match="`in_axes` cannot contain `StateAxes`"):
        pg.vmap(lambda m: m, in_axes=(StateAxes({...: 0}),), graph=False)
    with pytest.raises(ValueError, match="transform_metadata"):
        pg.vmap(lambda m: m, transform_metadata={pg.PARTITION_NAME: "a"}, graph=False)


def test_vmap_tree_mode_refuses_a_variable_as_a_prefix():
    with pytest.raises(ValueError, match="a prefix gives one entry for a whole Variable"):
        pg.vmap(lambda m: m, in_axes=(Variable(0),), graph=False)


def test_vmap_values_only_keeps_a_tied_model():
    t = Tied()
    t.encoder = Param(jnp.ones((3, 2)))
    t.decoder = t.encoder

    def f(t):
        t.encoder.value = t.encoder.value + 1
        return t.decoder.value.sum()

    out = pg.vmap(f, **VALUES_ONLY)(t)
    assert out.tolist() == [4.0] * 3 and t.decoder is t.encoder
    with pytest.raises(ValueError, match="Duplicate"):
        pg.vmap(f, graph=False)(t)


def test_pmap_tree_mode_writes_back_per_device():
    n = jax.local_device_count()
    m = Counter((n,))
    y = pg.pmap(lambda m, x: m(x), graph=False)(m, jnp.ones((n, 2)))
    assert y.shape == (n, 2) and m.count.value.tolist() == [1.0] * n


# --------------------------------------------------------------------------- scan


class Layer(Module):
    def __init__(self, w):
        self.w = Param(w)
        self.seen = BatchStat(jnp.zeros_like(w))

    def __call__(self, x):
        self.seen.value = self.seen.value + x
        return x * self.w.value


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_scan_lax_form_stacks_the_scanned_writes(modes):
    stack = Layer(jnp.array([1.0, 2.0, 3.0]))
    y, ys = pg.scan(lambda x, layer: (layer(x), x), jnp.array(1.0), stack, **modes)
    assert float(y) == 6.0 and ys.tolist() == [1.0, 1.0, 2.0]
    assert stack.seen.value.tolist() == [1.0, 1.0, 2.0]


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_scan_carries_a_module_and_broadcast_variables(modes):
    c = Counter()

    @pg.scan(in_axes=(Carry, None, 0), out_axes=(Carry, 0), **modes)
    def step(x, c, xi):
        c.count.value += 1
        return x + xi, x

    total, xs = step(jnp.array(0.0), c, jnp.arange(4.0))
    assert float(total) == 6.0 and xs.tolist() == [0.0, 0.0, 1.0, 3.0]
    assert float(c.count.value) == 4.0  # the broadcast Variable is carried

    @pg.scan(in_axes=(Carry, 0), out_axes=(Carry, 0), **modes)
    def carried(c, xi):
        c.count.value += xi
        return c, c.count.value

    out, counts = carried(c, jnp.arange(4.0))
    assert out.count is c.count and float(c.count.value) == 10.0
    assert counts.tolist() == [4.0, 5.0, 7.0, 10.0]


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_scan_refuses_a_carry_with_new_variables(modes):
    c = Counter()
    with pytest.raises(ValueError, match="Variable identity must be preserved across iterations"):
        pg.scan(lambda c, x: (Counter(), x), c, jnp.arange(3.0), **modes)


def test_scan_tree_mode_refuses_transform_metadata():
    with pytest.raises(ValueError, match="transform_metadata"):
        pg.scan(
            lambda c: c, in_axes=Carry, out_axes=Carry, transform_metadata={"a": 1}, graph=False
        )


# -------------------------------------------------------------- loops and branches


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_fori_loop_and_while_loop_write_the_carry_back(modes):
    m = Counter()

    def body(i, m):
        m.count.value += i
        return m

    out = pg.fori_loop(0, 4, body, m, **modes)
    assert out.count is m.count and float(m.count.value) == 6.0

    def add(m):
        m.count.value += 5
        return m

    pg.while_loop(lambda m: m.count.value < 20, add, m, **modes)
    assert float(m.count.value) == 21.0


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_loops_refuse_a_body_returning_other_variables(modes):
    m = Counter()
    with pytest.raises(ValueError, match=r"identity must be preserved[\s\S]*carry"):
        pg.fori_loop(0, 2, lambda i, m: Counter(), m, **modes)
    with pytest.raises(ValueError, match="identity must be preserved"):
        pg.while_loop(lambda m: m.count.value < 2, lambda m: Counter(), m, **modes)


def test_loops_tree_mode_refuse_a_tied_carry():
    with pytest.raises(ValueError, match=r"Duplicate[\s\S]*init_val\.decoder"):
        pg.fori_loop(0, 2, lambda i, t: t, Tied(), graph=False)


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_cond_and_switch_write_back_the_branch_taken(modes):
    m = Counter()
    skip = lambda m, x: x  # noqa: E731
    assert pg.cond(True, lambda m, x: m(x), skip, m, jnp.ones(2), **modes).tolist() == [1, 1]
    pg.cond(False, lambda m, x: m(x), skip, m, jnp.ones(2), **modes)
    pg.switch(1, [skip, lambda m, x: m(x)], m, jnp.ones(2), **modes)
    assert float(m.count.value) == 2.0


def test_cond_tree_mode_refuses_a_tied_operand():
    with pytest.raises(ValueError, match=r"pytree_graph\.cond with graph=False"):
        pg.cond(True, lambda t: None, lambda t: None, Tied(), graph=False)


# ---------------------------------------------------------- remat, eval_shape, checkify


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_remat_writes_back_and_differentiates(modes):
    m = Floats()
    assert float(pg.remat(lambda m: m(2.0), **modes)(m)) == 6.0
    assert float(m.stat.value) == 1.0
    grads = pg.grad(pg.remat(lambda m: m(2.0), **modes), **modes)(m)
    assert grads.w.value.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_eval_shape_gives_shapes_and_writes_nothing(modes):
    m = Counter()
    out = pg.eval_shape(lambda: Counter((3,)), **modes)
    assert out.w.value.shape == (3, 2)
    assert pg.eval_shape(lambda m, x: m(x), m, jnp.ones(2), **modes).shape == (2,)
    assert float(m.count.value) == 0.0
    with pytest.raises(ValueError, match="Duplicate"):
        pg.eval_shape(lambda m: m, m, **modes)


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_checkify_reports_and_writes_back(modes):
    m = Counter()
    error, _ = pg.checkify(lambda m, x: jnp.log(-m(x)), errors=ck.float_checks, **modes)(
        m, jnp.ones(2)
    )
    assert "nan generated" in error.get() and float(m.count.value) == 1.0


# ------------------------------------------------- vjp, jvp, jit_partial, shard_map


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_vjp_cotangents_are_module_shaped_and_writes_come_back(modes):
    m = Floats()
    out, vjp_fn = pg.vjp(lambda m, x: m(x), m, jnp.array([3.0, 4.0]), **modes)
    grads, gx = vjp_fn(jnp.array(1.0))
    assert float(out) == 11.0 and float(m.stat.value) == 1.0
    assert type(grads) is Floats and grads.w.value.tolist() == [3.0, 4.0]
    assert gx.tolist() == [1.0, 2.0]
    _, _, aux = pg.vjp(lambda m: (m(2.0), "aux"), m, has_aux=True, **modes)
    assert aux == "aux" and float(m.stat.value) == 2.0


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_jvp_takes_module_shaped_tangents(modes):
    m = Floats()
    tangent = jax.tree.map(jnp.ones_like, Floats())
    out, t = pg.jvp(lambda m, x: m(x), (m, jnp.array([3.0, 4.0])), (tangent, jnp.zeros(2)), **modes)
    assert float(out) == 11.0 and float(t) == 7.0 and float(m.stat.value) == 1.0


def test_vjp_tree_mode_refuses_a_tied_primal():
    with pytest.raises(ValueError, match=r"pytree_graph\.vjp with graph=False"):
        pg.vjp(lambda t: t.encoder.value.sum(), Tied(), graph=False)


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_jit_partial_and_cached_partial_bind_the_first_arguments(modes):
    m = Counter()
    step = pg.jit_partial(lambda m, x: m(x).sum(), m, **modes)
    assert float(step(jnp.ones(2))) == 2.0
    step(jnp.ones(2))
    assert float(m.count.value) == 2.0
    cached = pg.cached_partial(pg.jit(lambda m, x: m(x), **modes), m)
    cached(jnp.ones(2))
    assert float(m.count.value) == 3.0


@pytest.mark.multi_device
@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_shard_map_writes_back_with_the_arguments_spec(modes):
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(jax.devices()[:4], ("d",))
    m = Counter((8,))

    def f(m, x):
        m.count.value += 1
        return x * m.w.value

    out = pg.shard_map(f, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"), **modes)(
        m, jnp.ones((8, 2))
    )
    assert out.shape == (8, 2) and m.count.value.tolist() == [1.0] * 8
    with pytest.raises(ValueError, match="`in_specs` cannot contain `StateSharding`"):
        pg.shard_map(f, mesh=mesh, in_specs=(pg.StateSharding({...: P()}),), out_specs=P(), **modes)


class Pair(Module):
    def __init__(self):
        self.x = Param(jnp.array(1.0))
        self.y = Param(jnp.array(2.0))
        self.z = BatchStat(jnp.array(1.0))


def _sin_rule(modes, bwd):
    @pg.custom_vjp(**modes)
    def f(m):
        m.z.value = m.z.value * 2.0
        return jnp.sin(m.x.value) * m.y.value

    f.defvjp(lambda m: (f(m), (jnp.cos(m.x.value), jnp.sin(m.x.value), m)), bwd)
    return f


def _bwd(res, g):
    cos_x, sin_x, m = res
    m_g = jax.tree.map(jnp.zeros_like, m)
    m_g.x.value = cos_x * g * m.y.value
    m_g.y.value = sin_x * g
    return (m_g,)


@pytest.mark.parametrize("modes", SIMPLE_MODES)
def test_custom_vjp_module_shaped_cotangents_and_write_back(modes):
    f = _sin_rule(modes, _bwd)
    m = Pair()
    assert float(f(m)) == pytest.approx(jnp.sin(1.0) * 2.0)
    assert float(m.z.value) == 2.0
    grads = pg.grad(f, **modes)(m)
    assert type(grads) is Pair and float(m.z.value) == 4.0
    assert float(grads.x.value) == pytest.approx(jnp.cos(1.0) * 2.0)
    assert float(grads.y.value) == pytest.approx(jnp.sin(1.0))


def test_custom_vjp_tree_mode_gives_updates_g():
    seen = []

    def bwd(res, g, *, updates_g):
        seen.append((type(updates_g[0].z), updates_g[0].x))
        return _bwd(res, g)

    pg.grad(_sin_rule(TREE, bwd), graph=False)(Pair())
    assert seen == [(BatchStat, None)]  # the written Variable's cotangent; None elsewhere
    with pytest.raises(ValueError, match="`updates_g` needs tree mode"):
        _sin_rule(VALUES_ONLY, bwd)
    with pytest.raises(ValueError, match="`nondiff_argnums` cannot contain `DiffState`"):
        pg.custom_vjp(lambda m: m, nondiff_argnums=(pg.DiffState(0, Param),), graph=False)


@pytest.mark.multi_device
def test_jit_tree_mode_in_shardings_lay_out_the_written_variables():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(jax.devices()[:4], ("d",))
    rows, replicated = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    m = Counter((8,))
    prefix = Counter()
    prefix.w, prefix.count = rows, replicated  # a Module-shaped prefix

    def step(m, x):
        m.w.value = m.w.value * 2
        m.count.value = m.count.value + 1
        return x.sum()

    assert float(pg.jit(step, graph=False, in_shardings=(prefix, replicated))(m, jnp.ones(3))) == 3
    assert m.w.value.sharding.is_equivalent_to(rows, 2)
    assert m.count.value.sharding.is_equivalent_to(replicated, 1)
    assert m.w.value.tolist() == [[2.0, 2.0]] * 8
