import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Param
from pytree_nn import MLP, Dropout, Linear, Module, Optimizer, Rngs, Sequential, tabulate


class Block(Module):
    def __init__(self):
        self.linear = Linear(2, 3, rngs=0)
        self.mean = BatchStat(jnp.zeros(3))
        self.offset = jnp.zeros(3, jnp.float16)  # an array outside any Variable
        self.tied = self.linear.kernel  # a shared Variable: counted once

    def __call__(self, x):
        return self.linear(x) + self.mean.value + self.offset


BLOCK_TABLE = "\n".join(
    [
        "| path    | type   | Param                                  "
        "| BatchStat             | array                  |",
        "| ------- | ------ | -------------------------------------- "
        "| --------------------- | ---------------------- |",
        "| (root)  | Block  |                                        "
        "| 3 (12 B): mean f32[3] | 3 (6 B): offset f16[3] |",
        "| .linear | Linear | 9 (36 B): bias f32[3], kernel f32[2,3] "
        "|                       |                        |",
        "| Total   |        | 9 (36 B)                               "
        "| 3 (12 B)              | 3 (6 B)                |",
        "",
        "Total: 15 (54 B) in 2 Modules.",
        "Shared: .linear.kernel is also at .tied (counted once).",
    ]
)


def row(table, path):
    """The cells of the row of the Module at `path`."""
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if cells and cells[0] == path:
            return cells
    raise AssertionError(f"no row for {path}")


def test_table_of_modules_variables_counts_and_bytes():
    # kernel 2*3 + bias 3 = 9 float32 values (36 bytes); mean 3 float32; offset 3 float16.
    assert tabulate(Block()) == BLOCK_TABLE


def test_output_shapes_from_example_inputs():
    table = tabulate(Block(), jnp.ones((5, 2)))
    assert row(table, "path")[2] == "output"
    assert row(table, "(root)")[2] == "f32[5,3]"
    assert row(table, ".linear")[2] == "f32[5,3]"
    abstract = tabulate(Block(), jax.ShapeDtypeStruct((7, 2), jnp.float32))
    assert row(abstract, ".linear")[2] == "f32[7,3]"
    dropout = tabulate(Dropout(0.5), jnp.ones(4), deterministic=True)  # keywords too
    assert row(dropout, "(root)")[:3] == ["(root)", "Dropout", "f32[4]"]


def test_example_inputs_change_nothing():
    class Head(Linear):  # inherits its __call__
        pass

    model = Sequential(Linear(2, 4, rngs=0), Dropout(0.5, rngs=Rngs(1)), Head(4, 1, rngs=1))
    before = [np.asarray(v) for v in jax.tree.leaves(pg.state(model, Param))]
    original_call = vars(Linear)["__call__"]
    table = tabulate(model, jnp.ones((3, 2)))
    assert row(table, ".layers[2]")[:3] == [".layers[2]", "Head", "f32[3,1]"]
    assert row(table, ".layers[1]")[:3] == [".layers[1]", "Dropout", "f32[3,4]"]
    assert int(model.layers[1].rngs.default.count.value) == 0  # no key was drawn
    for old, new in zip(before, jax.tree.leaves(pg.state(model, Param)), strict=True):
        np.testing.assert_array_equal(old, new)
    assert vars(Linear)["__call__"] is original_call
    assert "__call__" not in vars(Head)


def test_shared_module_is_one_row_counted_once():
    class Twice(Module):
        def __init__(self):
            self.first = Linear(3, 3, rngs=0)
            self.second = self.first

        def __call__(self, x):
            return self.second(self.first(x))

    table = tabulate(Twice(), jnp.ones(3))
    rows = [line for line in table.splitlines() if "| Linear" in line]
    assert len(rows) == 1
    assert row(table, "Total")[3] == "12 (48 B)"
    assert "Shared: .first is also at .second (counted once)." in table


def test_totals_sizes_and_units():
    table = tabulate(MLP(256, 10, width_size=256, depth=1, rngs=0))
    # (256*256 + 256) + (256*10 + 10) = 68,362 float32 values.
    assert "68,362 (267.0 KiB)" in table
    assert "Total: 68,362 (267.0 KiB) in 3 Modules." in table


def test_many_variables_are_counted_not_listed():
    model = Linear(2, 3, rngs=0)
    table = tabulate(Optimizer(model, optax.adam(1e-3)))
    # count, mu (2 arrays), nu (2 arrays), step: 6 OptStates on the Optimizer itself,
    # 1 + 9 + 9 + 1 values of 4 bytes.
    assert row(table, "(root)")[1:] == ["Optimizer", "", "20 (80 B) in 6 Variables"]


