"""`LiftedCall`: one type for a lifted call, whether its walk is cached, reused or new,
with values, leaves and objects in leaf order and a loop's carry written back by `apply`."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph.extend import Call, Inside, LiftedCall, lift
from pytree_module import Module


class Pair(Module):
    def __init__(self):
        self.a = pg.Param(jnp.array(1.0))
        self.b = pg.BatchStat(jnp.array(2.0))


class Box:
    """A pytree node: the lift cache can neither key nor watch one."""

    def __init__(self, item):
        self.item = item


jax.tree_util.register_pytree_node(Box, lambda b: ((b.item,), None), lambda _, c: Box(*c))


class Holder(Module, pytree=False):
    def __init__(self, item):
        self.item = item


def expected(tree):
    """`(paths, values, leaves)` of `tree` from a new walk, in leaf order."""
    walk = pg._traverse.GraphWalk()
    graphdef = walk.graphdef(tree)
    values = [leaf.value if isinstance(leaf, pg.Variable) else leaf for leaf in walk.leaves]
    return graphdef.paths, values, walk.leaves


def test_every_lift_is_a_lifted_call_in_leaf_order():
    # Arrays before Variables in leaf order, so the cache reads them in another order.
    model, x = Pair(), jnp.array(3.0)
    cached = (x, model)
    unwatchable = (x, Holder(Box(model)))  # a pytree node below the top: walked each time
    unkeyable = (x, Box(model))  # one at the top: no cache key describes it
    for tree in (cached, cached, unwatchable, unwatchable, unkeyable):
        lifted = lift(tree)
        assert type(lifted) is LiftedCall
        paths, values, leaves = expected(tree)
        assert lifted.paths == paths and lifted.graphdef.paths == paths
        assert all(a is b for a, b in zip(lifted.values, values, strict=True))
        assert all(a is b for a, b in zip(lifted.leaves, leaves, strict=True))
        assert any(obj is model for obj in lifted.objects)


def test_jit_inputs_are_named_by_their_leaf_positions():
    model, x = Pair(), jnp.array(3.0)
    lift((x, model))
    lifted = lift((x, model))  # a cache hit: Variables are read before the array
    _, inputs = lifted.jit_inputs()
    positions = lifted.input_positions()
    assert sorted(positions) == list(range(3)) and positions != [0, 1, 2]
    assert all(inputs[i] is lifted.values[p] for i, p in enumerate(positions))


def test_inside_puts_jit_inputs_in_leaf_order_before_prepare():
    model, x = Pair(), jnp.array(3.0)
    call = Call(lambda x, m: x * m.a.value + m.b.value)
    tree = call.tree((x, model), {})
    lift(tree)
    lifted = lift(tree)
    seen = []

    def prepare(graphdef, values):
        seen.append((graphdef.paths, values))
        return [v * 10 for v in values]

    inside = Inside(*lifted.jit_inputs(), prepare=prepare)
    [(paths, values)] = seen
    assert paths == lifted.paths
    assert all(a is b for a, b in zip(values, lifted.values, strict=True))
    out = call.run(inside.tree)
    assert float(out) == 30.0 * 10.0 + 20.0
    outcome, values = inside.finish(out)
    assert float(lifted.apply(outcome, values)) == float(out)


def test_a_loop_carry_comes_back_as_the_callers_objects_and_new_arrays():
    model = Pair()
    holder = {"m": model}

    def body(i, carry):
        m, d, count = carry
        m.a.value = m.a.value + 1
        d["m"].b.value = d["m"].b.value * 2
        return m, d, count + 1

    out_model, out_holder, count = pg.fori_loop(0, 3, body, (model, holder, 0))
    assert out_model is model and out_holder["m"] is model and out_holder is not holder
    assert float(model.a.value) == 4.0 and float(model.b.value) == 16.0
    assert int(count) == 3 and isinstance(count, jax.Array)


def test_eval_shape_leaves_the_arguments_objects_alone():
    model = Pair()

    def grow(m):
        m.c = pg.Param(jnp.zeros(3))
        return m

    abstract = pg.eval_shape(grow, model)
    assert abstract is not model and not hasattr(model, "c")
    assert abstract.c.value == jax.ShapeDtypeStruct((3,), jnp.float32)
    assert float(model.a.value) == 1.0


def test_the_first_walk_and_its_cache_hits_give_a_jit_the_same_inputs():
    model, x = Pair(), jnp.array(3.0)
    first = lift((x, model))  # walks, and caches the walk
    hit = lift((x, model))
    assert hit is not first
    (structure, inputs), (hit_structure, hit_inputs) = first.jit_inputs(), hit.jit_inputs()
    assert structure == hit_structure
    assert all(a is b for a, b in zip(inputs, hit_inputs, strict=True))


@pytest.mark.parametrize("bounds", [("a", 3), (0, 2.5), (0, jnp.ones(2, jnp.int32))])
def test_fori_loop_refuses_bounds_that_are_not_integer_scalars(bounds):
    name = "lower" if bounds[0] == "a" else "upper"
    with pytest.raises(TypeError, match=rf"fori_loop: `{name}` must be an integer scalar"):
        pg.fori_loop(*bounds, lambda i, c: c, 0.0)
    assert pg.fori_loop(0, jnp.array(3), lambda i, c: c + i, 0) == 3
