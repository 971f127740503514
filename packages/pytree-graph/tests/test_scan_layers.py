"""`scan` with `in_axes`/`out_axes` and `Carry` (the Flax NNX form), over stacks of layers
built with `vmap`, and `transform_metadata`."""

import jax
import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_graph import PARTITION_NAME, BatchStat, Carry, Intermediate, Param, StateAxes
from pytree_module import Module


class Block(Module):
    def __init__(self, key):
        self.w = Param(jax.random.normal(key, (3, 3)) * 0.5, sharding=(None, "model"))
        self.mean = BatchStat(jnp.zeros(3))

    def __call__(self, x):
        y = x @ self.w.value
        self.mean.value = 0.9 * self.mean.value + 0.1 * y.mean(0)
        return jax.nn.relu(y)


def make_stack(layers=4, **kwargs):
    create = pg.vmap(lambda key: Block(key), in_axes=0, out_axes=0, **kwargs)
    return create(jax.random.split(jax.random.key(0), layers))


def by_hand(x, w, mean):
    """The loop over layers, written out: its output and the new statistics."""
    means = []
    for i in range(w.shape[0]):
        y = x @ w[i]
        means.append(0.9 * mean[i] + 0.1 * y.mean(0))
        x = jax.nn.relu(y)
    return x, jnp.stack(means)


@pg.scan(in_axes=(Carry, 0), out_axes=Carry)
def forward(x, block):
    return block(x)


def test_scan_over_layers_built_by_vmap_writes_the_statistics_back():
    blocks = make_stack()
    assert blocks.w.value.shape == (4, 3, 3) and blocks.mean.value.shape == (4, 3)
    w, mean = blocks.w.value, blocks.mean.value
    x = jnp.arange(6.0).reshape(2, 3)
    y = forward(x, blocks)
    expected, expected_mean = by_hand(x, w, mean)
    assert jnp.allclose(y, expected, atol=1e-6)
    assert jnp.allclose(blocks.mean.value, expected_mean, atol=1e-6)
    assert blocks.w.value is w  # not written, not replaced


def test_scan_over_layers_under_jit_and_grad():
    blocks = make_stack()
    x = jnp.ones((2, 3))
    expected, expected_mean = by_hand(x, blocks.w.value, blocks.mean.value)
    w = blocks.w.value
    y = pg.jit(lambda b, x: forward(x, b))(blocks, x)
    assert jnp.allclose(y, expected, atol=1e-6)
    assert jnp.allclose(blocks.mean.value, expected_mean, atol=1e-6)

    grads = pg.grad(lambda b: forward(x, b).sum())(blocks)

    def loss(w):
        return by_hand(x, w, blocks.mean.value)[0].sum()

    assert jnp.allclose(grads["w"].value, jax.grad(loss)(w), atol=1e-5)


def test_scan_as_a_method_decorator_and_with_stacked_outputs():
    class Stack(Module):
        def __init__(self):
            self.blocks = make_stack(3)

        @pg.scan(in_axes=(0, Carry), out_axes=(Carry, 0))
        def step(self, x):
            return self.blocks(x), x.sum()

    stack = Stack()
    w, mean = stack.blocks.w.value, stack.blocks.mean.value
    x = jnp.ones((2, 3))
    # `self` is scanned over: each step gets the Stack with one layer's slices.
    y, sums = stack.step(x)
    assert jnp.allclose(y, by_hand(x, w, mean)[0], atol=1e-6)
    assert sums.shape == (3,) and float(sums[0]) == 6.0


def test_a_module_carry_comes_back_as_the_callers_object():
    class Total(Module):
        def __init__(self):
            self.value = BatchStat(jnp.array(0.0))

    @pg.scan(in_axes=(Carry, 0), out_axes=Carry)
    def add(total, x):
        total.value.value += x
        return total

    total = Total()
    assert add(total, jnp.arange(4.0)) is total
    assert float(total.value.value) == 6.0


