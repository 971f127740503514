"""The graph API on the seeds' examples: sharing, split/merge/state/update/pop, errors."""

import jax
import jax.numpy as jnp
import pytest

from pytree_filter import Everything
from pytree_graph import (
    BatchStat,
    GraphDef,
    Intermediate,
    Param,
    State,
    Variable,
    clone,
    find_duplicates,
    graphdef,
    iter_graph,
    merge,
    pop,
    split,
    state,
    update,
)
from pytree_module import Module, data


class Count(Variable):
    pass


class StatefulLinear(Module):
    def __init__(self, din, dout, key):
        self.w = Param(jax.random.uniform(key, (din, dout)))
        self.b = Param(jnp.zeros((dout,)))
        self.count = Count(jnp.array(0))

    def __call__(self, x):
        self.count.value += 1
        return x @ self.w.value + self.b.value


class Shared(Module):
    def __init__(self):
        self.x = jnp.array(1.0)


class Parent(Module):
    def __init__(self):
        self.left = Shared()
        self.right = self.left


def test_find_duplicates():
    assert find_duplicates(Parent()) == [[("left",), ("right",)]]
    assert find_duplicates(StatefulLinear(2, 3, jax.random.key(0))) == []


def test_sharing_is_kept_across_jit_with_split_merge():
    m = Parent()
    gdef, st = split(m)
    assert list(st) == ["left"] and list(st["left"]) == ["x"]  # stored once

    @jax.jit
    def f(gdef, st):
        inner = merge(gdef, st)
        assert inner.left is inner.right
        inner.left.x = inner.left.x + 1
        return state(inner)

    new = f(gdef, st)
    update(m, new)
    assert m.left is m.right and float(m.right.x) == 2.0


def test_functional_api_with_state_updates():
    model = StatefulLinear(2, 3, jax.random.key(0))
    gdef, st = split(model)
    assert sorted(st) == ["b", "count", "w"]
    assert type(st["w"]) is Param and type(st["count"]) is Count

    def forward(gdef, st, x):
        model = gdef.merge(st)
        y = model(x)
        _, st = split(model)
        return y, st

    y, st = jax.jit(forward)(gdef, st, jnp.ones((1, 2)))
    assert y.shape == (1, 3)
    assert int(model.count.value) == 0
    update(model, st)
    assert int(model.count.value) == 1


def test_split_with_filters_and_merge_many_states():
    model = StatefulLinear(2, 3, jax.random.key(0))
    gdef, params, counts = split(model, Param, Count)
    assert sorted(params) == ["b", "w"] and list(counts) == ["count"]
    rebuilt = gdef.merge(params, counts)
    assert isinstance(rebuilt, StatefulLinear) and rebuilt is not model
    assert jnp.array_equal(rebuilt.w.value, model.w.value)
    counts["count"].value = jnp.array(5)
    update(model, params, counts)
    assert int(model.count.value) == 5
    _, params2, rest = split(model, Param, ...)
    assert sorted(params2) == ["b", "w"] and list(rest) == ["count"]


def test_filters_must_be_exhaustive():
    model = StatefulLinear(2, 3, jax.random.key(0))
    with pytest.raises(
        ValueError,
        match=r"^Non-exhaustive filters, got a non-empty remainder\. "
        r"No filter matched the Count at path \('count',\)",
    ):
        split(model, Param)
    assert list(state(model, Param)) == ["w", "b"] or sorted(state(model, Param)) == ["b", "w"]


def test_state_holds_the_graphs_own_variables():
    model = StatefulLinear(2, 3, jax.random.key(0))
    st = state(model)
    assert st["b"] is model.b
    st["b"].value = jnp.ones(3)
    assert model.b.value.tolist() == [1.0, 1.0, 1.0]
    # merge places them in the new graph; copy=True (and clone) makes new ones.
    gdef, st = split(model)
    assert merge(gdef, st).b is model.b
    copied = merge(gdef, st, copy=True)
    assert copied.b is not model.b and copied.b.value is model.b.value
    assert clone(model).w is not model.w
    # A State mapped by JAX holds new Variables, and leaves the model alone.
    doubled = jax.tree.map(lambda x: x * 2, st)
    assert doubled["b"] is not model.b and model.b.value.tolist() == [1.0, 1.0, 1.0]


