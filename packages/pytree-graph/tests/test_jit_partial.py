"""jit_partial and cached_partial: bound objects read and written without a walk per call,
yet every change made outside between calls seen (or refused), never a stale answer."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param, Variable
from pytree_module import Dict, List, Module, TraceContextError, static


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


@pytest.mark.parametrize("x", [jnp.ones(2), {"x": jnp.ones(2)}], ids=["array", "dict"])
def test_compiles_once_for_calls_of_one_structure(x):
    traces = []

    def apply(model, x):
        traces.append(None)
        return model(x if isinstance(x, jax.Array) else x["x"])

    model = Linear()
    fast = pg.jit_partial(apply, model)
    for _ in range(3):
        fast(x)
    assert len(traces) == 1


def test_value_written_outside_is_read_by_the_next_call():
    model = Linear()
    apply = pg.jit_partial(lambda m, x: m(x), model)
    x = jnp.ones(2)
    assert apply(x).tolist() == [2.0, 2.0]
    model.w.value = jnp.full((2, 2), 3.0)
    assert apply(x).tolist() == [6.0, 6.0]


def _bump(model, by):
    """Writes `w` only (never `b`), returns both: shows what each call was given."""
    model.w.value = model.w.value + by
    return model.w.value[0, 0], model.b.value[0]


# Every way a value can reach a Variable between two calls of a bound function: each must
# be read by the next call (a call passes on the values the last one wrote unless a value
# was written since). Each factory takes the model and gives the write; a write through a
# transform is made once before (so that the one between calls runs compiled, not traced).
WRITERS = {
    "value setter": lambda m: lambda: setattr(m.w, "value", m.w.value + 7.0),
    "set_value": lambda m: lambda: m.w.set_value(m.w.value * 3.0),
    "setitem": lambda m: lambda: m.w.__setitem__((...,), 10.0),
    "pg.jit": lambda m: partial(pg.jit(_add_to_w), m, 10.0),
    "another jit_partial": lambda m: partial(pg.jit_partial(_add_to_w, m), 10.0),
    "update": lambda m: lambda: pg.update(m, {"w": m.w.value + 10.0}),
    "state update": lambda m: lambda: pg.update(m, pg.State({"w": Param(m.w.value + 10.0)})),
    "merge in place": lambda m: lambda: pg.update(m, _state_with_w(m, 10.0)),
    "__init__ again": lambda m: lambda: m.w.__init__(m.w.value + 10.0),
    "__setstate__": lambda m: lambda: m.w.__setstate__((m.w.value + 10.0, {})),
    "vmap write back": lambda m: partial(
        pg.vmap(lambda m, v, _: _add_to_w(m, v), in_axes=(None, None, 0)), m, 10.0, jnp.arange(3)
    ),
}


def _add_to_w(model, value):
    model.w.value = model.w.value + value


def _state_with_w(model, value):
    state = pg.state(model)
    state.replace_by_pure_dict({"w": model.w.value + value, "b": model.b.value})
    return state


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_way_of_writing_a_value_between_calls_is_read(writer):
    # The reference first, in full: its writes must not run between the bound calls (any
    # write of any Variable makes the next call read its values again).
    reference = Linear()
    write_reference = WRITERS[writer](reference)
    write_reference()
    _bump(reference, 1.0)
    _bump(reference, 1.0)
    write_reference()
    expected = [float(v) for v in _bump(reference, 1.0)]
    model = Linear()
    write = WRITERS[writer](model)
    write()
    bump = pg.jit_partial(_bump, model)
    bump(1.0)
    bump(1.0)  # passes on what the first call wrote
    write()
    assert [float(v) for v in bump(1.0)] == expected
    assert jnp.array_equal(model.w.value, reference.w.value)


@pytest.fixture
def synchronous_dispatch():
    """Host callbacks run before a call returns (as on a CPU with synchronous dispatch)."""
    before = jax.config.read("jax_cpu_enable_async_dispatch")
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    yield
    jax.config.update("jax_cpu_enable_async_dispatch", before)


def test_a_value_written_while_a_call_runs_is_read_by_the_next(synchronous_dispatch):
    # Host code writes `b` while the step runs (as another thread could): the values the
    # call passes on to the next one must not hide that write.
    model = Linear()
    written = []

    def write_b():
        written.append(len(written) + 1.0)
        model.b.value = jnp.full(2, written[-1])

    def step(m, x):
        m.w.value = m.w.value + x
        jax.debug.callback(write_b)
        return m.b.value[0]

    train = pg.jit_partial(step, model)
    seen = [float(train(1.0)) for _ in range(4)]
    assert seen == [0.0, 1.0, 2.0, 3.0]


def test_a_variable_the_step_does_not_write_keeps_its_value_and_its_outside_writes():
    model = Linear()
    bump = pg.jit_partial(_bump, model)
    for _ in range(3):
        w, b = bump(1.0)
    assert (float(w), float(b)) == (4.0, 0.0)
    model.b.value = jnp.full(2, 5.0)
    w, b = bump(1.0)
    assert (float(w), float(b)) == (5.0, 5.0)
    w, b = bump(1.0)
    assert (float(w), float(b)) == (6.0, 5.0)


def test_repeated_calls_donating_bound_state_match_jit():
    model, reference = Model(), Model()
    train = pg.jit_partial(step, model, donate_argnums=0)
    x = jnp.ones(2)
    for _ in range(4):
        assert jnp.allclose(train(x), pg.jit(step)(reference, x))
    assert_same(params(model), params(reference))
    assert not any(v.is_deleted() for v in params(model))


@pytest.mark.parametrize("change", ["List item", "List append", "Dict item", "Dict delete"])
def test_changes_to_List_and_Dict_are_seen(change):
    class Blocks(Module):
        def __init__(self):
            self.layers = List([Linear(), Linear(2.0)])
            self.extra = Dict(a=Linear(3.0))

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return sum((layer(x) for layer in self.extra.values()), x)

    model = Blocks()
    apply = pg.jit_partial(lambda m, x: m(x), model)
    x = jnp.ones(2)
    apply(x)
    apply(x)
    if change == "List item":
        model.layers[1] = Linear(5.0)
    elif change == "List append":
        model.layers.append(Linear(4.0))
    elif change == "Dict item":
        model.extra["a"] = Linear(-1.0)
    else:
        del model.extra["a"]
    assert jnp.allclose(apply(x), model(x))


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
    with pytest.raises(TypeError, match="argument 0 is bound, so it cannot be static"):
        pg.jit_partial(step, model, static_argnums=0)


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


@pytest.mark.parametrize("how", ["__init__", "__setstate__"])
def test_a_variable_initialized_again_between_calls_is_seen(how):
    # Its metadata is part of the structure: the next call must see the new one, even
    # after calls that took the quick path (nothing changed).
    model = Linear()
    f = pg.jit_partial(lambda m, x: m(x) * m.w.metadata.get("factor", 1.0), model)
    x = jnp.ones(2)
    f(x)
    f(x)
    if how == "__init__":
        model.w.__init__(jnp.full((2, 2), 2.0), factor=3.0)
    else:
        model.w.__setstate__((jnp.full((2, 2), 2.0), {"factor": 3.0}))
    assert f(x).tolist() == [12.0, 12.0]


def test_refused_inside_another_transform_after_eager_calls():
    x = jnp.ones(2)
    # Called inside `jax.jit` on objects made there (allowed), a jit_partial function
    # meets tracers as per-step arguments: later calls with tracers take the quick path,
    # unless it checks the trace.
    jax.jit(lambda x: pg.jit_partial(step, Linear())(x))(x)
    model = Linear()
    f = pg.jit_partial(step, model)
    f(x)
    f(x)
    with pytest.raises(TraceContextError):
        jax.jit(f)(x)
    reference = Linear()
    for _ in range(3):
        step(reference, x)
    f(x)
    assert_same(params(model), params(reference))


def test_keyword_and_static_arguments_after_quick_calls():
    model = Linear()
    f = pg.jit_partial(lambda m, x, scale=1.0: m(x) * scale, model)
    x = jnp.ones(2)
    f(x)
    f(x)
    assert f(x, scale=2.0).tolist() == [4.0, 4.0]
    assert f(x=x).tolist() == [2.0, 2.0]
    assert f(x).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("change", ["swap", "reorder", "dict"])
def test_plain_lists_and_dicts_changed_between_quick_calls_are_seen(change):
    # The replacement is made before the calls: no Variable is written after them, so
    # only the comparison of the plain containers can see the change.
    model, spare = Model(), Linear(3.0)
    model.blocks = {"a": Linear(), "b": Linear(2.0)}
    model.layers[0].b.value = jnp.ones(2)  # so that the order of the layers matters
    f = pg.jit_partial(lambda m, x: m(x) + sum(b(x) for b in m.blocks.values()), model)
    x = jnp.ones(2)
    f(x)
    f(x)
    if change == "swap":
        model.layers[1] = spare
    elif change == "reorder":
        model.layers.reverse()
    else:
        model.blocks["b"] = spare
    expected = model(x) + sum(b(x) for b in model.blocks.values())
    assert jnp.allclose(f(x), expected)


def _copies(model):
    """Every way of making new Variables from a model's: name -> the copy."""
    import copy
    import pickle

    graphdef, state = pg.split(model)
    return {
        "Variable.copy": model.layers[0].w.copy(),
        "Variable.replace": model.layers[0].w.replace(),
        "copy.copy": copy.copy(model.layers[0].w),
        "copy.deepcopy": copy.deepcopy(model),
        "pickle": pickle.loads(pickle.dumps(model)),
        "clone": pg.clone(model),
        "merge(copy=True)": pg.merge(graphdef, state, copy=True),
        "jax.tree.map": jax.tree.map(lambda a: a, model),
        "jax unflatten": jax.tree.unflatten(*reversed(jax.tree.flatten(model))),
        "deref/reref": pg.reref(pg.deref(model)),
        "to_tree/from_tree": pg.from_tree(pg.to_tree(model)),
    }


