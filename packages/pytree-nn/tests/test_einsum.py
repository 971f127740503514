"""`Einsum` and `LinearGeneral`: numerics on fixed weights against `jnp.einsum` / `lax`,
initialisation, errors, and a layer shared twice in a model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_nn import Einsum, LinearGeneral, Module, Optimizer, Rngs, initializers


def fixed(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def set_weights(layer, seed=0):
    """Give the layer fixed, non-trivial weights (so no bias is zero)."""
    layer.kernel.value = fixed(seed, layer.kernel.value.shape)
    if layer.bias is not None:
        layer.bias.value = fixed(seed + 1, layer.bias.value.shape)
    return layer


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ Einsum


@pytest.mark.parametrize(
    ("equation", "kernel_shape", "bias_shape", "x_shape", "bias_broadcast"),
    [
        ("nta,hab->nthb", (8, 2, 4), (8, 4), (3, 5, 2), (1, 1, 8, 4)),
        ("btd,dh->bth", (4, 6), (6,), (2, 3, 4), (1, 1, 6)),
        ("btd,dnh->bnth", (4, 2, 3), (2, 3), (2, 5, 4), (1, 2, 1, 3)),
        ("...d,dnh->...nh", (4, 2, 3), (2, 3), (2, 7, 4), (1, 1, 2, 3)),
        ("...d,dnh->...nh", (4, 2, 3), (2, 3), (4,), (2, 3)),
        ("bd,hd->bh", (5, 4), None, (3, 4), None),
    ],
)
def test_einsum_matches_jnp_einsum_plus_the_broadcast_bias(
    equation, kernel_shape, bias_shape, x_shape, bias_broadcast
):
    layer = set_weights(Einsum(equation, kernel_shape, bias_shape, rngs=0))
    x = fixed(7, x_shape)
    expected = jnp.einsum(equation, x, layer.kernel.value)
    if bias_shape is not None:
        expected = expected + layer.bias.value.reshape(bias_broadcast)
    close(layer(x), expected)
    close(jax.jit(lambda layer, x: layer(x))(layer, x), expected)


def test_einsum_with_spaces_is_stored_without_them():
    layer = Einsum(" bd , dh -> bh ", (3, 2), rngs=0)
    assert layer.einsum_str == "bd,dh->bh"
    close(layer(jnp.ones((4, 3))), jnp.ones((4, 3)) @ layer.kernel.value)


def test_einsum_str_given_at_call_overrides_the_layers():
    layer = set_weights(Einsum("bd,dh->bh", (3, 4), (4,), rngs=0))
    x = fixed(3, (2, 3))
    transposed = layer(x, einsum_str="bd,dh->hb")
    close(transposed, jnp.einsum("bd,dh->hb", x, layer.kernel.value) + layer.bias.value[:, None])
    assert layer.einsum_str == "bd,dh->bh"


def test_einsum_without_a_string_takes_one_at_each_call():
    layer = set_weights(Einsum(None, (3, 4), (4,), rngs=0))
    x = fixed(3, (2, 3))
    close(layer(x, "bd,dh->bh"), x @ layer.kernel.value + layer.bias.value)
    with pytest.raises(ValueError, match=r"einsum_str=None.*layer\(inputs, einsum_str=\.\.\.\)"):
        layer(x)


def test_einsum_bias_of_another_shape_with_as_many_elements_is_reshaped_as_in_nnx():
    layer = set_weights(Einsum("bd,dnh->bnh", (3, 2, 4), (8,), rngs=0))
    x = fixed(3, (5, 3))
    expected = jnp.einsum("bd,dnh->bnh", x, layer.kernel.value) + layer.bias.value.reshape(2, 4)
    close(layer(x), expected)


def test_einsum_initialisation_uses_the_initializers_on_the_given_shapes():
    layer = Einsum(
        "bd,dnh->bnh",
        (3, 2, 4),
        (2, 4),
        kernel_init=initializers.lecun_normal(),
        bias_init=initializers.normal(1.0),
        rngs=Rngs(5),
    )
    rngs = Rngs(5)
    kernel = initializers.lecun_normal()(rngs.params(), (3, 2, 4), jnp.float32)
    bias = initializers.normal(1.0)(rngs.params(), (2, 4), jnp.float32)
    np.testing.assert_array_equal(layer.kernel.value, kernel)
    np.testing.assert_array_equal(layer.bias.value, bias)
    assert Einsum("bd,dh->bh", (3, 0), rngs=0).kernel.value.shape == (3, 0)


def test_einsum_dtype_and_param_dtype():
    layer = Einsum("bd,dh->bh", (3, 4), (4,), param_dtype=jnp.bfloat16, rngs=0)
    assert layer.kernel.value.dtype == jnp.bfloat16
    assert layer(jnp.ones((2, 3), jnp.bfloat16)).dtype == jnp.bfloat16
    assert layer(jnp.ones((2, 3))).dtype == jnp.float32
    computed = Einsum("bd,dh->bh", (3, 4), dtype=jnp.bfloat16, rngs=0)
    assert computed(jnp.ones((2, 3))).dtype == jnp.bfloat16


def test_einsum_shardings_become_metadata():
    layer = Einsum(
        "bd,dh->bh", (3, 4), (4,), kernel_sharding=(None, "model"), bias_sharding=("model",), rngs=0
    )
    assert layer.kernel.sharding == (None, "model")
    assert layer.bias.sharding == ("model",)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("bd,dh", (3, 4)), ValueError, r"'bd,dh' has no '->': write the output's subscripts"),
        (("bd,dh->bh->h", (3, 4)), ValueError, r"more than one '->'"),
        (("bd->bh", (3, 4)), ValueError, r"'bd->bh' has 1 operands.*exactly two"),
        (("bd,dh,hk->bk", (3, 4)), ValueError, r"has 3 operands.*exactly two"),
        (
            ("bd,dhk->bh", (3, 4)),
            ValueError,
            r"names 3 kernel axes \('dhk'\).*kernel_shape=\(3, 4\)",
        ),
        (
            ("bd,dh...->bh...", (3,)),
            ValueError,
            r"names 2 kernel axes besides '...' \('dh...'\).*kernel_shape=\(3,\) has only 1",
        ),
        (("bd,d..h...->bh", (3, 4)), ValueError, r"kernel's subscripts 'd..h...'"),
        (("b1,1h->bh", (3, 4)), ValueError, r"'1' in the input's subscripts 'b1'"),
        (("bd,dh->bz", (3, 4)), ValueError, r"output subscripts 'z' that are in neither"),
        (("bd,dh->...h", (3, 4)), ValueError, r"'\.\.\.' in the output but not in the input"),
        ((3, (3, 4)), TypeError, r"einsum_str must be a string"),
        ((["bd,dh->bh"], (3, 4)), TypeError, r"einsum_str must be a string"),
        (("bd,dh->bh", (3, -4)), ValueError, r"kernel_shape must be a tuple of ints >= 0"),
        (("bd,dh->bh", "34"), TypeError, r"kernel_shape must be a tuple of ints"),
        (
            ("bd,dh->bh", (3, 4), (5,)),
            ValueError,
            r"bias_shape=\(5,\) does not fit.*\('h'\) have sizes \(4,\), so give bias_shape=\(4,\)",
        ),
    ],
)
def test_einsum_construction_errors_name_the_string_and_the_fix(args, error, match):
    with pytest.raises(error, match=match):
        Einsum(*args, rngs=0)


def test_einsum_other_construction_errors():
    with pytest.raises(TypeError, match="preferred_element_type must be a dtype"):
        Einsum("bd,dh->bh", (3, 4), preferred_element_type="wide", rngs=0)
    with pytest.raises(ValueError, match="bias_sharding was given but bias_shape is None"):
        Einsum("bd,dh->bh", (3, 4), bias_sharding=("model",), rngs=0)
    with pytest.raises(ValueError, match="kernel_sharding has 1 entries"):
        Einsum("bd,dh->bh", (3, 4), kernel_sharding=("model",), rngs=0)


def test_einsum_call_errors_name_the_axis_and_the_sizes():
    layer = Einsum("btd,dh->bth", (4, 6), (6,), rngs=0)
    with pytest.raises(
        ValueError, match=r"names 3 input axes \('btd'\), got an input of shape \(2, 4\)"
    ):
        layer(jnp.ones((2, 4)))
    with pytest.raises(
        ValueError, match=r"input's axis 2 \('d' in 'btd,dh->bth'\) has size 5.*size 4"
    ):
        layer(jnp.ones((2, 3, 5)))
    with pytest.raises(ValueError, match=r"bias_shape=\(6,\) does not fit einsum_str 'btd,dh->bt'"):
        layer(jnp.ones((2, 3, 4)), einsum_str="btd,dh->bt")
    ellipsis = Einsum("...d,dh->...h", (4, 6), rngs=0)
    with pytest.raises(ValueError, match=r"input's axis 1 \('d'"):
        ellipsis(jnp.ones((2, 5)))
    with pytest.raises(ValueError, match=r"at least 1 input axes"):
        ellipsis(jnp.ones(()))
    layer.kernel.value = jnp.ones((4, 5))
    with pytest.raises(
        ValueError, match=r"Einsum.kernel has shape \(4, 5\).*kernel_shape=\(4, 6\)"
    ):
        layer(jnp.ones((2, 3, 4)))


class TiedHeads(Module):
    """One Einsum used twice: as the projection in and, transposed, as the projection out."""

    def __init__(self, rngs):
        self.project = Einsum("bd,dh->bh", (4, 3), rngs=rngs)
        self.again = self.project

    def __call__(self, x):
        hidden = jnp.tanh(self.project(x))
        return self.again(hidden, einsum_str="bh,dh->bd")


def test_a_shared_einsum_stays_one_through_split_merge_jit_and_the_optimizer():
    model = TiedHeads(Rngs(0))
    x = fixed(2, (5, 4))
    graph, state = pg.split(model)
    assert len(jax.tree.leaves(state)) == 1
    merged = pg.merge(graph, state)
    assert merged.again is merged.project

    optimizer = Optimizer(model, optax.sgd(0.1), wrt=Param)

    @pg.jit
    def step(model, optimizer, x):
        loss, grads = pg.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    kernel = model.project.kernel.value

    def loss(k):
        return jnp.mean((jnp.tanh(x @ k) @ k.T - x) ** 2)

    expected = kernel - 0.1 * jax.grad(loss)(kernel)
    step(model, optimizer, x)
    assert model.again is model.project
    close(model.project.kernel.value, expected)
    step(model, optimizer, x)
    assert model.again.kernel is model.project.kernel


# ------------------------------------------------------------------------------ LinearGeneral


@pytest.mark.parametrize(
    ("in_features", "out_features", "kwargs", "x_shape", "contract", "bias_broadcast"),
    [
        (3, 4, {}, (2, 5, 3), ((2,), (0,)), (1, 1, 4)),
        (3, (4, 5), {}, (2, 3), ((1,), (0,)), (1, 4, 5)),
        ((2, 3), (4, 5), {"axis": (1, -1)}, (6, 2, 3), ((1, 2), (0, 1)), (1, 4, 5)),
        ((2, 3), 4, {"axis": (-2, -1)}, (6, 7, 2, 3), ((2, 3), (0, 1)), (1, 1, 4)),
        (5, 4, {"axis": 0}, (5, 6, 2), ((0,), (0,)), (1, 1, 4)),
    ],
)
def test_linear_general_matches_lax_dot_general(
    in_features, out_features, kwargs, x_shape, contract, bias_broadcast
):
    layer = set_weights(LinearGeneral(in_features, out_features, **kwargs, rngs=0))
    x = fixed(9, x_shape)
    expected = jax.lax.dot_general(x, layer.kernel.value, (contract, ((), ())))
    expected = expected + layer.bias.value.reshape(bias_broadcast)
    close(layer(x), expected)


def test_linear_general_pairs_in_features_with_the_axes_in_increasing_order():
    layer = set_weights(LinearGeneral((2, 3), 4, axis=(-1, 1), rngs=0))
    assert layer.axis == (-1, 1)
    x = fixed(9, (6, 2, 3))
    expected = jnp.einsum("nab,abo->no", x, layer.kernel.value) + layer.bias.value
    close(layer(x), expected)


def test_linear_general_batch_axis_gives_a_kernel_per_entry():
    layer = set_weights(LinearGeneral(3, (4, 2), batch_axis={0: 5}, rngs=0))
    assert layer.kernel.value.shape == (5, 3, 4, 2)
    assert layer.bias.value.shape == (5, 4, 2)
    x = fixed(4, (5, 7, 3))
    expected = jnp.einsum("btd,bdoh->btoh", x, layer.kernel.value)
    expected = expected + layer.bias.value[:, None]
    close(layer(x), expected)
    two = set_weights(LinearGeneral((3,), 2, axis=-1, batch_axis={1: 4, 0: 2}, rngs=0))
    assert two.batch_axis == {0: 2, 1: 4}
    x = fixed(5, (2, 4, 6, 3))
    expected = jnp.einsum("abtd,abdo->abto", x, two.kernel.value) + two.bias.value[:, :, None]
    close(two(x), expected)


def test_linear_general_is_linear_for_ints():
    general = set_weights(LinearGeneral(3, 4, rngs=0))
    x = fixed(1, (2, 3))
    close(general(x), x @ general.kernel.value + general.bias.value)
    assert LinearGeneral(3, 4, use_bias=False, rngs=0).bias is None


def test_linear_general_draws_the_kernel_flat_as_nnx_does():
    """The kernel is the initializer's draw on (all inputs, all outputs), reshaped: its fans
    are the total sizes (here 2 * 3 = 6 in, 4 * 5 = 20 out)."""
    init = initializers.variance_scaling(1.0, "fan_avg", "uniform")
    layer = LinearGeneral(
        (2, 3),
        (4, 5),
        axis=(-2, -1),
        kernel_init=init,
        bias_init=initializers.normal(1.0),
        rngs=Rngs(3),
    )
    rngs = Rngs(3)
    kernel = init(rngs.params(), (6, 20), jnp.float32).reshape(2, 3, 4, 5)
    bias = initializers.normal(1.0)(rngs.params(), (20,), jnp.float32).reshape(4, 5)
    np.testing.assert_array_equal(layer.kernel.value, kernel)
    np.testing.assert_array_equal(layer.bias.value, bias)
    # Uniform on [-limit, limit] with limit = sqrt(3 / fan_avg), fan_avg = (6 + 20) / 2.
    assert float(jnp.max(jnp.abs(layer.kernel.value))) <= math.sqrt(3 / 13)
    batched = LinearGeneral(3, 2, batch_axis={0: 4}, kernel_init=init, rngs=Rngs(3))
    flat = init(Rngs(3).params(), (12, 2), jnp.float32).reshape(4, 3, 2)
    np.testing.assert_array_equal(batched.kernel.value, flat)


def test_linear_general_shardings_and_dtypes():
    layer = LinearGeneral(
        (2, 3),
        4,
        axis=(-2, -1),
        kernel_sharding=(None, None, "model"),
        bias_sharding=("model",),
        param_dtype=jnp.bfloat16,
        rngs=0,
    )
    assert layer.kernel.sharding == (None, None, "model")
    assert layer.bias.sharding == ("model",)
    assert layer.kernel.value.dtype == jnp.bfloat16
    assert layer(jnp.ones((1, 2, 3), jnp.bfloat16)).dtype == jnp.bfloat16
    assert layer(jnp.ones((1, 2, 3))).dtype == jnp.float32


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0, 4), {}, ValueError, r"in_features must be an int or a non-empty tuple of ints >= 1"),
        ((3, ()), {}, ValueError, r"out_features must be an int or a non-empty tuple"),
        ((3, 4.0), {}, ValueError, r"out_features must be"),
        (
            ((2, 3), 4),
            {},
            ValueError,
            r"axis=\(-1,\) names 1 axes but in_features=\(2, 3\) gives 2",
        ),
        (((2, 3), 4), {"axis": (1, 1)}, ValueError, r"names an axis twice"),
        ((3, 4), {"batch_axis": {1: 2}}, ValueError, r"batch axes must be the leading ones"),
        ((3, 4), {"batch_axis": [0]}, TypeError, r"batch_axis must be a mapping"),
        ((3, 4), {"batch_axis": {0: 0}}, ValueError, r"sizes must be positive"),
        (
            (3, 4),
            {"axis": 0, "batch_axis": {0: 2}},
            ValueError,
            r"both contracted.*and a batch axis",
        ),
        ((3, 4), {"use_bias": 1}, TypeError, r"use_bias must be True or False"),
        ((3, 4), {"kernel_sharding": ("m",)}, ValueError, r"kernel_sharding has 1 entries"),
        ((3, 4), {"preferred_element_type": "wide"}, TypeError, r"preferred_element_type"),
    ],
)
def test_linear_general_construction_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        LinearGeneral(*args, **kwargs, rngs=0)


def test_linear_general_call_errors_name_the_axes_and_sizes():
    layer = LinearGeneral((2, 3), 4, axis=(1, -1), rngs=0)
    with pytest.raises(ValueError, match=r"axes \(1, 2\).*sizes in_features=\(2, 3\).*\(3, 2\)"):
        layer(jnp.ones((5, 3, 2)))
    with pytest.raises(ValueError, match=r"does not fit an input of shape \(3,\)"):
        layer(jnp.ones((3,)))
    with pytest.raises(ValueError, match=r"repeat an axis"):
        layer(jnp.ones((2, 3)))
    batched = LinearGeneral(3, 4, batch_axis={0: 2}, rngs=0)
    with pytest.raises(ValueError, match=r"batch axis 0 has size 2"):
        batched(jnp.ones((5, 3)))
    layer.kernel.value = jnp.ones((2, 3, 5))
    with pytest.raises(ValueError, match=r"LinearGeneral.kernel has shape \(2, 3, 5\)"):
        layer(jnp.ones((5, 2, 3)))
