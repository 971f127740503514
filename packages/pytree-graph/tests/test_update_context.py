"""`update_context` with `split_context` / `merge_context` (Flax NNX's four-call protocol);
`to_flat_state`, `filter_state`, `split_state`, `PureState`, `A`; `split` / `merge` /
`update` of a lone Variable."""

import typing

import jax
import jax.numpy as jnp
import pytest

from pytree_graph import (
    A,
    BatchStat,
    FlatState,
    GraphDef,
    Param,
    PureState,
    State,
    UpdateContext,
    Variable,
    call,
    current_update_context,
    filter_state,
    from_tree,
    grad,
    merge,
    merge_context,
    split,
    split_context,
    split_state,
    state,
    to_flat_state,
    to_tree,
    unpack,
    update,
    update_context,
)
from pytree_module import Module


class Bar(Module):
    def __init__(self):
        self.x = 1
        self.w = Param(jnp.ones(2))


class Foo(Module):
    def __init__(self):
        self.a = Bar()
        self.b = self.a  # one Bar reached twice


class Tied(Module):
    def __init__(self):
        self.encoder = Param(jnp.ones(2))
        self.decoder = self.encoder  # one Variable reached twice


class Node(Module, pytree=False):
    def __init__(self):
        self.w = Param(jnp.zeros(()))


def _round_trip(tag, objects, inner_work, *, jit=True):
    """The four calls: outer split, inner merge, `inner_work`, inner split, outer merge."""

    def inside(graphdef, state):
        with merge_context(tag, inner=True) as ctx:
            inner = ctx.merge(graphdef, state)
        inner_work(inner)
        with split_context(tag) as ctx:
            return ctx.split(inner)

    inside = jax.jit(inside) if jit else inside
    with update_context(tag):
        with split_context(tag) as ctx:
            graphdef, state = ctx.split(objects)
        graphdef, state = inside(graphdef, state)
        with merge_context(tag, inner=False) as ctx:
            return ctx.merge(graphdef, state)


# ------------------------------------------------------------------ the four calls


@pytest.mark.parametrize("jit", [True, False])
def test_static_attribute_added_inside_reaches_the_original(jit):
    m = Foo()

    def work(inner):
        inner.a.y = 2
        inner.a.w.value = inner.a.w.value * 3

    out = _round_trip("t", m, work, jit=jit)
    assert out is m
    assert m.a.y == 2 and m.b.y == 2 and m.a is m.b
    assert m.a.w.value.tolist() == [3.0, 3.0]


def test_new_submodule_and_new_shared_reference():
    m = Foo()
    bar = m.a
    w = m.a.w

    def work(inner):
        inner.c = inner.a  # a new reference to an existing submodule
        inner.d = Bar()  # a new submodule

    out = _round_trip("t", m, work)
    assert out is m and m.a is bar and m.a.w is w
    assert m.c is m.a
    assert isinstance(m.d, Bar) and m.d is not m.a


def test_tied_variable_keeps_its_tie_and_object():
    model = Tied()
    encoder = model.encoder

    def work(inner):
        assert inner.encoder is inner.decoder
        inner.decoder.value = inner.decoder.value + 1

    out = _round_trip("t", model, work)
    assert out is model and model.encoder is encoder and model.decoder is encoder
    assert model.encoder.value.tolist() == [2.0, 2.0]


def test_reference_cycle_made_inside():
    node = Node()

    def work(inner):
        inner.ref = inner  # a cycle through a pytree=False object

    out = _round_trip("t", node, work)
    assert out is node and node.ref is node


def test_values_written_back_on_a_cached_call():
    """The second call of the jitted function runs no Python inside: the origins travel in
    the graphdef it returns, so the caller's objects are updated all the same."""
    traces = []

    @jax.jit
    def inside(graphdef, state):
        traces.append(1)
        with merge_context("t", inner=True) as ctx:
            inner = ctx.merge(graphdef, state)
        inner.a.w.value = inner.a.w.value + 1
        with split_context("t") as ctx:
            return ctx.split(inner)

    m = Foo()
    for _ in range(2):
        with update_context("t"):
            with split_context("t") as ctx:
                graphdef, state = ctx.split(m)
            graphdef, state = inside(graphdef, state)
            with merge_context("t", inner=False) as ctx:
                assert ctx.merge(graphdef, state) is m
    assert len(traces) == 1
    assert m.a.w.value.tolist() == [3.0, 3.0]


