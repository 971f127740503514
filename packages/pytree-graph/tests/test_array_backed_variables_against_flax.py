"""Array-backed Variables (`ref=True` / `hijax=True`), `var_defaults` and `with_vars` side
by side with Flax NNX 0.12 (runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_graph as pg  # noqa: E402
import pytree_module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# (library, its Module base, its graph jit)
LIBS = [
    pytest.param((nnx, nnx.Module, nnx.jit), id="nnx"),
    pytest.param((pg, pytree_module.Module, pg.jit), id="pg"),
]


def _user_metadata(variable):
    # NNX keeps `hijax`, `ref` and `eager_sharding` always; here only true flags are kept.
    return {
        k: v
        for k, v in variable.get_metadata().items()
        if k != "eager_sharding" and (k not in {"hijax", "ref"} or v is True)
    }


def _counter(lib, base, ref):
    class Counter(base):
        def __init__(self):
            self.w = lib.Param(jnp.ones((2, 3)), ref=ref)
            self.count = lib.BatchStat(jnp.array(0), ref=ref)

        def __call__(self, x):
            self.count[...] += 1
            return x @ self.w[...]

    return Counter()


@pytest.mark.parametrize("lib_", LIBS)
def test_ref_variable_basics(lib_):
    lib, _, _ = lib_
    v = lib.Param(jnp.array([1.0, 2.0]), ref=True, tag="a")
    assert v.ref is True and v.hijax is False
    assert isinstance(v.get_raw_value(), jax.Ref)
    assert _user_metadata(v) == {"ref": True, "tag": "a"}
    v[...] = jnp.array([5.0, 6.0])
    v[...] += 1
    assert v[...].tolist() == [6.0, 7.0] and float(v[1]) == 7.0
    assert isinstance(v.get_raw_value(), jax.Ref)
    ((path, leaf),) = jax.tree_util.tree_flatten_with_path(v)[0]
    assert path == (jax.tree_util.GetAttrKey("value"),) and isinstance(leaf, jax.Ref)


@pytest.mark.parametrize("lib_", LIBS)
def test_plain_jit_updates_in_place(lib_):
    lib, base, _ = lib_
    counter = _counter(lib, base, ref=True)
    count_ref = counter.count.get_raw_value()

    @jax.jit
    def step(counter, x):
        return counter(x)

    y = step(counter, jnp.ones((1, 2)))
    step(counter, jnp.ones((1, 2)))
    assert y.shape == (1, 3) and int(counter.count[...]) == 2
    assert counter.count.get_raw_value() is count_ref


@pytest.mark.parametrize("lib_", LIBS)
def test_graph_jit_updates(lib_):
    lib, base, graph_jit = lib_
    counter = _counter(lib, base, ref=True)

    @graph_jit
    def step(counter, x):
        counter.w[...] += 1.0
        return counter(x)

    y = step(counter, jnp.ones((1, 2)))
    assert float(y[0, 0]) == 4.0
    assert int(counter.count[...]) == 1 and float(counter.w[...][0, 0]) == 2.0
    assert isinstance(counter.w.get_raw_value(), jax.Ref)


@pytest.mark.parametrize("lib_", LIBS)
def test_hijax_dict_value(lib_):
    lib, _, _ = lib_
    v = lib.Variable({"a": jnp.array(0), "b": jnp.array(2)}, hijax=True)
    assert v.hijax

    @jax.jit
    def step(v):
        v["a"] += 1
        v["b"] *= 2

    step(v)
    assert int(v["a"]) == 1 and int(v["b"]) == 4


@pytest.mark.parametrize("lib_", LIBS)
def test_eval_shape_of_in_place_update(lib_):
    lib, _, _ = lib_
    v = lib.Param(jnp.array(0), ref=True)

    def f(v):
        v[...] += 1
        return v[...]

    assert jax.eval_shape(f, v).shape == ()


@pytest.mark.parametrize("lib_", LIBS)
def test_var_defaults(lib_):
    lib, _, _ = lib_
    defaults = lib.var_defaults()
    assert (defaults.hijax, defaults.ref) == (False, False)
    assert list(defaults) == ["hijax", "ref"] and len(defaults) == 2
    assert defaults["ref"] == defaults.ref
    seen = []
    with lib.var_defaults(hijax=True, ref=False):
        seen.append(tuple(lib.var_defaults().values()))
        with lib.var_defaults(ref=True):
            seen.append(tuple(lib.var_defaults().values()))
            with lib.var_defaults(hijax=False):
                seen.append(tuple(lib.var_defaults().values()))
        seen.append(tuple(lib.var_defaults().values()))
        seen.append((lib.Variable(1).hijax, lib.Variable(1, hijax=False).hijax))
    seen.append(tuple(lib.var_defaults().values()))
    assert seen == [
        (True, False),
        (True, True),
        (False, True),
        (True, False),
        (True, False),
        (False, False),
    ]

    @lib.var_defaults(hijax=True, ref=True)
    def f():
        return tuple(lib.var_defaults().values())

    assert f() == (True, True) and tuple(lib.var_defaults().values()) == (False, False)
    with lib.var_defaults(ref=True):
        v = lib.Variable(1)
    assert v.ref and isinstance(v.get_raw_value(), jax.Ref)


@pytest.mark.parametrize("lib_", LIBS)
def test_with_vars(lib_):
    lib, base, _ = lib_
    model = _counter(lib, base, ref=False)
    refs = lib.with_vars(model, ref=True)
    assert refs is not model and refs.w.ref and not model.w.ref
    assert isinstance(refs.count.get_raw_value(), jax.Ref)
    mixed = lib.with_vars(refs, ref=False, only=lib.BatchStat)
    assert mixed.w is refs.w and not mixed.count.ref
    assert not isinstance(mixed.count.get_raw_value(), jax.Ref)
    node = [lib.Variable(1.0), lib.Variable(2.0)]
    first = lib.vars_as(node, ref=True, only=lambda path, x: path[0] == 0)
    assert isinstance(first[0].get_raw_value(), jax.Ref)
    assert isinstance(first[1].get_raw_value(), float)
    # (`mutable=` is left out: NNX 0.12.8 reads `variable.mutable`, which a Variable made
    # without that metadata lacks, so it fails there.)


@pytest.mark.parametrize("lib_", LIBS)
def test_with_vars_duplicates(lib_):
    lib, _, _ = lib_
    shared = lib.Variable(1.0)
    with pytest.raises(ValueError, match="Found duplicate at path"):
        lib.with_vars([shared, shared], ref=True)
    both = lib.with_vars([shared, shared], ref=True, allow_duplicates=True)
    assert both[0].ref and both[1].ref


@pytest.mark.parametrize("lib_", LIBS)
def test_from_metadata_and_copy(lib_):
    lib, _, _ = lib_
    metadata = {"a": "hi", "hijax": False, "ref": False}
    low = lib.Param.from_metadata(1, metadata)
    assert type(low) is lib.Param and not low.hijax and low.a == "hi"
    v = lib.Param(jnp.array(1.0), ref=True)
    copy = v.copy()
    assert copy.ref and copy.get_raw_value() is not v.get_raw_value()
    copy[...] = 5.0
    assert float(v[...]) == 1.0


@pytest.mark.parametrize("lib_", LIBS)
def test_raw_value(lib_):
    lib, _, _ = lib_
    v = lib.Param(jnp.zeros(2))
    v.set_raw_value(jnp.ones(2))
    assert v.get_raw_value().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("lib_", LIBS)
def test_ref_value_refused(lib_):
    lib, _, _ = lib_
    with pytest.raises(ValueError, match="Ref"):
        lib.Param(jax.new_ref(jnp.zeros(2)))
