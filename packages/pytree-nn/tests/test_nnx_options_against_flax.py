"""Side by side with Flax NNX 0.12: normalization `mask=`, convolutions with
`strides=None`, a one-vector `Embedding` and `'...'` in an `Einsum` kernel's subscripts:
the same weights in, the same numbers out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")

import pytree_nn as pnn  # noqa: E402


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.parametrize(
    "name, args, kwargs",
    [
        ("LayerNorm", (6,), {}),
        ("RMSNorm", (6,), {}),
        ("GroupNorm", (6,), {"num_groups": 3}),
        ("InstanceNorm", (6,), {}),
        ("BatchNorm", (6,), {"use_running_average": False}),
    ],
)
@pytest.mark.parametrize("fast", [True, False])
def test_norm_mask_matches_nnx(name, args, kwargs, fast):
    x = normal(0, (10, 6)) * 2 + 0.5
    theirs = getattr(nnx, name)(*args, **kwargs, use_fast_variance=fast, rngs=nnx.Rngs(0))
    ours = getattr(pnn, name)(*args, **kwargs, use_fast_variance=fast, rngs=0)
    for mask in (None, np.array([True, False, True, True, False, True]), normal(1, (10, 6)) > 0):
        np.testing.assert_allclose(ours(x, mask=mask), theirs(x, mask=mask), rtol=1e-5, atol=1e-5)
    if name == "BatchNorm":
        np.testing.assert_allclose(ours.mean.value, theirs.mean[...], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours.var.value, theirs.var[...], rtol=1e-5, atol=1e-6)


def test_conv_strides_none_matches_nnx():
    x = normal(0, (2, 12, 9, 3))
    for cls in ("Conv", "ConvTranspose"):
        theirs = getattr(nnx, cls)(3, 6, (3, 2), None, rngs=nnx.Rngs(0))
        ours = getattr(pnn, cls)(3, 6, (3, 2), None, rngs=0)
        ours.kernel.value = jnp.asarray(theirs.kernel[...])
        np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_one_vector_embedding_matches_nnx():
    theirs = nnx.Embed(1, 5, rngs=nnx.Rngs(0))
    ours = pnn.Embedding(1, 5, rngs=0)
    ours.embedding.value = jnp.asarray(theirs.embedding[...])
    idx = jnp.array([0, 10, 3], jnp.int16)
    np.testing.assert_array_equal(ours(idx), theirs(idx))


@pytest.mark.parametrize("bias_shape", [None, (6, 7, 5)])
def test_einsum_kernel_ellipsis_matches_nnx(bias_shape):
    x = normal(0, (8, 6, 7, 3, 4))
    theirs = nnx.Einsum("d...ab,bc...->ad...c", (4, 5, 6, 7), bias_shape, rngs=nnx.Rngs(0))
    ours = pnn.Einsum("d...ab,bc...->ad...c", (4, 5, 6, 7), bias_shape, rngs=0)
    ours.kernel.value = jnp.asarray(theirs.kernel[...])
    if bias_shape:
        theirs.bias[...] = normal(1, bias_shape)
        ours.bias.value = jnp.asarray(theirs.bias[...])
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_einsum_and_linear_general_metadata_as_nnx():
    for make in (
        lambda m, **k: m.Einsum("ik,kj->ij", (5, 4), (4,), **k),
        lambda m, **k: m.LinearGeneral(5, (2, 2), **k),
    ):
        theirs = make(
            nnx, kernel_metadata={"tag": "k"}, bias_metadata={"tag": "b"}, rngs=nnx.Rngs(0)
        )
        ours = make(pnn, kernel_metadata={"tag": "k"}, bias_metadata={"tag": "b"}, rngs=0)
        assert (ours.kernel.tag, ours.bias.tag) == (theirs.kernel.tag, theirs.bias.tag)
        np.testing.assert_array_equal(ours.kernel.value, theirs.kernel[...])


def test_multi_head_attention_metadata_as_nnx():
    names = (
        "kernel_metadata",
        "bias_metadata",
        "out_kernel_metadata",
        "out_bias_metadata",
        "query_ln_scale_metadata",
        "key_ln_scale_metadata",
    )
    kwargs = {name: {"tag": name} for name in names}
    theirs = nnx.MultiHeadAttention(2, 4, normalize_qk=True, **kwargs, rngs=nnx.Rngs(0))
    ours = pnn.MultiHeadAttention(2, 4, normalize_qk=True, **kwargs, rngs=0)
    for path in (
        "query.kernel",
        "key.bias",
        "value.kernel",
        "out.kernel",
        "out.bias",
        "query_ln.scale",
        "key_ln.scale",
    ):
        a, b = theirs, ours
        for part in path.split("."):
            a, b = getattr(a, part), getattr(b, part)
        assert a.tag == b.tag


def test_dot_product_attention_module_weights_as_nnx():
    q, k, v = normal(0, (2, 8, 4, 16)), normal(1, (2, 8, 2, 16)), normal(2, (2, 8, 2, 16))

    class Holder(nnx.Module):
        pass

    theirs, ours = Holder(), pnn.Module()
    out_theirs = nnx.dot_product_attention(q, k, v, module=theirs)
    out_ours = pnn.dot_product_attention(q, k, v, module=ours)
    np.testing.assert_allclose(out_ours, out_theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        ours.attention_weights.value[0],
        theirs.attention_weights.get_value()[0],
        rtol=1e-5,
        atol=1e-6,
    )


def test_multi_head_attention_sow_weights_as_nnx():
    theirs = nnx.MultiHeadAttention(2, 4, decode=False, rngs=nnx.Rngs(0))
    ours = pnn.MultiHeadAttention(2, 4, rngs=0)
    for name in ("query", "key", "value", "out"):
        getattr(ours, name).kernel.value = jnp.asarray(getattr(theirs, name).kernel[...])
    x = normal(0, (3, 5, 4))
    np.testing.assert_allclose(
        ours(x, sow_weights=True), theirs(x, sow_weights=True), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        ours.attention_weights.value[0],
        theirs.attention_weights.get_value()[0],
        rtol=1e-5,
        atol=1e-6,
    )
