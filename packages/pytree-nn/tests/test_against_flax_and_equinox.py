"""Every layer of pytree_nn against Flax NNX and Equinox, with the same weights and inputs.

This module runs in the bench environment only (`hatch run bench:crosscheck`), which has
flax and equinox; the project's test environment has neither, and there the whole module
is skipped. Each test builds one of our layers and the reference library's with the same
arguments, gives both one set of random weights (drawn from a fixed seed rather than the
initializers, so that no bias is all zeros and no scale all ones), runs both on the same
random inputs and compares the results to float32 precision.

Equinox layers are channels-first and unbatched, and keep their weights as `(out, in)`
matrices and OIHW kernels: the helpers below transpose weights and inputs, and `vmap`
Equinox over the batch. Where a reference library computes something else by design
(another padding convention, an option it lacks), the case is skipped with the difference
named in its reason; where ours is the one that differs, the case is an expected failure
that documents it.
"""

import inspect
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
import pytree_nn as pnn
from pytree_graph import Param

nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")

# float32 throughout: both sides run the same algorithm, so only rounding differs.
RTOL = 1e-5
ATOL = 1e-5

Path = tuple[Any, ...]


# -------------------------------------------------------------------------------- helpers


def assert_close(
    actual: Any, expected: Any, rtol: float = RTOL, atol: float = ATOL, err_msg: str = ""
) -> None:
    """Compare two pytrees of arrays leaf by leaf (shapes must match, and NaNs)."""
    actual_leaves, actual_def = jax.tree.flatten(actual)
    expected_leaves, expected_def = jax.tree.flatten(expected)
    assert actual_def == expected_def, f"{err_msg}: {actual_def} != {expected_def}"
    for a, e in zip(actual_leaves, expected_leaves, strict=True):
        assert np.shape(a) == np.shape(e), f"{err_msg}: shapes {np.shape(a)} != {np.shape(e)}"
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(e), rtol=rtol, atol=atol, err_msg=err_msg
        )


def compare(
    ours: Callable[..., Any],
    theirs: Callable[..., Any],
    *args: Any,
    rtol: float = RTOL,
    atol: float = ATOL,
    **kwargs: Any,
) -> None:
    """Assert that `ours(*args, **kwargs)` and `theirs(*args, **kwargs)` agree.

    Both run in one compiled program: run op by op, every small operation of every case
    would be compiled on its own, and that would dominate the run time.
    """
    outputs = jax.jit(lambda *a: (ours(*a, **kwargs), theirs(*a, **kwargs)))(*args)
    assert_close(*outputs, rtol=rtol, atol=atol)


def normal(seed: int, shape: Sequence[int], scale: float = 1.0, offset: float = 0.0) -> jax.Array:
    """Fixed random float32 values (drawn by NumPy: nothing to compile per shape)."""
    values = np.random.default_rng(seed).standard_normal(tuple(shape))
    return jnp.asarray(offset + scale * values, jnp.float32)


def bernoulli(seed: int, p: float, shape: Sequence[int]) -> jax.Array:
    """A fixed random boolean array, True with probability `p`."""
    return jnp.asarray(np.random.default_rng(seed).random(tuple(shape)) < p)


def walk(node: Any, path: Path) -> Any:
    """The attribute (or list entry) of `node` at a graph path such as `("layers", 0, "kernel")`."""
    for key in path:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return node


def walk_state(state: Any, path: Path) -> Any:
    """The leaf of a nested State (ours or NNX's) at `path`."""
    for key in path:
        state = state[key]
    return state


def randomize(layer: Any) -> dict[Path, jax.Array]:
    """Give every Param of our `layer` random normal values; return them by path."""
    rng = np.random.default_rng(1000)
    weights = {}
    for path in sorted(pg.state(layer, Param).flat_state(), key=str):
        variable = walk(layer, path)
        value = 0.5 * rng.standard_normal(variable.value.shape)
        variable.value = jnp.asarray(value, variable.value.dtype)
        weights[path] = variable.value
    return weights


def copy_to_nnx(weights: dict[Path, jax.Array], module: Any) -> None:
    """Write our weights into the NNX module's Variables of the same paths."""
    for path, value in weights.items():
        variable = walk(module, path)
        assert variable.shape == value.shape, (path, variable.shape, value.shape)
        variable[...] = value


def no_init(*classes: Any) -> dict[str, Any]:
    """Zeros for every initializer argument the layer classes share.

    The weights are overwritten before use; the default random initializers would only
    cost time, compiling once per parameter shape.
    """
    names = [
        {name for name in inspect.signature(cls.__init__).parameters if name.endswith("_init")}
        for cls in classes
    ]
    return dict.fromkeys(set.intersection(*names), jax.nn.initializers.zeros)


def filled(module: Any) -> Any:
    """`module`, after checking that every array of a shell was given a value."""
    shapes = [leaf for leaf in jax.tree.leaves(module) if isinstance(leaf, jax.ShapeDtypeStruct)]
    assert not shapes, f"arrays left unset: {shapes}"
    return module


