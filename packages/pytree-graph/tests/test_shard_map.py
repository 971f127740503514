"""`shard`, `shard_map`, and the graph transforms on a device mesh.

The mesh tests need 8 devices: the CPU test environments fake them with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pytree_graph as pg
from pytree_module import Module
from pytree_transforms import filter_jit, filter_shard


def _mesh(n=8, name="model"):
    return Mesh(np.array(jax.devices()[:n]), (name,))


def _shard_shapes(array):
    return {shard.data.shape for shard in array.addressable_shards}


class Dense(Module):
    """Rows split over "model"; a replicated call counter."""

    def __init__(self):
        self.w = pg.Param(jnp.arange(32.0).reshape(8, 4), sharding=("model", None))
        self.calls = pg.Variable(jnp.array(0))

    def __call__(self, x):
        self.calls.value += 1
        return jax.lax.psum(x @ self.w.value, "model")


# ------------------------------------------------------------------------------------ shard


@pytest.mark.multi_device
def test_shard_lays_a_model_out_in_place():
    model = Dense()
    w = model.w
    assert pg.shard(model, _mesh()) is model
    assert model.w is w  # the same Variable, now holding a sharded array
    assert _shard_shapes(model.w.value) == {(1, 4)}
    assert model.calls.value.sharding.is_fully_replicated


@pytest.mark.multi_device
def test_shard_gives_a_new_state_and_constrains_inside_a_transform():
    mesh = _mesh()
    state = pg.state(Dense())
    placed = pg.shard(state, mesh)
    assert placed is not state and _shard_shapes(placed["w"].value) == {(1, 4)}
    assert _shard_shapes(state["w"].value) == {(8, 4)}  # the State given is left alone

    @pg.jit
    def double(model):
        model.w.value = model.w.value * 2
        pg.shard(model, mesh)  # pins the new value's layout

    model = Dense()
    double(model)
    assert _shard_shapes(model.w.value) == {(1, 4)}
    np.testing.assert_array_equal(model.w.value, np.arange(32.0).reshape(8, 4) * 2)


def test_shard_names_what_is_wrong_and_moves_nothing():
    model = Dense()
    before = model.w.value
    with pytest.raises(ValueError, match=r"mesh axes \['model'\].*its axes: \['data'\]"):
        pg.shard(model, _mesh(1, "data"))
    assert model.w.value is before
    with pytest.raises(TypeError, match=r"shard: mesh must be a jax\.sharding\.Mesh"):
        pg.shard(model, ("model",))


@pytest.mark.multi_device
def test_graph_transforms_keep_the_shardings_of_written_variables():
    mesh = _mesh()
    model = pg.shard(Dense(), mesh)

    @pg.jit
    def step(model):
        grads = pg.grad(lambda m: jnp.sum(m.w.value**2))(model)
        model.w.value = model.w.value - 0.1 * grads["w"].value

    step(model)
    assert model.w.value.sharding.is_equivalent_to(NamedSharding(mesh, P("model", None)), 2)
    np.testing.assert_allclose(model.w.value, np.arange(32.0).reshape(8, 4) * 0.8, rtol=1e-6)


@pytest.mark.multi_device
def test_filter_shard_takes_the_named_shardings_of_a_state():
    mesh = _mesh()
    state = pg.state(Dense())
    shardings = pg.get_named_sharding(state, mesh)
    assert _shard_shapes(filter_shard(state, shardings)["w"].value) == {(1, 4)}
    inside = filter_jit(lambda s: filter_shard(s, shardings))(state)
    assert _shard_shapes(inside["w"].value) == {(1, 4)}


# ----------------------------------------------------------- jit's in_shardings, out_shardings


def _rows(mesh):
    return NamedSharding(mesh, P("model", None))


@pytest.mark.multi_device
def test_in_shardings_lay_out_the_arguments_and_the_variables_written():
    mesh = _mesh()
    model = Dense()  # on one device: in_shardings move it
    untouched = pg.Variable(jnp.ones(8))
    model.untouched = untouched
    seen = []

    @pg.jit(in_shardings=(pg.get_named_sharding(model, mesh), NamedSharding(mesh, P())))
    def step(model, x):
        seen.append(model.w.value.shape)  # traced: the global shape
        model.w.value = model.w.value * x  # left alone, XLA might pick any layout
        return jnp.sum(model.w.value)

    total = step(model, jnp.array(2.0))
    assert float(total) == float(np.arange(32.0).sum() * 2)
    assert model.w.value.sharding.is_equivalent_to(_rows(mesh), 2)  # written: laid out
    assert _shard_shapes(model.w.value) == {(1, 4)}
    assert model.untouched is untouched and _shard_shapes(untouched.value) == {(8,)}
    step(model, jnp.array(2.0))
    step(model, jnp.array(0.5))
    assert step._cache_size() == 2  # the model came in on one device, then split
    np.testing.assert_array_equal(model.w.value, np.arange(32.0).reshape(8, 4) * 2)


@pytest.mark.multi_device
def test_out_shardings_lay_out_the_output_and_new_variables():
    mesh = _mesh()
    columns = NamedSharding(mesh, P(None, "model"))

    @pg.jit(out_shardings=(columns, {"new": _rows(mesh), "kept": None}))
    def make(x):
        return x * 2, {"new": pg.Param(x + 1), "kept": x}

    doubled, made = make(jnp.ones((8, 8)))
    assert _shard_shapes(doubled) == {(8, 1)}
    assert isinstance(made["new"], pg.Param) and _shard_shapes(made["new"].value) == {(1, 8)}
    np.testing.assert_array_equal(made["kept"], np.ones((8, 8)))


@pytest.mark.multi_device
def test_one_sharding_or_a_prefix_covers_a_whole_argument():
    mesh = _mesh()
    params = {"a": jnp.ones((8, 8)), "b": pg.Param(jnp.ones((8, 8)))}

    @pg.jit(in_shardings=_rows(mesh))  # every array of every argument
    def scale(params, factor):
        params["b"].value = params["b"].value * factor
        return params["a"] * factor

    scale(params, jnp.ones((8, 8)))
    assert _shard_shapes(params["b"].value) == {(1, 8)}

    @pg.jit(in_shardings=({"a": None, "b": _rows(mesh)},))  # a prefix of the argument
    def grow(params):
        params["b"].value = params["b"].value + params["a"]

    params["b"].value = jnp.zeros((8, 8))
    grow(params)
    assert _shard_shapes(params["b"].value) == {(1, 8)}
    np.testing.assert_array_equal(params["b"].value, np.ones((8, 8)))
    with jax.set_mesh(mesh):  # a PartitionSpec names the axes of the mesh in force

        @pg.jit(in_shardings=P(None, "model"))
        def halve(params):
            params["b"].value = params["b"].value / 2

        halve(params)
    assert _shard_shapes(params["b"].value) == {(8, 1)}


@pytest.mark.multi_device
def test_in_shardings_with_donated_arguments():
    mesh = _mesh()
    model = Dense()

    @pg.jit(in_shardings=(pg.get_named_sharding(model, mesh),), donate_argnums=0)
    def double(model):
        model.w.value = model.w.value * 2

    double(model)
    assert _shard_shapes(model.w.value) == {(1, 4)}
    np.testing.assert_array_equal(model.w.value, np.arange(32.0).reshape(8, 4) * 2)


def test_bad_shardings_are_named_and_nothing_changes():
    mesh = _mesh(1)
    model = Dense()
    before = model.w.value

    def double(model, x=None):
        model.w.value = model.w.value * 2

    other = pg.get_named_sharding(pg.state({"v": pg.Param(jnp.ones(2))}), mesh)
    replicated = NamedSharding(mesh, P())
    cases = [
        ((other,), {}, ValueError, r"in_shardings\[0\] has no entry for the value at \.calls"),
        ((replicated, replicated), {}, ValueError, "in_shardings has 2 entries but the"),
        (("model",), {}, TypeError, r"in_shardings\[0\]: the entry at the top level is 'model'"),
        (replicated, {"x": jnp.ones(2)}, TypeError, "keyword argument 'x' holds arrays"),
    ]
    for shardings, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            pg.jit(double, in_shardings=shardings)(model, **kwargs)
        assert model.w.value is before
    with pytest.raises(ValueError, match=r"out_shardings has no entry for the value at \[1\]"):
        pg.jit(lambda x: (x, x), out_shardings=(replicated,))(jnp.ones(2))


# -------------------------------------------------------------------------------- shard_map


@pytest.mark.multi_device
def test_each_device_sees_its_shard_and_writes_come_back_sharded():
    mesh = _mesh()
    model = pg.shard(Dense(), mesh)
    seen = []

    def scale(model, factor):
        seen.append(model.w.value.shape)
        model.w.value = model.w.value * factor
        return jnp.sum(model.w.value)[None]  # one partial sum per device

    specs = pg.get_partition_spec(model)
    partial_sums = pg.shard_map(scale, mesh=mesh, in_specs=(specs, P()), out_specs=P("model"))(
        model, jnp.array(2.0)
    )
    assert seen == [(1, 4)]
    expected = np.arange(32.0).reshape(8, 4) * 2
    np.testing.assert_array_equal(model.w.value, expected)
    assert model.w.value.sharding.is_equivalent_to(NamedSharding(mesh, P("model", None)), 2)
    np.testing.assert_array_equal(partial_sums, expected.sum(axis=1))


@pytest.mark.multi_device
def test_a_module_called_inside_shard_map_updates_the_callers_model():
    mesh = _mesh()
    model = Dense()
    x = jnp.ones((3, 8))
    expected = np.asarray(x @ model.w.value)
    forward = pg.shard_map(
        lambda m, x: m(x),
        mesh=mesh,
        in_specs=(pg.get_partition_spec(model), P(None, "model")),
        out_specs=P(),
    )
    np.testing.assert_allclose(forward(model, x), expected)
    assert int(model.calls.value) == 1  # replicated, written back once
    # Under pytree_graph.jit too, and as a method: the model's own metadata gives its specs.
    np.testing.assert_allclose(pg.jit(forward)(model, x), expected)
    method = pg.shard_map(model.__call__, mesh=mesh, in_specs=P(None, "model"), out_specs=P())
    np.testing.assert_allclose(method(x), expected)
    assert int(model.calls.value) == 3


@pytest.mark.multi_device
def test_one_partition_spec_splits_every_array_of_an_argument():
    mesh = _mesh()
    params = [pg.Param(jnp.arange(8.0)), pg.Param(jnp.ones((8, 2)))]

    def add(params):
        assert [p.value.shape for p in params] == [(1,), (1, 2)]
        return params[0].value + params[1].value.sum(axis=1)

    out = pg.shard_map(add, mesh=mesh, in_specs=P("model"), out_specs=P("model"))(params)
    np.testing.assert_array_equal(out, np.arange(8.0) + 2)


def test_shard_map_names_what_is_wrong():
    mesh = _mesh(1)
    model = Dense()
    other = pg.get_partition_spec(pg.state({"v": pg.Param(jnp.ones(2))}))
    with pytest.raises(ValueError, match=r"in_specs\[0\] has no entry for the Variable at \.calls"):
        pg.shard_map(lambda m: m.w.value, mesh=mesh, in_specs=(other,), out_specs=P())(model)
    with pytest.raises(ValueError, match="in_specs has 2 entries but the function was called"):
        pg.shard_map(lambda m: m.w.value, mesh=mesh, in_specs=(P(), P()), out_specs=P())(model)
    with pytest.raises(TypeError, match=r"in_specs\[0\]: the entry at the top level is 'model'"):
        pg.shard_map(lambda m: m.w.value, mesh=mesh, in_specs=("model",), out_specs=P())(model)
    with pytest.raises(TypeError, match="returned a Module or Variable"):
        pg.shard_map(lambda m: m, mesh=mesh, in_specs=P(), out_specs=P())(model)
    with pytest.raises(TypeError, match="keyword argument 'x' holds arrays"):
        pg.shard_map(lambda x: x, mesh=mesh, in_specs=P(), out_specs=P())(x=jnp.ones(2))
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh"):
        pg.shard_map(lambda x: x, mesh=("model",), in_specs=P(), out_specs=P())
    assert int(model.calls.value) == 0 and model.w.value.shape == (8, 4)


@pytest.mark.multi_device
def test_a_replicated_variable_given_different_values_per_device_is_refused():
    mesh = _mesh()
    model = Dense()

    def count_rows(model):
        model.calls.value = model.calls.value + model.w.value.shape[0] * jnp.sum(model.w.value)
        return jnp.zeros(())

    with pytest.raises(ValueError):
        pg.shard_map(count_rows, mesh=mesh, in_specs=pg.get_partition_spec(model),
                     out_specs=P())(model)  # fmt: skip
    assert int(model.calls.value) == 0
