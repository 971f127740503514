"""Array-backed Variables (`ref=True` / `hijax=True`), `var_defaults`, `with_vars`."""

import pickle
import warnings

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Param, Variable, var_defaults, with_vars
from pytree_module import Module


class Counter(Module):
    def __init__(self, ref=None):
        self.w = Param(jnp.ones((2, 3)), ref=ref)
        self.count = BatchStat(jnp.array(0), ref=ref)

    def __call__(self, x):
        self.count[...] += 1
        return x @ self.w


class Tied(Module):
    def __init__(self):
        self.first = Counter(ref=True)
        self.second = Counter(ref=True)
        self.second.w = self.first.w


# --- Variables ---


def test_ref_variable_holds_a_ref_and_reads_arrays():
    v = Param(jnp.array([1.0, 2.0]), ref=True, tag="a")
    assert v.ref and not v.hijax
    assert isinstance(v.get_raw_value(), jax.Ref)
    assert isinstance(v.value, jax.Array) and not isinstance(v.value, jax.Ref)
    assert v.get_metadata() == {"ref": True, "tag": "a"}
    assert v[1] == 2.0 and (v + 1).tolist() == [2.0, 3.0]
    v[...] = jnp.array([5.0, 6.0])
    v.value = v.value * 2
    v += 1
    assert v.value.tolist() == [11.0, 13.0]
    assert isinstance(v.get_raw_value(), jax.Ref)


def test_plain_variable_has_no_flags_in_its_metadata():
    v = Param(jnp.zeros(2), ref=False, hijax=False)
    assert not v.ref and not v.hijax
    assert v.get_metadata() == {}
    assert jax.tree.structure(v) == jax.tree.structure(Param(jnp.zeros(2)))
    assert v.get_raw_value() is v.value


def test_python_number_is_kept_in_a_ref():
    v = Variable(0, ref=True)
    assert isinstance(v.get_raw_value(), jax.Ref)
    v[...] += 1
    assert int(v.value) == 1


def test_flattening_gives_the_refs():
    counter = Counter(ref=True)
    paths_leaves, _ = jax.tree_util.tree_flatten_with_path(counter)
    assert all(isinstance(leaf, jax.Ref) for _, leaf in paths_leaves)
    assert [path[-1] for path, _ in paths_leaves] == [jax.tree_util.GetAttrKey("value")] * 2
    assert all(isinstance(leaf, jax.Ref) for leaf in jax.tree.leaves(counter))


def test_plain_jit_writes_in_place():
    counter = Counter(ref=True)
    ref_before = counter.count.get_raw_value()

    @jax.jit
    def step(counter, x):
        return counter(x)

    y = step(counter, jnp.ones((1, 2)))
    step(counter, jnp.ones((1, 2)))
    assert y.shape == (1, 3)
    assert int(counter.count.value) == 2
    assert counter.count.get_raw_value() is ref_before


def test_plain_jit_value_setter_and_operators():
    v = Param(jnp.array(1.0), ref=True, tag="hi")

    @jax.jit
    def f(v, a):
        assert isinstance(v, Param) and v.tag == "hi" and v.ref
        v[...] = a
        v[...] += 5
        v.value = v.value * 2
        return v + 2

    assert float(f(v, 10.0)) == 32.0
    assert float(v.value) == 30.0


def test_hijax_dict_value_updates_in_jit():
    v = Variable({"a": jnp.array(0), "b": jnp.array(2)}, hijax=True)
    assert v.hijax and not v.ref
    assert all(isinstance(r, jax.Ref) for r in jax.tree.leaves(v.get_raw_value()))

    @jax.jit
    def step(v):
        v["a"] += 1
        v["b"] *= 2

    step(v)
    assert int(v["a"]) == 1 and int(v["b"]) == 4


def test_hijax_structure_change_refused_inside_jit_allowed_outside():
    v = Variable({"a": jnp.array(0.0)}, hijax=True)

    @jax.jit
    def add_key(v):
        v["b"] = jnp.array(1.0)

    with pytest.raises(ValueError, match="Cannot change the structure"):
        add_key(v)
    assert set(v.value) == {"a"}
    empty = Variable({}, hijax=True)
    with pytest.raises(ValueError, match="Cannot change the structure"):
        add_key(empty)
    empty["c"] = jnp.array(3.0)  # outside: new refs
    assert isinstance(empty.get_raw_value()["c"], jax.Ref)
    v["b"] = jnp.array(2.0)
    assert float(v["b"]) == 2.0
    assert isinstance(v.get_raw_value()["b"], jax.Ref)