def test_decorator_form():
    m = Foo()

    @update_context("deco")
    def step(m):
        assert current_update_context("deco").tag == "deco"
        with split_context("deco") as ctx:
            graphdef, state = ctx.split(m)
        with merge_context("deco", inner=True) as ctx:
            inner = ctx.merge(graphdef, state)
        inner.a.x = 5
        with split_context("deco") as ctx:
            graphdef, state = ctx.split(inner)
        with merge_context("deco", inner=False) as ctx:
            return ctx.merge(graphdef, state)

    assert step(m) is m and m.a.x == 5
    with pytest.raises(ValueError, match="deco"):
        current_update_context("deco")  # closed with the function


def test_splits_in_one_context_share_objects():
    m = Foo()
    with split_context() as ctx:
        g1, s1 = ctx.split(m)
        g2, s2 = ctx.split(m)
        g3, s3 = ctx.split(m.a.w)
    assert len(to_flat_state(s1)) == 1 and len(s2) == 0 and len(s3) == 0
    with merge_context() as ctx:
        m1 = ctx.merge(g1, s1)
        m2 = ctx.merge(g2, s2)
        w = ctx.merge(g3, s3)
    assert m1 is m2 and m1 is not m and w is m1.a.w
    assert m1.a.w is not m.a.w  # the merge copies the State's Variables, as NNX's


def test_several_objects_through_one_protocol():
    first, second = Foo(), Tied()
    with update_context("two"):
        with split_context("two") as ctx:
            parts = [ctx.split(first), ctx.split(second), ctx.split(first)]

        @jax.jit
        def inside(parts):
            with merge_context("two", inner=True) as ctx:
                a, b, again = (ctx.merge(*part) for part in parts)
            assert again is a
            b.encoder.value = b.encoder.value * 0
            a.z = "new"
            with split_context("two") as ctx:
                return [ctx.split(a), ctx.split(b), ctx.split(a)]

        parts = inside(parts)
        with merge_context("two", inner=False) as ctx:
            a, b, again = (ctx.merge(*part) for part in parts)
    assert a is first and again is first and b is second
    assert first.z == "new" and second.decoder.value.tolist() == [0.0, 0.0]


def test_update_context_object_and_nesting():
    with update_context("n") as outer:
        assert isinstance(outer, UpdateContext) and current_update_context("n") is outer
        with update_context("n") as inner:
            assert current_update_context("n") is inner
        assert current_update_context("n") is outer


# ------------------------------------------------------------------ misuse


def test_split_context_without_update_context():
    with (
        pytest.raises(ValueError, match=r"split_context.*'missing'.*update_context"),
        split_context("missing"),
    ):
        pass


def test_merge_context_needs_inner_with_a_tag():
    with (
        update_context("t"),
        pytest.raises(ValueError, match=r"merge_context\('t'\).*inner"),
        merge_context("t"),
    ):
        pass


def test_inner_merge_before_outer_split():
    with (
        update_context("t"),
        pytest.raises(ValueError, match=r"inner=True.*no outer split \(step 1\)"),
        merge_context("t", inner=True),
    ):
        pass


def test_outer_merge_without_outer_split():
    m = Foo()
    with update_context("t"):
        with split_context("t") as ctx:
            graphdef, state = ctx.split(m)
        with merge_context("t", inner=True) as ctx:
            inner = ctx.merge(graphdef, state)
        with split_context("t") as ctx:
            inner_graphdef, inner_state = ctx.split(inner)
    with (
        update_context("t"),  # a new context: no step 1 in it
        pytest.raises(ValueError, match=r"inner=False.*no outer split \(step 1\)"),
        merge_context("t", inner=False) as ctx,
    ):
        ctx.merge(inner_graphdef, inner_state)
    assert not hasattr(m, "y")


