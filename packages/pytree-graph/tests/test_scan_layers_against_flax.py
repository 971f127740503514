"""The scan-over-layers pattern, side by side with Flax NNX: the same weights give the
same numbers, statistics and partition specs."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402


class TheirBlock(nnx.Module):
    def __init__(self, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (3, 3)) * 0.5)
        self.mean = nnx.BatchStat(jnp.zeros(3))

    def __call__(self, x):
        y = x @ self.w[...]
        self.mean[...] = 0.9 * self.mean[...] + 0.1 * y.mean(0)
        return jax.nn.relu(y)


class OurBlock(Module):
    def __init__(self, w):
        self.w = pg.Param(w)
        self.mean = pg.BatchStat(jnp.zeros(3))

    def __call__(self, x):
        y = x @ self.w.value
        self.mean.value = 0.9 * self.mean.value + 0.1 * y.mean(0)
        return jax.nn.relu(y)


def test_scan_over_layers_matches_nnx():
    @nnx.split_rngs(splits=4)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
        return TheirBlock(rngs)

    theirs = create(nnx.Rngs(0))
    ours = pg.vmap(OurBlock)(jnp.asarray(theirs.w[...]))
    assert ours.w.value.shape == theirs.w.shape == (4, 3, 3)

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def their_forward(x, block):
        return block(x)

    @pg.scan(in_axes=(pg.Carry, 0), out_axes=pg.Carry)
    def our_forward(x, block):
        return block(x)

    x = jnp.arange(6.0).reshape(2, 3)
    for _ in range(2):  # twice: the statistics written back feed the second call
        assert jnp.allclose(our_forward(x, ours), their_forward(x, theirs), atol=1e-6)
        assert jnp.allclose(ours.mean.value, theirs.mean[...], atol=1e-6)

    # Stacked outputs, (Carry, 0), as in NNX.
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    def their_sums(x, block):
        y = block(x)
        return y, y.sum()

    @pg.scan(in_axes=(pg.Carry, 0), out_axes=(pg.Carry, 0))
    def our_sums(x, block):
        y = block(x)
        return y, y.sum()

    (y1, s1), (y2, s2) = our_sums(x, ours), their_sums(x, theirs)
    assert jnp.allclose(y1, y2, atol=1e-6) and jnp.allclose(s1, s2, atol=1e-5)


def test_a_module_carry_is_returned_as_in_nnx():
    class TheirTotal(nnx.Module):
        def __init__(self):
            self.value = nnx.BatchStat(jnp.array(0.0))

    class OurTotal(Module):
        def __init__(self):
            self.value = pg.BatchStat(jnp.array(0.0))

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def their_add(total, x):
        total.value[...] += x
        return total

    @pg.scan(in_axes=(pg.Carry, 0), out_axes=pg.Carry)
    def our_add(total, x):
        total.value.value += x
        return total

    theirs, ours = TheirTotal(), OurTotal()
    assert their_add(theirs, jnp.arange(4.0)) is theirs
    assert our_add(ours, jnp.arange(4.0)) is ours
    assert float(ours.value.value) == float(theirs.value[...]) == 6.0


def test_transform_metadata_names_the_layer_axis_as_in_nnx():
    assert pg.PARTITION_NAME == nnx.PARTITION_NAME == "partition_name"
    mesh = jax.make_mesh((1, 1), ("layers", "model"))

    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def their_create(key):
        return nnx.Param(jax.random.normal(key, (3, 3)), out_sharding=(None, "model"))

    @pg.vmap(in_axes=0, out_axes=0, transform_metadata={pg.PARTITION_NAME: "layers"})
    def our_create(key):
        return pg.Param(jax.random.normal(key, (3, 3)), sharding=(None, "model"))

    keys = jax.random.split(jax.random.key(0), 4)
    with jax.set_mesh(mesh):
        theirs = their_create(keys)
    ours = our_create(keys)
    # NNX 0.12.8 keeps the names in `out_sharding`; ours are in `sharding`.
    assert ours.sharding == theirs.out_sharding == ("layers", None, "model")
    seen = {}

    @nnx.scan(
        in_axes=(nnx.Carry, 0),
        out_axes=nnx.Carry,
        transform_metadata={nnx.PARTITION_NAME: "layers"},
    )
    def their_step(x, w):
        seen["theirs"] = w.out_sharding
        return x @ w[...]

    @pg.scan(
        in_axes=(pg.Carry, 0), out_axes=pg.Carry, transform_metadata={pg.PARTITION_NAME: "layers"}
    )
    def our_step(x, w):
        seen["ours"] = w.sharding
        return x @ w.value

    x = jnp.ones((2, 3))
    with jax.set_mesh(mesh):
        expected = their_step(x, theirs)
    assert jnp.allclose(our_step(x, ours), expected, atol=1e-5)
    assert seen["ours"] == seen["theirs"] == (None, "model")


def test_writing_a_broadcast_variable():
    # NNX's graph mode (its default) gives every step the value the Variable came in with and
    # drops the write (the count stays 0); its tree mode carries it from step to step (the
    # count reaches 3). Ours reads as NNX's graph mode and keeps the last step's write (1).
    class TheirCount(nnx.Module):
        def __init__(self):
            self.n = nnx.BatchStat(jnp.array(0.0))

    class OurCount(Module):
        def __init__(self):
            self.n = pg.BatchStat(jnp.array(0.0))

    @nnx.scan(in_axes=(nnx.Carry, None, 0), out_axes=nnx.Carry)
    def theirs(x, c, xs):
        c.n[...] += 1
        return x + xs

    @pg.scan(in_axes=(pg.Carry, None, 0), out_axes=pg.Carry)
    def ours(x, c, xs):
        c.n.value += 1
        return x + xs

    count = TheirCount()
    theirs(jnp.array(0.0), count, jnp.arange(3.0))
    assert float(count.n[...]) == 0.0

    @nnx.scan(in_axes=(nnx.Carry, None, 0), out_axes=nnx.Carry, graph=False)
    def theirs_as_trees(x, c, xs):
        c.n[...] += 1
        return x + xs

    count = TheirCount()
    theirs_as_trees(jnp.array(0.0), count, jnp.arange(3.0))
    assert float(count.n[...]) == 3.0
    count = OurCount()
    ours(jnp.array(0.0), count, jnp.arange(3.0))
    assert float(count.n.value) == 1.0


def test_tuple_keys_in_state_axes_as_in_nnx():
    class Theirs(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.arange(6.0).reshape(2, 3))
            self.n = nnx.BatchStat(jnp.zeros(2))
            self.b = nnx.Cache(jnp.array(1.0))

    class Ours(Module):
        def __init__(self):
            self.w = pg.Param(jnp.arange(6.0).reshape(2, 3))
            self.n = pg.BatchStat(jnp.zeros(2))
            self.b = pg.Cache(jnp.array(1.0))

    def their_f(m):
        m.n[...] += 1
        return m.w[...].sum() + m.b[...]

    def our_f(m):
        m.n.value += 1
        return m.w.value.sum() + m.b.value

    their_axes = nnx.StateAxes({(nnx.Param, nnx.BatchStat): 0, ...: None})
    our_axes = pg.StateAxes({(pg.Param, pg.BatchStat): 0, ...: None})
    theirs, ours = Theirs(), Ours()
    expected = nnx.vmap(their_f, in_axes=(their_axes,))(theirs)
    assert jnp.array_equal(pg.vmap(our_f, in_axes=(our_axes,))(ours), expected)
    assert jnp.array_equal(ours.n.value, theirs.n[...])