def test_model_surgery_and_weight_tying():
    class Block(Module):
        def __init__(self, key):
            self.linear = StatefulLinear(2, 2, key)

        def __call__(self, x):
            return self.linear(x)

    class MLP(Module):
        def __init__(self):
            self.blocks = [Block(jax.random.key(i)) for i in range(5)]

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model = MLP()
    model.blocks[0] = Block(jax.random.key(42))  # module replacement
    model.blocks[3] = model.blocks[1]  # module sharing
    model.blocks[2] = lambda x: x  # monkey patching
    model.blocks[-1].linear.w = model.blocks[0].linear.w  # weight tying
    assert model(jnp.ones((1, 2))).shape == (1, 2)

    gdef, st = split(model)
    assert sorted(st["blocks"]) == [0, 1, 4]  # 2 is a function, 3 is block 1 again
    assert "w" not in st["blocks"][4]["linear"]  # the tied kernel is stored at block 0
    copy = merge(gdef, st)
    assert copy.blocks[3] is copy.blocks[1]
    assert copy.blocks[4].linear.w is copy.blocks[0].linear.w
    assert copy.blocks[2] is model.blocks[2]
    assert find_duplicates(copy) == find_duplicates(model)


def test_graphdef_is_hashable_and_a_leafless_pytree():
    a = graphdef(StatefulLinear(2, 3, jax.random.key(0)))
    b = graphdef(StatefulLinear(2, 3, jax.random.key(1)))
    c = graphdef(Parent())
    # Shapes are not structure: they belong to the state (and to jit's own cache key).
    d = graphdef(StatefulLinear(2, 4, jax.random.key(0)))
    assert isinstance(a, GraphDef) and a == b == d and hash(a) == hash(b) and a != c
    assert jax.tree.leaves(a) == []
    traces = []

    @jax.jit
    def f(gdef, st):
        traces.append(1)
        return merge(gdef, st).w.value.sum()

    f(*split(StatefulLinear(2, 3, jax.random.key(0))))
    f(*split(StatefulLinear(2, 3, jax.random.key(1))))
    assert len(traces) == 1
    f(*split(StatefulLinear(2, 4, jax.random.key(0))))
    assert len(traces) == 2


def test_cycles_through_pytree_false_objects():
    class Node(Module, pytree=False):
        def __init__(self, name):
            self.name = name
            self.weight = Param(jnp.ones(1))
            self.next = None

    a, b = Node("a"), Node("b")
    a.next, b.next = b, a
    gdef, st = split(a)
    assert sorted(st) == ["next", "weight"]
    copy = merge(gdef, st)
    assert copy.next.next is copy and copy.next.name == "b" and copy is not a
    assert find_duplicates(a) == [[(), ("next", "next")]]


def test_a_cycle_through_pytree_modules_is_refused():
    class Tree(Module):
        def __init__(self):
            self.child = data(None)  # data: it will hold a Module

    class Graph(Module, pytree=False):
        def __init__(self, child):
            self.child = child

    top = Tree()
    top.child = Graph(top)
    copy = merge(*split(top))  # the cycle goes through a pytree=False object: fine
    assert copy.child.child is copy and isinstance(copy.child, Graph) and copy is not top
    assert jax.tree.leaves(copy) == [copy.child]  # JAX sees the pytree=False object as a leaf
    bad = Tree()
    inner = Tree()
    bad.child = [inner]
    inner.child = bad
    with pytest.raises(ValueError, match=r"cycle through Tree at \.child\[0\]\.child"):
        split(bad)


def test_pytree_false_objects_hold_plain_arrays_as_state():
    class Foo(Module, pytree=False):
        def __init__(self):
            self.a = [jnp.array(1), jnp.array(2)]
            self.b = "hello"
            self.b = jnp.array(3)

    foo = Foo()
    st = state(foo)
    assert st.to_pure_dict() == {"a": {0: jnp.array(1), 1: jnp.array(2)}, "b": jnp.array(3)}
    doubled = jax.tree.map(lambda x: x * 2, st)
    update(foo, doubled)
    assert [int(x) for x in foo.a] == [2, 4] and int(foo.b) == 6
    assert jax.tree_util.all_leaves([foo])  # not a pytree


def test_merge_with_wrong_states_names_the_paths():
    model = StatefulLinear(2, 3, jax.random.key(0))
    gdef, params, counts = split(model, Param, Count)
    with pytest.raises(ValueError, match=r"Missing paths: \[\('count',\)\]"):
        merge(gdef, params)
    extra = State({"extra": Param(1.0)})
    with pytest.raises(ValueError, match=r"Paths the GraphDef does not have: \[\('extra',\)\]"):
        merge(gdef, params, counts, extra)
    with pytest.raises(TypeError, match="merge expects a GraphDef first"):
        merge(params, gdef)


