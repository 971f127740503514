"""Variables: value access, operators, metadata, pytree behaviour, the trace-level guard."""

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_graph import BatchStat, Cache, Intermediate, Param, Perturbation, Variable
from pytree_module import Module, TraceContextError, is_data, tree_equal


class Count(Variable):
    pass


def test_value_and_indexing():
    v = Param(jnp.arange(4.0))
    assert v.value.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert float(v[1]) == 1.0
    v[1] = 10.0
    assert v.value.tolist() == [0.0, 10.0, 2.0, 3.0]
    v.value = jnp.zeros(2)
    assert v.value.shape == (2,)
    assert len(v) == 2 and [float(x) for x in v] == [0.0, 0.0]


def test_indexed_assignment_writes_into_the_array():
    p = Param(jnp.zeros(3))
    p[...] = 1.0
    assert p.value.shape == (3,) and p.value.dtype == jnp.float32
    assert p.value.tolist() == [1.0, 1.0, 1.0] and p[...].tolist() == [1.0, 1.0, 1.0]
    p[0] = 5.0
    assert float(p[0]) == 5.0
    p[1:] = jnp.array([7.0, 8.0])
    assert p.value.tolist() == [5.0, 7.0, 8.0]
    p[...] = jnp.full(3, 2.0)
    assert p.value.tolist() == [2.0, 2.0, 2.0]
    counts = Count(jnp.zeros(2, jnp.int32))
    counts[...] = Count(jnp.array([1, 2], jnp.int32))  # a Variable's value is written
    assert counts.value.dtype == jnp.int32 and counts.value.tolist() == [1, 2]
    with pytest.raises(ValueError, match="broadcasting"):
        p[...] = jnp.ones(4)
    assert p.value.tolist() == [2.0, 2.0, 2.0]


def test_indexed_assignment_inside_jit_and_on_numpy_and_numbers():
    @jax.jit
    def fill(v, x):
        v[...] = x
        return v

    assert fill(Param(jnp.zeros((2, 2))), 3.0).value.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    buffer = np.zeros(3)
    n = Param(buffer)
    n[1] = 4.0
    assert type(n.value) is np.ndarray and n.value.tolist() == [0.0, 4.0, 0.0]
    assert buffer.tolist() == [0.0, 0.0, 0.0]  # a new array: the old one may be shared
    number = Param(1.5)
    assert number[...] == 1.5
    number[...] = 2.5
    assert number.value == 2.5


def test_operators_forward_to_the_value():
    w = Param(jnp.ones((2, 3)))
    x = jnp.ones(2)
    assert (x @ w).shape == (3,)
    assert (w.value.T @ x).shape == (3,)
    assert float((w + 1)[0, 0]) == 2.0 and float((1 + w)[0, 0]) == 2.0
    assert float((w * 3)[0, 0]) == 3.0 and float((2 - w)[0, 0]) == 1.0
    assert float((w / 2)[0, 0]) == 0.5 and float((w**2)[0, 0]) == 1.0
    assert float((-w)[0, 0]) == -1.0 and float(abs(-w)[0, 0]) == 1.0
    assert bool((w > 0).all()) and bool((w <= 1).all())
    assert w.shape == (2, 3) and w.dtype == jnp.float32
    n = Variable(7)
    assert n // 2 == 3 and n % 4 == 3 and int(n) == 7 and float(n) == 7.0
    assert [1, 2, 3, 4, 5, 6, 7, 8][n] == 8  # __index__
    assert np.asarray(w).shape == (2, 3)


def test_in_place_operators_keep_the_variable():
    class Counter(Module):
        def __init__(self):
            self.count = Count(0)

    counter = Counter()
    variable = counter.count
    counter.count += 1
    assert counter.count is variable and counter.count.value == 1
    counter.count.value += 1
    assert counter.count.value == 2


def test_equality_and_hash_are_by_identity():
    a, b = Param(1.0), Param(1.0)
    assert a == a and a != b
    assert len({a, b, a}) == 2
    assert tree_equal(a, b)


