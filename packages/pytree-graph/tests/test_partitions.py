"""refx's partition functions: tree_partition, merge_partitions, get_partition, update_refs."""

import pickle

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import NOTHING, Variable


def by_collection(c):
    return lambda x: getattr(x, "collection", None) == c


def refs():
    r1 = Variable(1.0, collection="params")
    r2 = Variable(2.0, collection="batch_stats")
    return r1, r2, {"a": [r1, r1, r2], "b": r2}


def test_seed_partition_example():
    r1, r2, pytree = refs()
    (params, rest), partitiondef = pg.tree_partition(pytree, by_collection("params"))
    assert params == {("a", "0"): r1, ("a", "1"): r1, ("a", "2"): NOTHING, ("b",): NOTHING}
    assert rest == {("a", "0"): NOTHING, ("a", "1"): NOTHING, ("a", "2"): r2, ("b",): r2}
    merged = pg.merge_partitions((params, rest), partitiondef)
    assert merged["a"][0] is merged["a"][1] is r1 and merged["b"] is r2
    assert pg.get_partition(pytree, by_collection("params")) == params


def test_seed_gradient_descent_example():
    r1, r2, pytree = refs()
    (params, rest), treedef = pg.tree_partition(pg.deref(pytree), by_collection("params"))

    def loss(params):
        tree = pg.reref(pg.merge_partitions((params, rest), treedef))
        # r1 appears twice but is one Variable: its value counts once per use
        return tree["a"][0].value * 3 + tree["a"][1].value + tree["b"].value

    grads = jax.grad(loss)(params)
    params = jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)
    pg.update_refs(pg.get_partition(pytree, by_collection("params")), params)
    assert r1.value == pytest.approx(1.0 - 0.1 * 4)
    assert r2.value == 2.0  # not in the partition: untouched
    assert pytree["a"][0] is pytree["a"][1]  # still tied


def test_partitions_are_pytrees_of_only_their_leaves():
    _, _, pytree = refs()
    (params, rest), _ = pg.tree_partition(pg.deref(pytree), by_collection("params"))
    assert len(jax.tree.leaves(params)) == 1 and len(jax.tree.leaves(rest)) == 1
    doubled = jax.jit(lambda p: jax.tree.map(lambda x: 2 * x, p))(params)
    assert doubled[("a", "2")] is NOTHING and doubled[("a", "1")].type is Variable


def test_one_more_partition_than_predicates_first_match_wins():
    tree = {"w": jnp.ones(2), "n": 3, "s": pg.Param(jnp.zeros(1)), "t": pg.BatchStat(1.0)}
    (arrays, params, rest), pdef = pg.tree_partition(
        tree, lambda x: isinstance(x, jax.Array), pg.Variable
    )
    assert arrays[("w",)] is tree["w"] and params[("s",)] is tree["s"]
    assert params[("t",)] is tree["t"] and rest[("n",)] == 3
    assert pdef.paths == (("n",), ("s",), ("t",), ("w",))
    # any filter works, with the paths filters see elsewhere
    (params_only, _), _ = pg.tree_partition(tree, pg.Param)
    assert [p for p, v in params_only.items() if v is not NOTHING] == [("s",)]
    (by_path, _), _ = pg.tree_partition({"layers": [1, 2]}, lambda path, x: path[-1] == 1)
    assert by_path == {("layers", "0"): NOTHING, ("layers", "1"): 2}


def test_deref_places_read_type_and_metadata():
    _, _, pytree = refs()
    values = jax.tree.leaves(
        pg.deref(pytree), is_leaf=lambda x: isinstance(x, pg.VariableValue | pg.VariableIndex)
    )
    first, again = values[0], values[1]
    assert isinstance(first, pg.VariableValue) and isinstance(again, pg.VariableIndex)
    assert first.type is again.type is Variable
    assert first.collection == again.collection == "params"
    with pytest.raises(AttributeError, match="VariableIndex of a Variable has no attribute"):
        _ = again.sharding


def test_tied_model_partitioned_and_merged_keeps_sharing():
    from pytree_module import Module

    class Tied(Module):
        def __init__(self):
            self.embed = pg.Param(jnp.ones((3, 2)))
            self.unembed = self.embed
            self.scale = pg.BatchStat(jnp.ones(2))

    model = Tied()
    (params, rest), pdef = pg.tree_partition(model, pg.Param)
    assert params[("embed",)] is params[("unembed",)] is model.embed
    back = pg.merge_partitions((params, rest), pdef)
    assert back.embed is back.unembed is model.embed
    # through a transform, by value, sharing kept by deref/reref
    (dparams, drest), ddef = pg.tree_partition(pg.deref(model), pg.Param)
    grads = jax.grad(lambda p: pg.reref(pg.merge_partitions((p, drest), ddef)).unembed.value.sum())(
        dparams
    )
    pg.update_refs(pg.get_partition(model, pg.Param), jax.tree.map(jnp.add, dparams, grads))
    assert model.embed is model.unembed and float(model.embed.value[0, 0]) == 2.0


def test_nothing_is_one_marker():
    assert repr(NOTHING) == "NOTHING"
    assert pickle.loads(pickle.dumps(NOTHING)) is NOTHING
    assert jax.tree.leaves(NOTHING) == []
    assert jax.tree.map(lambda x: x, {"a": NOTHING})["a"] is NOTHING


class Clash:
    """A node whose two children have keys that read the same as text."""


jax.tree_util.register_pytree_with_keys(
    Clash,
    lambda _: (((jax.tree_util.DictKey("0"), 1), (jax.tree_util.SequenceKey(0), 2)), None),
    lambda _, __: Clash(),
)


def test_errors_name_the_problem_and_build_nothing():
    r1, _, pytree = refs()
    (params, rest), pdef = pg.tree_partition(pytree, by_collection("params"))
    with pytest.raises(ValueError, match=r"no partition holds the leaf at \('a', '2'\)"):
        pg.merge_partitions((params,), pdef)
    with pytest.raises(ValueError, match=r"partitions \[0, 1\] all hold the leaf at \('a', '0'\)"):
        pg.merge_partitions((params, params), pdef)
    with pytest.raises(ValueError, match=r"partition 0 has paths the tree does not have"):
        pg.merge_partitions(({("z",): 1}, rest), pdef)
    with pytest.raises(TypeError, match="must be the PartitionDef"):
        pg.merge_partitions((params, rest), jax.tree.structure(pytree))
    with pytest.raises(TypeError, match="tree_partition: Unsupported filter 3"):
        pg.tree_partition(pytree, 3)
    with pytest.raises(ValueError, match=r"same path \('0',\) once written as text"):
        pg.tree_partition(Clash(), lambda x: True)
    before = r1.value
    with pytest.raises(ValueError, match="update_refs: the source has 1 places"):
        pg.update_refs(pg.get_partition(pytree, by_collection("params")), [5.0])
    assert r1.value == before
