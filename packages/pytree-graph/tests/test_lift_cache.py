"""The lift cache sees every structural write: one test per kind of writer.

Each test runs a graph transform on some objects (so that their walk is cached), changes
them with one writer, and checks that the next call sees the change, both in what the
jitted function computes and in the graphdef the cache gives (equal to a new walk's).
"""

import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import _lift_cache
from pytree_graph._traverse import GraphWalk
from pytree_module import Dict, List, Module, data, static


class Linear(Module):
    def __init__(self, scale=1.0):
        self.w = pg.Param(jnp.array(2.0))
        self.scale = scale

    def __call__(self, x):
        return self.w.value * x * self.scale


class Holder(Module, pytree=False):
    def __init__(self):
        self.inner = Linear()


@pg.jit
def run(model, x):
    return model(x)


def assert_cache_is_fresh(node):
    """The cache's graphdef of `node` is a new walk's."""
    assert pg.graphdef(node) == GraphWalk().graphdef(node)


def test_module_attribute_assigned_after_init():
    model = Linear()
    assert float(run(model, 1.0)) == 2.0
    model.scale = 3.0
    assert float(run(model, 1.0)) == 6.0
    model.w = pg.Param(jnp.array(5.0))
    assert float(run(model, 1.0)) == 15.0
    assert_cache_is_fresh(model)


def test_module_attribute_deleted_after_init():
    model = Linear()
    model.extra = pg.Param(jnp.array(1.0))
    run(model, 1.0)
    assert "extra" in pg.state(model)
    del model.extra
    assert "extra" not in pg.state(model)
    assert_cache_is_fresh(model)


def test_status_change():
    model = Linear()
    model.offset = static(1)
    run(model, 1.0)
    before = pg.graphdef(model)
    model.offset = data(jnp.array(1.0))
    assert pg.graphdef(model) != before
    assert "offset" in pg.state(model)
    assert_cache_is_fresh(model)


def test_variable_value_set_through_merge_and_update():
    model = Linear()
    run(model, 1.0)
    _, state = pg.split(model)
    state["w"] = pg.Param(jnp.array(7.0))
    pg.update(model, state)
    assert float(run(model, 1.0)) == 7.0
    assert_cache_is_fresh(model)


def test_variable_metadata_set_and_deleted():
    model = Linear()
    run(model, 1.0)
    before = pg.graphdef(model)
    model.w.tag = "kernel"
    tagged = pg.graphdef(model)
    assert tagged != before
    assert_cache_is_fresh(model)
    del model.w.tag
    assert pg.graphdef(model) == before
    assert_cache_is_fresh(model)


def test_update_with_new_variables():
    model = Linear()
    run(model, 1.0)
    pg.update(model, {"w": pg.Param(jnp.array(4.0))})
    assert float(run(model, 1.0)) == 4.0
    assert_cache_is_fresh(model)


def test_write_back_of_a_structural_change():
    model = Linear()
    run(model, 1.0)

    @pg.jit
    def grow(m):
        m.bias = pg.Param(jnp.array(1.0))

    grow(model)
    assert isinstance(model.bias, pg.Param)
    assert "bias" in pg.state(model)
    assert_cache_is_fresh(model)


def test_pytree_false_object_rebuilt_in_place():
    holder = Holder()
    run_inner = pg.jit(lambda h, x: h.inner(x))
    assert float(run_inner(holder, 1.0)) == 2.0

    @pg.jit
    def swap(h):
        h.inner = Linear(scale=10.0)

    swap(holder)  # the write-back rebuilds `holder` in place
    assert float(run_inner(holder, 1.0)) == 20.0
    holder.inner = Linear(scale=100.0)  # and a plain assignment
    assert float(run_inner(holder, 1.0)) == 200.0
    assert_cache_is_fresh(holder)