def test_carry_inside_a_tuple_keeps_the_callers_objects():
    class Total(Module):
        def __init__(self):
            self.value = BatchStat(jnp.array(0.0))

    total = Total()
    step = pg.scan(lambda c, x: ((c[0], c[1] + x), x * 2), in_axes=(Carry, 0), out_axes=(Carry, 0))
    (same, count), ys = step((total, 0), jnp.arange(3.0))
    assert same is total and float(count) == 3.0 and ys.tolist() == [0.0, 2.0, 4.0]


def test_roles_axes_and_reverse():
    # in_axes=1 / out_axes=1: scanned over and stacked along the second axis.
    step = pg.scan(lambda c, x: (c + x.sum(), x * 2), in_axes=(Carry, 1), out_axes=(Carry, 1))
    c, ys = step(jnp.array(0.0), jnp.arange(6.0).reshape(2, 3))
    assert float(c) == 15.0 and ys.shape == (2, 3)
    assert jnp.array_equal(ys, jnp.arange(6.0).reshape(2, 3) * 2)
    # No carry at all: every argument scanned.
    assert pg.scan(lambda x: x * 2, in_axes=0, out_axes=0)(jnp.arange(3.0)).tolist() == [
        0.0,
        2.0,
        4.0,
    ]
    # A broadcast argument is the same every step; reverse scans from the end.
    c, ys = pg.scan(lambda c, k, x: (c * 10 + x * k, c), in_axes=(Carry, None, 0), reverse=True)(
        0, 1, jnp.arange(3)
    )
    assert int(c) == 210 and ys.tolist() == [21, 2, 0]
    # The default roles are jax.lax.scan's: f(carry, x) -> (carry, y).
    c, ys = pg.scan(lambda c, x: (c + x, c))(0.0, jnp.arange(3.0))
    assert float(c) == 3.0 and ys.tolist() == [0.0, 0.0, 1.0]
    # Only the carry, for a given number of steps.
    assert int(pg.scan(lambda c: c + 1, in_axes=Carry, out_axes=Carry, length=5)(0)) == 5


def test_a_carried_filter_of_a_broadcast_argument():
    class Counter(Module):
        def __init__(self):
            self.scale = Param(jnp.array(2.0))
            self.count = BatchStat(jnp.array(0.0))

    counter = Counter()

    @pg.scan(in_axes=(Carry, StateAxes({BatchStat: Carry, ...: None}), 0), out_axes=Carry)
    def run(x, counter, xs):
        counter.count.value += 1
        return x + xs * counter.scale.value

    assert float(run(jnp.array(0.0), counter, jnp.arange(3.0))) == 6.0
    assert float(counter.count.value) == 3.0


def test_a_broadcast_variable_is_read_as_it_came_in_and_gets_the_last_write():
    # Each step reads the value the Variable came in with (as Flax NNX's graph mode); the
    # value the last step wrote is written back (NNX drops it).
    class Counter(Module):
        def __init__(self):
            self.count = BatchStat(jnp.array(0.0))

    counter = Counter()

    @pg.scan(in_axes=(Carry, None, 0), out_axes=(Carry, 0))
    def run(x, counter, xs):
        seen = counter.count.value
        counter.count.value = seen + xs + 1  # the last step (xs=2) writes 3
        return x + xs, seen

    x, seen = run(jnp.array(0.0), counter, jnp.arange(3.0))
    assert float(x) == 3.0 and seen.tolist() == [0.0, 0.0, 0.0]
    assert float(counter.count.value) == 3.0


def test_a_broadcast_write_keeps_a_tie_and_is_traced_again_only_when_written():
    class Tied(Module):
        def __init__(self):
            self.a = BatchStat(jnp.array(1.0))
            self.b = self.a

    tied, traces = Tied(), []

    @pg.scan(in_axes=(Carry, None, 0), out_axes=Carry)
    def run(x, m, xs):
        traces.append(1)
        m.b.value = m.a.value * 2
        return x + xs

    run(jnp.array(0.0), tied, jnp.arange(3.0))
    assert tied.a is tied.b and float(tied.a.value) == 2.0
    assert len(traces) == 2  # one trace found the write, one gave it its slot

    @pg.scan(in_axes=(Carry, None, 0), out_axes=Carry)
    def reads_only(x, m, xs):
        traces.append(1)
        return x + xs * m.a.value

    traces.clear()
    assert float(reads_only(jnp.array(0.0), tied, jnp.arange(3.0))) == 6.0
    assert len(traces) == 1


