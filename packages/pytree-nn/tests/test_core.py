"""Module conveniences, Rngs, Linear, MLP, Sequential, Lambda and Dropout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Intermediate, Param, Perturbation
from pytree_nn import MLP, Dropout, Lambda, Linear, Module, Rngs, Sequential, initializers

# -------------------------------------------------------------------------------- Rngs


def test_rngs_streams_fall_back_to_the_default_and_advance():
    rngs = Rngs(0, dropout=1)
    a, b = rngs.params(), rngs.params()  # "params" is not a stream: the default one
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    assert int(rngs.default.count.value) == 2 and int(rngs.dropout.count.value) == 0
    # The same seed gives the same keys; streams are independent.
    again = Rngs(0, dropout=1)
    assert np.array_equal(jax.random.key_data(again()), jax.random.key_data(a))
    assert not np.array_equal(
        jax.random.key_data(Rngs(0, dropout=1).dropout()), jax.random.key_data(a)
    )
    assert sorted(rngs.streams()) == ["default", "dropout"]


def test_rngs_accept_seeds_and_keys_and_refuse_the_rest():
    typed = jax.random.key(3)
    raw = jax.random.PRNGKey(3)
    for seed in (3, np.int32(3), typed, raw, jnp.array(3)):
        key = Rngs(seed).default.key.value
        assert jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    assert np.array_equal(
        jax.random.key_data(Rngs(typed).default.key.value), jax.random.key_data(typed)
    )
    with pytest.raises(TypeError, match="Rngs needs a seed or key"):
        Rngs()
    with pytest.raises(TypeError, match="expected an int seed or a PRNG key"):
        Rngs("zero")
    with pytest.raises(ValueError, match="cannot be called 'normal'"):
        Rngs(normal=0)
    only_params = Rngs(params=0)
    with pytest.raises(
        AttributeError, match="No RngStream named 'dropout' found in Rngs, and no default"
    ):
        only_params.dropout()


def test_the_default_stream_can_be_named_by_keyword():
    by_keyword, by_position = Rngs(default=42), Rngs(42)
    assert by_keyword.streams() == ["default"]
    for _ in range(2):
        np.testing.assert_array_equal(
            jax.random.key_data(by_keyword.params()), jax.random.key_data(by_position())
        )
    with_more = Rngs(default=0, dropout=1)
    assert sorted(with_more.streams()) == ["default", "dropout"]
    np.testing.assert_array_equal(jax.random.key_data(with_more()), jax.random.key_data(Rngs(0)()))
    with pytest.raises(TypeError, match="default stream twice"):
        Rngs(0, default=1)
    with pytest.raises(TypeError, match=r"Rngs\(default=None\)"):
        Rngs(default=None)


def test_rngs_distributions_and_split_for_vmap():
    rngs = Rngs(0)
    assert rngs.normal((2, 3)).shape == (2, 3)
    assert rngs.uniform((4,), minval=1.0, maxval=2.0).min() >= 1.0
    assert rngs.default.bernoulli(0.5, (5,)).dtype == jnp.bool_
    many = rngs.split(4)
    assert many.default.key.value.shape == (4,)
    draws = pg.vmap(lambda r: r.normal(()))(many)
    assert draws.shape == (4,) and len(set(np.asarray(draws).tolist())) == 4
    assert np.asarray(many.default.count.value).tolist() == [1, 1, 1, 1]


def test_rngs_advance_inside_graph_transforms():
    rngs = Rngs(0)
    draw = pg.jit(lambda r: r.normal(()))
    first, second = draw(rngs), draw(rngs)
    assert float(first) != float(second) and int(rngs.default.count.value) == 2


# ----------------------------------------------------------------------- Module


def test_sow_and_perturb():
    class Model(Module):
        def __init__(self):
            self.linear = Linear(2, 3, rngs=0)

        def __call__(self, x):
            y = self.linear(x)
            self.sow(Intermediate, "y", y)
            y = self.perturb("y_grad", y)
            return jnp.sum(y**2)

    model = Model()
    x = jnp.ones(2)
    model(x)
    model(x)
    assert len(model.y.value) == 2 and float(model.y_grad.value.sum()) == 0.0
    sown = pg.pop(model, Intermediate)
    assert list(sown) == ["y"] and not hasattr(model, "y")
    grads = pg.grad(lambda m: m(x), wrt=Perturbation)(model)
    y = model.linear(x)
    assert jnp.allclose(grads["y_grad"].value, 2 * y)  # d(sum y^2)/dy
    model.z = Param(jnp.zeros(2))
    with pytest.raises(
        ValueError,
        match=r"^Expected 'z' to be of type 'Intermediate', got 'Param': sow found Model\.z "
        r"holding a Param, not a Variable of type Intermediate",
    ):
        model.sow(Intermediate, "z", x)
    model.w = 10
    with pytest.raises(ValueError, match=r"^Expected 'w' to be a Variable, got int: sow"):
        model.sow(Intermediate, "w", x)
    with pytest.raises(ValueError, match=r"^Expected 'w' to be a Variable, got int: perturb"):
        model.perturb("w", x)
    with pytest.raises(ValueError, match=r"^Expected 'z' to be of type 'Perturbation'"):
        model.perturb("z", x)


def test_train_eval_and_set_attributes():
    class Net(Module):
        def __init__(self):
            self.drop = Dropout(0.5, rngs=0)
            self.blocks = [Dropout(0.1, rngs=1)]

    net = Net()
    assert net.drop.deterministic is False  # modules start in training mode
    assert net.eval() is net and net.drop.deterministic and net.blocks[0].deterministic
    net.train()
    assert not net.drop.deterministic
    net.set_attributes(rate=0.2)
    assert net.drop.rate == 0.2 and net.blocks[0].rate == 0.2
    with pytest.raises(
        ValueError,
        match=r"Could not find at least one instance of the following attributes: \{'momentum'\}.*"
        r"no selected Module has the attribute\(s\) \['momentum'\]",
    ):
        net.set_attributes(momentum=0.9)
    # Filters select the Modules, as Flax NNX's `Module.set_attributes(*filters, ...)`.
    net.set_attributes(lambda path, m: path == ("drop",), rate=0.3)
    assert net.drop.rate == 0.3 and net.blocks[0].rate == 0.2


def test_split_and_update_methods():
    layer = Linear(2, 2, rngs=0)
    graphdef, state = layer.split()
    doubled = jax.tree.map(lambda x: x * 2, state)
    layer.update(doubled)
    assert jnp.allclose(layer.kernel.value, doubled["kernel"].value)
    assert type(pg.merge(graphdef, state)) is Linear


# ----------------------------------------------------------------------- layers


def test_linear_matches_a_reference_and_checks_its_inputs():
    layer = Linear(3, 4, rngs=Rngs(params=0))
    x = jax.random.normal(jax.random.key(1), (2, 5, 3))
    expected = jnp.einsum("bti,io->bto", x, layer.kernel.value) + layer.bias.value
    assert jnp.allclose(layer(x), expected, atol=1e-6)
    assert layer(jnp.ones(3)).shape == (4,)  # unbatched
    # Default initialisation: lecun normal kernel, zero bias.
    key = Rngs(params=0).params()
    assert jnp.allclose(layer.kernel.value, initializers.lecun_normal()(key, (3, 4)))
    assert float(jnp.abs(layer.bias.value).sum()) == 0.0
    no_bias = Linear(3, 4, use_bias=False, rngs=0)
    assert no_bias.bias is None and no_bias(jnp.ones(3)).shape == (4,)
    half = Linear(3, 4, dtype=jnp.bfloat16, rngs=0)
    assert half(jnp.ones(3)).dtype == jnp.bfloat16 and half.kernel.value.dtype == jnp.float32
    with pytest.raises(ValueError, match=r"last dimension is in_features=3, got .* \(2, 5\)"):
        layer(jnp.ones((2, 5)))
    with pytest.raises(ValueError, match="out_features must be an int >= 0, got -1"):
        Linear(3, -1, rngs=0)
    with pytest.raises(TypeError, match="Linear needs `rngs=`"):
        Linear(3, 4)


def test_linear_with_no_input_features_gives_its_bias():
    # As Equinox's Linear(0, n): an empty kernel, and the output is the bias.
    layer = Linear(0, 3, bias_init=initializers.ones, rngs=0)
    assert layer.kernel.value.shape == (0, 3)
    np.testing.assert_array_equal(layer(jnp.ones((2, 0))), jnp.ones((2, 3)))
    np.testing.assert_array_equal(layer(jnp.ones((0,))), jnp.ones(3))
    # Every initializer sees no empty shape (fan-in scaled ones would divide by zero),
    # and the bias gets the key it gets in any Linear.
    seen = []
    recording = Linear(0, 3, kernel_init=lambda *a: seen.append(a), rngs=0)
    assert seen == [] and float(jnp.abs(recording.kernel.value).sum()) == 0.0
    normal = initializers.normal()
    np.testing.assert_array_equal(
        Linear(0, 3, bias_init=normal, rngs=0).bias.value,
        Linear(2, 3, bias_init=normal, rngs=0).bias.value,
    )
    assert MLP(0, 2, width_size=4, depth=1, rngs=0)(jnp.ones((0,))).shape == (2,)
    with pytest.raises(ValueError, match="in_features must be an int >= 0, got -1"):
        Linear(-1, 3, rngs=0)
    with pytest.raises(ValueError, match="out_size must be an int >= 0, got -2"):
        MLP(0, -2, width_size=4, depth=1, rngs=0)


def test_mlp_as_equinox_defines_it():
    mlp = MLP(2, 3, width_size=8, depth=2, final_activation=jnp.tanh, rngs=0)
    sizes = [(layer.in_features, layer.out_features) for layer in mlp.layers]
    assert sizes == [(2, 8), (8, 8), (8, 3)]
    x = jnp.ones((4, 2))
    h = x
    for layer in mlp.layers[:-1]:
        h = jax.nn.relu(h @ layer.kernel.value + layer.bias.value)
    expected = jnp.tanh(h @ mlp.layers[-1].kernel.value + mlp.layers[-1].bias.value)
    assert jnp.allclose(mlp(x), expected, atol=1e-6)
    assert len(MLP(2, 3, 8, depth=0, rngs=0).layers) == 1
    assert MLP(2, 3, 8, 1, use_final_bias=False, rngs=0).layers[-1].bias is None
    with pytest.raises(ValueError, match="depth must be an int >= 0"):
        MLP(2, 3, 8, -1, rngs=0)


def test_sequential_and_lambda():
    net = Sequential(Linear(2, 4, rngs=0), jax.nn.relu, Lambda(lambda x: x * 2))
    x = jnp.ones((3, 2))
    first = net[0]
    assert jnp.allclose(net(x), 2 * jax.nn.relu(first(x)))
    assert len(net) == 3 and isinstance(net[:1], Sequential)
    with pytest.raises(TypeError, match="layer 1 is a int"):
        Sequential(Linear(2, 2, rngs=0), 3)
    with pytest.raises(TypeError, match="Lambda expects a callable"):
        Lambda(3)


def test_dropout():
    dropout = Dropout(0.25, rngs=Rngs(dropout=0))
    y = dropout(jnp.ones((200, 50)))
    kept = float((y != 0).mean())
    assert abs(kept - 0.75) < 0.02 and jnp.allclose(y[y != 0], 1 / 0.75)
    # Whole channels dropped with broadcast_dims.
    channels = Dropout(0.5, broadcast_dims=(0,), rngs=0)(jnp.ones((10, 40)))
    assert bool(jnp.all(channels == channels[0]))
    # A new mask each call, in place and under pytree_graph.jit.
    step = pg.jit(lambda d, x: d(x))
    assert not jnp.array_equal(step(dropout, jnp.ones(100)), step(dropout, jnp.ones(100)))
    assert Dropout(1.0)(jnp.ones(3)).tolist() == [0.0, 0.0, 0.0]
    assert Dropout(0.5, deterministic=True)(jnp.ones(2)).tolist() == [1.0, 1.0]
    assert Dropout(0.5)(jnp.ones(2), rngs=0).shape == (2,)
    with pytest.raises(ValueError, match="Dropout needs random keys"):
        Dropout(0.5)(jnp.ones(2))
    with pytest.raises(ValueError, match=r"rate must be a number in \[0, 1\]"):
        Dropout(1.5)