def test_metadata():
    v = Param(jnp.zeros(2), sharding=("data",), tag="w")
    assert v.sharding == ("data",) and dict(v.metadata) == {"sharding": ("data",), "tag": "w"}
    v.sharding = (None,)
    assert v.sharding == (None,)
    del v.tag
    assert dict(v.metadata) == {"sharding": (None,)}
    replaced = v.replace(jnp.ones(2), tag="b")
    assert type(replaced) is Param and replaced.tag == "b" and replaced.sharding == (None,)
    assert v.value.tolist() == [0.0, 0.0]
    with pytest.raises(AttributeError, match=r"no metadata 'missing'.*Metadata: \['sharding'\]"):
        v.missing  # noqa: B018
    with pytest.raises(TypeError, match="metadata 'names' must be hashable"):
        Param(1.0, names=["a"])


def test_metadata_travels_through_transforms():
    v = Param(jnp.ones(2), sharding=("model",))
    out = jax.jit(lambda v: jax.tree.map(lambda x: x * 2, v))(v)
    assert type(out) is Param and out.sharding == ("model",)
    assert out.value.tolist() == [2.0, 2.0]
    grads = jax.grad(lambda v: jnp.sum(v.value**2))(v)
    assert type(grads) is Param and grads.sharding == ("model",)
    stacked = jax.vmap(lambda x: Param(x, sharding=("b",)))(jnp.ones((3, 2)))
    assert stacked.value.shape == (3, 2) and stacked.sharding == ("b",)


def test_a_pytree_node_with_the_value_as_leaf():
    v = Count(jnp.array(3), note="n")
    leaves, treedef = jax.tree.flatten(v)
    assert len(leaves) == 1 and leaves[0] is v.value
    rebuilt = jax.tree.unflatten(treedef, [jnp.array(4)])
    assert type(rebuilt) is Count and rebuilt.note == "n" and int(rebuilt.value) == 4
    [(path, _)] = jax.tree_util.tree_flatten_with_path({"c": v})[0]
    assert jax.tree_util.keystr(path) == "['c'].value"
    assert jax.tree.structure(Count(1, note="n")) == jax.tree.structure(Count(2, note="n"))
    assert jax.tree.structure(Count(1, note="n")) != jax.tree.structure(Count(1, note="m"))


def test_a_data_type_of_pytree_module():
    assert is_data(Param(1.0))

    class Linear(Module):
        def __init__(self):
            self.kernel = Param(jnp.ones((2, 2)))
            self.name = "linear"

    layer = Linear()
    assert len(jax.tree.leaves(layer)) == 1


def test_subtypes():
    for cls in (Param, BatchStat, Cache, Intermediate, Perturbation, Count):
        v = cls(jnp.zeros(1))
        assert isinstance(v, Variable) and type(jax.tree.map(lambda x: x, v)) is cls


def test_writes_are_guarded_by_trace_level():
    v = Param(jnp.zeros(2))

    @jax.jit
    def write():
        v.value = jnp.ones(2)

    with pytest.raises(
        TraceContextError,
        match=r"^Cannot mutate Param from a different trace level "
        r".*created outside the current JAX transform",
    ):
        write()

    @jax.jit
    def set_metadata():
        v.tag = "x"

    with pytest.raises(TraceContextError):
        set_metadata()
    assert v.value.tolist() == [0.0, 0.0] and "tag" not in v.metadata

    @jax.jit
    def passed_in(v):
        v.value = v.value + 1  # a copy made inside the trace: allowed
        return v

    assert passed_in(v).value.tolist() == [1.0, 1.0]


def test_errors():
    with pytest.raises(TypeError, match="cannot hold another Variable"):
        Param(Param(1.0))
    v = Param(1.0)
    with pytest.raises(TypeError, match=r"assign its `\.value`"):
        v.value = Param(2.0)
    with pytest.raises(TypeError, match=r"`\[0\]` of a Param holding a float: only arrays"):
        v[0] = 2.0
    with pytest.raises(TypeError, match=r"`\[\.\.\.\]` of a Param holding None"):
        Param(None)[...] = 2.0
    with pytest.raises(AttributeError, match="reserved"):
        v._secret = 1
    assert v.value == 1.0


