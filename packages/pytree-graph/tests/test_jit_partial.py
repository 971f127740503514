"""jit_partial and cached_partial: bound objects read and written without a walk per call,
yet every change made outside between calls seen (or refused), never a stale answer."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import Param, Variable
from pytree_module import Module, TraceContextError, static


class Linear(Module):
    def __init__(self, scale=1.0):
        self.w = Param(jnp.ones((2, 2)))
        self.b = Param(jnp.zeros(2))
        self.scale = scale

    def __call__(self, x):
        return (x @ self.w.value + self.b.value) * self.scale


class Model(Module):
    def __init__(self):
        self.layers = [Linear(), Linear(2.0)]
        self.count = Variable(jnp.array(0))

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def step(model, x):
    """A training-like step: writes every Param and a counter, returns the loss."""
    loss, grads = pg.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    grads = grads.flat_state()
    for path, p in pg.iter_graph(model):
        if isinstance(p, Param):
            p.value = p.value - 0.01 * grads[path].value
    if hasattr(model, "count"):
        model.count.value += 1
    return loss


def params(model):
    return [p.value for _, p in pg.iter_graph(model) if isinstance(p, Variable)]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert jnp.allclose(x, y)


def test_same_results_and_writes_as_jit():
    ours, theirs = Model(), Model()
    train = pg.jit_partial(step, ours)
    jitted = pg.jit(step)
    x = jnp.ones(2)
    for _ in range(3):
        assert jnp.allclose(train(x), jitted(theirs, x))
    assert_same(params(ours), params(theirs))
    assert int(ours.count.value) == 3


def test_value_written_outside_is_read_by_the_next_call():
    model = Linear()
    apply = pg.jit_partial(lambda m, x: m(x), model)
    x = jnp.ones(2)
    assert apply(x).tolist() == [2.0, 2.0]
    model.w.value = jnp.full((2, 2), 3.0)
    assert apply(x).tolist() == [6.0, 6.0]


@pytest.mark.parametrize(
    "change",
    [
        "static_flag",
        "new_variable",
        "replaced_variable",
        "swapped_submodule",
        "list_item",
        "metadata",
    ],
)
def test_structural_change_outside_is_seen(change):
    model, reference = Model(), Model()
    apply = pg.jit_partial(lambda m, x: m(x), model)
    x = jnp.ones(2)
    apply(x)
    for m in (model, reference):
        if change == "static_flag":
            m.layers[0].scale = 5.0
        elif change == "new_variable":
            m.layers[1].extra = Param(jnp.ones(2))
        elif change == "replaced_variable":
            m.layers[0].w = Param(jnp.full((2, 2), 2.0))
        elif change == "swapped_submodule":
            m.layers[1] = Linear(3.0)
        elif change == "list_item":
            m.layers.append(Linear(4.0))
        else:
            m.layers[0].w.set_metadata(tag="new")
    assert jnp.allclose(apply(x), reference(x))
    assert jnp.allclose(apply(x), pg.jit(lambda m, x: m(x))(reference, x))


def test_writes_after_a_structural_change_reach_the_new_variable():
    model = Model()
    train = pg.jit_partial(step, model)
    train(jnp.ones(2))
    new = Param(jnp.ones((2, 2)))
    model.layers[0].w = new
    train(jnp.ones(2))
    assert model.layers[0].w is new
    assert not jnp.allclose(new.value, 1.0)


def test_structural_change_inside_is_written_back():
    model = Linear()

    def grow(m, x):
        m.extra = Param(x)
        return m(x)

    pg.jit_partial(grow, model)(jnp.ones(2))
    assert model.extra.value.tolist() == [1.0, 1.0]


def test_shared_variable_is_passed_once():
    a, b = Linear(), Linear()
    b.w = a.w  # tied

    def tied(a, b, x):
        a.w.value = a.w.value + 1.0
        return b(x)

    out = pg.jit_partial(tied, a, b)(jnp.ones(2))
    assert a.w is b.w and float(a.w.value[0, 0]) == 2.0
    assert out.tolist() == [4.0, 4.0]
    assert len(pg.jit_partial(tied, a, b)._binding.kept) == 3  # a.w, a.b, b.b


def test_returns_bound_objects_and_tuples():
    model = Linear()
    out_model, (y, n) = pg.jit_partial(lambda m, x, n: (m, (m(x), n)), model)(jnp.ones(2), 3)
    assert out_model is model and n == 3 and y.tolist() == [2.0, 2.0]


def test_static_and_keyword_per_step_arguments():
    model = Linear()

    def apply(m, x, *, times):
        return m(x) * times

    f = pg.jit_partial(apply, model)
    assert f(jnp.ones(2), times=2).tolist() == [4.0, 4.0]
    assert f(jnp.ones(2), times=3).tolist() == [6.0, 6.0]
    assert f({"a": jnp.ones(2)}["a"], times=1).tolist() == [2.0, 2.0]


def test_bound_variable():
    count = Variable(jnp.array(0))

    def tick(c, by):
        c.value += by

    f = pg.jit_partial(tick, count)
    f(jnp.array(2))
    f(jnp.array(3))
    assert int(count.value) == 5


def test_donating_bound_state_and_per_step_arguments():
    model = Linear()
    old = model.w.value
    x = jnp.ones(2)
    train = pg.jit_partial(step, model, donate_argnums=0)
    train(x)
    assert old.is_deleted() and not x.is_deleted()
    assert not model.w.value.is_deleted()
    reference = Linear()
    pg.jit(step)(reference, jnp.ones(2))
    assert_same(params(model), params(reference))
    # The per-step argument 1 (counted with the bound one): its buffer takes the output.
    apply = pg.jit_partial(lambda m, x: m(x), model, donate_argnums=1)
    apply(x)
    assert x.is_deleted() and not model.w.value.is_deleted()


def test_cached_partial_takes_the_jit_options():
    model = Linear()
    jitted = pg.jit(step, donate_argnums=0)
    old = model.w.value
    cached = pg.cached_partial(jitted, model)
    cached(jnp.ones(2))
    assert old.is_deleted()
    with pytest.raises(TypeError, match=r"compiled with `pytree_graph\.jit`"):
        pg.cached_partial(step, model)


def test_bound_method():
    model = Linear()
    assert pg.jit_partial(model.__call__)(jnp.ones(2)).tolist() == [2.0, 2.0]
    model.w.value = jnp.zeros((2, 2))
    assert pg.jit_partial(model.__call__)(jnp.ones(2)).tolist() == [0.0, 0.0]


def test_errors():
    model = Linear()
    with pytest.raises(TypeError, match=r"bound argument 1 \(of type ArrayImpl\) is not a Module"):
        pg.jit_partial(step, model, jnp.ones(2))
    with pytest.raises(TypeError, match="3 arguments were bound"):
        pg.jit_partial(step, model, Linear(), Linear())
    f = pg.jit_partial(step, model)
    with pytest.raises(TypeError, match=r"1 argument\(s\) are bound by jit_partial \(model\)"):
        f()
    with pytest.raises(TypeError, match="per-step argument args\\[0\\] holds a Linear"):
        f(Linear())
    with pytest.raises(TypeError, match="does not take `in_shardings`"):
        pg.jit_partial(step, model, in_shardings=None)
    with pytest.raises(TypeError, match="does not take `static_argnums`"):
        pg.jit_partial(step, model, static_argnums=1)


def test_called_inside_another_transform_is_refused():
    model = Linear()
    f = pg.jit_partial(step, model)
    with pytest.raises(TraceContextError):
        jax.jit(f)(jnp.ones(2))


def test_pytree_false_object_changed_outside():
    class Holder(Module, pytree=False):
        def __init__(self):
            self.inner = Linear()

    holder = Holder()
    f = pg.jit_partial(lambda h, x: h.inner(x), holder)
    f(jnp.ones(2))
    holder.inner = Linear(10.0)
    assert f(jnp.ones(2)).tolist() == [20.0, 20.0]


def test_static_attribute_wrapped_change():
    model = Linear()
    model.mode = static("a")
    f = pg.jit_partial(lambda m, x: m(x) * (1.0 if m.mode == "a" else -1.0), model)
    assert f(jnp.ones(2)).tolist() == [2.0, 2.0]
    model.mode = static("b")
    assert f(jnp.ones(2)).tolist() == [-2.0, -2.0]