def test_plain_dict_variable_item_assignment_copies():
    held = {"a": 1}
    v = Variable(held)
    v["b"] = 2
    assert v.value == {"a": 1, "b": 2} and held == {"a": 1}


def test_ellipsis_read_of_an_array_is_the_array():
    x = jnp.ones(3)
    assert Param(x)[...] is x


def test_eval_shape_sees_in_place_update():
    v = Param(jnp.array(0), ref=True)

    def f(v):
        v[...] += 1
        return v[...]

    assert jax.eval_shape(f, v).shape == ()


def test_copy_replace_and_pickle_make_new_refs():
    v = Param(jnp.array(1.0), ref=True)
    for new in (v.copy(), v.replace(), pickle.loads(pickle.dumps(v))):
        assert new.ref and isinstance(new.get_raw_value(), jax.Ref)
        assert new.get_raw_value() is not v.get_raw_value()
        new[...] = 7.0
        assert float(v.value) == 1.0
    plain = v.replace(ref=False)
    assert not plain.ref and not isinstance(plain.get_raw_value(), jax.Ref)


def test_from_metadata():
    v = Param.from_metadata(1, {"a": "hi", "hijax": False, "ref": False, "mutable": True})
    assert type(v) is Param and not v.hijax and v.get_metadata() == {"a": "hi", "mutable": True}
    hi = Param.from_metadata(jnp.array(1), {"a": "hi", "hijax": True})
    assert hi.hijax and isinstance(hi.get_raw_value(), jax.Ref)


def test_raw_value_get_and_set():
    v = Param(jnp.zeros(2))
    v.set_raw_value(jnp.ones(2))
    assert v.value.tolist() == [1.0, 1.0]
    r = Param(jnp.zeros(2), ref=True)
    new_ref = jax.new_ref(jnp.full(2, 3.0))
    r.set_raw_value(new_ref)
    assert r.get_raw_value() is new_ref and r.value.tolist() == [3.0, 3.0]
    with pytest.raises(TypeError, match="get_raw_value"):
        v.set_raw_value(Param(1.0))


def test_variable_metadata_carries_flags():
    boxed = pg.VariableMetadata(jnp.zeros(2), ref=True)
    assert Param(boxed).ref
    with pytest.raises(ValueError, match="ref"):
        Param(boxed, ref=False)


# --- errors ---


def test_ref_value_refused():
    with pytest.raises(ValueError, match=r"jax\.Ref.*ref=True"):
        Param(jax.new_ref(jnp.zeros(2)))
    with pytest.raises(ValueError, match=r"jax\.Ref"):
        Param({"a": jax.new_ref(jnp.zeros(2))})


def test_flags_cannot_change_through_metadata():
    v = Param(jnp.zeros(2), ref=True)
    with pytest.raises(ValueError, match=r"with_vars\(variable, ref=\.\.\.\)"):
        v.set_metadata(ref=False)
    with pytest.raises(ValueError, match="hijax"):
        v.hijax = True
    assert v.ref and not v.hijax and isinstance(v.get_raw_value(), jax.Ref)
    v.set_metadata(tag="x")  # other entries still change
    assert v.get_metadata() == {"ref": True, "tag": "x"}


@pytest.mark.parametrize("missing", ["new_ref", "Ref"])
def test_clear_error_without_mutable_arrays(monkeypatch, missing):
    monkeypatch.delattr(jax, missing)
    message = rf"jax\.new_ref.*0\.7\.2.*installed JAX is {jax.__version__}"
    with pytest.raises(RuntimeError, match=message):
        Param(jnp.zeros(2), ref=True)
    with pytest.raises(RuntimeError, match=message):
        Param.from_metadata(jnp.zeros(2), {"hijax": True})
    with pytest.raises(RuntimeError, match=message):
        with_vars(Counter(), ref=True)
    with var_defaults(hijax=True), pytest.raises(RuntimeError, match=message):
        Param(jnp.zeros(2))
    assert not Param(jnp.zeros(2)).ref  # plain Variables are unaffected