def test_variables_added_in_each_step_come_back_stacked_at_their_axis():
    # As Flax NNX: what a step adds (e.g. `sow`'s Intermediate) is stacked along the axis
    # in_axes gives it, and the caller's object gets it; the tie of the model is kept.
    class Tied(Module):
        def __init__(self):
            self.w = Param(jnp.arange(6.0).reshape(3, 2))
            self.v = self.w

    model = Tied()

    @pg.scan(in_axes=(StateAxes({(Param, Intermediate): 0, ...: Carry}), Carry))
    def run(m, x):
        x = x * m.w.value
        m.seen = Intermediate(x)
        m.v.value = m.v.value + 1
        return x, None

    x, _ = run(model, jnp.ones(2))
    assert model.seen.value.shape == (3, 2)
    assert model.seen.value.tolist() == [[0.0, 1.0], [0.0, 3.0], [0.0, 15.0]]
    assert model.v is model.w and model.w.value.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert x.tolist() == [0.0, 15.0]

    @pg.scan(in_axes=(StateAxes({Param: 0, Intermediate: 1, ...: Carry}), Carry))
    def at_axis_1(m, x):
        m.rows = Intermediate(x[:, None] * jnp.ones(4))
        return x, None

    assert pg.pop(model, Intermediate)["seen"].value.shape == (3, 2)
    at_axis_1(model, jnp.ones(2))
    assert model.rows.value.shape == (2, 3, 4)


def test_adding_what_the_loop_cannot_stack_is_refused():
    class Model(Module):
        def __init__(self):
            self.w = Param(jnp.ones((3, 2)))

    model = Model()

    @pg.scan(in_axes=(StateAxes({Param: 0, ...: Carry}), Carry))
    def carried(m, x):
        m.count = BatchStat(jnp.zeros(()))
        return x, None

    with pytest.raises(ValueError, match=r"added the BatchStat at argument 0 at \.count, whose"):
        carried(model, jnp.ones(2))
    assert not hasattr(model, "count")  # nothing half-changed

    @pg.scan(in_axes=(StateAxes({Param: 0, ...: Carry}), Carry))
    def removes(m, x):
        del m.w
        m.u = Param(x)
        return x, None

    with pytest.raises(ValueError, match="do not have the structure they came in with"):
        removes(model, jnp.ones(2))
    assert model.w.value.shape == (3, 2) and not hasattr(model, "u")


def test_added_variables_get_the_layer_axis_in_their_sharding():
    class Model(Module):
        def __init__(self):
            self.w = Param(jnp.ones((3, 2)), sharding=("layers", None))

    model = Model()

    @pg.scan(
        in_axes=(StateAxes({(Param, Intermediate): 0, ...: Carry}), Carry),
        transform_metadata={PARTITION_NAME: "layers"},
    )
    def run(m, x):
        m.seen = Intermediate(x * m.w.value, sharding=("model",))
        return x, None

    run(model, jnp.ones(2))
    assert model.seen.sharding == ("layers", "model") and model.seen.value.shape == (3, 2)


def test_a_second_call_of_one_structure_reuses_the_trace_with_its_own_values():
    # The step's Python runs once per structure (JAX keeps the trace), and each call's
    # broadcast, carried and scanned values are its own, never the first call's.
    class Scale(Module):
        def __init__(self, s):
            self.s = Param(jnp.array(s))
            self.t = self.s  # tied

    traces = []

    @pg.scan(in_axes=(Carry, None, 0), out_axes=(Carry, 0))
    def run(c, m, x):
        traces.append(1)
        return c + x * m.s.value, m.t.value

    c, ys = run(jnp.array(0.0), Scale(2.0), jnp.arange(3.0))
    assert float(c) == 6.0 and ys.tolist() == [2.0, 2.0, 2.0]
    c, ys = run(jnp.array(1.0), Scale(10.0), jnp.arange(3.0))
    assert float(c) == 31.0 and ys.tolist() == [10.0, 10.0, 10.0]
    assert len(traces) == 1
    run(jnp.array(0.0), Scale(2.0), jnp.arange(4.0))  # more steps: the same step function
    assert len(traces) == 1
    run(jnp.zeros(2), Scale(2.0), jnp.ones((3, 2)))  # other shapes: traced again
    assert len(traces) == 2