def test_repr_copy_and_pickle():
    v = Param(jnp.zeros((2, 3)), sharding=(None, "model"))
    assert repr(v) == "Param(value=f32[2,3], sharding=(None, 'model'))"
    for other in (copy.copy(v), copy.deepcopy(v), pickle.loads(pickle.dumps(v)), v.copy()):
        assert type(other) is Param and other is not v and other.sharding == (None, "model")
        assert other.value.shape == (2, 3)


class TiedCoder(Module):
    def __init__(self):
        self.kernel = Param(jnp.ones((2, 2)), sharding=(None, "model"))
        self.dec_kernel = self.kernel
        self.stats = BatchStat(jnp.zeros(2))
        self.bias = Param(jnp.zeros(2))


def test_tree_at_replacing_a_variable_by_a_value_keeps_the_variable():
    import pytree_graph as pg
    from pytree_module import tree_at

    model = TiedCoder()
    new = tree_at(lambda m: m.dec_kernel, model, jnp.full((2, 2), 3.0))
    # A new Param of the same kind (the input is not changed), still tied, still a Param.
    assert type(new.dec_kernel) is Param and new.dec_kernel.sharding == (None, "model")
    assert new.dec_kernel is new.kernel and new.kernel is not model.kernel
    assert new.kernel.value.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert model.kernel.value.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert set(pg.state(new, Param).flat_state()) == {("bias",), ("dec_kernel",)}
    # replace_fn gets the Variable; what it returns (Variable arithmetic gives an array)
    # is the new value.
    doubled = tree_at(lambda m: m.stats, model, replace_fn=lambda s: s + 1.0)
    assert type(doubled.stats) is BatchStat and doubled.stats.value.tolist() == [1.0, 1.0]
    assert doubled.kernel is doubled.dec_kernel
    # Picking the value is the same change.
    by_value = tree_at(lambda m: m.kernel.value, model, jnp.zeros((2, 2)))
    assert by_value.kernel is by_value.dec_kernel and by_value.kernel.value.sum() == 0
    # A Variable given is put in at the place picked (as `m.dec_kernel = Param(...)`
    # would): the decoder gets its own Param.
    untied = tree_at(lambda m: m.dec_kernel, model, Param(jnp.zeros((2, 2))))
    assert untied.dec_kernel is not untied.kernel and untied.kernel.sharding == (None, "model")
    assert type(tree_at(lambda m: m.bias, model, Count(jnp.ones(2))).bias) is Count
    # `None` removes it; a Module replaces it (model surgery).
    assert tree_at(lambda m: m.bias, model, None).bias is None
    assert type(tree_at(lambda m: m.bias, model, TiedCoder()).bias) is TiedCoder
    # Variables as leaves (`is_leaf`) are kept the same way.
    as_leaf = tree_at(
        lambda m: m.kernel, model, jnp.zeros((2, 2)), is_leaf=lambda x: isinstance(x, Variable)
    )
    assert type(as_leaf.kernel) is Param and as_leaf.kernel is as_leaf.dec_kernel
    # Two paths to one Variable cannot get two values.
    with pytest.raises(ValueError, match="twice, by two paths to one shared object"):
        tree_at(lambda m: (m.kernel, m.dec_kernel), model, (jnp.zeros((2, 2)), jnp.ones((2, 2))))


def test_a_variable_holding_a_function_is_called_like_it():
    class Scaled(Param):
        def get_value(self):
            return lambda x: super(Scaled, self).get_value()(x) * 10

    assert Param(lambda x, y=1: x + y)(2, y=3) == 5
    assert Scaled(lambda x: x + 1)(1) == 20  # through a get_value override
    with pytest.raises(
        TypeError,
        match=r"Param is called like its value, but its value \(ArrayImpl\) is not callable",
    ):
        Param(jnp.ones(2))(1)


def test_flax_nnx_variable_hooks_are_refused_with_the_fix():
    with pytest.raises(
        TypeError,
        match=r"Param got the Variable hook\(s\) \['on_get_value'\].*overriding `get_value`",
    ):
        Param(jnp.array(1), on_get_value=lambda variable, value: value + 3)
    v = Param(jnp.array(1))
    with pytest.raises(TypeError, match=r"\['on_add_axis', 'on_set_value'\]"):
        v.set_metadata(on_set_value=lambda variable, value: value, on_add_axis=print)
    assert v.get_metadata() == {}  # nothing changed