def test_update_with_a_state_of_another_structure_changes_nothing():
    model = StatefulLinear(2, 3, jax.random.key(0))
    before = model.b.value
    bad = State({"b": Param(jnp.ones(3)), "missing": {"x": jnp.ones(1)}})
    with pytest.raises(ValueError, match=r"nothing at \.missing"):
        update(model, bad)
    assert model.b.value is before


def test_update_of_an_array_inside_a_tuple_is_refused_before_any_write():
    class Holder(Module, pytree=False):
        def __init__(self):
            self.a = Param(jnp.zeros(1))
            self.t = (jnp.zeros(1),)

    holder = Holder()
    with pytest.raises(ValueError, match=r"array at \.t\[0\] is inside a tuple"):
        update(holder, jax.tree.map(lambda x: x + 1, state(holder)))
    assert holder.a.value.tolist() == [0.0]


def test_update_of_an_array_in_a_frozen_module_is_refused_before_any_write():
    class Frozen(Module, frozen=True):
        w: jax.Array

    class Holder(Module):
        def __init__(self):
            self.a = Param(jnp.zeros(1))
            self.frozen = Frozen(jnp.zeros(2))

    holder = Holder()
    new = jax.tree.map(lambda x: x + 1, state(holder))
    with pytest.raises(ValueError, match=r"array at \.frozen\.w is inside a Frozen \(a frozen"):
        update(holder, new)
    assert holder.a.value.tolist() == [0.0]  # the Param before it was not written either
    # A Variable inside a frozen Module changes in place: the Variable is mutable.
    frozen_param = Frozen(Param(jnp.zeros(2)))
    update(frozen_param, jax.tree.map(lambda x: x + 1, state(frozen_param)))
    assert frozen_param.w.value.tolist() == [1.0, 1.0]


def test_pop_removes_every_reference():
    class Block(Module):
        def __init__(self):
            self.w = Param(jnp.ones(2))

        def __call__(self, x):
            y = x * self.w.value
            self.y_mean = Intermediate(jnp.mean(y))
            return y

    block = Block()
    block(jnp.ones(2))
    intermediates = pop(block, Intermediate)
    assert list(intermediates) == ["y_mean"] and float(intermediates.y_mean.value) == 1.0
    assert not hasattr(block, "y_mean") and list(state(block)) == ["w"]
    with pytest.raises(TypeError, match="needs at least one filter"):
        pop(block)


def test_clone_and_iter_graph():
    model = Parent()
    copy = clone(model)
    assert copy.left is copy.right and copy.left is not model.left
    seen = [(path, type(value).__name__) for path, value in iter_graph(model)]
    assert seen == [(("left", "x"), "ArrayImpl"), (("left",), "Shared"), ((), "Parent")]


def test_state_mapping_views():
    model = StatefulLinear(2, 3, jax.random.key(0))
    st = state(model)
    assert st.w is st["w"]
    flat = st.flat_state()
    assert sorted(flat) == [("b",), ("count",), ("w",)]
    assert State.from_flat_path(flat).to_dict() == st.to_dict()
    pure = st.to_pure_dict()
    assert isinstance(pure["w"], jax.Array)
    w = st["w"]
    assert st.replace_by_pure_dict(jax.tree.map(lambda x: x * 0, pure)) is None
    assert st["w"] is w and float(w.value.sum()) == 0.0 and float(model.w.value.sum()) == 0.0
    with pytest.raises(ValueError, match=r"Missing from `pure_dict`: \.count"):
        st.replace_by_pure_dict({"w": w.value, "b": st["b"].value})
    params, rest = st.filter(Param, ...)
    assert sorted(params) == ["b", "w"] and list(rest) == ["count"]
    assert sorted(State.merge(params, rest)) == sorted(st)
    assert "State({" in repr(st) and "Param(value=f32[2,3])" in repr(st)


def test_batch_stats_and_params_split_for_grad():
    class Norm(Module):
        def __init__(self):
            self.scale = Param(jnp.ones(2))
            self.mean = BatchStat(jnp.zeros(2))

        def __call__(self, x):
            return (x - self.mean.value) * self.scale.value

    model = Norm()
    gdef, params, stats = split(model, Param, BatchStat)

    def loss(params):
        return jnp.sum(merge(gdef, params, stats)(jnp.ones(2)))

    grads = jax.grad(loss)(params)
    assert isinstance(grads, State) and type(grads["scale"]) is Param
    assert grads["scale"].value.tolist() == [1.0, 1.0]