def our_layer(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """Our layer, built as shapes only (no initializer runs), then given random weights."""
    layer = pg.eval_shape(lambda: cls(*args, **kwargs, rngs=0))
    randomize(layer)
    return filled(layer)


def nnx_pair(ours_cls: Any, nnx_cls: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Our layer and NNX's, built with the same arguments and holding the same weights."""
    kwargs = no_init(ours_cls, nnx_cls) | kwargs
    ours = ours_cls(*args, **kwargs, rngs=pnn.Rngs(0))
    theirs = nnx_cls(*args, **kwargs, rngs=nnx.Rngs(0))
    copy_to_nnx(randomize(ours), theirs)
    return ours, theirs


def eqx_shell(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """An Equinox layer whose arrays are only shapes, for `set_eqx` to fill in."""
    if "key" in inspect.signature(cls.__init__).parameters:
        kwargs["key"] = jax.random.key(0)
    return eqx.filter_eval_shape(cls, *args, **kwargs)


def set_eqx(module: Any, **values: Any) -> Any:
    """`module` with the named attributes replaced (arrays checked against their shapes)."""
    for name, value in values.items():
        current = getattr(module, name)
        if not isinstance(current, eqx.Module):
            assert current is not None and current.shape == value.shape, (name, value.shape)
    names = list(values)
    return eqx.tree_at(lambda m: [getattr(m, n) for n in names], module, [values[n] for n in names])


def eqx_linear(module: Any, linear: pnn.Linear) -> Any:
    """An Equinox Linear holding our Linear's weights: `(out, in)`, the transpose of ours."""
    values = {"weight": linear.kernel.value.T}
    if linear.bias is not None:
        values["bias"] = linear.bias.value
    return set_eqx(module, **values)


def over_batch(fn: Callable[..., Any], batch_ndim: int) -> Callable[..., Any]:
    """`fn` mapped over `batch_ndim` leading axes of every argument."""
    for _ in range(batch_ndim):
        fn = jax.vmap(fn)
    return fn


def channels_first(fn: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """A function of a channels-first example as one of a channels-last example."""
    return lambda x: jnp.moveaxis(fn(jnp.moveaxis(x, -1, 0)), 0, -1)


def oihw(kernel: jax.Array) -> jax.Array:
    """A channels-last kernel `(*spatial, in, out)` in Equinox's layout `(out, in, *spatial)`."""
    rank = kernel.ndim - 2
    return jnp.transpose(kernel, (rank + 1, rank, *range(rank)))


# ============================================================================ Flax NNX

# ---------------------------------------------------------------------------- Linear


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_linear_nnx(use_bias, batch):
    ours, theirs = nnx_pair(pnn.Linear, nnx.Linear, 5, 3, use_bias=use_bias)
    compare(ours, theirs, normal(1, (*batch, 5)))


# ------------------------------------------------------------------------------ Conv

_IN, _OUT = 4, 6


def _with_mask(kernel_size: tuple[int, ...], kwargs: dict) -> dict:
    """The case's keyword arguments, with `mask=True` replaced by a fixed 0/1 mask."""
    kwargs = dict(kwargs)
    if kwargs.get("mask") is True:
        groups = kwargs.get("feature_group_count", 1)
        features = (_OUT, _IN) if kwargs.get("transpose_kernel") else (_IN // groups, _OUT)
        kwargs["mask"] = bernoulli(7, 0.6, (*kernel_size, *features)).astype(jnp.float32)
    return kwargs


NNX_CONV_CASES = [
    # (kernel_size, spatial input shape, keyword arguments)
    ((3,), (9,), {}),
    ((3,), (9,), dict(strides=2)),
    ((4,), (9,), dict(strides=2, padding="VALID")),
    ((3,), (9,), dict(padding="CIRCULAR")),
    ((4,), (10,), dict(strides=3, padding="CIRCULAR")),
    ((3,), (9,), dict(padding="CAUSAL")),
    ((3,), (9,), dict(strides=2, padding="CAUSAL", kernel_dilation=2)),
    ((3,), (9,), dict(padding="REFLECT")),
    ((4,), (9,), dict(padding="REFLECT", kernel_dilation=2)),
    ((3,), (9,), dict(padding=((2, 1),))),
    ((3,), (9,), dict(padding=1)),
    ((3,), (6,), dict(padding=((2, 2),), input_dilation=2)),
    ((3, 3), (7, 6), {}),
    ((3, 2), (7, 6), dict(strides=(2, 1))),
    ((3, 3), (7, 6), dict(strides=2, padding="VALID")),
    ((3, 3), (7, 6), dict(strides=2, padding="CIRCULAR")),
    ((2, 4), (7, 6), dict(padding="CIRCULAR", kernel_dilation=(2, 1))),
    ((3, 3), (7, 6), dict(padding="REFLECT")),
    ((3, 3), (7, 6), dict(padding=((1, 0), (2, 1)))),
    ((3, 3), (7, 6), dict(kernel_dilation=(2, 1))),
    ((3, 3), (7, 6), dict(strides=2, kernel_dilation=2, padding="VALID")),
    ((3, 3), (5, 4), dict(padding=((2, 2), (1, 1)), input_dilation=2)),
    ((3, 2), (5, 4), dict(strides=2, padding=((0, 1), (1, 0)), input_dilation=(2, 3))),
    ((3, 3), (7, 6), dict(feature_group_count=2)),
    ((3, 3), (7, 6), dict(strides=2, feature_group_count=2, padding="VALID")),
    ((3, 3), (7, 6), dict(use_bias=False)),
    ((3, 3), (7, 6), dict(mask=True)),
    ((3, 3), (7, 6), dict(feature_group_count=2, mask=True)),
    ((2, 3, 2), (5, 4, 5), {}),
    ((2, 3, 2), (5, 4, 5), dict(strides=(1, 2, 2), padding="VALID")),
    ((3, 3, 3), (4, 5, 4), dict(padding="CIRCULAR")),
    ((2, 2, 2), (5, 4, 5), dict(padding="REFLECT", kernel_dilation=2)),
    ((2, 2, 2), (5, 4, 5), dict(padding=1, input_dilation=(1, 2, 1), use_bias=False)),
    pytest.param(
        (3,),
        (6,),
        dict(padding="VALID", input_dilation=2),
        marks=pytest.mark.skip(
            reason="NNX's Conv passes padding='VALID' with input_dilation to "
            "lax.conv_general_dilated, which raises; ours pads explicitly with zeros"
        ),
    ),
]


@pytest.mark.parametrize(("kernel_size", "spatial", "kwargs"), NNX_CONV_CASES, ids=str)
def test_conv_nnx(kernel_size, spatial, kwargs):
    kwargs = _with_mask(kernel_size, kwargs)
    ours, theirs = nnx_pair(pnn.Conv, nnx.Conv, _IN, _OUT, kernel_size, **kwargs)
    compare(ours, theirs, normal(1, (2, *spatial, _IN)))


@pytest.mark.parametrize("batch", [(), (2, 3)])
def test_conv_batch_dims_nnx(batch):
    ours, theirs = nnx_pair(pnn.Conv, nnx.Conv, _IN, _OUT, (3, 3), strides=2)
    compare(ours, theirs, normal(1, (*batch, 7, 6, _IN)))


# --------------------------------------------------------------------- ConvTranspose

_NNX_NOT_THE_TRANSPOSE = pytest.mark.skip(
    reason="for these sizes NNX's CIRCULAR ConvTranspose with transpose_kernel is one position "
    "off the transpose of its circular Conv; ours is that transpose, as "
    "test_circular_conv_transpose_is_the_transpose_of_nnx_conv checks"
)

NNX_CONV_TRANSPOSE_CASES = [
    ((3,), (6,), {}),
    ((3,), (6,), dict(strides=2)),
    ((4,), (6,), dict(strides=2, padding="VALID")),
    ((2,), (6,), dict(strides=3, padding="VALID")),
    ((3,), (6,), dict(padding="CIRCULAR")),
    ((4,), (6,), dict(strides=2, padding="CIRCULAR")),
    ((4,), (6,), dict(strides=2, padding="CIRCULAR", transpose_kernel=True)),
    ((3,), (6,), dict(strides=2, padding=((2, 1),))),
    ((3,), (6,), dict(strides=2, padding=1)),
    ((3,), (6,), dict(strides=2, kernel_dilation=2)),
    ((3, 3), (5, 4), dict(strides=2)),
    ((3, 3), (5, 4), dict(strides=(2, 1), transpose_kernel=True)),
    ((4, 3), (5, 4), dict(strides=2, padding="VALID", transpose_kernel=True)),
    ((3, 3), (5, 4), dict(strides=2, padding="CIRCULAR", transpose_kernel=True)),
    ((4, 2), (5, 4), dict(strides=(2, 3), padding="CIRCULAR")),
    ((3, 3), (5, 4), dict(strides=2, padding=((1, 2), (0, 1)))),
    ((3, 3), (5, 4), dict(strides=2, kernel_dilation=(1, 2), padding="VALID")),
    ((3, 3), (5, 4), dict(use_bias=False)),
    ((3, 3), (5, 4), dict(strides=2, mask=True)),
    ((3, 3), (5, 4), dict(mask=True, transpose_kernel=True)),
    ((2, 2, 2), (3, 4, 3), dict(strides=2)),
    ((3, 2, 2), (3, 4, 3), dict(strides=(1, 2, 2), padding="CIRCULAR", transpose_kernel=True)),
    ((2, 3, 2), (3, 4, 3), dict(strides=2, padding="VALID", kernel_dilation=(1, 1, 2))),
    ((3,), (6,), dict(strides=2, padding="CIRCULAR")),
    ((5,), (4,), dict(strides=3, padding="CIRCULAR")),
    ((3, 3), (5, 4), dict(strides=2, padding="CIRCULAR")),
    pytest.param(
        (4,), (6,), dict(padding="CIRCULAR", transpose_kernel=True), marks=_NNX_NOT_THE_TRANSPOSE
    ),
    pytest.param(
        (3,),
        (4,),
        dict(strides=3, padding="CIRCULAR", transpose_kernel=True),
        marks=_NNX_NOT_THE_TRANSPOSE,
    ),
    pytest.param(
        (3,),
        (6,),
        dict(strides=2, padding="CAUSAL"),
        marks=pytest.mark.skip(
            reason="NNX's ConvTranspose documents padding='CAUSAL' but passes the string to "
            "lax.conv_transpose, which raises; our CAUSAL is checked against Equinox with "
            "the equivalent explicit padding"
        ),
    ),
]


@pytest.mark.parametrize(("kernel_size", "spatial", "kwargs"), NNX_CONV_TRANSPOSE_CASES, ids=str)
def test_conv_transpose_nnx(kernel_size, spatial, kwargs):
    kwargs = _with_mask(kernel_size, kwargs)
    ours, theirs = nnx_pair(pnn.ConvTranspose, nnx.ConvTranspose, _IN, _OUT, kernel_size, **kwargs)
    compare(ours, theirs, normal(1, (2, *spatial, _IN)))


@pytest.mark.parametrize(
    ("kernel_size", "strides", "kernel_dilation"),
    [((4,), 1, 1), ((3,), 3, 1), ((2,), 3, 2), ((5,), 3, 1), ((3,), 2, 2), ((4, 3), (1, 3), 1)],
    ids=str,
)
def test_circular_conv_transpose_is_the_transpose_of_nnx_conv(
    kernel_size, strides, kernel_dilation
):
    """With `transpose_kernel`, a CIRCULAR ConvTranspose is the transpose (the gradient with
    respect to its input) of NNX's circular Conv with the same kernel, plus the bias."""
    kwargs = dict(strides=strides, padding="CIRCULAR", kernel_dilation=kernel_dilation)
    ours = our_layer(pnn.ConvTranspose, _IN, _OUT, kernel_size, transpose_kernel=True, **kwargs)
    conv = nnx.Conv(
        _OUT, _IN, kernel_size, use_bias=False, **kwargs, **no_init(nnx.Conv), rngs=nnx.Rngs(0)
    )
    conv.kernel[...] = ours.kernel.value
    spatial = (4, 3)[: len(kernel_size)]
    x = normal(1, (2, *spatial, _IN))
    conv_input = jnp.zeros((2, *np.multiply(spatial, ours.strides), _OUT))

    def transpose(x: jax.Array) -> jax.Array:
        return jax.vjp(conv, conv_input)[1](x)[0] + ours.bias.value

    compare(ours, transpose, x)


# --------------------------------------------------------------------------- Pooling

POOL_CASES = [
    # (window_shape, spatial input shape, keyword arguments)
    ((2,), (9,), {}),
    ((3,), (9,), dict(strides=(2,), padding="SAME")),
    ((3,), (9,), dict(strides=(2,), padding=((1, 2),))),
    ((2, 2), (7, 6), dict(strides=(2, 2))),
    ((3, 3), (7, 6), dict(strides=(2, 1), padding="SAME")),
    ((3, 2), (7, 6), dict(padding=((1, 1), (0, 1)))),
    ((2, 2, 2), (4, 5, 4), dict(strides=(1, 2, 2), padding="SAME")),
]


@pytest.mark.parametrize("pool", ["max", "min", "avg", "avg_without_padding"])
@pytest.mark.parametrize(("window", "spatial", "kwargs"), POOL_CASES, ids=str)
def test_pooling_nnx(pool, window, spatial, kwargs):
    if pool == "avg_without_padding":
        pool, kwargs = "avg", dict(kwargs, count_include_pad=False)
    ours = partial(getattr(pnn, f"{pool}_pool"), window_shape=window, **kwargs)
    theirs = partial(getattr(nnx, f"{pool}_pool"), window_shape=window, **kwargs)
    compare(ours, theirs, normal(1, (2, *spatial, 3)))


# ------------------------------------------------------------------------- Embedding


def test_embedding_nnx():
    ours, theirs = nnx_pair(pnn.Embedding, nnx.Embed, 10, 4)
    # Negative indices count from the end; out of range gives NaN vectors in both.
    indices = jnp.array([[0, 3, 9], [-1, -10, 10]])
    compare(ours, theirs, indices)
    assert np.isnan(np.asarray(ours(indices))[1, 2]).all()
    compare(ours.attend, theirs.attend, normal(1, (2, 3, 4)))


# --------------------------------------------------------------------- Normalization

# Inputs with a mean and scale far from 0 and 1, so that centring and scaling both matter.
_NORM_SCALE, _NORM_OFFSET = 2.0, 3.0


@pytest.mark.parametrize(
    ("num_features", "shape", "kwargs"),
    [
        (6, (2, 3, 6), {}),
        (6, (2, 3, 6), dict(use_fast_variance=False, epsilon=1e-3)),
        (6, (2, 3, 6), dict(use_bias=False)),
        (6, (2, 3, 6), dict(use_scale=False, use_bias=False)),
        (6, (2, 3, 6), dict(reduction_axes=(1, 2))),
        (18, (2, 3, 6), dict(reduction_axes=(1, 2), feature_axes=(1, 2))),
        (6, (6,), {}),
    ],
    ids=str,
)
def test_layer_norm_nnx(num_features, shape, kwargs):
    ours, theirs = nnx_pair(pnn.LayerNorm, nnx.LayerNorm, num_features, **kwargs)
    compare(ours, theirs, normal(1, shape, _NORM_SCALE, _NORM_OFFSET))


@pytest.mark.parametrize(
    ("num_features", "shape", "kwargs"),
    [
        (6, (2, 3, 6), {}),
        (6, (2, 3, 6), dict(epsilon=1e-2)),
        (6, (2, 3, 6), dict(use_scale=False)),
        (6, (2, 3, 6), dict(reduction_axes=(1, 2))),
        (18, (2, 3, 6), dict(reduction_axes=(-2, -1), feature_axes=(-2, -1))),
    ],
    ids=str,
)
def test_rms_norm_nnx(num_features, shape, kwargs):
    ours, theirs = nnx_pair(pnn.RMSNorm, nnx.RMSNorm, num_features, **kwargs)
    compare(ours, theirs, normal(1, shape, _NORM_SCALE, _NORM_OFFSET))


@pytest.mark.parametrize(
    ("shape", "kwargs"),
    [
        ((2, 5, 4, 8), dict(num_groups=2)),
        ((2, 5, 4, 8), dict(num_groups=1)),
        ((2, 5, 4, 8), dict(num_groups=8)),
        ((2, 5, 4, 8), dict(num_groups=None, group_size=2)),
        ((2, 5, 4, 8), dict(num_groups=4, use_fast_variance=False, epsilon=1e-3)),
        ((2, 5, 4, 8), dict(num_groups=2, use_scale=False)),
        ((3, 8), dict(num_groups=4)),
        pytest.param(
            (2, 5, 4, 8),
            dict(num_groups=2, reduction_axes=(2, 3)),
            marks=pytest.mark.skip(
                reason="NNX's GroupNorm repeats its statistics along axis 1 as if they had "
                "shape (batch, num_groups), which scrambles them when reduction_axes leave "
                "out an axis besides the first; test_group_norm_reduction_axes_nnx checks "
                "ours another way"
            ),
        ),
    ],
    ids=str,
)
def test_group_norm_nnx(shape, kwargs):
    ours, theirs = nnx_pair(pnn.GroupNorm, nnx.GroupNorm, 8, **kwargs)
    compare(ours, theirs, normal(1, shape, _NORM_SCALE, _NORM_OFFSET))


def test_group_norm_reduction_axes_nnx():
    """Reducing over the last axes only makes the leading axes batch axes: the result is
    NNX's GroupNorm of the input with its batch axes merged into one."""
    ours, theirs = nnx_pair(pnn.GroupNorm, nnx.GroupNorm, 8, num_groups=2, reduction_axes=(2, 3))
    theirs.reduction_axes = None
    x = normal(1, (2, 5, 4, 8), _NORM_SCALE, _NORM_OFFSET)
    compare(ours, lambda x: theirs(x.reshape(10, 4, 8)).reshape(x.shape), x)


@pytest.mark.parametrize(
    ("num_features", "shape", "kwargs"),
    [
        (6, (8, 6), {}),
        (6, (4, 3, 6), dict(momentum=0.9)),
        (6, (4, 3, 6), dict(momentum=0.5, use_fast_variance=False, epsilon=1e-3)),
        (3, (4, 3, 5), dict(axis=1, momentum=0.8)),
        (6, (8, 6), dict(use_bias=False, use_scale=False)),
    ],
    ids=str,
)
def test_batch_norm_nnx(num_features, shape, kwargs):
    """Training mode (outputs, and running averages after each of two steps), then
    evaluation mode; each library's own jit writes the running averages back."""
    ours, theirs = nnx_pair(pnn.BatchNorm, nnx.BatchNorm, num_features, **kwargs)
    our_step = pg.jit(lambda model, x: model(x))
    their_step = nnx.jit(lambda model, x: model(x))
    for step in range(2):
        x = normal(1 + step, shape, _NORM_SCALE, _NORM_OFFSET + step)
        assert_close(our_step(ours, x), their_step(theirs, x))
        assert_close(ours.mean.value, theirs.mean[...])
        assert_close(ours.var.value, theirs.var[...])
    ours.eval()
    theirs.eval()
    x = normal(5, shape, _NORM_SCALE, _NORM_OFFSET)
    assert_close(our_step(ours, x), their_step(theirs, x))
    # Evaluation mode reads the running averages and leaves them as they were.
    assert_close(ours.mean.value, theirs.mean[...])
    assert_close(ours.var.value, theirs.var[...])


# --------------------------------------------------------------------------- Dropout


@pytest.mark.parametrize("broadcast_dims", [(), (1,)])
def test_dropout_nnx_draws_the_same_masks(broadcast_dims):
    """Both draw the n-th mask with the key `fold_in(key, n)` of a stream, and keep or zero
    the same elements: a layer built with `rngs=` from a stream of its own, forked from
    the Rngs' `dropout` stream (its root key is that stream's next key); a layer given
    `rngs=` at the call from the call's `dropout` stream. (A bare key given at the call
    is used as is by NNX, and seeds an Rngs in ours.)
    """
    x = normal(1, (6, 5))
    theirs_held = nnx.Dropout(0.3, broadcast_dims=broadcast_dims, rngs=nnx.Rngs(dropout=7))
    theirs_called = nnx.Dropout(0.3, broadcast_dims=broadcast_dims)
    ours_held = pnn.Dropout(0.3, broadcast_dims=broadcast_dims, rngs=pnn.Rngs(dropout=7))
    ours_called = pnn.Dropout(0.3, broadcast_dims=broadcast_dims)
    their_rngs, our_rngs = nnx.Rngs(dropout=7), pnn.Rngs(dropout=7)
    for _ in range(2):  # the second call draws a new mask
        assert_close(ours_held(x), theirs_held(x), rtol=0, atol=0)
        expected = theirs_called(x, rngs=their_rngs)
        assert_close(ours_called(x, rngs=our_rngs), expected, rtol=0, atol=0)
    assert 0 < int((expected == 0).sum()) < x.size


def test_two_dropouts_from_one_rngs_nnx():
    """Each forks a stream of its own from the one Rngs, so the two draw different masks,
    the same in every style (eager, `jit` with the model passed in); both libraries derive
    the same keys, so the masks agree bit for bit as well."""
    x = jnp.ones((8, 16))

    class Ours(pnn.Module):
        def __init__(self, rngs):
            self.first = pnn.Dropout(0.5, rngs=rngs)
            self.second = pnn.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.first(x), self.second(x)

    class Theirs(nnx.Module):
        def __init__(self, rngs):
            self.first = nnx.Dropout(0.5, rngs=rngs)
            self.second = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.first(x), self.second(x)

    expected = Theirs(nnx.Rngs(0))(x)
    assert not np.array_equal(expected[0], expected[1])
    assert_close(nnx.jit(lambda m, x: m(x))(Theirs(nnx.Rngs(0)), x), expected, rtol=0, atol=0)
    for style in (lambda f: f, pg.jit, jax.jit):
        assert_close(style(lambda m, x: m(x))(Ours(pnn.Rngs(0)), x), expected, rtol=0, atol=0)


def test_rngs_default_by_keyword_nnx():
    """`Rngs(default=seed)` is `Rngs(seed)` in both, and draws the same keys."""
    ours, theirs = pnn.Rngs(default=42), nnx.Rngs(default=42)
    for _ in range(2):
        assert_close(jax.random.key_data(ours.params()), jax.random.key_data(theirs.params()), 0, 0)
    assert_close(jax.random.key_data(pnn.Rngs(42)()), jax.random.key_data(nnx.Rngs(42)()), 0, 0)


def test_dropout_deterministic_nnx():
    x = normal(1, (4, 5))
    for ours, theirs in [
        (pnn.Dropout(0.5, deterministic=True), nnx.Dropout(0.5, deterministic=True)),
        (pnn.Dropout(0.5, rngs=pnn.Rngs(0)).eval(), nnx.Dropout(0.5, rngs=nnx.Rngs(0))),
    ]:
        theirs.eval()
        assert_close(ours(x), theirs(x), rtol=0, atol=0)
        assert_close(ours(x), x, rtol=0, atol=0)
    for rate in (0.0, 1.0):
        expected = nnx.Dropout(rate)(x, rngs=nnx.Rngs(0))
        assert_close(pnn.Dropout(rate)(x, rngs=pnn.Rngs(0)), expected, rtol=0, atol=0)


# ------------------------------------------------------------------------- Attention


def _attention_pair(**kwargs: Any) -> tuple[Any, Any]:
    # NNX has no default for `decode` (ours: False) and needs it given.
    return nnx_pair(pnn.MultiHeadAttention, nnx.MultiHeadAttention, decode=False, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "batch"),
    [
        (dict(num_heads=2, in_features=8), (2,)),
        (dict(num_heads=2, in_features=8, qkv_features=12, out_features=6), (2,)),
        (dict(num_heads=4, in_features=8, use_bias=False), (2,)),
        (dict(num_heads=2, in_features=8), ()),
        (dict(num_heads=2, in_features=8), (2, 3)),
    ],
    ids=str,
)
def test_self_attention_nnx(kwargs, batch):
    ours, theirs = _attention_pair(**kwargs)
    compare(ours, theirs, normal(1, (*batch, 5, 8)))


def test_cross_attention_nnx():
    ours, theirs = _attention_pair(
        num_heads=3, in_features=8, qkv_features=12, out_features=5, in_kv_features=6
    )
    q, k, v = normal(1, (2, 4, 8)), normal(2, (2, 7, 6)), normal(3, (2, 7, 6))
    # inputs_v defaults to inputs_k
    compare(lambda *a: (ours(*a), ours(*a[:2])), lambda *a: (theirs(*a), theirs(*a[:2])), q, k, v)


def test_attention_masks_nnx():
    ours, theirs = _attention_pair(num_heads=2, in_features=8)
    x = normal(1, (2, 5, 8))
    causal = pnn.make_causal_mask(jnp.zeros((2, 5)))
    assert_close(causal, nnx.make_causal_mask(jnp.zeros((2, 5))), rtol=0, atol=0)

    # Padding: the second sequence ends with two padding positions, whose queries see no
    # key at all; both give such rows uniform weights.
    valid = jnp.array([[True] * 5, [True, True, True, False, False]])
    padding = pnn.make_attention_mask(valid, valid)
    assert_close(padding, nnx.make_attention_mask(valid, valid), rtol=0, atol=0)

    causal_padding = pnn.combine_masks(causal, padding)
    assert_close(causal_padding, nnx.combine_masks(causal, padding), rtol=0, atol=0)

    per_head = bernoulli(3, 0.7, (2, 2, 5, 5))  # booleans rather than 0/1
    masks = (causal, padding, causal_padding, per_head)
    compare(
        lambda x: [ours(x, mask=mask) for mask in masks],
        lambda x: [theirs(x, mask=mask) for mask in masks],
        x,
    )


def test_attention_dropout_nnx():
    """Attention dropout takes its key from the call's `dropout` stream in both."""
    ours, theirs = _attention_pair(
        num_heads=2, in_features=8, dropout_rate=0.3, deterministic=False
    )
    compare(
        lambda x: (ours(x, rngs=pnn.Rngs(dropout=4)), ours(x, deterministic=True)),
        lambda x: (theirs(x, rngs=nnx.Rngs(dropout=4)), theirs(x, deterministic=True)),
        normal(1, (2, 5, 8)),
    )


def test_attention_decode_nnx():
    """Decoding one position at a time with the cache gives full causal attention."""
    ours, theirs = _attention_pair(num_heads=2, in_features=8, qkv_features=12)
    x = normal(1, (2, 6, 8))
    causal = pnn.make_causal_mask(jnp.zeros((2, 6)))
    our_full, their_full = ours(x, mask=causal), theirs(x, mask=causal)
    assert_close(our_full, their_full)

    ours.init_cache(x.shape)
    theirs.init_cache(x.shape)
    our_step = pg.jit(lambda model, x: model(x, decode=True))
    their_step = nnx.jit(lambda model, x: model(x, decode=True))
    our_steps, their_steps = [], []
    for t in range(x.shape[1]):
        our_steps.append(our_step(ours, x[:, t : t + 1]))
        their_steps.append(their_step(theirs, x[:, t : t + 1]))
        assert_close(our_steps[-1], their_steps[-1])
    assert_close(jnp.concatenate(our_steps, axis=1), our_full)
    assert_close(jnp.concatenate(their_steps, axis=1), their_full)
    assert_close(ours.cached_key.value, theirs.cached_key[...])
    assert_close(ours.cached_value.value, theirs.cached_value[...])
    assert int(ours.cache_index.value) == int(theirs.cache_index[...]) == x.shape[1]


@pytest.mark.parametrize(
    ("batch", "extras"),
    [((2,), ""), ((2,), "mask"), ((2,), "bias"), ((), "mask, bias"), ((2, 3), "mask, bias")],
    ids=str,
)
def test_dot_product_attention_nnx(batch, extras):
    # Without dropout NNX hands this to jax.nn.dot_product_attention, which wants values
    # with the keys' head size; values of another size are compared with dropout below.
    q, k, v = (normal(i, (*batch, length, 2, 3)) for i, length in [(1, 4), (2, 6), (3, 6)])
    kwargs = {}
    if "mask" in extras:
        kwargs["mask"] = bernoulli(4, 0.6, (*batch, 1, 4, 6))
    if "bias" in extras:
        kwargs["bias"] = normal(5, (*batch, 2, 4, 6))
    compare(pnn.dot_product_attention, nnx.dot_product_attention, q, k, v, **kwargs)


def test_dot_product_attention_dropout_nnx():
    """Both draw the dropout mask of the weights from the given key alike (one mask per
    head here: the layer test above covers the broadcast mask)."""
    q, k, v = normal(1, (4, 2, 3)), normal(2, (6, 2, 3)), normal(3, (6, 2, 5))

    def run(attention: Callable[..., jax.Array]) -> Callable[..., Any]:
        kwargs = dict(dropout_rng=jax.random.key(9), dropout_rate=0.4, broadcast_dropout=False)
        return lambda *a: (attention(*a, **kwargs), attention(*a, deterministic=True, **kwargs))

    compare(run(pnn.dot_product_attention), run(nnx.dot_product_attention), q, k, v)


# ------------------------------------------------------------------------- Recurrent

_CELLS = {"lstm": (pnn.LSTMCell, nnx.LSTMCell), "gru": (pnn.GRUCell, nnx.GRUCell)}


def _random_carry(cell: Any, shape: tuple[int, ...]) -> Any:
    """A non-zero carry of the cell's structure for steps of shape `shape`."""
    zeros = cell.initialize_carry(shape)
    leaves, treedef = jax.tree.flatten(zeros)
    return treedef.unflatten([normal(20 + i, leaf.shape) for i, leaf in enumerate(leaves)])


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
@pytest.mark.parametrize("cell", list(_CELLS))
def test_cell_nnx(cell, batch):
    ours, theirs = nnx_pair(*_CELLS[cell], 3, 5)
    x = normal(1, (*batch, 3))
    compare(ours, theirs, _random_carry(ours, x.shape), x)
    assert_close(ours.initialize_carry(x.shape), theirs.initialize_carry(x.shape, nnx.Rngs(0)))


# Options given at the call override the RNN's own (built with return_carry=True).
_RNN_CALLS = [
    dict(return_carry=False),
    dict(initial_carry=True),
    dict(reverse=True),
    dict(reverse=True, keep_order=True),
    dict(seq_lengths=[6, 3]),
    dict(reverse=True, seq_lengths=[2, 5]),
    dict(reverse=True, keep_order=True, seq_lengths=[4, 6]),
    dict(time_major=True),
]


@pytest.mark.parametrize("cell", list(_CELLS))
def test_rnn_nnx(cell):
    our_cell, their_cell = nnx_pair(*_CELLS[cell], 3, 5)
    ours = pnn.RNN(our_cell, return_carry=True)
    theirs = nnx.RNN(their_cell, return_carry=True)
    x = normal(1, (2, 6, 3))
    calls = []
    for call in _RNN_CALLS:
        call = dict(call)
        if call.get("initial_carry"):
            call["initial_carry"] = _random_carry(our_cell, (2, 3))
        if "seq_lengths" in call:
            call["seq_lengths"] = jnp.array(call["seq_lengths"])
        calls.append(call)

    def run(model: Any, x: jax.Array) -> list[Any]:
        time_major = jnp.swapaxes(x, 0, 1)
        return [model(time_major if c.get("time_major") else x, **c) for c in calls]

    # One program per library for all the calls. NNX's RNN runs NNX's scan transform,
    # which writes back to the cell: under `nnx.jit` rather than `jax.jit`.
    our_outputs = jax.jit(partial(run, ours))(x)
    their_outputs = nnx.jit(run)(theirs, x)
    for call, our_output, their_output in zip(calls, our_outputs, their_outputs, strict=True):
        assert_close(our_output, their_output, err_msg=f"RNN(...)(x, **{call})")


# ------------------------------------------------------------------------- Optimizer


class _OurNet(pnn.Module):
    def __init__(self, rngs: Any):
        self.linear = pnn.Linear(3, 4, **no_init(pnn.Linear), rngs=rngs)
        self.norm = pnn.LayerNorm(4, rngs=rngs)
        self.head = pnn.Linear(4, 2, **no_init(pnn.Linear), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(jnp.tanh(self.norm(self.linear(x))))


class _TheirNet(nnx.Module):
    def __init__(self, rngs: Any):
        self.linear = nnx.Linear(3, 4, **no_init(nnx.Linear), rngs=rngs)
        self.norm = nnx.LayerNorm(4, rngs=rngs)
        self.head = nnx.Linear(4, 2, **no_init(nnx.Linear), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(jnp.tanh(self.norm(self.linear(x))))


def _loss(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


@pytest.mark.parametrize(
    "tx",
    [optax.adam(1e-3), optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2))],
    ids=["adam", "clipped_adamw"],
)
def test_optimizer_nnx(tx):
    """Three steps of `Optimizer(model, tx, wrt=Param).update(model, grads)` against
    `nnx.Optimizer(model, tx, wrt=nnx.Param).update(model, grads)`, each under its own
    library's jit: the gradients agree at every step, and so do the parameters."""
    ours, theirs = _OurNet(pnn.Rngs(0)), _TheirNet(nnx.Rngs(0))
    weights = randomize(ours)
    copy_to_nnx(weights, theirs)
    our_opt = pnn.Optimizer(ours, tx, wrt=Param)
    their_opt = nnx.Optimizer(theirs, tx, wrt=nnx.Param)

    @pg.jit
    def our_step(model: Any, optimizer: Any, x: jax.Array, y: jax.Array) -> Any:
        grads = pg.grad(_loss)(model, x, y)
        optimizer.update(model, grads)
        return grads

    @nnx.jit
    def their_step(model: Any, optimizer: Any, x: jax.Array, y: jax.Array) -> Any:
        grads = nnx.grad(_loss)(model, x, y)
        optimizer.update(model, grads)
        return grads

    for step in range(3):
        x, y = normal(step, (8, 3)), normal(10 + step, (8, 2))
        our_grads = our_step(ours, our_opt, x, y)
        their_grads = their_step(theirs, their_opt, x, y)
        for path in weights:
            assert_close(walk_state(our_grads, path).value, walk_state(their_grads, path)[...])
            assert_close(walk(ours, path).value, walk(theirs, path)[...])
    assert int(our_opt.step.value) == int(their_opt.step[...]) == 3


# ============================================================================= Equinox

# ----------------------------------------------------------------------- Linear, MLP


@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_equinox(use_bias):
    ours = our_layer(pnn.Linear, 5, 3, use_bias=use_bias)
    theirs = filled(eqx_linear(eqx_shell(eqx.nn.Linear, 5, 3, use_bias=use_bias), ours))
    compare(ours, over_batch(theirs, 2), normal(1, (2, 4, 5)))


def test_linear_with_no_input_features_equinox():
    """`Linear(0, n)`, built by both with real initializers: an empty kernel, and the
    output is the bias (ours holds its kernel as `(0, n)`, Equinox as `(n, 0)`)."""
    ours = pnn.Linear(0, 3, bias_init=pnn.initializers.normal(), rngs=0)
    theirs = eqx_linear(eqx.nn.Linear(0, 3, key=jax.random.key(0)), ours)
    assert ours.kernel.value.shape == (0, 3) and theirs.weight.shape == (3, 0)
    compare(ours, over_batch(theirs, 1), jnp.ones((2, 0)))
    assert_close(ours(jnp.ones((0,))), ours.bias.value, rtol=0, atol=0)
    mlp = eqx.nn.MLP(0, 2, 4, 1, key=jax.random.key(0))
    assert pnn.MLP(0, 2, 4, 1, rngs=0)(jnp.ones((0,))).shape == mlp(jnp.ones((0,))).shape


@pytest.mark.parametrize(
    ("depth", "kwargs"),
    [
        (0, {}),
        (1, {}),
        # str() of a function holds its address, which differs between processes (pytest-xdist).
        pytest.param(
            3, dict(activation=jnp.tanh, final_activation=jax.nn.sigmoid), id="3-tanh-sigmoid"
        ),
        (2, dict(use_bias=False)),
        pytest.param(
            2,
            dict(use_final_bias=False, activation=jax.nn.softplus),
            id="2-softplus-use_final_bias=False",
        ),
    ],
    ids=str,
)
def test_mlp_equinox(depth, kwargs):
    """Both take `depth` as the number of hidden layers: `depth + 1` Linears."""
    ours = our_layer(pnn.MLP, 3, 2, 4, depth, **kwargs)
    theirs = eqx_shell(eqx.nn.MLP, 3, 2, 4, depth, **kwargs)
    assert len(theirs.layers) == len(ours.layers) == depth + 1
    layers = tuple(map(eqx_linear, theirs.layers, ours.layers))
    theirs = filled(eqx.tree_at(lambda m: m.layers, theirs, layers))
    compare(ours, jax.vmap(theirs), normal(1, (5, 3)))


# ------------------------------------------------------------------------------ Conv

_EQX_NO_MASK = "Equinox's convolutions take no kernel mask"

EQX_CONV_CASES = [
    # (kernel_size, spatial input shape, our keyword arguments, Equinox's)
    ((3,), (9,), {}, dict(padding="SAME")),
    ((4,), (9,), dict(strides=2, padding="VALID"), dict(stride=2, padding="VALID")),
    ((3,), (9,), dict(padding=((2, 1),)), dict(padding=((2, 1),))),
    ((3,), (9,), dict(strides=2, padding=2), dict(stride=2, padding=2)),
    # Our CAUSAL, CIRCULAR and REFLECT pad the input, then convolve without padding, as
    # Equinox's explicit padding with a padding mode does: CAUSAL by (k - 1, 0) for a
    # dilated kernel size k, the others by ((k - 1) // 2, k // 2).
    ((3,), (9,), dict(padding="CAUSAL", kernel_dilation=2), dict(padding=((4, 0),), dilation=2)),
    (
        (3,),
        (9,),
        dict(padding="CIRCULAR", strides=2),
        dict(padding=((1, 1),), padding_mode="CIRCULAR", stride=2),
    ),
    ((4,), (9,), dict(padding="REFLECT"), dict(padding=((1, 2),), padding_mode="REFLECT")),
    ((3, 3), (7, 6), dict(strides=2), dict(stride=2, padding="SAME")),
    # At stride 1, Equinox's SAME padding is ((k - 1) // 2, k // 2) too.
    ((3, 4), (7, 6), dict(padding="CIRCULAR"), dict(padding="SAME", padding_mode="CIRCULAR")),
    ((3, 3), (7, 6), dict(padding="REFLECT"), dict(padding="SAME", padding_mode="REFLECT")),
    (
        (3, 3),
        (7, 6),
        dict(kernel_dilation=(2, 1), padding=((1, 2), (0, 0))),
        dict(dilation=(2, 1), padding=((1, 2), (0, 0))),
    ),
    ((3, 3), (7, 6), dict(feature_group_count=2), dict(groups=2, padding="SAME")),
    ((3, 3), (7, 6), dict(use_bias=False), dict(use_bias=False, padding="SAME")),
    ((2, 3, 2), (5, 4, 5), dict(strides=(1, 2, 1)), dict(stride=(1, 2, 1), padding="SAME")),
    (
        (2, 2, 2),
        (5, 4, 5),
        dict(padding="REFLECT", kernel_dilation=2),
        dict(padding=((1, 1),) * 3, padding_mode="REFLECT", dilation=2),
    ),
    pytest.param(
        (3, 3),
        (5, 4),
        dict(padding=((2, 2), (1, 1)), input_dilation=2),
        {},
        marks=pytest.mark.skip(reason="Equinox's Conv has no input dilation"),
    ),
    pytest.param((3, 3), (7, 6), dict(mask=True), {}, marks=pytest.mark.skip(reason=_EQX_NO_MASK)),
    pytest.param(
        (3, 3),
        (7, 6),
        dict(padding="CIRCULAR", strides=2),
        dict(padding="SAME", padding_mode="CIRCULAR", stride=2),
        marks=pytest.mark.skip(
            reason="with strides, Equinox's SAME padding depends on the stride (as lax's "
            "does), while our CIRCULAR pads ((k - 1) // 2, k // 2) whatever the stride (as "
            "NNX's does); the case with explicit padding above covers strides"
        ),
    ),
]


def _eqx_conv(cls: Any, ours: Any, kernel: jax.Array, kwargs: dict) -> Any:
    """An Equinox (transposed) convolution with our layer's sizes and these weights."""
    rank = len(ours.kernel_size)
    theirs = eqx_shell(cls, rank, _IN, _OUT, ours.kernel_size, **kwargs)
    values = {"weight": oihw(kernel)}
    if ours.bias is not None:
        values["bias"] = ours.bias.value.reshape((-1,) + (1,) * rank)
    return filled(set_eqx(theirs, **values))


@pytest.mark.parametrize(
    ("kernel_size", "spatial", "kwargs", "eqx_kwargs"), EQX_CONV_CASES, ids=str
)
def test_conv_equinox(kernel_size, spatial, kwargs, eqx_kwargs):
    ours = our_layer(pnn.Conv, _IN, _OUT, kernel_size, **kwargs)
    theirs = _eqx_conv(eqx.nn.Conv, ours, ours.kernel.value, eqx_kwargs)
    compare(ours, jax.vmap(channels_first(theirs)), normal(1, (2, *spatial, _IN)))


# Both transposed convolutions convolve the input, dilated by the strides, with the kernel
# as it is (no flip). Our explicit (low, high) pairs pad that dilated input; Equinox's
# padding is that of the forward Conv it undoes, and pads it by `k - 1 - padding` on each
# side (k the dilated kernel size).
EQX_CONV_TRANSPOSE_CASES = [
    # Equinox's SAME (without output_padding) pads as lax's SAME transposed convolution.
    ((3,), (6,), {}, dict(padding="SAME")),
    ((3,), (6,), dict(strides=2), dict(stride=2, padding="SAME")),
    ((4,), (5,), dict(strides=3, kernel_dilation=2), dict(stride=3, dilation=2, padding="SAME")),
    ((4, 3), (5, 4), dict(strides=(2, 3)), dict(stride=(2, 3), padding="SAME")),
    ((4,), (6,), dict(strides=2, padding="VALID"), dict(stride=2, padding="VALID")),
    # A dilated kernel smaller than the stride: our VALID output has n * stride positions,
    # Equinox's (n - 1) * stride + k; output_padding adds the difference.
    (
        (2,),
        (6,),
        dict(strides=3, padding="VALID"),
        dict(stride=3, padding="VALID", output_padding=1),
    ),
    ((3,), (6,), dict(strides=2, padding=((2, 1),)), dict(stride=2, padding=((0, 1),))),
    # CAUSAL pads the dilated input by (k - 1, stride - 1).
    ((3,), (6,), dict(strides=2, padding="CAUSAL"), dict(stride=2, padding=((0, 1),))),
    (
        (3, 3),
        (5, 4),
        dict(strides=2, padding=((1, 2), (0, 1)), kernel_dilation=(1, 2)),
        dict(stride=2, padding=((1, 0), (4, 3)), dilation=(1, 2)),
    ),
    (
        (3, 3),
        (5, 4),
        dict(strides=2, padding="VALID", use_bias=False),
        dict(stride=2, padding="VALID", use_bias=False),
    ),
    (
        (3, 3),
        (5, 4),
        dict(strides=(2, 1), padding="VALID", transpose_kernel=True),
        dict(stride=(2, 1), padding="VALID"),
    ),
    # At stride 1, our CIRCULAR with transpose_kernel is the transpose of a circular Conv,
    # as Equinox's CIRCULAR SAME is.
    (
        (3, 4),
        (5, 4),
        dict(padding="CIRCULAR", transpose_kernel=True),
        dict(padding="SAME", padding_mode="CIRCULAR"),
    ),
    ((2, 2, 3), (3, 4, 3), dict(strides=2, padding="VALID"), dict(stride=2, padding="VALID")),
    pytest.param(
        (3, 3),
        (5, 4),
        dict(strides=2, padding="CIRCULAR", transpose_kernel=True),
        dict(stride=2, padding="SAME", padding_mode="CIRCULAR"),
        marks=pytest.mark.skip(
            reason="with strides, the circular Conv that each one is the transpose of pads "
            "differently (Equinox: lax's SAME for that stride; ours: ((k - 1) // 2, k // 2))"
        ),
    ),
    pytest.param((3, 3), (5, 4), dict(mask=True), {}, marks=pytest.mark.skip(reason=_EQX_NO_MASK)),
]


@pytest.mark.parametrize(
    ("kernel_size", "spatial", "kwargs", "eqx_kwargs"), EQX_CONV_TRANSPOSE_CASES, ids=str
)
def test_conv_transpose_equinox(kernel_size, spatial, kwargs, eqx_kwargs):
    ours = our_layer(pnn.ConvTranspose, _IN, _OUT, kernel_size, **kwargs)
    kernel = ours.kernel.value
    if ours.transpose_kernel:
        # lax flips the spatial axes of such a kernel and swaps its feature axes.
        kernel = jnp.flip(kernel, range(len(kernel_size))).swapaxes(-1, -2)
    theirs = _eqx_conv(eqx.nn.ConvTranspose, ours, kernel, eqx_kwargs)
    compare(ours, jax.vmap(channels_first(theirs)), normal(1, (2, *spatial, _IN)))


# --------------------------------------------------------------------- Normalization

# Equinox takes the variance in two passes, E[(x - E[x])^2]: so do ours here
# (use_fast_variance=False), and with Equinox's epsilon.


@pytest.mark.parametrize(
    ("shape", "kwargs", "eqx_kwargs"),
    [
        ((6,), {}, {}),
        ((6,), dict(use_bias=False), dict(use_bias=False)),
        ((6,), dict(use_scale=False, use_bias=False), dict(use_weight=False, use_bias=False)),
        ((3, 6), dict(reduction_axes=(-2, -1), feature_axes=(-2, -1)), {}),
    ],
    ids=str,
)
def test_layer_norm_equinox(shape, kwargs, eqx_kwargs):
    ours = our_layer(
        pnn.LayerNorm, math.prod(shape), epsilon=1e-5, use_fast_variance=False, **kwargs
    )
    theirs = eqx_shell(eqx.nn.LayerNorm, shape, eps=1e-5, **eqx_kwargs)
    values = {}
    if ours.scale is not None:
        values["weight"] = ours.scale.value.reshape(shape)
    if ours.bias is not None:
        values["bias"] = ours.bias.value.reshape(shape)
    theirs = filled(set_eqx(theirs, **values))
    compare(ours, over_batch(theirs, 2), normal(1, (2, 3, *shape), _NORM_SCALE, _NORM_OFFSET))


@pytest.mark.parametrize("use_scale", [True, False])
def test_rms_norm_equinox(use_scale):
    ours = our_layer(pnn.RMSNorm, 6, epsilon=1e-5, use_scale=use_scale)
    theirs = eqx_shell(eqx.nn.RMSNorm, 6, eps=1e-5, use_weight=use_scale, use_bias=False)
    if use_scale:
        theirs = set_eqx(theirs, weight=ours.scale.value)
    x = normal(1, (2, 3, 6), _NORM_SCALE, _NORM_OFFSET)
    compare(ours, over_batch(filled(theirs), 2), x)


@pytest.mark.parametrize(
    ("shape", "kwargs", "groups"),
    [
        ((2, 5, 4, 8), dict(num_groups=2), 2),
        ((2, 5, 4, 8), dict(num_groups=1), 1),
        ((2, 5, 4, 8), dict(num_groups=None, group_size=2), 4),
        ((3, 7, 8), dict(num_groups=8), 8),
        ((3, 8), dict(num_groups=4), 4),
    ],
    ids=str,
)
def test_group_norm_equinox(shape, kwargs, groups):
    ours = our_layer(pnn.GroupNorm, 8, epsilon=1e-5, use_fast_variance=False, **kwargs)
    theirs = eqx_shell(eqx.nn.GroupNorm, groups, 8, eps=1e-5)
    theirs = filled(set_eqx(theirs, weight=ours.scale.value, bias=ours.bias.value))
    x = normal(1, shape, _NORM_SCALE, _NORM_OFFSET)
    compare(ours, jax.vmap(channels_first(theirs)), x)


# ------------------------------------------------------------------------- Embedding


def test_embedding_equinox():
    ours = our_layer(pnn.Embedding, 10, 4)
    theirs = filled(set_eqx(eqx_shell(eqx.nn.Embedding, 10, 4), weight=ours.embedding.value))
    # In range only: out of range, Equinox's indexing clamps to the last row where ours
    # gives NaN vectors (as NNX's does). Equinox's Embedding has no `attend`.
    compare(ours, over_batch(theirs, 2), jnp.array([[0, 3, 9], [-1, -10, 5]]))


# ------------------------------------------------------------------------- Attention


def _eqx_attention(ours: pnn.MultiHeadAttention) -> Any:
    """Equinox's MultiheadAttention holding our weights.

    Its projections are Linears `(num_heads * head_dim, in)`, heads major, where ours are
    `(in, num_heads, head_dim)` (and `(num_heads, head_dim, out)` for the output).
    """
    theirs = eqx_shell(
        eqx.nn.MultiheadAttention,
        ours.num_heads,
        ours.in_features,
        key_size=ours.in_kv_features,
        value_size=ours.in_kv_features,
        output_size=ours.out_features,
        qk_size=ours.head_dim,
        vo_size=ours.head_dim,
        use_query_bias=ours.use_bias,
        use_key_bias=ours.use_bias,
        use_value_bias=ours.use_bias,
        use_output_bias=ours.use_bias,
    )
    projections = {}
    for name in ("query", "key", "value", "out"):
        layer = getattr(ours, name)
        kernel = layer.kernel.value
        split = 1 if name != "out" else 2  # the axes that are the input features
        matrix = kernel.reshape(math.prod(kernel.shape[:split]), -1)
        values = {"weight": matrix.T}
        if ours.use_bias:
            values["bias"] = layer.bias.value.reshape(-1)
        proj = "output_proj" if name == "out" else f"{name}_proj"
        projections[proj] = set_eqx(getattr(theirs, proj), **values)
    return filled(set_eqx(theirs, **projections))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_heads=2, in_features=8),
        dict(num_heads=3, in_features=8, qkv_features=12, out_features=5, in_kv_features=6),
        dict(num_heads=2, in_features=8, use_bias=False),
    ],
    ids=str,
)
def test_attention_equinox(kwargs):
    ours = our_layer(pnn.MultiHeadAttention, **kwargs)
    theirs = jax.vmap(_eqx_attention(ours))
    q = normal(1, (2, 4, ours.in_features))
    k, v = normal(2, (2, 7, ours.in_kv_features)), normal(3, (2, 7, ours.in_kv_features))

    # Equinox's mask is (q, kv) or (num_heads, q, kv) for one example; ours broadcasts to
    # (batch, num_heads, q, kv).
    shared = bernoulli(4, 0.6, (2, 4, 7))
    per_head = bernoulli(5, 0.6, (2, ours.num_heads, 4, 7))
    compare(
        lambda *a: [ours(*a), ours(*a, mask=shared[:, None]), ours(*a, mask=per_head)],
        lambda *a: [theirs(*a), theirs(*a, shared), theirs(*a, per_head)],
        q,
        k,
        v,
    )


def test_self_attention_masks_equinox():
    ours = our_layer(pnn.MultiHeadAttention, 2, 8)
    theirs = jax.vmap(_eqx_attention(ours))
    x = normal(1, (2, 5, 8))
    causal = pnn.make_causal_mask(jnp.zeros((2, 5)))
    valid = jnp.array([[True] * 5, [True, True, True, False, False]])
    padding = pnn.make_attention_mask(valid, valid)  # rows with no key: uniform weights
    masks = (causal, padding, pnn.combine_masks(causal, padding))
    compare(
        lambda x: [ours(x, mask=mask) for mask in masks],
        lambda x: [theirs(x, x, x, mask[:, 0].astype(bool)) for mask in masks],
        x,
    )


# ------------------------------------------------------------------------- Recurrent


@pytest.mark.parametrize("batch", [(), (3,)])
def test_lstm_cell_equinox(batch):
    ours = our_layer(pnn.LSTMCell, 3, 5)
    # Equinox stacks the gates' weights in the order i, f, g, o as `(4 * hidden, in)`,
    # with one bias (ours is on the recurrent Linears).
    inputs = [ours.ii, ours.if_, ours.ig, ours.io]
    hidden = [ours.hi, ours.hf, ours.hg, ours.ho]
    theirs = set_eqx(
        eqx_shell(eqx.nn.LSTMCell, 3, 5),
        weight_ih=jnp.concatenate([layer.kernel.value.T for layer in inputs]),
        weight_hh=jnp.concatenate([layer.kernel.value.T for layer in hidden]),
        bias=jnp.concatenate([layer.bias.value for layer in hidden]),
    )
    theirs = over_batch(filled(theirs), len(batch))

    def their_step(carry: Any, x: jax.Array) -> Any:
        # Equinox's carry is (h, c), ours (c, h); Equinox returns the carry only.
        c, h = carry
        h, c = theirs(x, (h, c))
        return (c, h), h

    x = normal(1, (*batch, 3))
    compare(ours, their_step, _random_carry(ours, x.shape), x)


@pytest.mark.parametrize("batch", [(), (3,)])
def test_gru_cell_equinox(batch):
    ours = our_layer(pnn.GRUCell, 3, 5)
    # The same gates (r, z, n) in the same order, transposed. Equinox also adds a bias to
    # the recurrent term of the candidate, `bias_n`, which ours (as NNX's) has not: zero.
    theirs = set_eqx(
        eqx_shell(eqx.nn.GRUCell, 3, 5),
        weight_ih=ours.dense_i.kernel.value.T,
        weight_hh=ours.dense_h.kernel.value.T,
        bias=ours.dense_i.bias.value,
        bias_n=jnp.zeros(5),
    )
    theirs = over_batch(filled(theirs), len(batch))

    def their_step(h: jax.Array, x: jax.Array) -> Any:
        h = theirs(x, h)
        return h, h

    x = normal(1, (*batch, 3))
    compare(ours, their_step, _random_carry(ours, x.shape), x)
