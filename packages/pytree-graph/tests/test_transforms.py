"""Graph transforms: sharing kept inside, changes written back, retracing only on new structure."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_filter
import pytree_graph as pg
from pytree_graph import BatchStat, Cache, Param, Perturbation, State, StateAxes, Variable
from pytree_module import Module, TraceContextError, data


class Linear(Module):
    def __init__(self, din, dout, key):
        self.w = Param(jax.random.normal(key, (din, dout)) * 0.1)
        self.b = Param(jnp.zeros(dout))
        self.calls = Variable(jnp.array(0))

    def __call__(self, x):
        self.calls.value += 1
        return x @ self.w.value + self.b.value


class MLP(Module):
    def __init__(self, key, depth=3):
        keys = jax.random.split(key, depth)
        self.layers = [Linear(2, 2, k) for k in keys]

    def __call__(self, x):
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return x


class Tied(Module):
    def __init__(self):
        self.encoder = Linear(2, 2, jax.random.key(0))
        self.decoder = self.encoder


class Optimizer(Module):
    """Holds the model it updates: the model is shared between two arguments."""

    def __init__(self, model):
        self.model = model
        self.step = Variable(jnp.array(0))


def counting(fun):
    traces = []

    def counted(*args, **kwargs):
        traces.append(1)
        return fun(*args, **kwargs)

    return counted, traces


# ------------------------------------------------------------------------------ jit


def test_jit_writes_variable_updates_back_and_does_not_retrace_on_new_values():
    model = MLP(jax.random.key(0))
    f, traces = counting(lambda m, x: m(x))
    step = pg.jit(f)
    x = jnp.ones(2)
    expected = model(x)  # eager call: counts one
    assert jnp.allclose(step(model, x), expected)
    assert [int(layer.calls.value) for layer in model.layers] == [2, 2, 2]
    old_w = model.layers[0].w
    model.layers[0].w.value = model.layers[0].w.value * 2  # a new value, same structure
    step(model, x * 3)
    assert len(traces) == 1
    assert model.layers[0].w is old_w
    assert [int(layer.calls.value) for layer in model.layers] == [3, 3, 3]


def test_jit_retraces_when_the_structure_changes():
    model = MLP(jax.random.key(0))
    f, traces = counting(lambda m, x: m(x))
    step = pg.jit(f)
    step(model, jnp.ones(2))
    model.layers.append(Linear(2, 2, jax.random.key(5)))
    step(model, jnp.ones(2))
    assert len(traces) == 2
    step(model, jnp.ones(2))
    model.layers[0].w.tag = "new metadata"
    step(model, jnp.ones(2))
    assert len(traces) == 3
    step(model, jnp.ones((4, 2)))  # a new shape retraces too
    assert len(traces) == 4


def test_jit_keeps_sharing_inside_and_across_arguments():
    model = Tied()
    optimizer = Optimizer(model)
    seen = []

    @pg.jit
    def step(model, optimizer):
        seen.append((model.encoder is model.decoder, optimizer.model is model))
        model.encoder.b.value += 1.0
        optimizer.step.value += 1
        return model.decoder.b.value

    out = step(model, optimizer)
    assert seen == [(True, True)]
    assert out.tolist() == [1.0, 1.0]
    assert model.decoder.b.value.tolist() == [1.0, 1.0] and model.encoder is model.decoder
    assert int(optimizer.step.value) == 1


def test_jit_returns_the_callers_objects_and_new_objects():
    model = MLP(jax.random.key(0))

    @pg.jit
    def f(m):
        return m, m.layers[1], Linear(2, 3, jax.random.key(1))

    same, layer, new = f(model)
    assert same is model and layer is model.layers[1]
    assert isinstance(new, Linear) and new.w.value.shape == (2, 3)
    assert not isinstance(new.w.value, jax.core.Tracer)


def test_jit_writes_structural_changes_back():
    model = MLP(jax.random.key(0))
    first, second = model.layers[0], model.layers[1]
    old_b = first.b

    @pg.jit
    def surgery(m):
        m.layers[0], m.layers[1] = m.layers[1], m.layers[0]  # swap submodules
        m.extra = Param(jnp.zeros(3))  # a new attribute
        m.layers[2].b = m.layers[0].b  # tie two Variables
        m.layers[1].b.tag = "tagged"  # new metadata
        del m.layers[2].calls

    surgery(model)
    assert model.layers[0] is second and model.layers[1] is first
    assert model.extra.value.tolist() == [0.0, 0.0, 0.0]
    assert model.layers[2].b is second.b
    assert first.b is old_b and first.b.tag == "tagged"
    assert not hasattr(model.layers[2], "calls")
    assert not isinstance(model.extra.value, jax.core.Tracer)


def test_jit_replaced_array_attributes_are_written_back():
    class Mutable(Module):
        def __init__(self):
            self.total = jnp.array(0.0)
            self.items = [jnp.array(1.0)]

    m = Mutable()

    @pg.jit
    def bump(m):
        m.total = m.total + 1
        m.items[0] = m.items[0] * 5

    bump(m)
    assert float(m.total) == 1.0 and float(m.items[0]) == 5.0


def test_jit_refuses_mutating_a_closed_over_object():
    model = MLP(jax.random.key(0))

    @pg.jit
    def f(x):
        return model(x)  # model is captured: its counter cannot be written

    with pytest.raises(TraceContextError, match="Pass the Variable"):
        f(jnp.ones(2))
    assert int(model.layers[0].calls.value) == 0

    # Reading a captured object is fine.
    assert pg.jit(lambda x: x @ model.layers[0].w.value)(jnp.ones(2)).shape == (2,)


def test_jit_on_objects_that_are_not_pytrees():
    class Foo(Module, pytree=False):
        def __init__(self):
            self.a = [jnp.array(1), jnp.array(2)]
            self.b = "hello"
            self.b = jnp.array(3)

    foo = Foo()

    @pg.jit
    def double(foo):
        foo.a = [x * 2 for x in foo.a]
        foo.b *= 2

    double(foo)
    assert pg.state(foo).to_pure_dict() == {"a": {0: 2, 1: 4}, "b": 6}


def test_jit_with_a_cycle_through_an_object_that_is_not_a_pytree():
    class Parent(Module, pytree=False):
        pass

    class Child(Module):
        def __init__(self, parent):
            self.parent = parent
            self.v = Variable(jnp.array(1.0))

    parent = Parent()
    parent.child = Child(parent)

    @pg.jit
    def f(p):
        assert p.child.parent is p
        p.child.v.value *= 3

    f(parent)
    assert float(parent.child.v.value) == 3.0 and parent.child.parent is parent


def test_jit_as_a_method_and_of_a_bound_method():
    class Counter(Module):
        def __init__(self):
            self.n = Variable(jnp.array(0))

        @pg.jit
        def tick(self, k):
            self.n.value += k
            return self.n.value

    c = Counter()
    assert int(c.tick(2)) == 2 and int(c.n.value) == 2
    tick = pg.jit(c.tick)  # the bound method holds the module: it is an input too
    tick(3)
    assert int(c.n.value) == 5

    @pg.jit
    def outer(x):
        return c.tick(x)  # c is captured by `outer`: the inner write-back must refuse

    with pytest.raises(TraceContextError, match="captured by the function"):
        outer(jnp.array(1))
    assert int(c.n.value) == 5


def test_jit_static_values_and_donation():
    f, traces = counting(lambda m, x, scale: m(x) * scale)
    model = MLP(jax.random.key(0))
    step = pg.jit(f)
    step(model, jnp.ones(2), 2.0)
    step(model, jnp.ones(2), 2.0)
    step(model, jnp.ones(2), 3.0)  # non-array arguments are static: a new value retraces
    assert len(traces) == 2
    donating = pg.jit(lambda m, x: m(x), donate_argnums=1)
    assert jnp.allclose(donating(model, jnp.ones(2)), model(jnp.ones(2)))


def test_jit_errors_on_a_non_callable_and_options_it_cannot_honour():
    with pytest.raises(TypeError, match="jit expects a function"):
        pg.jit(3)
    with pytest.raises(ValueError, match="static_argnums=1 holds 1, but <lambda> takes 1"):
        pg.jit(lambda x: x, static_argnums=1)
    with pytest.raises(ValueError, match="donate_argnames names 'y'"):
        pg.jit(lambda x: x, donate_argnames="y")


# ------------------------------------------------------------------------ autodiff


class Affine(Module):
    def __init__(self):
        self.w = Param(jnp.array(2.0))
        self.shift = BatchStat(jnp.array(1.0))
        self.count = Variable(jnp.array(0))

    def __call__(self, x):
        self.count.value += 1
        return self.w.value * x + self.shift.value


def test_grad_returns_a_state_of_params_and_writes_updates_back():
    model = Affine()
    grads = pg.grad(lambda m, x: m(x))(model, 3.0)
    assert isinstance(grads, State) and list(grads) == ["w"]
    assert isinstance(grads["w"], Param) and float(grads["w"].value) == 3.0
    assert int(model.count.value) == 1


def test_grad_wrt_filters_argnums_and_aux():
    model = Affine()
    both = pg.grad(lambda m, x: m(x), wrt=pytree_filter.Any(Param, BatchStat))(model, 3.0)
    assert sorted(both) == ["shift", "w"] and isinstance(both["shift"], BatchStat)
    g_model, g_x = pg.grad(lambda m, x: m(x), argnums=(0, 1))(model, jnp.array(3.0))
    assert float(g_model["w"].value) == 3.0 and float(g_x) == 2.0
    (value, aux), grads = pg.value_and_grad(lambda m, x: (m(x), m), has_aux=True)(model, 3.0)
    assert float(value) == 7.0 and aux is model and float(grads["w"].value) == 3.0
    with pytest.raises(TypeError, match=r"the Variable at \.count .* int32"):
        pg.grad(lambda m: m.count.value.sum(), wrt=...)(model)
    with pytest.raises(TypeError, match="must return a pair"):
        pg.grad(lambda m: m(1.0), has_aux=True)(model)
    with pytest.raises(ValueError, match="out of range"):
        pg.grad(lambda m: m(1.0), argnums=2)(model)


def test_grad_of_tied_weights_counts_both_uses_once():
    model = Tied()

    def loss(m, x):
        return jnp.sum(m.decoder(m.encoder(x)))

    grads = pg.grad(loss)(model, jnp.ones(2))
    # Once, at the first path in walk order (attributes by name).
    assert sorted(grads["decoder"]) == ["b", "w"] and "encoder" not in grads
    # The same as differentiating the arrays themselves, both uses summed.
    w, b = model.encoder.w.value, model.encoder.b.value
    expected = jax.grad(lambda w: jnp.sum((jnp.ones(2) @ w + b) @ w + b))(w)
    assert jnp.allclose(grads["decoder"]["w"].value, expected)


def test_grad_of_plain_arguments_and_states():
    d = {"a": jnp.array(2.0), "name": "x", "n": jnp.array(1)}
    assert pg.grad(lambda d, x: d["a"] * x)(d, 3.0) == {"a": 3.0, "name": None, "n": None}
    # States are differentiated whole (seed 002: value_and_grad over split States).
    model = Affine()
    graphdef, params, rest = pg.split(model, Param, ...)

    def loss(params, rest):
        return pg.merge(graphdef, params, rest)(2.0)

    g_params, g_rest = pg.grad(loss, argnums=(0, 1))(params, rest)
    assert float(g_params["w"].value) == 2.0 and isinstance(g_params["w"], Param)
    assert float(g_rest["shift"].value) == 1.0 and g_rest["count"] is None


def test_grad_of_perturbations():
    class Model(Module):
        def __init__(self):
            self.w = Param(jnp.array(3.0))
            self.xgrad = Perturbation(jnp.array(0.0))

        def __call__(self, x):
            return (x + self.xgrad.value) * self.w.value

    g = pg.grad(lambda m, x: m(x), wrt=Perturbation)(Model(), 1.0)
    assert list(g) == ["xgrad"] and float(g["xgrad"].value) == 3.0


def test_jit_of_grad_training_step():
    model = Affine()

    @pg.jit
    def train_step(model, x):
        loss, grads = pg.value_and_grad(lambda m: (m(x) - 1.0) ** 2)(model)
        model.w.value -= 0.1 * grads["w"].value
        return loss

    losses = [float(train_step(model, 1.0)) for _ in range(5)]
    assert losses[-1] < losses[0] and int(model.count.value) == 5


# ----------------------------------------------------------------------------- vmap


class Layer(Module):
    def __init__(self):
        self.w = Param(jnp.full(3, 2.0))
        self.last = Cache(jnp.zeros((4, 3)))

    def __call__(self, x):
        self.last.value = x * self.w.value
        return self.last.value.sum()


def test_vmap_with_axes_per_filter():
    layer = Layer()
    axes = StateAxes({Param: None, Cache: 0})
    out = pg.vmap(lambda m, x: m(x), in_axes=(axes, 0))(layer, jnp.arange(12.0).reshape(4, 3))
    assert out.shape == (4,)
    assert jnp.allclose(layer.last.value, jnp.arange(12.0).reshape(4, 3) * 2)
    assert layer.w.value.shape == (3,)


class Scaler(Module):
    def __init__(self):
        self.w = Param(jnp.full(3, 2.0))

    def scale(self, x):
        return x * self.w.value


def test_vmap_of_a_bound_method_maps_its_arguments_and_broadcasts_the_module():
    scaler = Scaler()
    out = pg.vmap(scaler.scale)(jnp.arange(12.0).reshape(4, 3))
    assert jnp.array_equal(out, jnp.arange(12.0).reshape(4, 3) * 2)


def test_vmap_errors():
    layer = Layer()
    with pytest.raises(ValueError, match="differs across the batch"):
        pg.vmap(lambda m, x: m(x), in_axes=(None, 0))(layer, jnp.ones((4, 3)))
    with pytest.raises(ValueError, match=r"no filter of StateAxes\(\{Param: None\}\) matches"):
        pg.vmap(lambda m, x: m(x), in_axes=(StateAxes({Param: None}), 0))(layer, jnp.ones(3))
    with pytest.raises(ValueError, match="nothing is mapped"):
        pg.vmap(lambda m: m.w.value, in_axes=None)(layer)
    with pytest.raises(ValueError, match="in_axes has 1 entries"):
        pg.vmap(lambda m, x: x, in_axes=(0,))(layer, jnp.ones(3))
    with pytest.raises(TypeError, match="in_axes must be"):
        pg.vmap(lambda x: x, in_axes="0")
    with pytest.raises(TypeError, match="StateAxes expects"):
        StateAxes([Param])

    def grow(m, x):
        m.extra = Param(x)

    with pytest.raises(ValueError, match="vmap: the function changed the structure"):
        pg.vmap(grow, in_axes=(None, 0))(layer, jnp.ones(3))


def test_vmap_returning_an_argument_object_keeps_one_axis():
    tied = Tied()
    stacked = pg.vmap(lambda m: m, in_axes=0, out_axes=0, axis_size=2)(
        pg.vmap(lambda _: Tied(), in_axes=0)(jnp.arange(2))
    )
    assert stacked.decoder is stacked.encoder  # the same axis both ways: returned as it came

    with pytest.raises(
        ValueError,
        match=r"vmap: Inconsistent aliasing detected: the Param reached as argument 0 at "
        r"\.decoder\.b and as the output at \[1\]\.decoder\.b is one object, but in_axes "
        r"and out_axes give it two axes:\n.*: None \(in_axes\)\n.*: 0 \(out_axes\)",
    ):
        pg.vmap(lambda m, x: (m.encoder(x), m), in_axes=(None, 0), out_axes=0)(
            tied, jnp.ones((3, 2))
        )
    # Nothing was written: the model is as it was.
    assert tied.encoder.calls.value.shape == ()

    axes = StateAxes({Param: None, ...: 0})
    with pytest.raises(
        ValueError,
        match=r"argument 0 at \.decoder\.b: None \(in_axes\)\n  the output at \.decoder\.b: 1 ",
    ):
        pg.vmap(lambda m: m, in_axes=(axes,), out_axes=1)(
            pg.vmap(lambda _: Tied(), in_axes=0, out_axes=axes)(jnp.arange(2))
        )


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: pg.vmap(f, in_axes=0, out_axes=0),
        pg.jit,
        lambda f: pg.grad(f, has_aux=True),
    ],
    ids=["vmap", "jit", "grad"],
)
def test_returning_a_captured_module_raises(transform):
    captured = Affine()

    def f(x):
        return x.sum(), captured

    with pytest.raises(
        TraceContextError,
        match=r"Trying to extract graph node from different trace level: the output holds "
        r"a Affine made outside the transform and captured by the function",
    ):
        transform(f)(jnp.ones((2, 3)))
    # Made inside, or passed in, it comes back.
    made = pg.jit(lambda x: (x, Affine()))(jnp.ones(2))[1]
    assert isinstance(made, Affine) and float(made.w.value) == 2.0
    assert pg.jit(lambda m, x: (x, m))(captured, jnp.ones(2))[1] is captured


def test_jit_may_make_a_cycle_through_a_pytree_false_module():
    traces = []

    class Node(Module, pytree=False):
        def __init__(self):
            self.ref = None
            self.w = Param(jnp.ones(2))

    @pg.jit
    def close(m):
        traces.append(1)
        m.ref = m
        return m

    node = Node()
    assert close(node) is node and node.ref is node
    close(node)  # the new structure (the cycle) traces once more, then is reused
    close(node)
    assert len(traces) == 2 and node.ref is node

    class PytreeNode(Module):
        def __init__(self):
            self.ref = data(None)

    with pytest.raises(
        ValueError, match=r"cycle through PytreeNode .* pytree Modules must form a tree"
    ):
        close(PytreeNode())


def test_vmap_builds_an_ensemble():
    class Small(Module):
        def __init__(self, key):
            self.w = Param(jax.random.normal(key, (3,)))

    ensemble = pg.vmap(Small)(jax.random.split(jax.random.key(0), 5))
    assert isinstance(ensemble, Small) and ensemble.w.value.shape == (5, 3)
    out = pg.vmap(lambda m, x: m.w.value @ x, in_axes=(0, None))(ensemble, jnp.ones(3))
    assert out.shape == (5,)


# ----------------------------------------------------------------- control flow


def test_cond_and_switch_write_back():
    count = Variable(jnp.array(0))

    def increment(c):
        c.value += 1
        return c.value

    assert int(pg.cond(jnp.array(True), increment, lambda c: c.value, count)) == 1
    assert int(pg.cond(jnp.array(False), increment, lambda c: c.value, count)) == 1
    assert int(count.value) == 1
    v = Variable(jnp.array(10.0))

    def double(v):
        v.value *= 2

    def halve(v):
        v.value /= 2

    pg.switch(jnp.array(0), [double, halve], v)
    pg.switch(jnp.array(1), [double, halve], v)
    pg.switch(jnp.array(1), [double, halve], v)
    assert float(v.value) == 5.0


class Step(Module):
    def __init__(self):
        self.step = Variable(jnp.array(0))
        self.reward = Variable(jnp.array(0.0))


def _replace_with(reward):
    def branch(m):
        m.step = Variable(m.step.value + 1)  # new Variables in place of the old
        m.reward = Variable(jnp.array(reward))

    return branch


def test_cond_branches_may_make_the_same_structure_change():
    m = Step()
    old_step = m.step
    for expected in (2.0, 0.0, 2.0):
        pg.cond(m.step.value % 2 == 0, _replace_with(2.0), _replace_with(0.0), m)
        assert float(m.reward.value) == expected
    assert int(m.step.value) == 3 and m.step is not old_step
    pg.switch(jnp.array(1), [_replace_with(1.0), _replace_with(5.0)], m)
    assert float(m.reward.value) == 5.0 and int(m.step.value) == 4


def test_cond_structure_change_keeps_a_tie():
    tied = Tied()

    def grow(t):
        t.encoder.extra = Param(t.encoder.w.value * 2)

    pg.cond(jnp.array(True), grow, grow, tied)
    assert tied.decoder is tied.encoder and tied.decoder.extra is tied.encoder.extra


def test_cond_branches_changing_structure_differently_raise_and_change_nothing():
    m = Step()
    step = m.step

    def in_place(m):
        m.step.value += 1

    with pytest.raises(
        ValueError,
        match=r"cond: the branches left the operands with "
        r"different structures \(branch 0: changed it, 1: kept it",
    ):
        pg.cond(jnp.array(True), _replace_with(1.0), in_place, m)
    assert m.step is step and int(m.step.value) == 0
    with pytest.raises(ValueError, match=r"switch: the branches .* make it in each branch"):
        pg.switch(jnp.array(0), [in_place, _replace_with(1.0)], m)


def test_loops_carry_models():
    model = Affine()

    def body(i, m):
        m.w.value = m.w.value + i
        return m

    assert pg.fori_loop(0, 4, body, model) is model
    assert float(model.w.value) == 8.0
    v = Variable(jnp.array(1))

    def double(v):
        v.value *= 2
        return v

    assert pg.while_loop(lambda v: v.value < 100, double, v) is v
    assert int(v.value) == 128


def test_loop_body_must_keep_the_carry_objects():
    model = Tied()
    kernel = model.encoder.w

    def replace_kernel(carry):
        m, c = carry
        m.encoder.w = Param(jnp.zeros_like(m.encoder.w.value))  # same shape, new object
        return m, c - 1.0

    with pytest.raises(
        ValueError,
        match=r"while_loop: body_fun returned another Param at \[0\]\.decoder\.w than the "
        r"one it was given: Variable and Module identity must be preserved",
    ):
        pg.while_loop(lambda carry: carry[1] > 0, replace_kernel, (model, 2.0))
    assert model.encoder.w is kernel and model.decoder is model.encoder

    def new_model(i, m):
        return Affine()

    with pytest.raises(ValueError, match=r"fori_loop: body_fun returned another Affine at "):
        pg.fori_loop(0, 2, new_model, Affine())


def test_loop_errors():
    model = Affine()

    def grow(i, m):
        m.extra = Param(jnp.zeros(1))
        return m

    with pytest.raises(ValueError, match="fori_loop: body_fun must return a carry of the same"):
        pg.fori_loop(0, 2, grow, model)

    def sneaky_cond(v):
        v.value += 1
        return v.value < 10

    with pytest.raises(ValueError, match="cond_fun changed a value"):
        pg.while_loop(sneaky_cond, lambda v: v, Variable(jnp.array(0)))


def test_scan_over_stacked_layers_and_with_a_model_carry():
    class Scaled(Module):
        def __init__(self, w):
            self.w = Param(w)
            self.seen = Variable(jnp.zeros_like(w))

        def __call__(self, x):
            self.seen.value = self.seen.value + x
            return x * self.w.value

    stack = Scaled(jnp.array([1.0, 2.0, 3.0]))
    y, ys = pg.scan(lambda x, layer: (layer(x), x), jnp.array(1.0), stack)
    assert float(y) == 6.0 and ys.tolist() == [1.0, 1.0, 2.0]
    assert stack.seen.value.tolist() == [1.0, 1.0, 2.0]  # each layer's write, stacked

    model = Affine()

    def step(m, x):
        return m, m(x)

    carry, outs = pg.scan(step, model, jnp.arange(3.0))
    assert carry is model and int(model.count.value) == 3
    assert outs.tolist() == [1.0, 3.0, 5.0]

    with pytest.raises(ValueError, match="both in the carry and in xs"):
        pg.scan(lambda c, x: (c, None), stack, stack)
    with pytest.raises(TypeError, match="must return a pair"):
        pg.scan(lambda c, x: c, model, jnp.arange(3.0))


# -------------------------------------------------------------- remat, eval_shape


def test_remat_and_eval_shape():
    class Block(Module):
        def __init__(self):
            self.w = Param(jnp.array(2.0))
            self.n = Variable(jnp.array(0))

        @pg.remat
        def __call__(self, x):
            self.n.value += 1
            return jnp.sin(self.w.value * x)

    block = Block()
    g = pg.grad(lambda m, x: m(x))(block, 0.5)
    assert jnp.allclose(g["w"].value, 0.5 * jnp.cos(1.0)) and int(block.n.value) == 1

    abstract = pg.eval_shape(lambda: Linear(1000, 1000, jax.random.key(0)))
    assert abstract.w.value == jax.ShapeDtypeStruct((1000, 1000), jnp.float32)
    # Nothing is written back: the objects passed are left as they are.
    out = pg.eval_shape(lambda m, x: m(x), block, jnp.ones(3))
    assert out.shape == (3,) and int(block.n.value) == 1


def test_remat_static_argnums_give_python_values():
    @pg.remat(static_argnums=(1,))
    def power(m, n, x):
        for _ in range(n):  # a Python loop on the static argument
            x = x * m.w.value
        return x

    block = Affine()
    g = pg.grad(lambda m, x: power(m, 3, x).sum())(block, jnp.ones(2))
    np.testing.assert_allclose(g["w"].value, 2 * 3 * block.w.value**2)  # two elements
    with pytest.raises(
        ValueError, match=r"remat\(power\): the static argument 1 \('n'\) is or holds a Module"
    ):
        power(block, Affine(), jnp.ones(2))
    with pytest.raises(ValueError, match=r"the static argument 1 \('n'\) is of type list"):
        power(block, [3], jnp.ones(2))


def test_remat_on_init_with_static_argnums_and_a_tie():
    class Block(Module):
        @pg.remat(static_argnums=(1, 2))
        def __init__(self, din, dout, key):
            self.first = Linear(din, dout, key)
            self.second = self.first  # a tie made inside is kept
            self.din = din

        @pg.remat
        def __call__(self, x):
            return self.second(self.first(x))

    block = Block(2, 2, jax.random.key(0))
    assert block.din == 2 and block.second is block.first
    assert isinstance(block.first.w.value, jax.Array)
    loss, g = pg.value_and_grad(lambda m, x: m(x).sum())(block, jnp.ones((1, 2)))
    assert loss.shape == () and sorted(g["first"]) == ["b", "w"]
    assert int(block.first.calls.value) == 2  # one object, called twice

    class Selfish(Module):
        @pg.remat(static_argnums=0)
        def __init__(self):
            self.w = Param(jnp.ones(2))

    with pytest.raises(
        ValueError, match=r"remat on Selfish.__init__: `static_argnums` names argument 0"
    ):
        Selfish()


def test_transforms_nest():
    model = MLP(jax.random.key(0))
    x = jnp.ones((5, 2))

    @pg.jit
    def step(m, x):
        def loss(m):
            return jnp.sum(pg.vmap(lambda m, x: m(x), in_axes=(None, 0))(m, x))

        return pg.grad(loss)(m)

    step(model, x)  # the broadcast call counters get one increment, the same for all
    assert [int(layer.calls.value) for layer in model.layers] == [1, 1, 1]

    axes = StateAxes({Param: None, ...: None})

    @pg.jit
    def forward(m, x):
        return pg.vmap(lambda m, x: m.layers[0].w.value.T @ x, in_axes=(axes, 0))(m, x)

    assert forward(model, x).shape == (5, 2)


# ---------------------------------------------------------- the cache of walks


def test_repeat_calls_see_every_kind_of_change():
    """A cached walk is reused only while nothing it depends on changed."""
    model = MLP(jax.random.key(0))
    step = pg.jit(lambda m, x: m(x))
    x = jnp.ones(2)
    step(model, x)
    # Replace a list item in place with a layer of the same structure: new values used.
    model.layers[1] = Linear(2, 2, jax.random.key(7))
    assert jnp.allclose(step(model, x), model(x))
    assert int(model.layers[1].calls.value) == 2
    # A new attribute value of a Module.
    model.layers[2].w = Param(jnp.zeros((2, 2)))
    assert jnp.allclose(step(model, x), jnp.zeros(2))

    # A Variable replaced in a dict, and a pytree=False object's attribute.
    class Holder(Module, pytree=False):
        pass

    holder = Holder()
    holder.params = {"w": Param(jnp.ones(2))}
    read = pg.jit(lambda h: h.params["w"].value * 1)
    assert read(holder).tolist() == [1.0, 1.0]
    holder.params["w"] = Param(jnp.full(2, 3.0))
    assert read(holder).tolist() == [3.0, 3.0]
    holder.params = {"w": Param(jnp.full(2, 4.0))}
    assert read(holder).tolist() == [4.0, 4.0]


def test_equal_structures_share_the_compiled_function():
    f, traces = counting(lambda m, x: m(x))
    step = pg.jit(f)
    for seed in range(3):
        step(MLP(jax.random.key(seed)), jnp.ones(2))
    assert len(traces) == 1


def test_the_cache_does_not_keep_objects_alive():
    import gc
    import weakref

    from pytree_graph._lift_cache import lift_cache

    model = MLP(jax.random.key(0))
    pg.jit(lambda m: m.layers[0].w.value)(model)
    ref = weakref.ref(model.layers[0])
    del model
    gc.collect()
    assert ref() is None
    # Entries go with their objects.
    assert all(r() is not None for e in lift_cache._entries.values() for r in e.refs)


def test_seed_002_jit_preserves_shared_references():
    class Shared(Module):
        def __init__(self):
            self.x = jnp.array(1.0)

    class Parent(Module):
        def __init__(self):
            self.left = Shared()
            self.right = self.left

    m = Parent()
    inside = []

    @pg.jit
    def f(m):
        inside.append(m.left is m.right)
        return m

    out = f(m)
    assert inside == [True] and out is m and out.left is out.right


# ------------------------------------------------ Python numbers, compiled __init__


def test_grad_of_params_holding_python_floats():
    grads = pg.grad(lambda d: d["p"].value * 2.0)({"p": Param(1.5)})
    assert type(grads["p"]) is Param and float(grads["p"].value) == 2.0

    class Scalar(Module):
        def __init__(self):
            self.p = Param(1.5)
            self.n = Param(3)

    model = Scalar()
    grads = pg.grad(lambda m: m.p.value * m.p.value, wrt=pytree_filter.PathContains("p"))(model)
    assert float(grads["p"].value) == 3.0 and model.p.value == 1.5
    with pytest.raises(TypeError, match=r"the Param at \.n of argument 0 matches wrt=Param but "):
        pg.grad(lambda m: m.p.value)(model)
    value, grads = pg.value_and_grad(lambda p: p.value**2)(Param(2.0))
    assert float(value) == 4.0 and float(grads.value) == 4.0


def test_loops_carry_python_numbers_as_jax_lax_does():
    assert pg.fori_loop(0, 3, lambda i, c: c + 1, 0).tolist() == 3
    assert pg.while_loop(lambda c: c < 5, lambda c: c + 2, 0).tolist() == 6
    model = MLP(jax.random.key(0))
    out_model, total = pg.fori_loop(0, 3, lambda i, c: (c[0], c[1] + 1.0), (model, 0.0))
    assert out_model is model and float(total) == 3.0
    carry, ys = pg.scan(lambda c, x: (c + x, c), 0.0, jnp.arange(3.0))
    assert float(carry) == 3.0 and ys.tolist() == [0.0, 0.0, 1.0]
    assert pg.fori_loop(0, 2, lambda i, c: {"n": 7}, {"n": 0})["n"].tolist() == 7


def test_jit_on_init_builds_the_object_compiled():
    traces = []

    class Built(Module):
        @pg.jit
        def __init__(self, size, key, scale=2.0):
            traces.append(size)
            self.w = Param(jax.random.normal(key, (size,)) * scale)
            self.calls = Variable(jnp.array(0))
            self.size = size
            self.key = key

    key = jax.random.key(0)
    built = Built(3, key)
    assert isinstance(built.w.value, jax.Array) and not isinstance(built.w.value, jax.core.Tracer)
    assert built.w.value.shape == (3,) and built.size == 3 and built.key is not None
    assert jnp.allclose(built.w.value, jax.random.normal(key, (3,)) * 2.0)
    again = Built(3, jax.random.key(1))
    assert len(traces) == 1 and not jnp.allclose(again.w.value, built.w.value)
    assert jax.tree.structure(again) == jax.tree.structure(built)
    Built(4, key)
    assert len(traces) == 2

    class Parent(Module):
        @pg.jit
        def __init__(self):
            self.w = Param(jnp.ones(2))

    class Child(Parent):
        def __init__(self):
            super().__init__()

    with pytest.raises(TypeError, match=r"only the `__init__` of the class being built"):
        Child()