def test_a_broadcast_python_number_is_part_of_what_the_trace_is_kept_for():
    class Holder(Module):
        def __init__(self, n):
            self.n = BatchStat(n)  # a Python number, not an array

    traces = []

    @pg.scan(in_axes=(Carry, None, 0), out_axes=Carry)
    def run(c, m, x):
        traces.append(type(m.n.value))
        return c + x * m.n.value

    assert float(run(jnp.array(0.0), Holder(2), jnp.arange(3.0))) == 6.0
    assert float(run(jnp.array(0.0), Holder(3), jnp.arange(3.0))) == 9.0
    assert traces == [int, int]  # stays a Python number inside; a new one, a new trace
    assert float(run(jnp.array(0.0), Holder(3), jnp.arange(3.0))) == 9.0
    assert len(traces) == 2


def test_a_broadcast_write_of_another_shape_is_refused():
    class Counter(Module):
        def __init__(self):
            self.count = BatchStat(jnp.array(0.0))

    counter = Counter()

    @pg.scan(in_axes=(Carry, None, 0), out_axes=Carry)
    def run(x, counter, xs):
        counter.count.value = jnp.zeros(2)
        return x + xs

    with pytest.raises(ValueError, match=r"writing a broadcast argument\) changed the array at"):
        run(jnp.array(0.0), counter, jnp.arange(3.0))
    assert counter.count.value.shape == ()


def test_transform_metadata_names_the_layer_axis():
    blocks = make_stack(transform_metadata={PARTITION_NAME: "layers"})
    assert blocks.w.sharding == ("layers", None, "model")
    assert tuple(pg.get_partition_spec(blocks)["w"].value) == ("layers", None, "model")
    assert "sharding" not in blocks.mean.metadata  # none before, none added (as in NNX)
    seen = []

    @pg.scan(in_axes=(Carry, 0), out_axes=(Carry, 0), transform_metadata={PARTITION_NAME: "layers"})
    def run(x, block):
        seen.append(block.w.sharding)
        return block(x), Param(block.w.value[0], sharding=("model",))

    x = jnp.ones((2, 3))
    _, rows = run(x, blocks)
    assert seen == [(None, "model")]
    assert blocks.w.sharding == ("layers", None, "model")  # put back after
    assert rows.value.shape == (4, 3) and rows.sharding == ("layers", "model")
    # A Variable whose metadata does not name the axis is an error, not a silent mislabel.
    with pytest.raises(ValueError, match="without 'stack' at its axis 0"):
        pg.scan(
            forward.__wrapped__,
            in_axes=(Carry, 0),
            out_axes=Carry,
            transform_metadata={PARTITION_NAME: "stack"},
        )(x, blocks)


def test_transform_metadata_in_vmap_of_mapped_arguments():
    blocks = make_stack(transform_metadata={PARTITION_NAME: "layers"})
    seen = []

    def norm(block):
        seen.append(block.w.sharding)
        return (block.w.value**2).sum()

    out = pg.vmap(norm, transform_metadata={PARTITION_NAME: "layers"})(blocks)
    assert out.shape == (4,) and seen == [(None, "model")]
    assert blocks.w.sharding == ("layers", None, "model")


def test_the_jax_lax_form_and_ambiguous_calls():
    blocks = make_stack(2)
    x = jnp.ones((2, 3))
    y, _ = pg.scan(lambda x, block: (block(x), None), x, blocks)
    assert y.shape == (2, 3)
    y, ys = pg.scan(lambda c, x: (c + x, c), init=0.0, xs=jnp.arange(3.0))
    assert float(y) == 3.0 and ys.tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(TypeError, match="got both `init`"):
        pg.scan(lambda c, x: (c, x), 0.0, jnp.arange(3.0), in_axes=(Carry, 0))
    with pytest.raises(TypeError, match="got both `init`"):
        pg.scan(lambda c, x: (c, x), None, transform_metadata={PARTITION_NAME: "layers"})
    with pytest.raises(TypeError, match="got `xs` but no `init`"):
        pg.scan(lambda c, x: (c, x), xs=jnp.arange(3.0))