def test_tied_ref_variable_refused_by_plain_jit():
    model = Tied()

    @jax.jit
    def step(model):
        model.first.count[...] += 1

    with pytest.raises(ValueError, match=r"second\.w\.value|first\.w\.value"):
        step(model)


# --- var_defaults ---


def test_var_defaults_reads_and_scopes():
    defaults = var_defaults()
    assert isinstance(defaults, pg.VarDefaults)
    assert (defaults.hijax, defaults.ref) == (False, False)
    assert list(defaults) == ["hijax", "ref"] and len(defaults) == 2
    assert defaults["ref"] is False and dict(defaults) == {"hijax": False, "ref": False}
    with var_defaults(hijax=True, ref=False):
        assert var_defaults().hijax and not var_defaults().ref
        with var_defaults(ref=True):
            assert var_defaults() == pg.VarDefaults(hijax=True, ref=True)
            with var_defaults(hijax=False):
                assert var_defaults() == pg.VarDefaults(hijax=False, ref=True)
        assert var_defaults() == pg.VarDefaults(hijax=True, ref=False)
        assert Param(1.0).hijax and not Param(1.0, hijax=False).hijax
    assert var_defaults() == pg.VarDefaults(hijax=False, ref=False)
    assert not Param(1.0).hijax


def test_var_defaults_decorator_applies_per_call():
    @var_defaults(hijax=True, ref=True)
    def make():
        return var_defaults(), Param(jnp.zeros(2))

    assert var_defaults() == pg.VarDefaults(hijax=False, ref=False)
    defaults, v = make()
    assert defaults.hijax and defaults.ref and v.ref and v.hijax
    assert var_defaults() == pg.VarDefaults(hijax=False, ref=False)


def test_var_defaults_bare_call_sets_until_reset():
    var_defaults(ref=True)
    try:
        assert Param(jnp.zeros(2)).ref
    finally:
        var_defaults(ref=False)
    assert not Param(jnp.zeros(2)).ref


def test_var_defaults_rejects_non_bools():
    with pytest.raises(TypeError, match=r"var_defaults\(ref=\.\.\.\) takes True, False or None"):
        var_defaults(ref="yes")
    assert var_defaults() == pg.VarDefaults(hijax=False, ref=False)


def test_var_defaults_for_layers():
    with var_defaults(ref=True):
        counter = Counter()
    assert counter.w.ref and counter.count.ref

    @jax.jit
    def step(counter):
        return counter(jnp.ones((1, 2)))

    step(counter)
    assert int(counter.count.value) == 1


# --- with_vars / vars_as ---


def test_with_vars_converts_and_back():
    model = Counter()
    refs = with_vars(model, ref=True)
    assert refs is not model and not model.w.ref
    assert refs.w.ref and isinstance(refs.count.get_raw_value(), jax.Ref)
    plain = with_vars(refs, ref=False)
    assert not plain.w.ref and isinstance(plain.w.get_raw_value(), jax.Array)
    assert "ref" not in plain.w.get_metadata()
    hijax = with_vars(plain, hijax=True)
    assert hijax.w.hijax and not hijax.w.ref


def test_with_vars_only_keeps_the_others_shared():
    model = with_vars(Counter(), ref=True)
    mixed = with_vars(model, ref=False, only=BatchStat)
    assert mixed.w is model.w and not mixed.count.ref
    again = with_vars(mixed, ref=True, only=BatchStat)
    assert again.w is model.w and again.count.ref and again.count is not model.count


def test_with_vars_mutable_metadata():
    model = with_vars(Counter(), ref=True)
    frozen = with_vars(model, mutable=False)
    assert frozen.w.get_metadata("mutable") is False and frozen.w.ref
    assert with_vars(frozen, mutable=True).w.get_metadata("mutable") is True


def test_with_vars_on_variables_and_lists():
    v = Variable(1.0)
    assert with_vars(v, ref=True).ref
    node = [Variable(1.0), Variable(2.0)]
    first_only = with_vars(node, ref=True, only=lambda path, x: path[0] == 0)
    assert first_only[0].ref and first_only[1] is node[1]