def test_split_after_the_context_ended():
    with split_context() as ctx:
        pass
    with pytest.raises(TypeError, match="ended"):
        ctx.split(Foo())
    with merge_context() as merge_ctx:
        pass
    with pytest.raises(TypeError, match="ended"):
        merge_ctx.merge(*split(Foo()))


def test_current_update_context_unknown_tag():
    with pytest.raises(ValueError, match="No update context found for tag 'nope'"):
        current_update_context("nope")


def test_merge_context_checks_the_states():
    graphdef, state = split(Foo())
    with merge_context() as ctx:
        with pytest.raises(ValueError, match="Missing paths"):
            ctx.merge(graphdef, State({}))
        with pytest.raises(TypeError, match="GraphDef"):
            ctx.merge(state, state)


# ------------------------------------------------------------------ State functions


def test_to_flat_state_counts_a_tied_variable_once():
    graphdef, st = split(Tied())
    flat = to_flat_state(st)
    assert isinstance(flat, FlatState)
    assert len(flat) == 1 and flat.paths == (("decoder",),)
    assert merge(graphdef, st).encoder is merge(graphdef, st).encoder
    model = merge(graphdef, flat.to_nested_state())
    assert model.encoder is model.decoder


def test_to_flat_state_of_a_dict_and_refusal():
    flat = to_flat_state({"a": {"b": Param(1.0)}})
    assert flat.paths == (("a", "b"),)
    with pytest.raises(TypeError, match="to_flat_state expects a State"):
        to_flat_state([Param(1.0)])


def test_filter_state_and_split_state():
    st = State({"w": Param(jnp.ones(1)), "stats": {"mean": BatchStat(jnp.zeros(1))}})
    assert list(filter_state(st, Param)) == ["w"]
    params, stats = filter_state(st, Param, BatchStat)
    assert list(params) == ["w"] and list(stats) == ["stats"]
    params, rest = split_state(st, Param, ...)
    assert list(rest.flat_state()) == [("stats", "mean")]
    with pytest.raises(ValueError, match="stats"):
        split_state(st, Param)  # the BatchStat matches no filter
    with pytest.raises(TypeError):
        filter_state(st)  # a filter is required, as NNX's
    with pytest.raises(TypeError, match="split_state expects a State"):
        split_state(3, Param)


def test_pure_state_and_a_annotations():
    annotation = PureState[Foo]
    assert typing.get_origin(annotation) is tuple
    assert typing.get_args(annotation) == (GraphDef[Foo], State)

    class Counted(Variable[A]):
        pass

    counter = Counted(jnp.array(0))
    assert isinstance(counter, Variable)

    class Counter(Module):
        def __init__(self):
            self.count = Param(jnp.zeros(()))

        def inc(self):
            self.count.value += 1
            return 1

    @jax.jit
    def step(pure: PureState[Counter]):
        _, pure = call(pure).inc()
        return pure

    pure = step(step(split(Counter())))
    assert merge(*pure).count.value == 2.0


# ------------------------------------------------------------------ a lone Variable


def test_split_a_lone_variable():
    v = Param(jnp.array(1.0))
    graphdef, st = split(v)
    assert st is v and isinstance(graphdef, GraphDef)
    assert merge(graphdef, st) is v
    assert isinstance(merge(graphdef, st, copy=True), Param)
    assert merge(graphdef, st, copy=True) is not v
    assert state(v) is v


def test_split_a_lone_variable_with_filters():
    v = Param(jnp.array(1.0))
    graphdef, stats, params, rest = split(v, BatchStat, Param, ...)
    assert params is v
    assert isinstance(stats, State) and not stats and isinstance(rest, State) and not rest
    assert merge(graphdef, stats, params, rest) is v
    with pytest.raises(ValueError, match="BatchStat"):
        split(v, BatchStat)  # the Param matches no filter