def _variables_of(tree):
    found = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Variable))
    return [v for v in found if isinstance(v, Variable)]


def test_no_two_variables_share_a_value_list():
    # Writes go into a Variable's value list in place (`jit_partial`, `set_value`): a
    # list held by two Variables would make a write to one show in the other.
    model = Model()
    variables = _variables_of(model)
    for made in _copies(model).values():
        for variable in _variables_of(made):
            if not any(variable is v for v in variables):
                variables.append(variable)
    lists = {id(v._pg_flat[0]) for v in variables}
    assert len(lists) == len(variables)


@pytest.mark.parametrize("how", list(_copies(Model())))
def test_copies_keep_their_values_while_the_original_trains(how):
    model = Model()
    train = pg.jit_partial(step, model)
    x = jnp.ones(2)
    train(x)
    originals = _variables_of(model)
    made = [v for v in _variables_of(_copies(model)[how]) if not any(v is o for o in originals)]
    assert made  # new Variables, not the model's own
    before = [v.value for v in made]
    train(x)
    train(x)
    assert_same([v.value for v in made], before)
    trained = [v.value for v in originals]
    for v in made:
        v.value = jnp.zeros_like(v.value)  # and a write to a copy leaves the model alone
    assert_same([v.value for v in originals], trained)


def test_eval_shape_computes_nothing_and_changes_nothing():
    model = Model()
    train = pg.jit_partial(step, model)
    before = params(model)
    loss = train.eval_shape(jnp.ones(2))
    assert isinstance(loss, jax.ShapeDtypeStruct) and loss.shape == ()
    assert_same(params(model), before)

    def grown(m, x):
        m.layers[0].w.value = jnp.zeros((2, 2))
        return m, x * 2

    out, doubled = pg.jit_partial(grown, model).eval_shape(jnp.ones(2))
    assert out is not model and isinstance(out.layers[0].w.value, jax.ShapeDtypeStruct)
    assert doubled.shape == (2,)
    assert_same(params(model), before)
    with pytest.raises(TypeError, match="holds a Linear"):
        train.eval_shape(Linear())


