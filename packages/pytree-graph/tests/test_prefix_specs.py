"""Specs chosen per filter: tuple keys in `StateAxes`, `vmap`'s `out_axes` per output and
per filter, and `StateSharding` for `jit`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pytree_graph as pg
from pytree_filter import PathContains
from pytree_graph import BatchStat, Cache, Carry, Param, StateAxes, StateSharding
from pytree_module import Module


class Norm(Module):
    def __init__(self):
        self.scale = Param(jnp.ones(3))
        self.mean = BatchStat(jnp.zeros(3))
        self.last = Cache(jnp.zeros(3))


def test_a_tuple_key_matches_any_of_its_filters():
    axes = StateAxes({(Param, BatchStat): 0, ...: None})
    assert repr(axes) == "StateAxes({(Param, BatchStat): 0, ...: None})"
    norm = Norm()
    assert axes.axis_of(("scale",), norm.scale) == 0
    assert axes.axis_of(("mean",), norm.mean) == 0
    assert axes.axis_of(("last",), norm.last) is None
    # Filters of any kind may be grouped, path filters included.
    grouped = StateAxes({(Cache, PathContains("scale")): 1, ...: 0})
    assert grouped.axis_of(("scale",), norm.scale) == 1
    assert grouped.axis_of(("mean",), norm.mean) == 0


def test_vmap_with_a_tuple_key():
    class Stack(Module):
        def __init__(self):
            self.w = Param(jnp.arange(6.0).reshape(2, 3))
            self.count = BatchStat(jnp.zeros(2))
            self.bias = Cache(jnp.array(1.0))

    stack = Stack()

    def f(m):
        m.count.value += 1
        return m.w.value.sum() + m.bias.value

    out = pg.vmap(f, in_axes=StateAxes({(Param, BatchStat): 0, ...: None}))(stack)
    assert out.tolist() == [4.0, 13.0] and stack.count.value.tolist() == [1.0, 1.0]


def test_vmap_out_axes_per_output_and_per_filter():
    x = jnp.arange(6.0).reshape(2, 3)
    a, b = pg.vmap(lambda r: (r * 2, r.sum()), out_axes=(1, 0))(x)
    assert a.shape == (3, 2) and jnp.array_equal(a, (x * 2).T) and b.shape == (2,)
    # None: the same for every example (and checked to be).
    a, c = pg.vmap(lambda r: (r, jnp.ones(2)), out_axes=(0, None))(x)
    assert a.shape == (2, 3) and c.shape == (2,)
    with pytest.raises(ValueError, match="differs across the batch"):
        pg.vmap(lambda r: (r, r), out_axes=(0, None))(x)

    class Made(Module):
        def __init__(self, r):
            self.w = Param(r)
            self.total = BatchStat(r.sum())

    made = pg.vmap(Made, out_axes=StateAxes({Param: 1, ...: 0}))(x)
    assert made.w.value.shape == (3, 2) and made.total.value.shape == (2,)
    with pytest.raises(ValueError, match="out_axes has 2 entries, one per output"):
        pg.vmap(lambda r: r, out_axes=(0, 0))(x)


def test_vmap_refuses_carry_and_bad_axes():
    with pytest.raises(TypeError, match="Carry is for `scan`"):
        pg.vmap(lambda m: m, in_axes=StateAxes({Param: Carry, ...: 0}))
    with pytest.raises(TypeError, match="an axis must be an int, None or Carry"):
        StateAxes({Param: "0"})
    with pytest.raises(TypeError, match=r"out_axes\[1\] must be an int"):
        pg.vmap(lambda x: x, out_axes=(0, "1"))
    with pytest.raises(ValueError, match="must come last"):
        StateAxes({...: 0, Param: None})


def test_state_sharding_lays_out_each_filter():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    shardings = StateSharding({Param: rows, (BatchStat, Cache): None})
    assert repr(shardings).startswith("StateSharding({Param: NamedSharding(")
    norm = Norm()

    @pg.jit(in_shardings=(shardings, None))
    def step(m, x):
        m.mean.value = m.mean.value + x
        m.scale.value = m.scale.value * 2
        return (m.scale.value * x).sum()

    assert float(step(norm, jnp.ones(3))) == 6.0
    assert norm.mean.value.tolist() == [1.0, 1.0, 1.0]
    assert norm.scale.value.sharding.is_equivalent_to(rows, 1)


@pytest.mark.multi_device
def test_state_sharding_lays_out_a_new_model():
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rows, replicated = (
        NamedSharding(mesh, PartitionSpec("data")),
        NamedSharding(mesh, PartitionSpec()),
    )

    class Wide(Module):
        def __init__(self):
            self.scale = Param(jnp.ones(8))
            self.mean = BatchStat(jnp.zeros(8))

    wide = pg.jit(Wide, out_shardings=StateSharding({Param: rows, ...: replicated}))()
    assert wide.scale.value.sharding.is_equivalent_to(rows, 1)
    assert wide.mean.value.sharding.is_equivalent_to(replicated, 1)


def test_state_sharding_errors():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    with pytest.raises(TypeError, match="a sharding must be"):
        StateSharding({Param: 0})
    with pytest.raises(ValueError, match=r"out_shardings: no filter of StateSharding"):
        pg.jit(Norm, out_shardings=StateSharding({BatchStat: rows}))()
    only_params = pg.jit(lambda m: m.scale.value, in_shardings=(StateSharding({Param: rows}),))
    with pytest.raises(ValueError, match=r"in_shardings\[0\]: no filter of StateSharding"):
        only_params(Norm())


# ---------------------------------------------------------------------------------- prefix


class Tied(Module):
    def __init__(self):
        self.a = Param(jnp.arange(3.0))
        self.b = self.a  # the same Variable at a second path
        self.c = Param(jnp.ones(2))


def test_prefix_gives_each_path_of_the_object_its_axis():
    tied = Tied()
    axes = pg.prefix(tied, lambda path, leaf: 0 if path[0] in ("a", "b") else None)
    assert isinstance(axes, StateAxes)
    assert repr(axes) == "PrefixAxes({.a: 0, .b: 0, .c: None})"
    out = pg.vmap(lambda m: m.b.value * m.c.value.sum(), in_axes=(axes,))(tied)
    np.testing.assert_allclose(out, [0.0, 2.0, 4.0])


def test_prefix_from_a_filter_map_and_a_tuple_of_objects():
    stack = pg.vmap(lambda key: Norm())(jax.random.split(jax.random.key(0), 4))
    first, second = pg.prefix((stack, stack), {(Param, BatchStat): 0, ...: 0})

    @pg.vmap(in_axes=(first, second, None))
    def forward(a, b, x):
        assert a is b  # one object, passed twice, still one inside
        return a.scale.value * x + b.mean.value

    assert forward(stack, stack, jnp.ones(3)).shape == (4, 3)
    # Axes per path in scan too: carry the statistics, scan over the rest.
    axes = pg.prefix(stack, lambda path, leaf: Carry if path == ("mean",) else 0)

    @pg.scan(in_axes=(axes, Carry), out_axes=Carry)
    def accumulate(norm, h):
        norm.mean.value = norm.mean.value + norm.scale.value
        return h + norm.scale.value.sum()

    assert float(accumulate(stack, jnp.zeros(()))) == 12.0


def test_prefix_errors_name_the_leaf():
    tied = Tied()
    with pytest.raises(ValueError, match=r"no filter matches the Param at \.a"):
        pg.prefix(tied, {BatchStat: 0})
    with pytest.raises(TypeError, match="filter_map must be a function"):
        pg.prefix(tied, 0)
    with pytest.raises(TypeError, match="an axis must be an int, None or Carry"):
        pg.prefix(tied, lambda path, leaf: "layers")
    # Computed from another object: the missing path is named, never guessed.
    axes = pg.prefix(Norm(), {...: 0})
    with pytest.raises(ValueError, match=r"the prefix has no axis for the Param at \.a"):
        pg.vmap(lambda m: m.a.value, in_axes=(axes,))(tied)


# ------------------------------------------------------------------------- scan keywords


def test_scan_binds_keyword_arguments_to_their_positions():
    @pg.scan(in_axes=(Carry, 0, None), out_axes=(Carry, 0))
    def step(h, x, scale):
        h = h + x * scale
        return h, h

    by_position = step(jnp.zeros(()), jnp.arange(3.0), 2.0)
    by_name = step(h=jnp.zeros(()), x=jnp.arange(3.0), scale=2.0)
    for a, b in zip(by_position, by_name, strict=True):
        np.testing.assert_allclose(a, b)
    with pytest.raises(TypeError, match=r"could not be bound.*'scale'"):
        step(jnp.zeros(()), jnp.arange(3.0), scal=2.0)

    @pg.scan(in_axes=(Carry, 0), out_axes=(Carry, 0))
    def keyword_only(h, x, *, k=1.0):
        return h + x * k, h

    with pytest.raises(TypeError, match=r"keyword-only argument\(s\) \['k'\] have no position"):
        keyword_only(jnp.zeros(()), jnp.arange(3.0), k=2.0)
