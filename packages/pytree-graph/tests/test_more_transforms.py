"""vjp, jvp, custom_vjp, pmap, checkify and make_jaxpr on Modules: (co)tangents as States,
changes written back once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify as ck

import pytree_graph as pg
from pytree_filter import PathContains
from pytree_graph import BatchStat, DiffState, Param, State, StateAxes, Variable
from pytree_module import Module


class Affine(Module):
    def __init__(self):
        self.w = Param(jnp.array([1.0, 2.0]))
        self.scale = BatchStat(jnp.array(3.0))
        self.calls = Variable(jnp.array(0))

    def __call__(self, x):
        self.calls.value += 1
        return (self.w.value * x).sum() * self.scale.value


class Tied(Module):
    def __init__(self):
        self.a = Affine()
        self.b = self.a


# ------------------------------------------------------------------------------ vjp


def test_vjp_cotangents_are_states_and_writes_happen_once():
    model, x = Affine(), jnp.array([1.0, 1.0])
    out, vjp_fn = pg.vjp(lambda m, x: m(x), model, x)
    assert float(out) == 9.0 and int(model.calls.value) == 1
    g_model, g_x = vjp_fn(jnp.array(2.0))
    g_model_again, _ = vjp_fn(jnp.array(1.0))
    assert int(model.calls.value) == 1  # the backward pass runs nothing forward
    assert isinstance(g_model, State) and set(g_model) == {"w", "scale"}  # floats only
    assert type(g_model["w"]) is Param and type(g_model["scale"]) is BatchStat
    np.testing.assert_allclose(g_model["w"].value, [6.0, 6.0])
    np.testing.assert_allclose(g_model["scale"].value, 6.0)
    np.testing.assert_allclose(g_model_again["w"].value, [3.0, 3.0])
    np.testing.assert_allclose(g_x, [6.0, 12.0])


def test_vjp_matches_grad_and_counts_shared_variables_once():
    model = Tied()

    def loss(m, x):
        return m.a(x) + m.b(x)

    x = jnp.array([1.0, 1.0])
    _, vjp_fn = pg.vjp(loss, model, x)
    g_model, _ = vjp_fn(jnp.array(1.0))
    grads = pg.grad(loss)(pg.clone(model), x)
    assert set(g_model.flat_state()) == {("a", "w"), ("a", "scale")}
    np.testing.assert_allclose(g_model["a"]["w"].value, grads["a"]["w"].value)
    assert int(model.a.calls.value) == 2


def test_vjp_has_aux_and_none_cotangent():
    model = Affine()
    _, vjp_fn, aux = pg.vjp(lambda m: ((m.w.value, m.w.value.sum()), m), model, has_aux=True)
    assert aux is model
    (g,) = vjp_fn((None, jnp.array(1.0)))
    np.testing.assert_allclose(g["w"].value, [1.0, 1.0])
    np.testing.assert_allclose(g["scale"].value, 0.0)


def test_vjp_errors():
    model = Affine()
    with pytest.raises(TypeError, match="vjp expects a function"):
        pg.vjp(3, model)
    _, vjp_fn = pg.vjp(lambda m: m.w.value * 2, model)
    with pytest.raises(ValueError, match="structure of the function's output"):
        vjp_fn((jnp.ones(2), jnp.ones(2)))
    with pytest.raises(ValueError, match=r"has shape \(3,\), but the output's has shape \(2,\)"):
        vjp_fn(jnp.ones(3))
    with pytest.raises(TypeError, match="output holds a Module"):
        pg.vjp(lambda m: m, model)


# ------------------------------------------------------------------------------ jvp


def test_jvp_with_state_tangents_and_zero_for_the_rest():
    model, x = Affine(), jnp.array([1.0, 1.0])
    dw = jax.tree.map(jnp.ones_like, pg.state(model, Param))
    out, tangent = pg.jvp(lambda m, x: m(x), (model, x), (dw, None))
    assert float(out) == 9.0 and float(tangent) == 6.0  # d/dw . 1 = x.sum() * scale
    assert int(model.calls.value) == 1
    out, tangent = pg.jvp(lambda m, x: m(x), (model, x), (None, jnp.array([1.0, 0.0])))
    assert float(tangent) == 3.0
    # A dict by path works as a State; a Variable may be given as its value.
    _, tangent = pg.jvp(lambda m, x: m(x), (model, x), ({"scale": jnp.array(1.0)}, None))
    assert float(tangent) == 3.0


def test_jvp_agrees_with_jax_on_the_values():
    model, x = Affine(), jnp.array([0.5, -1.0])
    dw, dx = jnp.array([0.1, 0.2]), jnp.array([1.0, 2.0])
    tangents = (State({"w": Param(dw)}), dx)
    out, tangent = pg.jvp(lambda m, x: jnp.sin(m(x)), (model, x), tangents)

    def plain(w, x):
        return jnp.sin((w * x).sum() * 3.0)

    expected = jax.jvp(plain, (jnp.array([1.0, 2.0]), x), (dw, dx))
    np.testing.assert_allclose(out, expected[0], rtol=1e-6)
    np.testing.assert_allclose(tangent, expected[1], rtol=1e-6)


def test_jvp_has_aux_and_under_jit():
    model = Affine()
    dw = State({"w": Param(jnp.ones(2))})

    @pg.jit
    def step(m, x):
        return pg.jvp(lambda m, x: (m(x), m.calls.value), (m, x), (dw, None), has_aux=True)

    _, tangent, calls = step(model, jnp.ones(2))
    assert float(tangent) == 6.0 and int(calls) == 1 and int(model.calls.value) == 1


def test_jvp_wrong_tangents_are_refused_with_where():
    model, x = Affine(), jnp.ones(2)

    def f(m, x):
        return m(x)

    with pytest.raises(TypeError, match="primals` and `tangents` as tuples"):
        pg.jvp(f, model, x)
    with pytest.raises(ValueError, match=r"2 primal\(s\) but 1 tangent"):
        pg.jvp(f, (model, x), (None,))
    with pytest.raises(TypeError, match="must be a State"):
        pg.jvp(f, (model, x), (model, None))
    with pytest.raises(
        ValueError, match=r"entry at \.bias, but argument 0 has no .*: \.scale, \.w"
    ):
        pg.jvp(f, (model, x), ({"bias": jnp.ones(2)}, None))
    with pytest.raises(ValueError, match=r"entry at \.calls"):  # integer: not differentiated
        pg.jvp(f, (model, x), ({"calls": jnp.ones(())}, None))
    with pytest.raises(ValueError, match=r"tangents\[0\]\.w has shape \(3,\)"):
        pg.jvp(f, (model, x), ({"w": jnp.ones(3)}, None))
    with pytest.raises(ValueError, match=r"tangents\[1\] must be a dict with keys \['a'\]"):
        pg.jvp(lambda m, d: m(d["a"]), (model, {"a": x}), (None, [x]))


# ------------------------------------------------------------------------------ custom_vjp


class Scale(Module):
    def __init__(self):
        self.w = Param(jnp.array(3.0))
        self.bias = Param(jnp.array(0.5))
        self.calls = Variable(jnp.array(0))


@pg.custom_vjp
def clipped(model, x):
    model.calls.value += 1
    return model.w.value * x + model.bias.value


def clipped_fwd(model, x):
    return clipped(model, x), (model, x)


def clipped_bwd(residuals, g):
    _, out_g = g
    model, x = residuals
    clip = jnp.clip(out_g * x, -1.0, 1.0)
    return {"w": clip}, jnp.clip(out_g * model.w.value, -1.0, 1.0)  # bias left out: zero


clipped.defvjp(clipped_fwd, clipped_bwd)


def test_custom_vjp_clips_gradients_of_a_model_argument():
    model = Scale()
    assert float(clipped(model, jnp.array(2.0))) == 6.5 and int(model.calls.value) == 1
    grads, g_x = pg.grad(clipped, argnums=(0, 1))(model, jnp.array(5.0))
    assert int(model.calls.value) == 2
    assert float(grads["w"].value) == 1.0 and float(g_x) == 1.0
    assert float(grads["bias"].value) == 0.0
    small = pg.grad(clipped)(model, jnp.array(0.25))
    assert float(small["w"].value) == 0.25


def test_custom_vjp_composes_with_jit_and_later_uses_of_the_model():
    model = Scale()

    @pg.jit
    def step(m, x):
        return pg.grad(lambda m, x: clipped(m, x) + 10 * m.w.value)(m, x)

    grads = step(model, jnp.array(5.0))
    # The clipped gradient (1.0) plus the one through the later use of w (10.0).
    assert float(grads["w"].value) == 11.0
    assert int(model.calls.value) == 1


def test_custom_vjp_nondiff_argnums_and_diff_state():
    @pg.custom_vjp(nondiff_argnums=(0, DiffState(1, PathContains("w"))))
    def f(power, model, x):
        return model.w.value**power * x + model.bias.value

    def f_fwd(power, model, x):
        return f(power, model, x), (model.w.value, x)

    def f_bwd(power, residuals, g):
        (model_g, x_g), out_g = g
        # The model's entry has all its Variables, x's none (an array, not a Variable).
        assert sorted(model_g) == ["bias", "calls", "w"] and x_g is None
        w, x = residuals
        return {"w": out_g * power * w ** (power - 1) * x}, out_g * w**power

    f.defvjp(f_fwd, f_bwd)
    model = Scale()
    grads = pg.grad(f, argnums=DiffState(1, PathContains("w")))(2, model, jnp.array(1.0))
    assert float(grads["w"].value) == 6.0 and list(grads) == ["w"]


class Counter(Module):
    def __init__(self):
        self.w = Param(jnp.array(2.0))
        self.total = Param(jnp.array(0.0))
        self.steps = 0  # a static field


@pg.custom_vjp
def accumulate(model, x):
    model.total.value = model.total.value + model.w.value * x
    model.steps += 1
    return jnp.sin(x), model


def accumulate_fwd(model, x):
    return accumulate(model, x), (model.w.value, x)


def accumulate_bwd(residuals, g):
    (model_g, _), (out_g, model_out_g) = g
    assert model_out_g is None  # a Module of the output: its cotangent is in inputs_g
    w, x = residuals
    total_g = model_g["total"].value  # the cotangent of total after the call
    model_g["w"].value = total_g * x
    return model_g, total_g * w + out_g * jnp.cos(x)


accumulate.defvjp(accumulate_fwd, accumulate_bwd)


def test_custom_vjp_bwd_gets_the_cotangents_of_the_arguments_after_the_call():
    model = Counter()

    def loss(m, x):
        y, same = accumulate(m, x)
        assert same is m  # the caller's Module comes back
        return y + 3.0 * m.total.value  # a later use of the Variable accumulate wrote

    grads, g_x = pg.grad(loss, argnums=(0, 1))(model, jnp.array(0.5))
    # total = total0 + w * x: d/dw = 3 x, d/dx = 3 w + cos x, d/dtotal0 = 3.
    assert float(grads["w"].value) == pytest.approx(1.5)
    assert float(grads["total"].value) == pytest.approx(3.0)
    assert float(g_x) == pytest.approx(6.0 + np.cos(0.5), rel=1e-6)
    # The static field and the Variable written inside were written back, once.
    assert model.steps == 1 and float(model.total.value) == 1.0


def test_custom_vjp_writes_back_a_structure_change_and_returns_models_under_jit():
    model = Counter()
    y, same = pg.jit(accumulate)(model, jnp.array(1.0))
    assert same is model and model.steps == 1 and float(model.total.value) == 2.0
    assert float(y) == pytest.approx(np.sin(1.0))


def test_custom_vjp_keeps_a_tie_and_gives_the_shared_variable_once():
    seen = {}

    @pg.custom_vjp
    def f(model, x):
        model.a.scale.value = model.a.scale.value * 2.0
        return (model.b.w.value * x).sum(), model

    def f_fwd(model, x):
        return f(model, x), None

    def f_bwd(_, g):
        (model_g, _), _ = g
        seen["paths"] = sorted(model_g.flat_state())
        return model_g, None

    f.defvjp(f_fwd, f_bwd)
    model = Tied()
    pg.grad(lambda m, x: f(m, x)[0])(model, jnp.ones(2))
    # The shared Affine is listed once, at its first path, and stays shared after the call.
    assert seen["paths"] == [("a", "calls"), ("a", "scale"), ("a", "w")]
    assert model.b is model.a and float(model.b.scale.value) == 6.0
    _, out = f(model, jnp.ones(2))
    assert out is model and out.a is out.b


def test_custom_vjp_int_nondiff_argnum_may_name_a_model():
    @pg.custom_vjp(nondiff_argnums=(0,))
    def f(model, x):
        model.calls.value += 1
        return model.w.value * x

    def f_fwd(model, x):
        return f(model, x), x

    def f_bwd(model, x, g):
        (x_g,), out_g = g
        assert isinstance(model, Scale) and x_g is None
        return (out_g * model.w.value,)

    f.defvjp(f_fwd, f_bwd)
    model = Scale()
    assert float(pg.grad(f, argnums=1)(model, jnp.array(2.0))) == 3.0
    assert int(model.calls.value) == 1


def test_custom_vjp_errors():
    @pg.custom_vjp
    def f(model):
        return model.w.value

    with pytest.raises(TypeError, match=r"f\.defvjp\(fwd, bwd\)"):
        f(Scale())
    f.defvjp(lambda m: (m.w.value, None), lambda res, g: (g[1], g[1]))
    with pytest.raises(ValueError, match="bwd must return a tuple with one cotangent per"):
        pg.grad(f)(Scale())
    with pytest.raises(TypeError, match="custom_vjp expects a function"):
        pg.custom_vjp(3)
    with pytest.raises(ValueError, match="names argument 0 twice"):
        pg.custom_vjp(lambda m: m, nondiff_argnums=(0, DiffState(0, Param)))


# ------------------------------------------------------------------------------ pmap


class Norm(Module):
    def __init__(self):
        self.scale = Param(jnp.array(2.0))
        self.mean = BatchStat(jnp.array(0.0))
        self.seen = Variable(jnp.zeros(jax.local_device_count(), jnp.int32))

    def __call__(self, x):
        self.mean.value = jax.lax.pmean(x.mean(), "devices")
        self.seen.value = self.seen.value + 1
        return self.scale.value * (x - self.mean.value)


def test_pmap_writes_replicated_and_split_variables_back():
    n = jax.local_device_count()
    norm = Norm()
    axes = StateAxes({Param: None, BatchStat: None, ...: 0})
    step = pg.pmap(lambda m, x: m(x), in_axes=(axes, 0), axis_name="devices")
    x = jnp.arange(n * 3.0).reshape(n, 3)
    out = step(norm, x)
    np.testing.assert_allclose(out, 2.0 * (x - x.mean()))
    np.testing.assert_allclose(norm.mean.value, x.mean())
    np.testing.assert_array_equal(norm.seen.value, np.ones(n))


@pytest.mark.multi_device
def test_pmap_over_several_devices_with_shared_variables():
    norm = Norm()
    pair = [norm, norm]
    axes = StateAxes({Param: None, BatchStat: None, ...: 0})
    step = pg.pmap(lambda p, x: p[0](x) + p[1](x), in_axes=(axes, 0), axis_name="devices")
    out = step(pair, jnp.ones((8, 2)))
    assert out.shape == (8, 2) and out.devices() and len(out.sharding.device_set) == 8
    np.testing.assert_array_equal(norm.seen.value, np.full(8, 2))


def test_pmap_errors():
    with pytest.raises(TypeError, match=r"pmap: in_axes\[1\] must be an int, None or a StateAxes"):
        pg.pmap(lambda m, x: x, in_axes=(None, "0"))
    with pytest.raises(TypeError, match="pmap: out_axes must be an int, None or a StateAxes"):
        pg.pmap(lambda x: x, out_axes="0")
    with pytest.raises(TypeError, match="static_broadcasted_argnums is not supported"):
        pg.pmap(lambda x: x, static_broadcasted_argnums=1)
    with pytest.raises(ValueError, match="in_axes has 1 entries"):
        pg.pmap(lambda m, x: x, in_axes=(0,))(Norm(), jnp.ones(1))
    with pytest.raises(ValueError, match="nothing is mapped"):
        pg.pmap(lambda m: m.scale.value, in_axes=None)(Norm())


# ------------------------------------------------------------------------------ checkify


def test_checkify_returns_errors_and_writes_back():
    model = Scale()

    def f(m, x):
        ck.check(x > 0, "x must be positive, got {x}", x=x)
        m.calls.value += 1
        return m.w.value * x

    error, out = pg.checkify(f)(model, jnp.array(-1.0))
    assert "x must be positive, got -1.0" in error.get() and float(out) == -3.0
    assert int(model.calls.value) == 1
    error, out = pg.jit(pg.checkify(f))(model, jnp.array(2.0))
    assert error.get() is None and float(out) == 6.0 and int(model.calls.value) == 2
    with pytest.raises(ck.JaxRuntimeError, match="x must be positive"):
        pg.checkify(f)(model, jnp.array(-2.0))[0].throw()


def test_checkify_float_checks_and_module_outputs():
    model = Scale()
    model.w.value = jnp.array(-1.0)
    error, out = pg.checkify(lambda m: (jnp.log(m.w.value), m), errors=ck.float_checks)(model)
    assert "nan generated by primitive: log" in error.get()
    assert out[1] is model
    with pytest.raises(TypeError, match="checkify expects a function"):
        pg.checkify("f")


# ------------------------------------------------------------------------------ make_jaxpr


def test_make_jaxpr_of_a_module_function_writes_nothing_back():
    model = Affine()
    jaxpr = pg.make_jaxpr(lambda m, x: m(x))(model, jnp.ones(2))
    # Inputs: calls, scale, w (by name), x; outputs: the result, then calls written.
    assert [a.shape for a in jaxpr.in_avals] == [(), (), (2,), (2,)]
    assert [a.dtype for a in jaxpr.out_avals] == [jnp.float32, jnp.int32]
    assert int(model.calls.value) == 0
    shared = pg.make_jaxpr(lambda t, x: t.a(x) + t.b(x))(Tied(), jnp.ones(2))
    assert len(shared.in_avals) == 4  # the shared Module's Variables once
    with pytest.raises(TypeError, match="make_jaxpr expects a function"):
        pg.make_jaxpr(1)
