"""Tree mode (`graph=False`) of the graph functions, `unpack` / `GraphState`,
`to_tree(prefix=)`, `merge` / `map(recreate_variables=)`, and `List` / `Dict` kept shared."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_module import Dict, List, Module


class Linear(Module):
    def __init__(self, scale=1.0):
        self.w = pg.Param(jnp.ones(2) * scale)
        self.b = pg.BatchStat(jnp.zeros(2))


class TiedVariables(Module):
    def __init__(self):
        self.encoder = pg.Param(jnp.ones(2))
        self.decoder = self.encoder


class TiedModules(Module):
    def __init__(self):
        self.left = Linear()
        self.right = self.left


class Plain(Module):
    def __init__(self):
        self.x = jnp.ones(3)


class SharedPlain(Module):
    def __init__(self):
        self.a = Plain()
        self.b = self.a


class Graphish(Module, pytree=False):
    def __init__(self):
        self.w = pg.Param(jnp.ones(1))


class Outer(Module):
    def __init__(self):
        self.inner = [Linear(), Linear(2.0)]


GRAPH_FUNCTIONS = {
    "split": lambda node, graph: pg.split(node, graph=graph),
    "state": lambda node, graph: pg.state(node, graph=graph),
    "graphdef": lambda node, graph: pg.graphdef(node, graph=graph),
    "clone": lambda node, graph: pg.clone(node, graph=graph),
    "flatten": lambda node, graph: pg.flatten(node, graph=graph),
    "unpack": lambda node, graph: pg.unpack(node, graph=graph),
    "map": lambda node, graph: pg.map(lambda p, v: v, node, graph=graph),
    "iter_graph": lambda node, graph: list(pg.iter_graph(node, graph=graph)),
    "iter_modules": lambda node, graph: list(pg.iter_modules(node, graph=graph)),
    "recursive_map": lambda node, graph: pg.recursive_map(lambda p, v: v, node, graph=graph),
    "view": lambda node, graph: pg.view(node, graph=graph),
    "with_attributes": lambda node, graph: pg.with_attributes(node, graph=graph),
}


# ------------------------------------------------------------------ tied models, both modes


@pytest.mark.parametrize("name", sorted(GRAPH_FUNCTIONS))
def test_tied_variables_refused_in_tree_mode_naming_both_paths(name):
    with pytest.raises(ValueError) as info:
        GRAPH_FUNCTIONS[name](TiedVariables(), False)
    message = str(info.value)
    assert "Duplicate Param" in message
    assert ".decoder" in message and ".encoder" in message
    assert "graph=True" in message


@pytest.mark.parametrize("name", sorted(GRAPH_FUNCTIONS))
def test_tied_variables_work_in_graph_mode(name):
    GRAPH_FUNCTIONS[name](TiedVariables(), True)
    GRAPH_FUNCTIONS[name](TiedVariables(), None)


def test_tied_modules_refused_in_tree_mode_by_their_variables():
    with pytest.raises(ValueError, match=r"(?s)Duplicate BatchStat.*\.left\.b.*\.right\.b"):
        pg.split(TiedModules(), graph=False)


@pytest.mark.parametrize("name", sorted(GRAPH_FUNCTIONS))
def test_pytree_false_objects_refused_in_tree_mode(name):
    with pytest.raises(ValueError, match=r"'Graphish' instance that has pytree=False.*\[0\]"):
        GRAPH_FUNCTIONS[name]([Graphish()], False)
    GRAPH_FUNCTIONS[name]([Graphish()], True)


def test_set_graph_mode_is_the_default_of_graph_none():
    with pg.set_graph_mode(False):
        with pytest.raises(ValueError, match="Duplicate"):
            pg.split(TiedVariables())
        # An explicit graph=True wins over the switch.
        graphdef, state = pg.split(TiedVariables(), graph=True)
    model = pg.merge(graphdef, state)
    assert model.encoder is model.decoder


def test_graph_takes_only_booleans_and_none():
    with pytest.raises(TypeError, match="graph= takes True, False or None; got 0"):
        pg.split(Linear(), graph=0)


# ------------------------------------------------------------------------ tree mode results


def test_tree_mode_split_matches_graph_mode_on_a_tree_and_merges():
    model = Outer()
    tree_graphdef, tree_state = pg.split(model, graph=False)
    graph_graphdef, graph_state = pg.split(model, graph=True)
    assert tree_graphdef == graph_graphdef
    assert tree_state.flat_state().keys() == graph_state.flat_state().keys()
    rebuilt = pg.merge(tree_graphdef, jax.tree.map(lambda x: x * 3, tree_state))
    np.testing.assert_allclose(rebuilt.inner[1].w.value, 6.0)
    np.testing.assert_allclose(model.inner[1].w.value, 2.0)


def test_tree_mode_filters_and_state():
    params, stats = pg.state(Linear(), pg.Param, pg.BatchStat, graph=False)
    assert list(params) == ["w"] and list(stats) == ["b"]
    _, params, rest = pg.split(Linear(), pg.Param, ..., graph=False)
    assert list(rest) == ["b"]


def test_tree_mode_copies_a_module_reached_twice():
    # As `jax.tree` would: two copies, the arrays under both paths.
    model = SharedPlain()
    graphdef, state = pg.split(model, graph=False)
    assert sorted(state) == ["a", "b"]
    rebuilt = pg.merge(graphdef, state)
    assert rebuilt.a is not rebuilt.b
    modules = [path for path, _ in pg.iter_modules(model, graph=False)]
    assert modules == [("a",), ("b",), ()]
    # Graph mode keeps the sharing.
    graphdef, state = pg.split(model)
    assert sorted(state) == ["a"]
    rebuilt = pg.merge(graphdef, state)
    assert rebuilt.a is rebuilt.b


def test_tree_mode_clone_and_recursive_map_copy_shared_modules():
    model = SharedPlain()
    copy = pg.clone(model, graph=False)
    assert copy.a is not copy.b and copy.a is not model.a
    mapped = pg.recursive_map(lambda path, v: v, model, graph=False)
    assert mapped.a is not mapped.b
    mapped = pg.recursive_map(lambda path, v: v, model)
    assert mapped.a is mapped.b


def test_tree_mode_flatten_and_graphdef():
    graphdef, flat = pg.flatten(Linear(), graph=False)
    assert [path for path, _ in flat] == [("b",), ("w",)]
    assert pg.graphdef(Linear(), graph=False) == graphdef
    model = pg.unflatten(graphdef, flat)
    assert isinstance(model.w, pg.Param)


def test_iter_children_tree_mode_refuses_pytree_false_node():
    with pytest.raises(ValueError, match="'Graphish' instance that has pytree=False"):
        list(pg.iter_children(Graphish(), graph=False))
    assert list(pg.iter_children(Graphish(), graph=True)) == []


def test_tree_mode_cycle_named():
    class Node(Module, pytree=False):
        pass

    node = Node()
    node.me = node
    with pytest.raises(ValueError, match="pytree=False"):
        pg.split(node, graph=False)


def test_set_attributes_tree_mode():
    class Drop(Module):
        def __init__(self):
            self.deterministic = False

    class Pair(Module):
        def __init__(self):
            self.a = Drop()
            self.w = pg.Param(jnp.ones(1))
            self.v = self.w

    with pytest.raises(ValueError, match="Duplicate Param"):
        pg.set_attributes(Pair(), deterministic=True, graph=False)
    pair = Pair()
    pg.set_attributes(pair, deterministic=True)
    assert pair.a.deterministic


# ------------------------------------------------------------------------------- unpack


def test_unpack_returns_graph_states_that_merge():
    model = TiedVariables()
    graph_state = pg.unpack(model)
    assert isinstance(graph_state, pg.GraphState)
    assert graph_state.graphdef == pg.graphdef(model)
    # Attributes in name order: the shared Param is held at its first path, `decoder`.
    assert list(graph_state) == ["decoder"] and len(graph_state) == 1
    assert "decoder" in graph_state
    np.testing.assert_allclose(graph_state.decoder.value, 1.0)
    np.testing.assert_allclose(graph_state["decoder"].value, 1.0)
    rebuilt = pg.merge(graph_state)
    assert rebuilt.encoder is rebuilt.decoder


def test_unpack_with_filters_and_one_filter():
    params, stats = pg.unpack(Linear(), pg.Param, pg.BatchStat)
    assert list(params) == ["w"] and list(stats) == ["b"]
    assert type(pg.merge(params, stats)).__name__ == "Linear"
    only = pg.unpack(Linear(), ...)
    assert isinstance(only, pg.GraphState) and sorted(only) == ["b", "w"]


def test_graph_state_is_a_pytree_and_updates_a_model():
    model = Linear()
    graph_state = pg.unpack(model)
    doubled = jax.jit(lambda gs: jax.tree.map(lambda x: x * 2, gs))(graph_state)
    assert isinstance(doubled, pg.GraphState) and doubled.graphdef == graph_state.graphdef
    pg.update(model, doubled)
    np.testing.assert_allclose(model.w.value, 2.0)
    # Its leaves have the State's paths.
    keyed = jax.tree_util.tree_flatten_with_path
    assert [p for p, _ in keyed(graph_state)[0]] == [p for p, _ in keyed(graph_state.state)[0]]
    copied = copy.copy(graph_state)
    assert copied.graphdef is graph_state.graphdef and copied.state is graph_state.state


def test_graph_state_setters():
    graph_state = pg.unpack(Linear())
    graph_state["extra"] = pg.Param(jnp.zeros(1))
    assert "extra" in graph_state.state
    del graph_state["extra"]
    assert "extra" not in graph_state


def test_unpack_errors():
    with pytest.raises(ValueError, match="Duplicate Param"):
        pg.unpack(TiedVariables(), graph=False)
    params, _ = pg.unpack(Linear(), pg.Param, pg.BatchStat)
    with pytest.raises(ValueError, match="GraphDef must be the same for all GraphState"):
        pg.merge(params, pg.unpack(Outer()))
    with pytest.raises(ValueError, match="Expected GraphState object"):
        pg.merge(params, pg.state(Linear(), pg.BatchStat))
    with pytest.raises(ValueError, match="Expected a State object, got dict"):
        pg.GraphState(pg.graphdef(Linear()), {})
    with pytest.raises(TypeError, match=r"GraphDef first .* or GraphStates"):
        pg.merge({"w": 1})


# --------------------------------------------------------------------- recreate_variables


def test_map_recreate_variables():
    model = Linear()
    bare = pg.map(lambda path, v: v.value * 0, model, recreate_variables=False)
    assert isinstance(bare.w, jax.Array) and not isinstance(bare.w, pg.Variable)
    wrapped = pg.map(lambda path, v: v.value * 0, model)
    assert isinstance(wrapped.w, pg.Param)
    np.testing.assert_allclose(model.w.value, 1.0)


def test_merge_recreate_variables():
    graphdef, state = pg.split(Linear())
    values = jax.tree.map(lambda v: v.value, state, is_leaf=lambda x: isinstance(x, pg.Variable))
    model = pg.merge(graphdef, values, recreate_variables=False)
    assert isinstance(model.w, jax.Array)
    assert isinstance(pg.merge(graphdef, values).w, pg.Param)


# ------------------------------------------------------------------------- to_tree prefix


def test_to_tree_consistent_prefix():
    model = Linear()
    tree = (model, 1, {"b": model})
    pure = pg.to_tree(tree, prefix=(0, None, 0))
    rebuilt = pg.from_tree(pure)
    assert rebuilt[0] is rebuilt[2]["b"]
    with pytest.raises(ValueError) as info:
        pg.to_tree(tree, prefix=(0, None, 1))
    message = str(info.value)
    assert "Inconsistent aliasing detected" in message
    assert "Node: Param" in message and "Node: BatchStat" in message
    assert "[0].w: 0" in message and "[2].b.w: 1" in message


def test_to_tree_prefix_with_state_axes():
    model = Linear()
    axes = pg.StateAxes({pg.Param: 0, ...: None})
    pg.to_tree((model, model), prefix=(axes, axes))
    with pytest.raises(ValueError, match=r"(?s)Node: BatchStat.*None.*0"):
        pg.to_tree((model, model), prefix=(axes, 0))


def test_to_tree_prefix_must_fit():
    with pytest.raises(ValueError, match="prefix= must be a prefix of the tree's structure"):
        pg.to_tree((Linear(), 1), prefix=(0, None, 0))
    # No prefix, no check: a shared Variable is one NodeState entry.
    model = Linear()
    assert len(pg.to_tree((model, model))[1].state) == 0


# -------------------------------------------------------------- List and Dict keep identity


class Holder(Module):
    def __init__(self):
        layer = Linear()
        self.layers = Dict(a=layer, b=layer)
        self.alias = self.layers
        self.seq = List([layer, self.layers])


def test_dict_and_list_shared_through_split_merge():
    rebuilt = pg.merge(*pg.split(Holder()))
    assert rebuilt.layers is rebuilt.alias
    assert rebuilt.seq[1] is rebuilt.layers
    assert rebuilt.layers.a is rebuilt.layers["b"] is rebuilt.seq[0]
    assert pg.find_duplicates(Holder())[0] == [("alias",), ("layers",), ("seq", 1)]


def test_dict_shared_through_jit_with_a_structure_change():
    model = Holder()
    layers = model.layers

    @pg.jit
    def grow(model):
        model.layers.c = Linear(3.0)
        model.layers.a.w.value = model.layers.a.w.value + 1
        return model

    out = grow(model)
    assert out is model and model.layers is layers and model.alias is layers
    assert sorted(model.alias) == ["a", "b", "c"]
    np.testing.assert_allclose(model.seq[0].w.value, 2.0)
    np.testing.assert_allclose(model.alias.c.w.value, 3.0)


def test_plain_containers_still_copied_by_value():
    shared = [jnp.ones(1)]
    graphdef, state = pg.split({"a": shared, "b": shared})
    rebuilt = pg.merge(graphdef, state)
    assert rebuilt["a"] is not rebuilt["b"]


def test_dict_copied_by_value_in_tree_mode():
    inner = Dict(x=jnp.ones(1))
    rebuilt = pg.merge(*pg.split([inner, inner], graph=False))
    assert rebuilt[0] is not rebuilt[1]
    rebuilt = pg.merge(*pg.split([inner, inner]))
    assert rebuilt[0] is rebuilt[1]


def test_get_abstract_model_graph():
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
    _, abstract = pg.get_abstract_model(Linear, mesh, graph=False)
    assert abstract["w"].value.shape == (2,)
    with pytest.raises(ValueError, match="Duplicate Param"):
        pg.get_abstract_model(TiedVariables, mesh, graph=False)
    _, abstract = pg.get_abstract_model(TiedVariables, mesh)
    assert list(abstract) == ["decoder"]