def test_errors_name_what_is_wrong():
    # Flax NNX's words open each message (its tests match them), then ours.
    with pytest.raises(ValueError, match="If one of in_axes or out_axes has Carry, the other"):
        pg.scan(lambda c, x: c, in_axes=(Carry, 0), out_axes=0)
    with pytest.raises(ValueError, match="If one of in_axes or out_axes has Carry, the other"):
        pg.scan(lambda c, x: c, in_axes=0, out_axes=(Carry, 0))
    with pytest.raises(ValueError, match=r"Cannot broadcast output state: out_axes\[1\] is None"):
        pg.scan(lambda c, x: (c, x), out_axes=(Carry, None))
    with pytest.raises(ValueError, match=r"Cannot broadcast output state. Got StateAxes"):
        pg.scan(lambda c, x: (c, x), out_axes=(Carry, StateAxes({...: None})))
    with pytest.raises(
        ValueError, match="Found multiple Carry definitions: in_axes has Carry more"
    ):
        pg.scan(lambda c, x: (c, x), in_axes=(Carry, Carry))
    with pytest.raises(TypeError, match="must be Carry, an int"):
        pg.scan(lambda c, x: (c, x), in_axes=(Carry, "0"))
    with pytest.raises(TypeError, match="not `Carry\\(\\)`"):
        Carry()
    step = pg.scan(lambda c, x: (c, x))
    with pytest.raises(ValueError, match="in_axes has 2 entries"):
        step(jnp.zeros(()))
    with pytest.raises(TypeError, match="pass every argument positionally"):
        step(jnp.zeros(()), xs=jnp.arange(3.0))
    with pytest.raises(ValueError, match="When in_axes=Carry, the function must take exactly one"):
        pg.scan(lambda c, x: c, in_axes=Carry, out_axes=Carry)(jnp.zeros(()), jnp.zeros(()))
    with pytest.raises(ValueError, match="nothing is scanned over"):
        pg.scan(lambda c: c, in_axes=Carry, out_axes=Carry)(jnp.zeros(()))
    with pytest.raises(ValueError, match="a tuple of 2"):
        pg.scan(lambda c, x: c)(jnp.zeros(()), jnp.arange(3.0))

    blocks = make_stack(2)

    @pg.scan(in_axes=(Carry, 0), out_axes=Carry)
    def grow(model, x):
        model.extra = Param(x)
        return model

    class Holder(Module):
        def __init__(self):
            self.w = Param(jnp.zeros(()))

    with pytest.raises(ValueError, match=r"added the Param at argument 0 at \.extra, whose role"):
        grow(Holder(), jnp.arange(2.0))
    with pytest.raises(ValueError, match="one object, but in_axes gives it two specs"):
        pg.scan(lambda a, b: a, in_axes=(Carry, 0), out_axes=Carry)(blocks, blocks)


def test_a_carry_must_hold_the_objects_it_was_given():
    class Counter(Module):
        def __init__(self, n):
            self.n = BatchStat(n)

    counter = Counter(jnp.array(0))

    @pg.scan(in_axes=(Carry, 0), out_axes=(Carry, 0))
    def replaces(c, x):
        return Counter(c.n.value + 1), x

    with pytest.raises(ValueError, match="Carry references must be the same between iterations"):
        replaces(counter, jnp.arange(3))
    assert int(counter.n.value) == 0

    @pg.scan(in_axes=(Carry, 0), out_axes=(Carry, 0))
    def swaps_the_variable(c, x):
        c.n = BatchStat(c.n.value + 1)
        return c, x

    with pytest.raises(ValueError, match=r"another BatchStat at argument 0 at \.n"):
        swaps_the_variable(counter, jnp.arange(3))

    @pg.scan(in_axes=(Carry, 0), out_axes=(Carry, 0))
    def in_place(c, x):
        c.n.value += 1
        return c, x

    assert in_place(counter, jnp.arange(3))[0] is counter and int(counter.n.value) == 3