def test_list_and_dict_containers_inside_modules():
    class Stack(Module, pytree=False):
        def __init__(self):
            self.layers = [Linear()]
            self.named = {"a": Linear()}

    stack = Stack()
    total = pg.jit(lambda s, x: sum(layer(x) for layer in s.layers) + s.named["a"](x))
    assert float(total(stack, 1.0)) == 4.0
    stack.layers.append(Linear(scale=2.0))  # changed in place: no write tells anyone
    assert float(total(stack, 1.0)) == 8.0
    stack.named["a"] = Linear(scale=3.0)
    assert float(total(stack, 1.0)) == 12.0
    assert_cache_is_fresh(stack)


@pytest.mark.parametrize("pytree", [True, False])
def test_List_and_Dict_changes_are_seen_without_comparing_them_each_call(pytree):
    class Stack(Module, pytree=pytree):
        def __init__(self):
            self.layers = List([Linear()])
            self.named = Dict(a=Linear())

    stack = Stack()
    total = pg.jit(lambda s, x: sum(layer(x) for layer in s.layers) + s.named["a"](x))
    assert float(total(stack, 1.0)) == 4.0
    entry = _cached_entry(stack)
    # Watched through the mutation count: not among the containers compared every call.
    assert entry.containers == [] and len(entry.checks.watched) == 2
    stack.layers.append(Linear(scale=2.0))
    assert float(total(stack, 1.0)) == 8.0
    stack.named["a"] = Linear(scale=3.0)
    assert float(total(stack, 1.0)) == 12.0
    stack.layers[0] = Linear(scale=0.0)
    assert float(total(stack, 1.0)) == 10.0
    del stack.named["a"]
    stack.named.update(a=Linear(scale=0.5))
    assert float(total(stack, 1.0)) == 5.0
    assert_cache_is_fresh(stack)


def test_List_and_Dict_keep_their_type_through_split_merge_and_transforms():
    class Stack(Module):
        def __init__(self):
            self.layers = List([Linear(), Linear()])
            self.named = Dict(a=Linear())

    stack = Stack()
    graphdef, state = pg.split(stack)
    merged = pg.merge(graphdef, state)
    assert type(merged.layers) is List and type(merged.named) is Dict
    plain = Stack()
    plain.layers, plain.named = list(plain.layers), dict(plain.named)
    assert pg.graphdef(plain) != graphdef  # a list is not a List: another structure

    @pg.jit
    def grow(s):
        s.layers.append(Linear(scale=3.0))
        s.named["b"] = Linear()

    grow(stack)
    assert type(stack.layers) is List and len(stack.layers) == 3
    assert type(stack.named) is Dict and set(stack.named) == {"a", "b"}
    grads = pg.grad(lambda s: sum(layer(1.0) for layer in s.layers))(stack)
    assert float(grads["layers"][2]["w"].value) == 3.0
    mapped = pg.recursive_map(lambda path, node: node, stack)
    assert type(mapped.layers) is List and type(mapped.named) is Dict
    assert [key for key, _ in pg.iter_children(stack.named)] == ["a", "b"]


def _cached_entry(root):
    """The lift cache's entry for a call of `root`."""
    entries = _lift_cache.lift_cache._entries.values()
    (entry,) = [e for e in entries if any(ref() is root for ref in e.refs)]
    return entry


def test_check_flag_names_a_stale_hit(monkeypatch):
    # A writer that bypasses `touch()`: the flag's re-walk notices the stale hit.
    monkeypatch.setattr(_lift_cache, "CHECK_HITS", True)
    holder, replacement = Holder(), Linear(scale=5.0)
    run_inner = pg.jit(lambda h, x: h.inner(x))
    run_inner(holder, 1.0)
    run_inner(holder, 1.0)  # a checked hit: nothing changed
    vars(holder)["inner"] = replacement  # no touch()
    with pytest.raises(_lift_cache.StaleLiftCacheError, match=r"Stale lift cache hit.*inner"):
        run_inner(holder, 1.0)
