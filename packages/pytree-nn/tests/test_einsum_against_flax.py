"""`Einsum`, `LinearGeneral` and `preferred_element_type=` against Flax NNX 0.12.

Runs in the bench environment only (`hatch run bench:crosscheck`, which has flax); elsewhere
the module is skipped. Each test builds NNX's layer and ours with the same arguments and
seed, checks that the initial parameters are the same numbers (both draw the same keys in
the same order), copies NNX's weights into ours after giving them fixed random values (so no
bias is zero), and compares outputs, output dtypes and gradients on the same inputs.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
import pytree_nn as pnn

nnx = pytest.importorskip("flax.nnx")

BF16 = jnp.bfloat16
F32 = jnp.float32


def fixed(seed, shape, dtype=F32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def same_params_then_copy(ours, theirs):
    """Assert that the two layers were initialised alike, then give both the same fixed
    weights."""
    np.testing.assert_array_equal(np.asarray(ours.kernel.value), np.asarray(theirs.kernel[...]))
    assert (ours.bias is None) == (theirs.bias is None)
    if ours.bias is not None:
        np.testing.assert_array_equal(np.asarray(ours.bias.value), np.asarray(theirs.bias[...]))
    for seed, name in enumerate(("kernel", "bias")):
        if getattr(ours, name) is None:
            continue
        value = getattr(theirs, name)[...]
        new = fixed(seed + 10, value.shape, value.dtype)
        getattr(theirs, name)[...] = new
        getattr(ours, name).value = new


def assert_same(ours, theirs, rtol=1e-6, atol=1e-6):
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(
        np.asarray(ours, np.float32), np.asarray(theirs, np.float32), rtol=rtol, atol=atol
    )


def gradients(ours, theirs, x, **call):
    """Gradients of a scalar loss with respect to the kernel and bias, on both sides."""

    def our_loss(model):
        return jnp.sum(jnp.sin(model(x, **call)))

    def their_loss(model):
        return jnp.sum(jnp.sin(model(x, **call)))

    our_grads = pg.grad(our_loss)(ours)
    their_grads = nnx.grad(their_loss)(theirs)
    for name in ("kernel", "bias"):
        if getattr(ours, name) is None:
            continue
        np.testing.assert_allclose(
            np.asarray(getattr(our_grads, name).value),
            np.asarray(getattr(their_grads, name)[...]),
            rtol=1e-5,
            atol=1e-5,
        )


EINSUMS = [
    ("nta,hab->nthb", (8, 2, 4), (8, 4), (3, 5, 2)),
    ("btd,dnh->btnh", (6, 2, 3), (2, 3), (2, 4, 6)),
    ("btd,dnh->bnth", (6, 2, 3), (2, 3), (2, 4, 6)),
    ("...d,dh->...h", (6, 5), (5,), (2, 3, 6)),
    ("bd,dnh->bnh", (6, 2, 3), (6,), (4, 6)),
    ("b d , d h -> b h", (6, 5), None, (4, 6)),
]


@pytest.mark.parametrize(("equation", "kernel_shape", "bias_shape", "x_shape"), EINSUMS)
def test_einsum_same_init_outputs_and_gradients(equation, kernel_shape, bias_shape, x_shape):
    kwargs = {"bias_init": nnx.initializers.normal(1.0)}
    theirs = nnx.Einsum(equation, kernel_shape, bias_shape, **kwargs, rngs=nnx.Rngs(3))
    ours = pnn.Einsum(equation, kernel_shape, bias_shape, **kwargs, rngs=pnn.Rngs(3))
    assert ours.einsum_str == theirs.einsum_str
    same_params_then_copy(ours, theirs)
    x = fixed(1, x_shape)
    assert_same(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    gradients(ours, theirs, x)


def test_einsum_string_given_at_call():
    theirs = nnx.Einsum("bd,dh->bh", (6, 5), (5,), rngs=nnx.Rngs(0))
    ours = pnn.Einsum("bd,dh->bh", (6, 5), (5,), rngs=pnn.Rngs(0))
    same_params_then_copy(ours, theirs)
    x = fixed(1, (4, 6))
    assert_same(ours(x, "bd,dh->hb"), theirs(x, "bd,dh->hb"), rtol=1e-5, atol=1e-5)
    gradients(ours, theirs, x, einsum_str="bd,dh->hb")


@pytest.mark.parametrize("equation", ["bd,dh", "bd,dh,hk->bk", "bd->bh"])
def test_einsum_bad_strings_raise_value_error_on_both(equation):
    with pytest.raises(ValueError):
        nnx.Einsum(equation, (6, 5), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=equation):
        pnn.Einsum(equation, (6, 5), rngs=0)


LINEAR_GENERALS = [
    (3, 4, {}, (2, 5, 3)),
    (3, (4, 5), {}, (2, 3)),
    ((2, 3), (4, 5), {"axis": (1, -1)}, (6, 2, 3)),
    ((2, 3), (4, 5), {"axis": (-1, 1)}, (6, 2, 3)),
    ((2, 3), 4, {"axis": (-2, -1)}, (6, 7, 2, 3)),
    (5, 4, {"axis": 0}, (5, 6, 2)),
    (3, (4, 2), {"batch_axis": {0: 5}}, (5, 7, 3)),
    ((3,), 2, {"batch_axis": {0: 2, 1: 4}}, (2, 4, 6, 3)),
    (3, 4, {"use_bias": False}, (2, 3)),
]


@pytest.mark.parametrize(("in_features", "out_features", "kwargs", "x_shape"), LINEAR_GENERALS)
def test_linear_general_same_init_outputs_and_gradients(in_features, out_features, kwargs, x_shape):
    options = {"bias_init": nnx.initializers.normal(1.0), **kwargs}
    theirs = nnx.LinearGeneral(in_features, out_features, **options, rngs=nnx.Rngs(4))
    ours = pnn.LinearGeneral(in_features, out_features, **options, rngs=pnn.Rngs(4))
    same_params_then_copy(ours, theirs)
    x = fixed(1, x_shape)
    assert_same(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    gradients(ours, theirs, x)


@pytest.mark.parametrize(
    "init",
    [
        nnx.initializers.lecun_normal(),
        nnx.initializers.variance_scaling(2.0, "fan_avg", "uniform"),
        nnx.initializers.orthogonal(),
    ],
    ids=["lecun_normal", "fan_avg_uniform", "orthogonal"],
)
def test_linear_general_draws_the_same_kernel_as_nnx(init):
    theirs = nnx.LinearGeneral((2, 3), (4, 5), axis=(-2, -1), kernel_init=init, rngs=nnx.Rngs(8))
    ours = pnn.LinearGeneral((2, 3), (4, 5), axis=(-2, -1), kernel_init=init, rngs=pnn.Rngs(8))
    np.testing.assert_array_equal(np.asarray(ours.kernel.value), np.asarray(theirs.kernel[...]))


# ------------------------------------------------------------------ preferred_element_type


def layers(kind, preferred, **kwargs):
    """The same layer from both libraries, and an input for it."""
    common = {"preferred_element_type": preferred, **kwargs}
    if kind == "Linear":
        args, x = (16, 8), (3, 16)
    elif kind == "Conv":
        args, x = (4, 8, (3, 3)), (2, 5, 5, 4)
    elif kind == "ConvTranspose":
        args, x = (4, 8, (3, 3)), (2, 5, 5, 4)
        common["strides"] = 2
    elif kind == "Einsum":
        args, x = ("btd,dnh->btnh", (16, 2, 4), (2, 4)), (2, 3, 16)
    else:
        args, x = ((4, 4), (2, 3)), (3, 4, 4)
        common["axis"] = (-2, -1)
    if kind == "Einsum" and common.pop("use_bias", True) is False:
        args = args[:2]
    theirs = getattr(nnx, kind)(*args, **common, rngs=nnx.Rngs(0))
    ours = getattr(pnn, kind)(*args, **common, rngs=pnn.Rngs(0))
    return ours, theirs, x


KINDS = ["Linear", "Conv", "ConvTranspose", "Einsum", "LinearGeneral"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("preferred", "options", "x_dtype"),
    [
        (F32, {"param_dtype": BF16}, BF16),
        (F32, {"param_dtype": BF16, "use_bias": False}, BF16),
        (F32, {"dtype": BF16}, F32),
        (F32, {}, BF16),
        (BF16, {}, F32),
        (BF16, {"use_bias": False}, F32),
    ],
    ids=["bf16-params", "bf16-no-bias", "bf16-compute", "promoted", "narrower", "narrower-no-bias"],
)
def test_preferred_element_type_same_numbers_and_dtype(kind, preferred, options, x_dtype):
    if preferred == BF16 and kind in ("Conv", "ConvTranspose"):
        pytest.skip("lax's convolutions refuse a preferred_element_type narrower than the inputs")
    ours, theirs, x_shape = layers(kind, preferred, **options)
    same_params_then_copy(ours, theirs)
    x = fixed(2, x_shape, x_dtype)
    exact = preferred == F32
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if exact else {"rtol": 1e-2, "atol": 1e-2}
    assert_same(ours(x), theirs(x), **tolerance)