def test_update_a_lone_variable():
    v = Param(jnp.array(1.0))
    _, stats, params, rest = split(v, BatchStat, Param, ...)
    params = jax.tree.map(lambda x: x * 5, params)  # a new Variable
    update(v, stats, params, rest)
    assert v.value == 5.0
    update(v, Param(jnp.array(2.0), sharding_names=("a",)))
    assert v.value == 2.0 and v.sharding_names == ("a",)


def test_lone_variable_errors():
    v = Param(jnp.array(1.0))
    graphdef, st = split(v)
    with pytest.raises(ValueError, match=r"lone Variable.*exactly one Variable"):
        merge(graphdef, st, Param(jnp.array(2.0)))
    with pytest.raises(ValueError, match=r"lone Variable.*exactly one Variable"):
        merge(graphdef, State({}))
    with pytest.raises(ValueError, match="lone Param takes exactly one Variable"):
        update(v, Param(jnp.array(2.0)), Param(jnp.array(3.0)))
    assert v.value == 1.0
    with pytest.raises(TypeError, match="single value"):
        split(jnp.ones(2))


def test_lone_variable_through_the_update_context():
    v = Param(jnp.array(1.0))

    def work(inner):
        inner.value = inner.value + 1

    assert _round_trip("v", v, work) is v
    assert v.value == 2.0


def test_variables_updated_by_variables_tree_map():
    """NNX's idiom: `jax.tree.map(update, m, grads, is_leaf=...)` updates each Variable
    from the Variable in its place."""
    p1, p2 = Param(10.0), Param(20.0)
    m = {"a": [p1, p2], "b": p1}
    grads = {"a": [Param(2.0), Param(1.0)], "b": Param(2.0)}
    jax.tree.map(update, m, grads, is_leaf=lambda x: isinstance(x, Variable))
    assert m["a"][0] is m["b"] and p1.value == 2.0 and p2.value == 1.0


# ------------------------------------------------------------------ update of static values


def test_update_sets_a_static_value_of_a_pure_dict_path():
    node = {"a": {"b": 1, "c": Param(jnp.array(2)), "d": 3}}
    update(node, {"a": {"b": 4, "c": jnp.array(10)}})
    assert node["a"]["b"] == 4 and node["a"]["c"].value == 10 and node["a"]["d"] == 3

    class Counter(Module):
        def __init__(self):
            self.w = Param(jnp.ones(2))
            self.name = "a"

    counter = Counter()
    update(counter, {"name": "b"})
    assert counter.name == "b"


def test_update_of_a_static_value_refused_changes_nothing():
    node = {"a": {"b": 1, "c": Param(jnp.array(2)), "t": (1, 2)}}
    with pytest.raises(ValueError, match=r"\.a\.b holds the static value 1.*array"):
        update(node, {"a": {"b": jnp.ones(2), "c": jnp.array(5)}})
    with pytest.raises(ValueError, match=r"\.a\.t\[0\].*tuple.*cannot be changed"):
        update(node, {"a": {"b": 7, "t": {0: 5}}})
    with pytest.raises(ValueError, match=r"at \.a\.c: shape \(3,\)"):
        update(node, {"a": {"b": 7, "c": jnp.ones(3)}})
    assert node["a"]["b"] == 1 and node["a"]["c"].value == 2 and node["a"]["t"] == (1, 2)

    class Frozen(Module, frozen=True):
        def __init__(self):
            self.n = 1

    frozen = Frozen()
    with pytest.raises(ValueError, match=r"\.n.*frozen Module"):
        update(frozen, {"n": 2})
    assert frozen.n == 1


# ------------------------------------------------------------------ flat forms and to_tree


