"""Side by side with Flax NNX: `to_tree`/`from_tree`, `flatten`/`unflatten`, `map`, `call`,
`update` from a pure dict, `clone`'s options, views and `State.replace_by_pure_dict`
(runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


class OursLinear(Module):
    def __init__(self, n):
        self.w = pg.Param(jnp.arange(n, dtype=jnp.float32))
        self.count = pg.Variable(jnp.array(0))

    def __call__(self, x):
        self.count.value += 1
        return x * self.w.value


class OursDropout(Module):
    def __init__(self):
        self.deterministic = False


class Ours(Module):
    def __init__(self):
        self.a = OursLinear(2)
        self.b = self.a
        self.layers = [OursLinear(3), OursLinear(4)]
        self.dropout = OursDropout()

    def __call__(self, x):
        return self.b(self.a(x))


class TheirsLinear(nnx.Module):
    def __init__(self, n):
        self.w = nnx.Param(jnp.arange(n, dtype=jnp.float32))
        self.count = nnx.Variable(jnp.array(0))

    def __call__(self, x):
        self.count[...] += 1
        return x * self.w[...]


class TheirsDropout(nnx.Module):
    def __init__(self):
        self.deterministic = False


class Theirs(nnx.Module):
    def __init__(self):
        self.a = TheirsLinear(2)
        self.b = self.a
        self.layers = nnx.List([TheirsLinear(3), TheirsLinear(4)])
        self.dropout = TheirsDropout()

    def __call__(self, x):
        return self.b(self.a(x))


def _values(leaves):
    return [np.asarray(x).tolist() for x in leaves]


def test_to_tree_has_the_same_leaves_and_round_trips_through_jit():
    ours, theirs = Ours(), Theirs()
    assert _values(jax.tree.leaves(pg.to_tree(ours))) == _values(
        jax.tree.leaves(nnx.to_tree(theirs))
    )

    def bump(from_tree, to_tree, count):
        def step(tree):
            model = from_tree(tree)
            count(model)
            return to_tree(model)

        return jax.jit(step)

    def count_ours(m):
        m.b.count.value += 1

    def count_theirs(m):
        m.b.count[...] += 1

    new_ours = pg.from_tree(bump(pg.from_tree, pg.to_tree, count_ours)(pg.to_tree(ours)))
    new_theirs = nnx.from_tree(bump(nnx.from_tree, nnx.to_tree, count_theirs)(nnx.to_tree(theirs)))
    assert new_ours.a is new_ours.b and new_theirs.a is new_theirs.b
    assert int(new_ours.a.count.value) == int(new_theirs.a.count[...]) == 1
    # Both give new Variables and leave the original as it was.
    assert new_ours.a.w is not ours.a.w and new_theirs.a.w is not theirs.a.w
    assert int(ours.a.count.value) == int(theirs.a.count[...]) == 0


def test_to_tree_of_a_list_keeps_sharing_between_items():
    ours, theirs = Ours(), Theirs()
    ours_tree = pg.to_tree([ours, ours.a])
    theirs_tree = nnx.to_tree([theirs, theirs.a])
    assert len(ours_tree) == len(theirs_tree) == 2
    assert jax.tree.leaves(ours_tree[1]) == jax.tree.leaves(theirs_tree[1]) == []
    ours_back, theirs_back = pg.from_tree(ours_tree), nnx.from_tree(theirs_tree)
    assert ours_back[1] is ours_back[0].a and theirs_back[1] is theirs_back[0].a


def test_flatten_and_unflatten_have_the_same_forms():
    ours, theirs = Ours(), Theirs()
    _, ours_flat = pg.flatten(ours)
    _, theirs_flat = nnx.flatten(theirs)
    ours_pairs = [(path, leaf.value) for path, leaf in ours_flat]
    theirs_pairs = [(path, leaf[...]) for path, leaf in theirs_flat]
    assert [p for p, _ in ours_pairs] == [p for p, _ in theirs_pairs]
    assert _values(v for _, v in ours_pairs) == _values(v for _, v in theirs_pairs)
    # Both FlatStates are pytrees of the arrays alone.
    assert len(jax.tree.leaves(ours_flat)) == len(jax.tree.leaves(theirs_flat))

    ours_def, ours_values = pg.flatten(ours, with_paths=False)
    theirs_def, theirs_values = nnx.flatten(theirs, with_paths=False)
    assert _values(ours_values) == _values(theirs_values)
    ours_new = pg.unflatten(ours_def, [v + 1 for v in ours_values])
    theirs_new = nnx.unflatten(theirs_def, [v + 1 for v in theirs_values])
    assert ours_new.b.w.value.tolist() == theirs_new.b.w[...].tolist() == [1.0, 2.0]
    assert ours_new.a is ours_new.b and theirs_new.a is theirs_new.b
    # A FlatState's Variables are placed as they are, in both.
    assert pg.unflatten(*pg.flatten(ours)).a.w is ours.a.w
    assert nnx.unflatten(*nnx.flatten(theirs)).a.w is theirs.a.w


def test_map_gives_a_new_graph_sharing_returned_variables():
    ours, theirs = Ours(), Theirs()
    ours_same = pg.map(lambda path, v: v, ours)
    theirs_same = nnx.map(lambda path, v: v, theirs)
    assert ours_same is not ours and theirs_same is not theirs
    assert ours_same.a.w is ours.a.w and theirs_same.a.w is theirs.a.w
    ours_zero = pg.map(lambda path, v: v.replace(jnp.zeros_like(v.value)), ours)
    theirs_zero = nnx.map(lambda path, v: v.replace(jnp.zeros_like(v[...])), theirs)
    assert ours_zero.layers[1].w.value.tolist() == theirs_zero.layers[1].w[...].tolist()
    assert ours.layers[1].w.value.tolist() == [0.0, 1.0, 2.0, 3.0]
    # A bare value gets a Variable of the leaf's type in both.
    assert type(nnx.map(lambda p, v: v[...], theirs).a.w) is nnx.Param
    assert type(pg.map(lambda p, v: v.value, ours).a.w) is pg.Param


def test_call_returns_the_same_and_ours_leaves_the_input_state_alone():
    ours, theirs = Ours(), Theirs()
    ours_gs, theirs_gs = pg.split(ours), nnx.split(theirs)
    ours_y, (_, ours_after) = pg.call(ours_gs)(jnp.ones(2))
    theirs_y, (_, theirs_after) = nnx.call(theirs_gs)(jnp.ones(2))
    assert ours_y.tolist() == theirs_y.tolist()
    assert int(ours_after["a"]["count"].value) == int(theirs_after["a"]["count"][...]) == 2
    # NNX's call writes into the State passed in (and so into the model split from it).
    assert int(theirs.a.count[...]) == 2
    assert int(ours.a.count.value) == 0 and int(ours_gs[1]["a"]["count"].value) == 0
    ours_y, _ = pg.call(ours_gs).layers[1](jnp.ones(4))
    theirs_y, _ = nnx.call(theirs_gs).layers[1](jnp.ones(4))
    assert ours_y.tolist() == theirs_y.tolist()
    ours_y, _ = ours_gs[0].apply(ours_gs[1]).a(jnp.ones(2))
    theirs_y, _ = theirs_gs[0].apply(theirs_gs[1]).a(jnp.ones(2))
    assert ours_y.tolist() == theirs_y.tolist()


def test_update_from_a_pure_dict_and_ours_checks_it():
    ours, theirs = Ours(), Theirs()
    pg.update(ours, {"b": {"w": jnp.full(2, 5.0)}})
    nnx.update(theirs, {"b": {"w": jnp.full(2, 5.0)}})
    assert ours.a.w.value.tolist() == theirs.a.w[...].tolist() == [5.0, 5.0]
    # NNX takes a wrong shape and an unknown path without a word; we refuse both.
    nnx.update(theirs, {"b": {"w": jnp.zeros(3)}})
    assert theirs.a.w[...].shape == (3,)
    with pytest.raises(ValueError, match="shape"):
        pg.update(ours, {"b": {"w": jnp.zeros(3)}})
    nnx.update(theirs, {"nope": jnp.zeros(1)})
    with pytest.raises(ValueError, match="Not in the State"):
        pg.update(ours, {"nope": jnp.zeros(1)})
    assert ours.a.w.value.tolist() == [5.0, 5.0]


def test_clone_options_match():
    ours, theirs = Ours(), Theirs()
    for clone, model, raw in (
        (pg.clone, ours, lambda v: v.value),
        (nnx.clone, theirs, lambda v: v.get_raw_value()),
    ):
        copy = clone(model)
        assert copy.a.w is not model.a.w and raw(copy.a.w) is raw(model.a.w)
        deep = clone(model, arrays=True)
        assert raw(deep.a.w) is not raw(model.a.w) and deep.a is deep.b
        assert clone(model, variables=False).a.w is model.a.w
        with pytest.raises(ValueError):
            clone(model, variables=False, arrays=True)


def test_views_and_set_attributes():
    ours, theirs = Ours(), Theirs()
    ours_view = pg.with_attributes(ours, deterministic=True)
    theirs_view = nnx.with_attributes(theirs, deterministic=True)
    for view, model in ((ours_view, ours), (theirs_view, theirs)):
        assert view.dropout.deterministic and not model.dropout.deterministic
        assert view.dropout is not model.dropout and view.a.w is model.a.w
    with pytest.raises(ValueError, match="foo"):
        nnx.with_attributes(theirs, foo=1)
    with pytest.raises(ValueError, match="foo"):
        pg.with_attributes(ours, foo=1)
    assert pg.view(ours, deterministic=True).dropout.deterministic
    theirs.set_attributes(deterministic=True)
    pg.set_attributes(ours, deterministic=True)
    assert theirs.dropout.deterministic and ours.dropout.deterministic
    # NNX sets what it finds, then raises; ours raises first and changes nothing.
    with pytest.raises(ValueError):
        theirs.set_attributes(deterministic=False, foo=1)
    assert not theirs.dropout.deterministic
    with pytest.raises(ValueError):
        pg.set_attributes(ours, deterministic=False, foo=1)
    assert ours.dropout.deterministic


def test_state_method_replace_by_pure_dict_returns_none_in_both():
    ours_state, theirs_state = pg.state(Ours()), nnx.state(Theirs())
    pure = jax.tree.map(lambda x: x + 1, nnx.to_pure_dict(theirs_state))
    assert theirs_state.replace_by_pure_dict(pure) is None
    assert ours_state.replace_by_pure_dict(pure) is None
    assert ours_state["a"]["w"].value.tolist() == theirs_state["a"]["w"][...].tolist()