def test_with_vars_refuses_duplicates_naming_the_paths():
    shared = Variable(1.0)
    with pytest.raises(ValueError, match=r"Found duplicate at paths(.|\n)*\[0\], \[1\]"):
        with_vars([shared, shared], ref=True)
    model = Tied()
    with pytest.raises(ValueError, match=r"first\.w, \.second\.w"):
        with_vars(model, ref=False)
    plain = with_vars(model, ref=False, allow_duplicates=True)
    assert plain.first.w is plain.second.w and not plain.first.w.ref


def test_vars_as_is_deprecated_with_vars():
    with pytest.warns(DeprecationWarning, match="with_vars"):
        converted = pg.vars_as([Variable(1.0)], ref=True)
    assert converted[0].ref


# --- graph functions and transforms ---


def test_split_merge_and_clone():
    model = with_vars(Counter(), ref=True)
    graphdef, state = pg.split(model)
    assert isinstance(state["w"].get_raw_value(), jax.Ref)
    rebuilt = pg.merge(graphdef, state)
    assert rebuilt.w.ref
    clone = pg.clone(model)
    assert clone.w.ref and clone.w.get_raw_value() is not model.w.get_raw_value()


def test_tied_model_stays_shared_through_pg_jit():
    model = Tied()
    shared_ref = model.first.w.get_raw_value()

    @pg.jit
    def step(model, x):
        model.first.w[...] += 1.0
        return model.second(x)

    y = step(model, jnp.ones((1, 2)))
    assert model.first.w is model.second.w
    assert model.first.w.get_raw_value() is shared_ref
    assert float(y[0, 0]) == 4.0 and float(model.second.w.value[0, 0]) == 2.0
    assert int(model.second.count.value) == 1 and int(model.first.count.value) == 0


def test_tied_model_with_vars_and_merge_keep_sharing():
    model = with_vars(Tied(), ref=False, allow_duplicates=True)
    graphdef, state = pg.split(model)
    rebuilt = pg.merge(graphdef, state)
    assert rebuilt.first.w is rebuilt.second.w


def test_variables_made_inside_pg_jit_come_out_with_refs():
    @pg.jit
    def make():
        return Counter(ref=True)

    made = make()
    assert made.w.ref and isinstance(made.w.get_raw_value(), jax.Ref)


def test_pg_grad_and_vmap_read_and_write_back():
    model = Counter(ref=True)
    count_ref = model.count.get_raw_value()

    def loss(model, x):
        return model(x).sum()

    grads = pg.grad(loss)(model, jnp.ones((1, 2)))
    assert grads["w"].value.shape == (2, 3)
    assert int(model.count.value) == 1 and model.count.get_raw_value() is count_ref

    out = pg.vmap(lambda model, x: x @ model.w, in_axes=(None, 0))(model, jnp.ones((4, 2)))
    assert out.shape == (4, 3)


def test_cond_and_scan_write_into_the_refs():
    model = Counter(ref=True)
    count_ref = model.count.get_raw_value()
    pg.cond(True, lambda m: m(jnp.ones((1, 2))), lambda m: m(jnp.ones((1, 2))), model)
    pg.scan(lambda m, x: (m, m(x[None])), in_axes=(pg.Carry, 0))(model, jnp.ones((3, 2)))
    assert int(model.count.value) == 4 and model.count.get_raw_value() is count_ref


def test_warnings_free_normal_use():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = with_vars(Counter(), ref=True)
        jax.jit(lambda m: m(jnp.ones((1, 2))))(model)


def test_jit_partial_sees_writes_made_by_plain_jit():
    model = Counter(ref=True)

    def step(model):
        model.count[...] += 1
        return model.count[...]

    train = pg.jit_partial(step, model)

    @jax.jit
    def bump(model):
        model.count[...] += 100

    assert [int(train()) for _ in range(2)] == [1, 2]
    bump(model)
    bump(model)  # compiled: writes the ref, draws no stamp
    assert int(train()) == 203 and int(model.count.value) == 203


def test_raw_ref_attribute_is_data():
    class Holder(Module):
        def __init__(self):
            self.count = jax.new_ref(jnp.array(0))

    holder = Holder()
    assert jax.tree.leaves(holder) == [holder.count]

    @jax.jit
    def bump(holder):
        holder.count[...] += 1

    bump(holder)
    bump(holder)
    assert int(holder.count[...]) == 2

    @pg.jit
    def bump_graph(holder):
        holder.count[...] += 1

    bump_graph(holder)
    assert int(holder.count[...]) == 3