def test_repeated_split_and_merge_take_the_fast_paths_and_stay_exact():
    """Repeats reuse the cached walk and JAX's unflatten; every change is still seen."""

    class Layer(Module):
        def __init__(self, k):
            self.w = Param(jnp.full(2, float(k)))
            self.b = BatchStat(jnp.zeros(2))

    class Net(Module):
        def __init__(self):
            self.layers = [Layer(k) for k in range(4)]
            self.scale = 2

    net = Net()
    for _ in range(3):
        gdef, st = split(net)
        rebuilt = merge(gdef, st)
        assert rebuilt is not net and rebuilt.layers[2].w is net.layers[2].w
        assert rebuilt.scale == 2 and len(rebuilt.layers) == 4
    # Changes between splits are seen: an item replaced, an attribute, metadata.
    net.layers[1] = Layer(10)
    net.scale = 3
    net.layers[0].w.tag = "t"
    gdef2, st2 = split(net)
    assert gdef2 != gdef and float(st2["layers"][1]["w"].value[0]) == 10.0
    rebuilt = merge(gdef2, st2)
    assert rebuilt.scale == 3 and rebuilt.layers[0].w.tag == "t"
    # A State changed after split goes the general way, and says what it lacks.
    gdef, st = split(net)
    st["layers"][3]["w"] = Param(jnp.ones(2) * 7)
    assert float(merge(gdef, st).layers[3].w.value[0]) == 7.0
    gdef, st = split(net)
    del st["layers"][3]["w"]
    with pytest.raises(ValueError, match=r"Missing paths: \[\('layers', 3, 'w'\)\]"):
        merge(gdef, st)
    # Bare values (no Variables) after the fast form was learnt: new Variables.
    gdef, st = split(net)
    pure = State(st.to_pure_dict())
    rebuilt = merge(gdef, pure)
    assert isinstance(rebuilt.layers[0].w, Param) and rebuilt.layers[0].w is not net.layers[0].w
    # copy=True on the fast path too.
    copied = merge(gdef, split(net)[1], copy=True)
    assert copied.layers[0].w is not net.layers[0].w
    assert copied.layers[0].w.value is net.layers[0].w.value


def test_states_copy_and_pickle():
    import copy as copy_module
    import pickle

    st = state(StatefulLinear(2, 3, jax.random.key(0)))
    for other in (copy_module.copy(st), copy_module.deepcopy(st), pickle.loads(pickle.dumps(st))):
        assert isinstance(other, State) and sorted(other) == sorted(st)
        assert other["w"].value.tolist() == st["w"].value.tolist()


# ------------------------------------------------------------ filters, clone, bad nodes


def test_split_refuses_filters_after_everything():
    model = StatefulLinear(2, 3, jax.random.key(0))
    for filters in [(..., Param), (True, Param, BatchStat), (Everything(), Param)]:
        with pytest.raises(ValueError, match=r"must come last: \(Param"):
            split(model, *filters)
    with pytest.raises(ValueError, match=r"the filters after it \(Param\) could never match"):
        state(model, ..., Param)
    with pytest.raises(
        ValueError,
        match=r"^`\.\.\.` or `True` can only be used as the last filters, "
        r"got \.\.\. at position 0 .*: it matches every leaf",
    ):
        pop(model, ..., Param)
    assert split(model, Param, ...)[1]  # `...` last is fine


def test_clone_copies_numpy_arrays():
    import numpy as np

    class Holder(Module):
        def __init__(self):
            self.table = np.zeros(3)
            self.v = Variable(np.zeros(2))
            self.j = Param(jnp.ones(2))

    original = Holder()
    copy = clone(original)
    copy.table[0] = 1.0
    copy.v.value[1] = 5.0
    assert original.table.tolist() == [0.0, 0.0, 0.0]
    assert original.v.value.tolist() == [0.0, 0.0]
    assert copy.j.value is original.j.value  # JAX arrays are immutable: shared
    single = clone(original.v)  # a Variable on its own
    assert type(single) is Variable and single is not original.v
    single.value[0] = 3.0
    assert original.v.value.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("function", [split, graphdef, clone, find_duplicates, state])
@pytest.mark.parametrize("node", [5, "text", None, jnp.ones(2)])
def test_graph_functions_refuse_a_single_value(function, node):
    with pytest.raises(TypeError, match=rf"{function.__name__} expects an object graph as its "):
        function(node)


def test_graph_functions_accept_containers_and_variables():
    v = Param(jnp.ones(2))
    for node in ([v], {"a": v}, (v, jnp.zeros(1)), [], StatefulLinear(2, 3, jax.random.key(0))):
        assert merge(*split(node)) is not None
        assert isinstance(graphdef(node), GraphDef)
        assert find_duplicates(node) == []
        clone(node)
    assert find_duplicates([v, v]) == [[(0,), (1,)]]
    assert isinstance(graphdef(v), GraphDef)