def test_flatten_and_unflatten_through_the_protocol():
    m = Foo()
    with update_context("flat"):
        with split_context("flat") as ctx:
            graphdef, flat = ctx.flatten(m)
        assert isinstance(flat, FlatState) and flat.paths == (("a", "w"),)

        @jax.jit
        def inside(graphdef, flat):
            with merge_context("flat", inner=True) as ctx:
                inner = ctx.unflatten(graphdef, flat)
            inner.a.w.value = inner.a.w.value * 2
            inner.a.tag = "seen"
            with split_context("flat") as ctx:
                return ctx.flatten(inner, with_paths=False)

        graphdef, values = inside(graphdef, flat)
        assert isinstance(values, list) and len(values) == 1
        with merge_context("flat", inner=False) as ctx:
            out = ctx.unflatten(graphdef, values)
    assert out is m and m.a.tag == "seen" and m.a.w.value.tolist() == [2.0, 2.0]


def test_flatten_with_filters_and_errors():
    model = Tied()
    model.stats = BatchStat(jnp.zeros(1))
    with split_context() as ctx:
        graphdef, params, stats = ctx.flatten(model, Param, BatchStat)
        with pytest.raises(ValueError, match="with_paths=True"):
            ctx.flatten(model, Param, with_paths=False)
    assert params.paths == (("decoder",),) and stats.paths == (("stats",),)
    with merge_context() as ctx:
        copy = ctx.unflatten(graphdef, params, stats)
        with pytest.raises(ValueError, match="exactly the graphdef's paths"):
            ctx.unflatten(graphdef, params)
        with pytest.raises(ValueError, match="only state"):
            ctx.unflatten(graphdef, [1.0])
        with pytest.raises(TypeError, match="FlatStates"):
            ctx.unflatten(graphdef, params, State({}))
    assert copy.encoder is copy.decoder and copy.encoder is not model.encoder


def test_to_tree_and_from_tree_with_ctxtag():
    m = Foo()
    tree = (m, 1, {"again": m})
    with update_context("tree"):
        pure = to_tree(tree, ctxtag="tree")

        @jax.jit
        def inside(pure):
            inner = from_tree(pure, ctxtag="tree", is_inner=True)
            assert inner[0] is inner[2]["again"] and inner[0] is not m
            inner[0].a.w.value = inner[0].a.w.value + 4
            inner[0].extra = Bar()
            return to_tree(inner, ctxtag="tree")

        out = from_tree(inside(pure), ctxtag="tree", is_inner=False)
    assert out[0] is m and out[2]["again"] is m and out[1] == 1
    assert m.a.w.value.tolist() == [5.0, 5.0] and isinstance(m.extra, Bar)


def test_from_tree_with_ctxtag_needs_is_inner():
    with update_context("tree"):
        pure = to_tree([Foo()], ctxtag="tree")
        with pytest.raises(ValueError, match="inner"):
            from_tree(pure, ctxtag="tree")


def test_lone_variable_in_tree_mode_flatten_and_unpack():
    v = Param(jnp.array(1.0))
    graphdef, st = split(v, graph=False)
    assert st is v and merge(graphdef, st) is v
    with pytest.raises(TypeError, match=r"unpack: a lone Param.*split\(variable\)"):
        unpack(v)
    graphdef, st = split(v)
    new = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s))(st)
    assert merge(graphdef, new).value == 2.0 and v.value == 1.0


def test_update_from_grads_of_a_shared_variable():
    """`grad` gives a shared Variable's gradient at its first place and None at the
    others; NNX's `jax.tree.map(update, m, grads, is_leaf=...)` idiom skips those."""
    p1, p2 = Param(10.0), Param(20.0)
    m = {"a": [p1, p2], "b": p1}
    grads = grad(lambda m: m["a"][0].value + m["a"][1].value + m["b"].value)(m)
    assert grads["b"] is None and grads["a"][0].value == 2.0
    jax.tree.map(update, m, grads, is_leaf=lambda x: isinstance(x, Variable))
    assert m["a"][0] is m["b"] and p1.value == 2.0 and p2.value == 1.0
    update(p1, State({}))  # an empty State writes nothing, as NNX
    assert p1.value == 2.0
    with pytest.raises(ValueError):
        update(Tied(), None)  # a graph still needs a source