def test_a_class_attribute_binds_like_a_method():
    model = Linear()

    class Holder:
        scale = 2.0
        apply = pg.jit_partial(lambda m, holder, x: m(x) * holder.scale, model)

    assert Holder().apply(jnp.ones(2)).tolist() == [4.0, 4.0]
    assert Holder.apply is vars(Holder)["apply"]  # on the class: the function itself


@pytest.mark.multi_device
def test_shardings_lay_out_the_bound_objects_the_steps_arguments_and_the_output():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from pytree_graph import StateSharding

    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())

    class Wide(Module):
        def __init__(self):
            self.w = Param(jnp.arange(8.0))
            self.count = Variable(jnp.array(0))

    def train(m, x):
        m.w.value = m.w.value * x
        m.count.value += 1
        return m.w.value + x

    model, reference = Wide(), Wide()
    laid_out = pg.jit_partial(
        train,
        model,
        in_shardings=(StateSharding({Param: rows, ...: replicated}), rows),
        out_shardings=rows,
    )
    for _ in range(3):
        out = laid_out(jnp.full(8, 2.0))
        expected = train(reference, jnp.full(8, 2.0))
    assert jnp.array_equal(out, expected) and jnp.array_equal(model.w.value, reference.w.value)
    assert model.w.value.sharding.is_equivalent_to(rows, 1)
    assert len(model.w.value.addressable_shards) == 8  # one row per device
    assert model.count.value.sharding.is_equivalent_to(replicated, 0)
    assert out.sharding.is_equivalent_to(rows, 1)
    # One sharding for everything; per-step arguments laid out through a prefix.
    both = pg.jit_partial(lambda w, xs: w.value * xs["a"], Param(jnp.ones(8)), in_shardings=rows)
    assert both({"a": jnp.ones(8)}).sharding.is_equivalent_to(rows, 1)


def test_shardings_errors():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    model = Linear()
    apply = pg.jit_partial(lambda m, x: m(x), model, in_shardings=(None, rows, rows))
    with pytest.raises(ValueError, match=r"in_shardings has 3 entries, 1 for the bound"):
        apply(jnp.ones(2))
    pairs = pg.jit_partial(lambda m, p: m(p[0]), model, in_shardings=(None, (rows, rows, rows)))
    with pytest.raises(ValueError, match=r"in_shardings\[1\] \(for per-step argument 0\)"):
        pairs((jnp.ones(2), jnp.ones(2)))
    assert pg.jit_partial(lambda m, x: m(x), model, in_shardings=(None, rows))(
        jnp.ones(2)
    ).tolist() == [2.0, 2.0]
