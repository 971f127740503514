"""Side by side with Flax NNX: tree mode (`graph=False`) of the graph functions, `unpack`,
`to_tree(prefix=)`, `map(recreate_variables=)`, `Dict` / `List` sharing, and the Rngs
helpers' `graph=` (runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytree_graph as pg  # noqa: E402
import pytree_nn as pn  # noqa: E402
from pytree_module import Dict, List, Module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


class OursLinear(Module):
    def __init__(self):
        self.w = pg.Param(jnp.ones(2))
        self.b = pg.BatchStat(jnp.zeros(2))


class TheirsLinear(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones(2))
        self.b = nnx.BatchStat(jnp.zeros(2))


class OursTied(Module):
    def __init__(self):
        self.first = OursLinear()
        self.second = self.first


class TheirsTied(nnx.Module):
    def __init__(self):
        self.first = TheirsLinear()
        self.second = self.first


class OursTree(Module):
    def __init__(self):
        self.first = OursLinear()
        self.second = OursLinear()


class TheirsTree(nnx.Module):
    def __init__(self):
        self.first = TheirsLinear()
        self.second = TheirsLinear()


def both(name, ours_node, theirs_node, graph):
    """Run graph function `name` on both libraries; return `(ours, theirs)` results or
    the exceptions raised."""
    calls = {
        "split": lambda lib, node: lib.split(node, graph=graph),
        "state": lambda lib, node: lib.state(node, graph=graph),
        "graphdef": lambda lib, node: lib.graphdef(node, graph=graph),
        "clone": lambda lib, node: lib.clone(node, graph=graph),
        "unpack": lambda lib, node: lib.unpack(node, graph=graph),
        "iter_graph": lambda lib, node: list(lib.iter_graph(node, graph=graph)),
        "recursive_map": lambda lib, node: lib.recursive_map(lambda p, v: v, node, graph=graph),
        "map": lambda lib, node: lib.map(lambda p, v: v, node, graph=graph),
    }
    results = []
    for lib, node in ((pg, ours_node), (nnx, theirs_node)):
        try:
            results.append(calls[name](lib, node))
        except Exception as error:  # compared below
            results.append(error)
    return results


NAMES = ["split", "state", "graphdef", "clone", "unpack", "iter_graph", "recursive_map", "map"]


@pytest.mark.parametrize("name", NAMES)
def test_tied_model_refused_in_tree_mode_as_nnx(name):
    ours, theirs = both(name, OursTied(), TheirsTied(), graph=False)
    assert isinstance(theirs, ValueError) and isinstance(ours, ValueError)
    for error in (ours, theirs):
        message = str(error)
        assert "Duplicate" in message and "found at paths" in message
        assert "first" in message and "second" in message
    assert "does not support shared references" in str(ours)


@pytest.mark.parametrize("name", NAMES)
def test_tied_model_works_in_graph_mode_as_nnx(name):
    ours, theirs = both(name, OursTied(), TheirsTied(), graph=True)
    assert not isinstance(ours, Exception) and not isinstance(theirs, Exception)


def _paths(state):
    return sorted(path for path, _ in state.flat_state())


def test_tree_mode_split_paths_and_merge_as_nnx():
    (ours_def, ours_state), (theirs_def, theirs_state) = both(
        "split", OursTree(), TheirsTree(), graph=False
    )
    assert sorted(ours_state.flat_state()) == sorted(
        tuple(path) for path, _ in theirs_state.flat_state()
    )
    ours = pg.merge(ours_def, jax.tree.map(lambda x: x + 1, ours_state))
    theirs = nnx.merge(theirs_def, jax.tree.map(lambda x: x + 1, theirs_state))
    np.testing.assert_allclose(ours.second.w.value, theirs.second.w[...])


def test_pytree_false_refused_in_tree_mode_as_nnx():
    class OursGraph(Module, pytree=False):
        def __init__(self):
            self.w = pg.Param(jnp.ones(1))

    class TheirsGraph(nnx.Module, pytree=False):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(1))

    for lib, node in ((pg, OursGraph()), (nnx, TheirsGraph())):
        with pytest.raises(ValueError, match="pytree=False"):
            lib.split([node], graph=False)
        lib.split([node], graph=True)


def test_set_graph_mode_as_nnx():
    for lib, node in ((pg, OursTied()), (nnx, TheirsTied())):
        with lib.set_graph_mode(False), pytest.raises(ValueError, match="Duplicate"):
            lib.split(node)
        lib.split(node)


def test_unpack_as_nnx():
    ours = pg.unpack(OursLinear(), pg.Param, pg.BatchStat)
    theirs = nnx.unpack(TheirsLinear(), nnx.Param, nnx.BatchStat)
    assert [list(s) for s in ours] == [list(s) for s in theirs]
    assert type(pg.merge(*ours)).__name__ == "OursLinear"
    assert type(nnx.merge(*theirs)).__name__ == "TheirsLinear"
    single_ours, single_theirs = pg.unpack(OursLinear()), nnx.unpack(TheirsLinear())
    assert sorted(single_ours) == sorted(single_theirs)
    doubled_ours = jax.tree.map(lambda x: x * 2, single_ours)
    doubled_theirs = jax.tree.map(lambda x: x * 2, single_theirs)
    np.testing.assert_allclose(doubled_ours.w.value, doubled_theirs.w[...])
    # GraphStates of two graphs do not merge.
    with pytest.raises(ValueError, match="GraphDef must be the same"):
        pg.merge(ours[0], pg.unpack(OursTree()))
    with pytest.raises(ValueError, match="GraphDef must be the same"):
        nnx.merge(theirs[0], nnx.unpack(TheirsTree()))


def test_map_recreate_variables_as_nnx():
    ours = pg.map(lambda p, v: v.value * 0, OursLinear(), recreate_variables=False)
    theirs = nnx.map(lambda p, v: v[...] * 0, TheirsLinear(), recreate_variables=False)
    assert isinstance(ours.w, jax.Array) and isinstance(theirs.w, jax.Array)
    ours = pg.map(lambda p, v: v.value * 0, OursLinear())
    theirs = nnx.map(lambda p, v: v[...] * 0, TheirsLinear())
    assert isinstance(ours.w, pg.Param) and isinstance(theirs.w, nnx.Param)


def test_to_tree_consistent_prefix_as_nnx():
    for lib, model in ((pg, OursLinear()), (nnx, TheirsLinear())):
        tree = (model, 1, {"b": model})
        lib.to_tree(tree, prefix=(0, None, 0))
        with pytest.raises(ValueError, match="Inconsistent aliasing detected"):
            lib.to_tree(tree, prefix=(0, None, 1))


def test_dict_attribute_access_as_nnx():
    ours, theirs = Dict(a=1.0), nnx.Dict(a=1.0)
    ours.b = theirs.b = 2.0
    assert (ours.a, ours["b"]) == (theirs.a, theirs["b"])
    assert sorted(ours) == sorted(theirs)


def test_shared_dict_and_list_survive_merge_as_nnx():
    class OursHolder(Module):
        def __init__(self):
            layer = OursLinear()
            self.layers = Dict(a=layer, b=layer)
            self.alias = self.layers
            self.seq = List([self.layers])

    class TheirsHolder(nnx.Module):
        def __init__(self):
            layer = TheirsLinear()
            self.layers = nnx.Dict(a=layer, b=layer)
            self.alias = self.layers
            self.seq = nnx.List([self.layers])

    ours = pg.merge(*pg.split(OursHolder()))
    theirs = nnx.merge(*nnx.split(TheirsHolder()))
    for model in (ours, theirs):
        assert model.layers is model.alias and model.seq[0] is model.layers
        assert model.layers["a"] is model.layers["b"]


@pytest.mark.parametrize("graph", [True, False])
def test_split_rngs_graph_as_nnx(graph):
    ours, theirs = pn.Rngs(params=0, dropout=1), nnx.Rngs(params=0, dropout=1)
    ours_result = pn.split_rngs(ours, splits=5, graph=graph)
    theirs_result = nnx.split_rngs(theirs, splits=5, graph=graph)
    assert ours.params.key.shape == theirs.params.key.shape
    if not graph:
        assert ours_result.params.key.shape == theirs_result.params.key.shape == (5,)
        assert ours_result["dropout"].key.shape == theirs_result["dropout"].key.shape


@pytest.mark.parametrize("graph", [True, False])
def test_reseed_graph_as_nnx(graph):
    for lib in (pn, nnx):
        rngs = lib.Rngs(params=0, dropout=42)
        layer = lib.Dropout(0.5, rngs=rngs)
        x = jnp.ones(8)
        first = layer(x)
        lib.reseed(layer, graph=graph, dropout=42)
        np.testing.assert_allclose(layer(x), first)