def test_abstract_model():
    abstract = pg.eval_shape(lambda: Linear(4, 5, rngs=0))
    assert "25 (100 B): bias f32[5], kernel f32[4,5]" in tabulate(abstract)


def test_a_single_value_is_refused():
    for value in (5, None, jnp.ones(3)):
        with pytest.raises(TypeError, match=r"tabulate: `model` must be a Module .*got "):
            tabulate(value)


# ---------------------------------------------------------------------------------------------
# depth= and FLOPs


class TwoLayers(Module):
    def __init__(self):
        self.first = Linear(2, 4, rngs=0)
        self.second = Linear(4, 1, rngs=1)

    def __call__(self, x):
        return self.second(jax.nn.relu(self.first(x)))


def lowered_flops(fn, *args):
    cost = jax.jit(fn).lower(*args).cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return int(cost["flops"])


def test_flops_of_each_call_from_xla_cost_analysis():
    x = jnp.ones((3, 2))
    table = tabulate(TwoLayers(), x, compute_flops=True)
    assert row(table, "(root)")[:4] == ["(root)", "TwoLayers", "f32[3,1]", "99"]
    # A dense layer: 2 * batch * in * out for the product, batch * out for the bias.
    assert row(table, ".first")[3] == str(2 * 3 * 2 * 4 + 3 * 4)
    assert row(table, ".second")[3] == str(2 * 3 * 4 * 1 + 3 * 1)
    assert "vjp_flops" not in table


def test_vjp_flops_are_those_of_the_hand_written_vjp():
    model, x = TwoLayers(), jnp.ones((3, 2))
    table = tabulate(model, x, compute_vjp_flops=True)
    kernel, bias = model.first.kernel.value, model.first.bias.value

    def vjp(kernel, bias, x):
        out, pullback = jax.vjp(lambda k, b, x: x @ k + b, kernel, bias, x)
        return pullback(out)

    assert row(table, ".first")[3] == f"{lowered_flops(vjp, kernel, bias, x):,}"
    assert row(table, "(root)")[3] == "277"


def test_depth_folds_deeper_modules_into_their_ancestor():
    model = Sequential(TwoLayers(), Linear(1, 2, rngs=2))
    # `.layers[0]` is two deep (an attribute, then an index), as in NNX.
    table = tabulate(model, jnp.ones((3, 2)), depth=2, compute_flops=True)
    paths = [line.split("|")[1].strip() for line in table.splitlines()[2:-3]]
    assert paths == ["(root)", ".layers[0]", ".layers[1]"]
    assert row(table, ".layers[0]")[4] == (
        "17 (68 B): first.bias f32[4], first.kernel f32[2,4], second.bias f32[1], "
        "second.kernel f32[4,1]"
    )
    assert row(table, ".layers[0]")[3] == "99"  # the FLOPs of the whole subtree's call
    # The totals count every Module, shown or not.
    assert "Total: 21 (84 B) in 5 Modules." in table
    only_root = tabulate(model, depth=0)
    assert [line.split("|")[1].strip() for line in only_root.splitlines()[2:-3]] == ["(root)"]
    assert tabulate(model, depth=None) == tabulate(model)


def test_flops_of_a_module_called_twice_add_up_and_it_stays_one_row():
    class Twice(Module):
        def __init__(self):
            self.layer = Linear(3, 3, rngs=0)

        def __call__(self, x):
            return self.layer(self.layer(x))

    table = tabulate(Twice(), jnp.ones((2, 3)), compute_flops=True)
    assert row(table, ".layer")[3] == str(2 * (2 * 2 * 3 * 3 + 2 * 3))


def test_flops_on_an_abstract_model_change_nothing():
    abstract = pg.eval_shape(lambda: MLP(4, 2, width_size=8, depth=1, rngs=0))
    table = tabulate(abstract, jax.ShapeDtypeStruct((5, 4), jnp.float32), compute_flops=True)
    assert row(table, ".layers[0]")[3] == str(2 * 5 * 4 * 8 + 5 * 8)
    model = Sequential(Linear(2, 2, rngs=0), Dropout(0.5, rngs=Rngs(1)))
    before = pg.state(model)
    tabulate(model, jnp.ones((4, 2)), compute_flops=True, compute_vjp_flops=True)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), before, pg.state(model)))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(depth=-1), r"`depth` must be None or an int >= 0"),
        (dict(depth=1.5), r"`depth` must be None or an int >= 0"),
        (dict(depth=True), r"`depth` must be None or an int >= 0"),
        (dict(compute_flops=True), r"need example inputs"),
        (dict(compute_vjp_flops=True), r"need example inputs"),
    ],
)
def test_bad_depth_and_flops_without_inputs(options, message):
    with pytest.raises(ValueError, match=message):
        tabulate(TwoLayers(), **options)
