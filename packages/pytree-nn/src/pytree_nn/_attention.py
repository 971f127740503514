"""Attention: `MultiHeadAttention`, `dot_product_attention` and the masks they take."""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_graph import Cache, Intermediate
from pytree_module import data

from . import initializers
from ._checks import check_features, check_metadata
from ._dropout import drop
from ._dtypes import at_least_float32, promote_dtype, with_rank
from ._flat_draws import flat_when_eager
from ._linear import default_kernel_init, sharded_param
from ._module import Module
from ._normalization import LayerNorm
from ._rngs import as_rngs, forked_rngs
from ._rotary import RotaryPositionalEmbedding


def _check_extra_batch_dims(where: str, extra_batch_dims: Any) -> None:
    if (
        isinstance(extra_batch_dims, bool)
        or not isinstance(extra_batch_dims, int)
        or extra_batch_dims < 0
    ):
        raise ValueError(
            f"{where}: extra_batch_dims must be an int >= 0, got {extra_batch_dims!r}."
        )


def make_attention_mask(
    query_input: Any,
    key_input: Any,
    pairwise_fn: Callable[[jax.Array, jax.Array], jax.Array] = jnp.multiply,
    extra_batch_dims: int = 0,
    dtype: Any = jnp.float32,
) -> jax.Array:
    """A mask for attention, built from one value per query and one per key position.

    `mask[..., 0, i, j] = pairwise_fn(query_input[..., i], key_input[..., j])`: with the
    default `jnp.multiply` and `query_input = key_input = tokens != pad` it lets real
    tokens attend to real tokens only (a padding mask). The singleton axis broadcasts
    over the heads.

    Arguments:
        query_input: an array of shape `(batch..., q_length)`.
        key_input: an array of shape `(batch..., kv_length)`; its batch axes broadcast with
            `query_input`'s.
        pairwise_fn: the elementwise function of a query value and a key value.
        extra_batch_dims: how many leading singleton axes to add.
        dtype: the dtype of the mask.

    Returns:
        The mask, of shape `(1,) * extra_batch_dims + (batch..., 1, q_length, kv_length)`;
        nonzero where attention is allowed.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import make_attention_mask
        >>> tokens = jnp.array([[5, 7, 0]])  # 0 is padding
        >>> mask = make_attention_mask(tokens != 0, tokens != 0)
        >>> mask.shape, mask[0, 0].tolist()
        ((1, 1, 3, 3), [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    """
    _check_extra_batch_dims("make_attention_mask", extra_batch_dims)
    query_input, key_input = jnp.asarray(query_input), jnp.asarray(key_input)
    if query_input.ndim < 1 or key_input.ndim < 1:
        raise ValueError(
            "make_attention_mask expects query_input of shape (batch..., q_length) and "
            "key_input of shape (batch..., kv_length), one value per position; got shapes "
            f"{query_input.shape} and {key_input.shape}."
        )
    try:
        np.broadcast_shapes(query_input.shape[:-1], key_input.shape[:-1])
    except ValueError:
        raise ValueError(
            "make_attention_mask: the batch axes of query_input "
            f"{query_input.shape[:-1]} and key_input {key_input.shape[:-1]} do not "
            "broadcast together."
        ) from None
    mask = pairwise_fn(query_input[..., :, None], key_input[..., None, :])[..., None, :, :]
    return mask.reshape((1,) * extra_batch_dims + mask.shape).astype(dtype)


def make_causal_mask(x: Any, extra_batch_dims: int = 0, dtype: Any = jnp.float32) -> jax.Array:
    """A causal mask: position `i` attends to positions `j <= i` only.

    Arguments:
        x: an array of shape `(batch..., length)` (only its shape is used, e.g. the
            tokens).
        extra_batch_dims: how many leading singleton axes to add.
        dtype: the dtype of the mask.

    Returns:
        The mask, of shape `(1,) * extra_batch_dims + (batch..., 1, length, length)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import make_causal_mask
        >>> make_causal_mask(jnp.zeros(3))[0].tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    shape = jnp.shape(x)
    if not shape:
        raise ValueError(
            "make_causal_mask expects an array of shape (batch..., length), got a scalar."
        )
    positions = jnp.broadcast_to(jnp.arange(shape[-1], dtype=jnp.int32), shape)
    return make_attention_mask(
        positions, positions, jnp.greater_equal, extra_batch_dims=extra_batch_dims, dtype=dtype
    )


def combine_masks(*masks: Any, dtype: Any = jnp.float32) -> jax.Array | None:
    """Combine attention masks: attend only where every mask allows it.

    Arguments:
        *masks: masks (or None, which are skipped); their shapes broadcast together.
        dtype: the dtype of the result.

    Returns:
        The logical and of the masks, broadcast, in `dtype`; None if every mask is None.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import combine_masks, make_attention_mask, make_causal_mask
        >>> tokens = jnp.array([4, 2, 0])  # 0 is padding
        >>> padding = make_attention_mask(tokens != 0, tokens != 0)
        >>> combine_masks(make_causal_mask(tokens), padding, None)[0].tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    """
    present = [jnp.asarray(mask) for mask in masks if mask is not None]
    if not present:
        return None
    try:
        np.broadcast_shapes(*(mask.shape for mask in present))
    except ValueError:
        shapes = ", ".join(str(mask.shape) for mask in present)
        raise ValueError(
            f"combine_masks: masks of shapes {shapes} do not broadcast together."
        ) from None
    # Each made boolean and of one rank first: float masks and masks of fewer axes then
    # combine under strict dtype and rank promotion too.
    ndim = max(mask.ndim for mask in present)
    combined = with_rank(present[0].astype(bool), ndim)
    for mask in present[1:]:
        combined = jnp.logical_and(combined, with_rank(mask.astype(bool), ndim))
    return combined.astype(dtype)


def _check_qkv(query: jax.Array, key: jax.Array, value: jax.Array) -> None:
    """Refuse query/key/value shapes that do not fit together, saying which."""
    arrays = {"query": query, "key": key, "value": value}
    for name, array in arrays.items():
        if array.ndim < 3:
            raise ValueError(
                f"dot_product_attention expects {name} of shape (batch..., length, "
                f"num_heads, head_dim), got shape {array.shape}."
            )
    shapes = ", ".join(f"{name} {array.shape}" for name, array in arrays.items())
    if not query.shape[:-3] == key.shape[:-3] == value.shape[:-3]:
        raise ValueError(
            f"dot_product_attention: query, key and value must have the same batch axes; got "
            f"{shapes}."
        )
    if key.shape[-3] != value.shape[-3]:
        raise ValueError(
            f"dot_product_attention: key and value must have the same length; got {shapes}."
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "dot_product_attention: key and value must have the same number of heads; got "
            f"{shapes}."
        )
    if query.shape[-2] % key.shape[-2]:
        raise ValueError(
            "dot_product_attention: the number of query heads must be a multiple of the "
            "number of key/value heads (grouped-query attention: each key/value head serves "
            f"num_heads // num_kv_heads query heads); got {shapes}."
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"dot_product_attention: query and key must have the same head_dim; got {shapes}."
        )


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether an array of `shape` broadcasts to `target` without changing it."""
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _check_broadcasts(name: str, array: Any, target: tuple[int, ...]) -> None:
    shape = jnp.shape(array)
    if not _broadcasts_to(shape, target):
        raise ValueError(
            f"dot_product_attention: {name} of shape {shape} does not broadcast to the "
            f"attention weights' shape {target} (batch..., num_heads, q_length, "
            "kv_length). Give it singleton axes where it does not vary, as "
            "make_attention_mask's (batch..., 1, q_length, kv_length) does."
        )


_IMPLEMENTATIONS = (None, "einsum", "xla", "cudnn")

# The dtypes whose softmax jax.nn.dot_product_attention takes in their own precision or
# wider (it always takes it in float32): float64 inputs keep the einsum path's float64.
_FUSED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _why_not_fused(
    query: jax.Array, key: jax.Array, value: jax.Array, dropping: bool, precision: Any
) -> str | None:
    """Why `jax.nn.dot_product_attention` cannot compute this call, or None if it can."""
    if dropping:
        return "attention dropout is on (dropout_rate > 0 and deterministic=False)"
    if precision is not None:
        return "precision= is given"
    if value.shape[-1] != key.shape[-1]:
        return "the values' head_dim differs from the keys'"
    if query.dtype not in _FUSED_DTYPES:
        return f"the inputs are {query.dtype} (it takes float32, bfloat16 or float16)"
    return None


def _as_4d(x: Any, batch: tuple[int, ...], tail: int) -> Any:
    """`x`, of shape `(batch..., *last tail axes)` or broadcastable to it, with its batch
    axes made one: `jax.nn.dot_product_attention` takes exactly one batch axis."""
    if x is None:
        return None
    x = with_rank(x, len(batch) + tail)
    lead = x.shape[: x.ndim - tail]
    if all(n == 1 for n in lead):
        return jnp.reshape(x, (1, *x.shape[x.ndim - tail :]))
    x = jnp.broadcast_to(x, (*batch, *x.shape[x.ndim - tail :]))
    return jnp.reshape(x, (math.prod(batch), *x.shape[len(batch) :]))


def _fused_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: Any,
    mask: Any,
    is_causal: bool,
    implementation: str | None,
) -> jax.Array:
    """Attention by `jax.nn.dot_product_attention`, with any number of batch axes."""
    batch = query.shape[:-3]
    out = jax.nn.dot_product_attention(
        _as_4d(query, batch, 3),
        _as_4d(key, batch, 3),
        _as_4d(value, batch, 3),
        _as_4d(bias, batch, 3),
        _as_4d(mask, batch, 3),
        is_causal=is_causal,
        implementation=implementation,
    )
    return jnp.reshape(out, query.shape)


def _einsum_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: Any,
    mask: Any,
    is_causal: bool,
    dropout: tuple[jax.Array, float, bool] | None,
    precision: Any,
    sow: Callable[[jax.Array], None] | None = None,
) -> jax.Array:
    """Attention by explicit einsums and softmax, computed as the XLA implementation of
    `jax.nn.dot_product_attention` computes it (logits in at least float32, scaled after
    the product, masked with -0.7 * the largest float, softmax in the logits' dtype,
    weights cast back), so that the two paths give the same numbers."""
    dtype = query.dtype
    *batch, q_length, num_heads, depth = query.shape
    kv_length, num_kv_heads = key.shape[-3], key.shape[-2]
    groups = num_heads // num_kv_heads
    logits_dtype = at_least_float32(dtype)
    # Query head h belongs to key/value head h // groups: group the query heads instead of
    # repeating the keys and values.
    grouped = jnp.reshape(query, (*batch, q_length, num_kv_heads, groups, depth))
    logits = jnp.einsum(
        "...qhgd,...khd->...hgqk",
        grouped,
        key,
        precision=precision,
        preferred_element_type=logits_dtype,
    )
    logits = logits * jnp.asarray(1.0 / np.sqrt(depth), logits_dtype)
    logits = jnp.reshape(logits, (*batch, num_heads, q_length, kv_length))
    if bias is not None:
        logits = logits + with_rank(jnp.asarray(bias).astype(logits_dtype), logits.ndim)
    if is_causal:
        causal = jnp.tril(jnp.ones((q_length, kv_length), bool))
        if mask is None:
            mask = causal
        else:
            mask = with_rank(mask, max(mask.ndim, 2))
            mask = jnp.logical_and(mask, with_rank(causal, mask.ndim))
    if mask is not None:
        large_negative = jnp.asarray(-0.7 * jnp.finfo(logits_dtype).max, logits_dtype)
        logits = jnp.where(with_rank(mask, logits.ndim), logits, large_negative)
    weights = jax.nn.softmax(logits, axis=-1).astype(dtype)
    if sow is not None:
        # Recorded before dropout, as Flax NNX records them.
        sow(weights)
    if dropout is not None:
        dropout_rng, dropout_rate, broadcast_dropout = dropout
        # One mask for every batch entry and head: broadcast over all but (q, k).
        broadcast_dims = range(weights.ndim - 2) if broadcast_dropout else ()
        weights = drop(dropout_rng, weights, dropout_rate, broadcast_dims)
    weights = jnp.reshape(weights, (*batch, num_kv_heads, groups, q_length, kv_length))
    out = jnp.einsum("...hgqk,...khd->...qhgd", weights, value, precision=precision)
    return jnp.reshape(out, (*batch, q_length, num_heads, value.shape[-1]))


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    broadcast_dropout: bool = True,
    dropout_rng: jax.Array | None = None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    dtype: Any = None,
    precision: Any = None,
    is_causal: bool = False,
    implementation: str | None = None,
    module: Any = None,
) -> jax.Array:
    """Scaled dot-product attention, each head separately: `softmax(q k^T / sqrt(d)) v`.

    For each head, the weights of query position `i` over key positions `j` are the
    softmax over `j` of `q_i . k_j / sqrt(head_dim) + bias`, taken where `mask` is
    nonzero (masked positions get weight 0; a row masked everywhere gets uniform
    weights). The logits and the softmax are computed in at least float32, the weights
    then cast to the inputs' dtype. In training (`deterministic=False` with
    `dropout_rate > 0`), weights are dropped with probability `dropout_rate` and the rest
    scaled by `1 / (1 - dropout_rate)`.

    Grouped-query attention: `key` and `value` may have fewer heads than `query`
    (`num_kv_heads` dividing `num_heads`); query head `h` then attends with key/value head
    `h // (num_heads // num_kv_heads)`, as in `jax.nn.dot_product_attention`. One
    key/value head is multi-query attention.

    Which computation runs: `jax.nn.dot_product_attention` (which lets XLA pick the
    kernel, fused on GPU where available) whenever it can compute the call, that is
    without attention dropout, without `precision=`, with values of the keys' head_dim
    and float32, bfloat16 or float16 inputs; otherwise explicit einsums and softmax,
    computed the same way (both give the same numbers). `implementation=` chooses.

    Arguments:
        query: `(batch..., q_length, num_heads, head_dim)`.
        key: `(batch..., kv_length, num_kv_heads, head_dim)`, `num_kv_heads` dividing
            `num_heads`.
        value: `(batch..., kv_length, num_kv_heads, v_head_dim)`. The batch axes (any
            number, none included) must be the same for all three.
        bias: added to the attention logits; broadcastable to
            `(batch..., num_heads, q_length, kv_length)`.
        mask: where attention is allowed (True or nonzero); broadcastable to the same.
        broadcast_dropout: use one dropout mask for every batch entry and head.
        dropout_rng: the PRNG key for dropout.
        dropout_rate: the probability of dropping an attention weight, in [0, 1].
        deterministic: no dropout.
        dtype: the dtype to compute in (None: promote the inputs').
        precision: the matmul precision (`jax.lax.Precision`), or None.
        is_causal: query position `i` attends to key positions `j <= i` only (counted
            from the start of both, as `jax.nn.dot_product_attention` does), together
            with `mask`.
        implementation: None (the default: `jax.nn.dot_product_attention` where it can
            compute the call, else einsums), `"einsum"` (always the explicit einsums),
            or `"xla"`/`"cudnn"` (`jax.nn.dot_product_attention` with that
            implementation; an error where it cannot compute the call).
        module: None, or a Module to record the attention weights in, as Flax NNX's
            `module=`: `module.sow(Intermediate, "attention_weights", weights)` with the
            weights `(batch..., num_heads, q_length, kv_length)` before dropout (read them
            with `pytree_graph.pop(module, Intermediate)`). The weights exist only on the
            einsum path, which then runs.

    Returns:
        The attended values, `(batch..., q_length, num_heads, v_head_dim)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import dot_product_attention
        >>> q = jnp.ones((2, 5, 4, 8))  # (batch, length, num_heads, head_dim)
        >>> kv = jnp.ones((2, 5, 2, 8))  # two key/value heads, each for two query heads
        >>> dot_product_attention(q, kv, kv, is_causal=True).shape
        (2, 5, 4, 8)
    """
    query, key, value = promote_dtype(query, key, value, dtype=dtype)
    dtype = query.dtype
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(
            f"dot_product_attention computes in a floating dtype, got {dtype} inputs. Cast "
            "them, or pass dtype=jnp.float32."
        )
    _check_qkv(query, key, value)
    weights_shape = (*query.shape[:-3], query.shape[-2], query.shape[-3], key.shape[-3])
    if bias is not None:
        _check_broadcasts("bias", bias, weights_shape)
    if mask is not None:
        _check_broadcasts("mask", mask, weights_shape)
        mask = jnp.asarray(mask).astype(bool)
    if not isinstance(is_causal, bool):
        raise TypeError(
            f"dot_product_attention: is_causal must be True or False, got {is_causal!r}."
        )
    if isinstance(dropout_rate, bool) or not 0.0 <= dropout_rate <= 1.0:
        raise ValueError(
            f"dot_product_attention: dropout_rate must be a number in [0, 1], got {dropout_rate!r}."
        )
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(
            "dot_product_attention: implementation must be None, 'einsum', 'xla' or "
            f"'cudnn', got {implementation!r}."
        )
    sow = None
    if module is not None:
        if not callable(getattr(module, "sow", None)):
            raise TypeError(
                "dot_product_attention: module must be a Module (whose sow method records "
                f"the attention weights), got {type(module).__name__}."
            )
        if implementation in ("xla", "cudnn"):
            raise ValueError(
                f"dot_product_attention: implementation={implementation!r} never forms the "
                "attention weights, so module= cannot record them; leave implementation=None."
            )
        implementation = "einsum"

        def sow(weights: jax.Array) -> None:
            module.sow(Intermediate, "attention_weights", weights)

    dropping = not deterministic and dropout_rate > 0.0
    if dropping and dropout_rng is None:
        raise ValueError(
            "dot_product_attention needs dropout_rng=<a PRNG key> to drop attention weights "
            "(dropout_rate > 0 and deterministic=False); pass a key, or deterministic=True."
        )
    if implementation != "einsum":
        why_not = _why_not_fused(query, key, value, dropping, precision)
        if why_not is None:
            logits_dtype = at_least_float32(dtype)
            if bias is not None:
                bias = jnp.asarray(bias).astype(logits_dtype)
            return _fused_attention(query, key, value, bias, mask, is_causal, implementation)
        if implementation is not None:
            raise ValueError(
                f"dot_product_attention: implementation={implementation!r} runs "
                f"jax.nn.dot_product_attention, which cannot compute this call: {why_not}. "
                "Leave implementation=None to fall back to the einsum path."
            )
    dropout = (dropout_rng, dropout_rate, broadcast_dropout) if dropping else None
    return _einsum_attention(query, key, value, bias, mask, is_causal, dropout, precision, sow)


def _check_positions(name: str, positions: Any, target: tuple[int, ...]) -> None:
    """Refuse `MultiHeadAttention` positions that do not broadcast to `target`, naming them."""
    if positions is None:
        return
    shape = jnp.shape(positions)
    if not _broadcasts_to(shape, target):
        raise ValueError(
            f"MultiHeadAttention: {name} of shape {shape} does not broadcast to "
            f"(batch..., length) = {target}; give one position per input position, e.g. "
            f"shape ({target[-1]},)."
        )


class HeadProjection(Module):
    """The dense layer of `MultiHeadAttention`'s `query`, `key`, `value` and `out`.

    It contracts the trailing axes of its input, of shape `in_features`, with a kernel of
    shape `in_features + out_features`: `(in, num_heads, head_dim)` to split features
    into heads, `(num_heads, head_dim, out)` to merge them. Initializers see the kernel
    as the matrix `(prod(in_features), prod(out_features))`, so fan-in and fan-out are
    those of the projection.

    Arguments:
        in_features: the shape of the contracted trailing axes of the input.
        out_features: the shape of the output's trailing axes.
        use_bias: whether to add a bias of shape `out_features`.
        dtype: the dtype to compute in (None: promote the input's and the parameters').
        param_dtype: the dtype of the parameters.
        precision: the matmul precision, or None.
        kernel_init: initializer of the kernel (seen as a matrix, see above).
        bias_init: initializer of the bias.
        kernel_sharding: the kernel's mesh axes, one entry per dimension (a name, a
            tuple of names, or None), stored as its `sharding` metadata; None: none.
        bias_sharding: the bias's mesh axes, likewise.
        kernel_metadata: more metadata for the kernel's Param (see `Linear`).
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn._attention import HeadProjection
        >>> split_heads = HeadProjection((8,), (2, 4), rngs=0)
        >>> split_heads.kernel.value.shape, split_heads(jnp.ones((5, 8))).shape
        ((8, 2, 4), (5, 2, 4))
    """

    def __init__(
        self,
        in_features: Sequence[int],
        out_features: Sequence[int],
        *,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: initializers.Initializer = default_kernel_init,
        bias_init: initializers.Initializer = initializers.zeros,
        kernel_sharding: Sequence[Any] | None = None,
        bias_sharding: Sequence[Any] | None = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        in_features, out_features = tuple(in_features), tuple(out_features)
        check_features(
            "HeadProjection",
            **{f"in_features[{i}]": n for i, n in enumerate(in_features)},
            **{f"out_features[{i}]": n for i, n in enumerate(out_features)},
        )
        kernel_sharding, kernel_metadata = check_metadata(
            "HeadProjection",
            "kernel_metadata",
            kernel_metadata,
            "kernel_sharding",
            kernel_sharding,
            len(in_features + out_features),
        )
        bias_sharding, bias_metadata = check_metadata(
            "HeadProjection",
            "bias_metadata",
            bias_metadata,
            "bias_sharding",
            bias_sharding,
            len(out_features),
        )
        rngs = as_rngs(rngs, "HeadProjection")
        matrix = (math.prod(in_features), math.prod(out_features))
        kernel = kernel_init(flat_when_eager(rngs.params()), matrix, param_dtype)
        self.kernel = sharded_param(
            jnp.reshape(kernel, in_features + out_features), kernel_sharding, kernel_metadata
        )
        self.bias = (
            sharded_param(
                jnp.reshape(
                    bias_init(flat_when_eager(rngs.params()), matrix[1:], param_dtype),
                    out_features,
                ),
                bias_sharding,
                bias_metadata,
            )
            if use_bias
            else None
        )
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the projection to `x`, of shape `(..., *in_features)`."""
        n = len(self.in_features)
        if jnp.ndim(x) < n or jnp.shape(x)[jnp.ndim(x) - n :] != self.in_features:
            raise ValueError(
                f"HeadProjection expects inputs whose trailing axes are {self.in_features}, "
                f"got an input of shape {jnp.shape(x)}."
            )
        bias = self.bias.value if self.bias is not None else None
        x, kernel, bias = promote_dtype(x, self.kernel.value, bias, dtype=self.dtype)
        y = jnp.tensordot(x, kernel, axes=n, precision=self.precision)
        return y if bias is None else y + with_rank(bias, y.ndim)


class MultiHeadAttention(Module):
    """Multi-head dot-product attention, with Flax NNX's arguments and parameters.

    The inputs are projected per head (`query`, kernel of shape
    `(in_features, num_heads, head_dim)` with `head_dim = qkv_features // num_heads`;
    `key` and `value`, kernels `(in_kv_features, num_kv_heads, head_dim)`), attended
    with `attention_fn` (by default `dot_product_attention`), and the heads merged by
    `out` (kernel `(num_heads, head_dim, out_features)`).

    Grouped-query attention: `num_kv_heads` (a divisor of `num_heads`, by default
    `num_heads`) key/value heads, each shared by `num_heads // num_kv_heads` query heads;
    `num_kv_heads=1` is multi-query attention. The key/value projections and the decoding
    cache are sized for `num_kv_heads` heads.

    `normalize_qk=True` layer-normalizes each projected query and key head (over
    `head_dim`, epsilon 1e-6, no centring bias: `LayerNorm`s `query_ln` and `key_ln` with
    a `scale` of shape `(head_dim,)`) before rotary embeddings and attention, as in
    ViT-22B (arxiv.org/abs/2302.05442).

    Call it as `att(inputs_q)` for self-attention, or `att(inputs_q, inputs_k, inputs_v)`
    for cross-attention (`inputs_k` defaults to `inputs_q`, `inputs_v` to `inputs_k`);
    inputs are `(batch..., length, features)` with any number of batch axes (none
    included). `mask` (True where attention is allowed) broadcasts to
    `(batch..., num_heads, q_length, kv_length)`: build it with `make_causal_mask`,
    `make_attention_mask` and `combine_masks`.

    Attention dropout (when `dropout_rate > 0`) draws keys from a stream of the layer's
    own, forked from the `dropout` stream of `rngs` after the parameters are drawn (as
    Flax NNX does; kept at `.rngs.default`; not kept with `keep_rngs=False`), or from the
    `dropout` stream of `rngs=` given to the call; it is off in evaluation mode
    (`deterministic=True`, set by `Module.eval()`).

    Autoregressive decoding: `init_cache(input_shape)` makes `Cache` Variables
    (`cached_key`, `cached_value`, `cache_index`); each call in decode mode then takes the
    next position(s), writes their keys and values into the cache in place, and attends
    to the positions filled so far (new positions causally among themselves). Under a
    transform use `pytree_graph.jit` (or another graph transform), which writes the cache
    back. Feeding more positions than the cache holds raises an error, or, inside a
    transform where the position is not known, gives NaN outputs.

    Rotary position embeddings: with `rotary=RotaryPositionalEmbedding(head_dim)` the
    projected queries and keys of every head are rotated by their positions before
    attention, so that the logits depend on relative positions only. The positions
    default to `0, 1, ...` along the length axis, and in decode mode to
    `cache_index + 0, 1, ...` (the cache then holds rotated keys); `positions=` and
    `kv_positions=` on the call set them, e.g. for packed or left-padded sequences. The
    embedding is a layer of the attention, rather than a `process_heads` function
    passed to each call as in Equinox, so that decoding, which alone knows the cache
    index, rotates the new positions correctly, and so that a model built once applies it
    on every call.

    Arguments:
        num_heads: the number of heads; it must divide `qkv_features`.
        in_features: the size of `inputs_q`'s last axis.
        qkv_features: the total size of the queries, keys and values over all heads
            (default `in_features`).
        out_features: the size of the output's last axis (default `in_features`).
        num_kv_heads: the number of key/value heads (default `num_heads`); it must
            divide `num_heads` (see above).
        in_kv_features: the size of `inputs_k`'s and `inputs_v`'s last axis (default
            `in_features`).
        dtype: the dtype to compute in (None: promote the inputs' and parameters').
        param_dtype: the dtype of the parameters.
        broadcast_dropout: use one dropout mask for every batch entry and head.
        dropout_rate: the probability of dropping an attention weight in training.
        deterministic: start in evaluation mode (no dropout).
        precision: the matmul precision (`jax.lax.Precision`), or None.
        kernel_init: initializer of the `query`, `key` and `value` kernels (and of `out`'s
            unless `out_kernel_init` is given), seen as `(fan_in, fan_out)` matrices.
        out_kernel_init: initializer of the `out` kernel (None: `kernel_init`).
        bias_init: initializer of the biases (and of `out`'s unless `out_bias_init` is
            given).
        out_bias_init: initializer of the `out` bias (None: `bias_init`).
        use_bias: whether the projections have biases.
        attention_fn: called as `attention_fn(query, key, value, mask=, dropout_rng=,
            dropout_rate=, broadcast_dropout=, deterministic=, dtype=, precision=)` on the
            projected `(batch..., length, heads, head_dim)` arrays (keys and values with
            `num_kv_heads` heads), and with `is_causal=True` too when a call asks for it.
        decode: start in decode mode (see above; `init_cache` first).
        normalize_qk: layer-normalize the query and key heads (see above).
        rotary: a `RotaryPositionalEmbedding` of size `head_dim` (see above), or None for
            no position information in the layer. Any Module called as
            `rotary(heads, positions)` on arrays `(batch..., num_heads, length, head_dim)`
            is accepted too (e.g. a variant that rotates part of each head).
        qkv_kernel_sharding: the mesh axes of the `query`, `key` and `value` kernels
            `(in_features, heads, head_dim)`, e.g. `(None, "model", None)` to split
            the heads (tensor parallelism); stored as their `sharding` metadata.
        qkv_bias_sharding: the mesh axes of their biases `(num_heads, head_dim)`.
        out_kernel_sharding: the mesh axes of the `out` kernel
            `(num_heads, head_dim, out_features)`, e.g. `("model", None, None)`.
        out_bias_sharding: the mesh axes of its bias `(out_features,)`.
        kernel_metadata: more metadata for the `query`, `key` and `value` kernels' Params,
            a mapping of names to hashable values (see `Linear`'s `kernel_metadata`), as
            Flax NNX's; a `sharding` entry is `qkv_kernel_sharding`.
        bias_metadata: the same for their biases.
        out_kernel_metadata: the same for the `out` kernel.
        out_bias_metadata: the same for the `out` bias.
        query_ln_scale_metadata: the same for the `query_ln` scale (`normalize_qk`).
        key_ln_scale_metadata: the same for the `key_ln` scale.
        rngs: an `Rngs`, a PRNG key or an int seed (parameters from its `params` stream;
            the dropout stream forked from its `dropout` stream).
        keep_rngs: keep that forked dropout stream (as `.rngs`); with False the layer
            holds no random state, and calls with dropout need `rngs=`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import MultiHeadAttention, make_causal_mask
        >>> att = MultiHeadAttention(num_heads=2, in_features=8, rngs=0)
        >>> x = jnp.ones((3, 5, 8))  # (batch, length, features)
        >>> att(x, mask=make_causal_mask(jnp.zeros((3, 5)))).shape
        (3, 5, 8)
        >>> att.query.kernel.value.shape, att.out.kernel.value.shape
        ((8, 2, 4), (2, 4, 8))
        >>> from pytree_nn import RotaryPositionalEmbedding
        >>> rope = MultiHeadAttention(2, 8, rotary=RotaryPositionalEmbedding(4), rngs=0)
        >>> rope(x, positions=jnp.arange(10, 15)).shape
        (3, 5, 8)
        >>> gqa = MultiHeadAttention(4, 8, num_kv_heads=2, normalize_qk=True, rngs=0)
        >>> gqa.key.kernel.value.shape, gqa.query_ln.scale.value.shape
        ((8, 2, 2), (2,))
        >>> gqa(x, is_causal=True).shape
        (3, 5, 8)
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        qkv_features: int | None = None,
        out_features: int | None = None,
        num_kv_heads: int | None = None,
        *,
        in_kv_features: int | None = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        broadcast_dropout: bool = True,
        dropout_rate: float = 0.0,
        deterministic: bool = False,
        precision: Any = None,
        kernel_init: initializers.Initializer = default_kernel_init,
        out_kernel_init: initializers.Initializer | None = None,
        bias_init: initializers.Initializer = initializers.zeros,
        out_bias_init: initializers.Initializer | None = None,
        use_bias: bool = True,
        attention_fn: Callable[..., jax.Array] = dot_product_attention,
        decode: bool = False,
        normalize_qk: bool = False,
        rotary: Module | None = None,
        qkv_kernel_sharding: Sequence[Any] | None = None,
        qkv_bias_sharding: Sequence[Any] | None = None,
        out_kernel_sharding: Sequence[Any] | None = None,
        out_bias_sharding: Sequence[Any] | None = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        out_kernel_metadata: Mapping[str, Any] | None = None,
        out_bias_metadata: Mapping[str, Any] | None = None,
        query_ln_scale_metadata: Mapping[str, Any] | None = None,
        key_ln_scale_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
        keep_rngs: bool = True,
    ):
        qkv_features = in_features if qkv_features is None else qkv_features
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        out_features = in_features if out_features is None else out_features
        in_kv_features = in_features if in_kv_features is None else in_kv_features
        check_features(
            "MultiHeadAttention",
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            in_features=in_features,
            qkv_features=qkv_features,
            out_features=out_features,
            in_kv_features=in_kv_features,
        )
        if qkv_features % num_heads:
            raise ValueError(
                f"MultiHeadAttention: num_heads={num_heads} must divide "
                f"qkv_features={qkv_features} (each head gets qkv_features // num_heads "
                "features). Pick qkv_features as a multiple of num_heads, e.g. "
                f"qkv_features={num_heads * max(1, qkv_features // num_heads)}."
            )
        if num_heads % num_kv_heads:
            raise ValueError(
                f"MultiHeadAttention: num_kv_heads={num_kv_heads} must divide "
                f"num_heads={num_heads} (each key/value head serves num_heads // "
                "num_kv_heads query heads). Pick a divisor of num_heads, e.g. "
                f"num_kv_heads={math.gcd(num_heads, num_kv_heads)}."
            )
        for name, flag in (("normalize_qk", normalize_qk), ("keep_rngs", keep_rngs)):
            if not isinstance(flag, bool):
                raise TypeError(f"MultiHeadAttention: {name} must be True or False, got {flag!r}.")
        if (
            isinstance(dropout_rate, bool)
            or not isinstance(dropout_rate, int | float)
            or not 0 <= dropout_rate <= 1
        ):
            raise ValueError(
                f"MultiHeadAttention: dropout_rate must be a number in [0, 1], got "
                f"{dropout_rate!r}."
            )
        if not callable(attention_fn):
            raise TypeError(
                "MultiHeadAttention: attention_fn must be a function such as "
                f"dot_product_attention, got {type(attention_fn).__name__}."
            )
        head_dim = qkv_features // num_heads
        if isinstance(rotary, RotaryPositionalEmbedding) and rotary.embedding_size != head_dim:
            raise ValueError(
                "MultiHeadAttention: rotary rotates each head, so its embedding_size must be "
                f"head_dim = qkv_features // num_heads = {head_dim}, got "
                f"embedding_size={rotary.embedding_size}. Pass "
                f"rotary=RotaryPositionalEmbedding({head_dim})."
            )
        if rotary is not None and not callable(rotary):
            raise TypeError(
                "MultiHeadAttention: rotary must be a RotaryPositionalEmbedding (or None), "
                f"got {type(rotary).__name__}."
            )
        # Each Param's sharding and metadata (NNX's `*_metadata` names), checked before any
        # key is drawn: (sharding, metadata) by the sharding argument's name.
        shardings = {
            sharding_name: check_metadata(
                "MultiHeadAttention", metadata_name, metadata, sharding_name, value, ndim
            )
            for sharding_name, value, metadata_name, metadata, ndim in (
                ("qkv_kernel_sharding", qkv_kernel_sharding, "kernel_metadata", kernel_metadata, 3),
                ("qkv_bias_sharding", qkv_bias_sharding, "bias_metadata", bias_metadata, 2),
                (
                    "out_kernel_sharding",
                    out_kernel_sharding,
                    "out_kernel_metadata",
                    out_kernel_metadata,
                    3,
                ),
                ("out_bias_sharding", out_bias_sharding, "out_bias_metadata", out_bias_metadata, 1),
            )
        }

        rngs = as_rngs(rngs, "MultiHeadAttention")

        def projection(
            in_shape: tuple[int, ...],
            out_shape: tuple[int, ...],
            init: Any,
            of: str,
            bias_init: Any = bias_init,
        ) -> HeadProjection:
            return HeadProjection(
                in_shape,
                out_shape,
                use_bias=use_bias,
                dtype=dtype,
                param_dtype=param_dtype,
                precision=precision,
                kernel_init=init,
                bias_init=bias_init,
                kernel_sharding=shardings[f"{of}_kernel_sharding"][0],
                bias_sharding=shardings[f"{of}_bias_sharding"][0],
                kernel_metadata=shardings[f"{of}_kernel_sharding"][1],
                bias_metadata=shardings[f"{of}_bias_sharding"][1],
                rngs=rngs,
            )

        heads, kv_heads = (num_heads, head_dim), (num_kv_heads, head_dim)
        self.query = projection((in_features,), heads, kernel_init, "qkv")
        self.key = projection((in_kv_features,), kv_heads, kernel_init, "qkv")
        self.value = projection((in_kv_features,), kv_heads, kernel_init, "qkv")
        if normalize_qk:
            # Drawn between the value and out projections, as Flax NNX draws them.
            self.query_ln = self._head_norm(
                head_dim, dtype, param_dtype, rngs, query_ln_scale_metadata
            )
            self.key_ln = self._head_norm(head_dim, dtype, param_dtype, rngs, key_ln_scale_metadata)
        else:
            self.query_ln = data(None)
            self.key_ln = data(None)
        self.out = projection(
            heads,
            (out_features,),
            out_kernel_init or kernel_init,
            "out",
            bias_init=out_bias_init or bias_init,
        )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.normalize_qk = normalize_qk
        self.in_features = in_features
        self.qkv_features = qkv_features
        self.out_features = out_features
        self.in_kv_features = in_kv_features
        self.head_dim = head_dim
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.broadcast_dropout = broadcast_dropout
        self.dropout_rate = float(dropout_rate)
        self.deterministic = deterministic
        self.precision = precision
        self.use_bias = use_bias
        self.attention_fn = attention_fn
        self.decode = decode
        self.rotary = rotary
        keep = keep_rngs and dropout_rate > 0
        self.rngs = data(forked_rngs(rngs, "dropout", "MultiHeadAttention") if keep else None)
        self.cached_key = data(None)
        self.cached_value = data(None)
        self.cache_index = data(None)

    @staticmethod
    def _head_norm(
        head_dim: int, dtype: Any, param_dtype: Any, rngs: Any, scale_metadata: Any
    ) -> LayerNorm:
        """The layer norm of each query or key head (`normalize_qk`): a `scale` only."""
        return LayerNorm(
            head_dim,
            use_bias=False,
            dtype=dtype,
            param_dtype=param_dtype,
            scale_metadata=scale_metadata,
            rngs=rngs,
        )

    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        rngs: Any = None,
        decode: bool | None = None,
        is_causal: bool = False,
        positions: Any = None,
        kv_positions: Any = None,
        sow_weights: bool = False,
    ) -> jax.Array:
        """Attend from `inputs_q` to `inputs_k`/`inputs_v` (by default: to itself).

        Arguments:
            inputs_q: the queries' inputs, `(batch..., q_length, in_features)`.
            inputs_k: the keys' inputs, `(batch..., kv_length, in_kv_features)`
                (default: `inputs_q`).
            inputs_v: the values' inputs, shaped like `inputs_k` (default: `inputs_k`).
            mask: True (or nonzero) where attention is allowed, broadcastable to
                `(batch..., num_heads, q_length, kv_length)`; in decode mode `kv_length`
                is the cache's length.
            deterministic: override the layer's mode for this call (True: no dropout).
            rngs: dropout keys for this call (an `Rngs`, `RngStream`, key or seed)
                instead of the layer's own stream.
            decode: override the layer's `decode` for this call.
            is_causal: query position `i` attends to key positions `j <= i` only (with
                `mask`), passed on to `attention_fn` as `is_causal=True`, which lets
                fused kernels skip the masked half. Decode mode is causal already, and
                ignores it.
            positions: with `rotary`, the positions of the queries, broadcastable to
                `(batch..., q_length)` (default `0, 1, ...`; in decode mode
                `cache_index + 0, 1, ...`).
            kv_positions: with `rotary`, the positions of the keys, broadcastable to
                `(batch..., kv_length)` (default: `positions` when given, else as for
                `positions`); needed only when the keys are another sequence.
            sow_weights: record this call's attention weights in the layer, as Flax NNX:
                `attention_fn` gets `module=self` (see `dot_product_attention`), and
                `pytree_graph.pop(layer, Intermediate)["attention_weights"]` reads them.

        Returns:
            `(batch..., q_length, out_features)`.
        """
        if not isinstance(is_causal, bool):
            raise TypeError(
                f"MultiHeadAttention: is_causal must be True or False, got {is_causal!r}."
            )
        if not isinstance(sow_weights, bool):
            raise TypeError(
                f"MultiHeadAttention: sow_weights must be True or False, got {sow_weights!r}."
            )
        if inputs_k is None:
            if inputs_v is not None:
                raise ValueError(
                    "MultiHeadAttention: inputs_v was given without inputs_k. Pass inputs_k "
                    "as well (inputs_k defaults to inputs_q, and inputs_v to inputs_k)."
                )
            inputs_k = inputs_q
        if inputs_v is None:
            inputs_v = inputs_k
        self._check_inputs(inputs_q, inputs_k, inputs_v)
        query = self.query(inputs_q)
        key = self.key(inputs_k)
        value = self.value(inputs_v)
        if self.normalize_qk:
            query = self.query_ln(query)
            key = self.key_ln(key)

        decoding = self.decode if decode is None else decode
        if self.rotary is not None:
            query, key = self._rotate(query, key, positions, kv_positions, decoding)
        elif positions is not None or kv_positions is not None:
            raise ValueError(
                "MultiHeadAttention: positions and kv_positions are used by rotary position "
                "embeddings only, and this layer has none. Build it with "
                f"rotary=RotaryPositionalEmbedding({self.head_dim}), or leave them out."
            )
        overflow = None
        if decoding:
            key, value, mask, overflow = self._write_cache(query, key, value, mask)

        if deterministic is None:
            deterministic = self.deterministic
        dropout_rng = None
        if deterministic or self.dropout_rate == 0.0:
            deterministic = True
        else:
            rngs = self.rngs if rngs is None else as_rngs(rngs, "MultiHeadAttention")
            if rngs is None:
                raise ValueError(
                    "MultiHeadAttention needs random keys for attention dropout in training "
                    "mode: pass rngs=... to the call, or switch to evaluation mode with "
                    "`.eval()` (or deterministic=True)."
                )
            dropout_rng = rngs.dropout()

        # Only asked for: an attention_fn written without is_causal keeps working. In
        # decode mode the cache's mask is causal already.
        causal = {"is_causal": True} if is_causal and not decoding else {}
        x = self.attention_fn(
            query,
            key,
            value,
            mask=mask,
            dropout_rng=dropout_rng,
            dropout_rate=self.dropout_rate,
            broadcast_dropout=self.broadcast_dropout,
            deterministic=deterministic,
            dtype=self.dtype,
            precision=self.precision,
            **causal,
            **({"module": self} if sow_weights else {}),
        )
        out = self.out(x)
        if overflow is not None:
            out = jnp.where(overflow, jnp.asarray(jnp.nan, out.dtype), out)
        return out

    def _rotate(
        self,
        query: jax.Array,
        key: jax.Array,
        positions: Any,
        kv_positions: Any,
        decoding: bool,
    ) -> tuple[jax.Array, jax.Array]:
        """Apply `rotary` to the queries and keys, at their positions."""
        batch = query.shape[:-3]
        q_length, kv_length = query.shape[-3], key.shape[-3]
        if kv_positions is None and positions is not None:
            if kv_length != q_length:
                raise ValueError(
                    f"MultiHeadAttention: the keys have another length ({kv_length}) than "
                    f"the queries ({q_length}), so they cannot take the queries' "
                    "positions; pass kv_positions= as well."
                )
            kv_positions = positions
        if positions is None and decoding:
            self._check_cache()
            positions = self.cache_index.value + jnp.arange(q_length, dtype=jnp.int32)
        if kv_positions is None and decoding:
            kv_positions = positions
        _check_positions("positions", positions, (*batch, q_length))
        _check_positions("kv_positions", kv_positions, (*batch, kv_length))
        return self._rotate_heads(query, positions), self._rotate_heads(key, kv_positions)

    def _rotate_heads(self, heads: jax.Array, positions: Any) -> jax.Array:
        """`rotary` on `(batch..., length, num_heads, head_dim)` heads, each head alike."""
        if positions is not None and jnp.ndim(positions) >= 2:
            # (batch..., length) positions broadcast over the heads axis moved before length.
            positions = jnp.expand_dims(positions, -2)
        rotated = self.rotary(jnp.swapaxes(heads, -3, -2), positions)
        return jnp.swapaxes(rotated, -3, -2)

    def _check_inputs(self, inputs_q: Any, inputs_k: Any, inputs_v: Any) -> None:
        """Refuse inputs whose shapes do not fit the layer or each other, naming which."""
        inputs = {"inputs_q": inputs_q, "inputs_k": inputs_k, "inputs_v": inputs_v}
        expected = {
            "inputs_q": ("in_features", self.in_features),
            "inputs_k": ("in_kv_features", self.in_kv_features),
            "inputs_v": ("in_kv_features", self.in_kv_features),
        }
        for name, x in inputs.items():
            shape = jnp.shape(x)
            size_name, size = expected[name]
            if len(shape) < 2:
                raise ValueError(
                    f"MultiHeadAttention expects {name} of shape (batch..., length, "
                    f"{size_name}), got shape {shape}. For a single position add a length "
                    "axis: x[..., None, :]."
                )
            if shape[-1] != size:
                raise ValueError(
                    f"MultiHeadAttention expects {name} whose last dimension is "
                    f"{size_name}={size}, got an input of shape {shape}."
                )
        shape_q, shape_k, shape_v = (jnp.shape(x) for x in inputs.values())
        if not shape_q[:-2] == shape_k[:-2] == shape_v[:-2]:
            raise ValueError(
                "MultiHeadAttention: inputs_q, inputs_k and inputs_v must have the same batch "
                f"axes; got shapes {shape_q}, {shape_k} and {shape_v}."
            )
        if shape_k[-2] != shape_v[-2]:
            raise ValueError(
                "MultiHeadAttention: inputs_k and inputs_v must have the same length; got "
                f"shapes {shape_k} and {shape_v}."
            )

    def set_view(
        self,
        deterministic: bool | None = None,
        decode: bool | None = None,
        batch_size: int | Sequence[int] | None = None,
        max_length: int | None = None,
    ) -> None:
        """What `pytree_graph.view` (and `view_info`) set on a MultiHeadAttention layer.

        With `decode=True` and both `batch_size` and `max_length`, an empty cache is made
        if the layer has none (as `init_cache((*batch_size, max_length, in_features))`);
        with neither, `init_cache` is left to call later.

        Arguments:
            deterministic: if True, the module is set to deterministic mode.
            decode: if True, the module is set to decode mode.
            batch_size: the batch size to use for the cache.
            max_length: the max length to use for the cache.
        """
        if (batch_size is None) != (max_length is None):
            missing = "max_length" if max_length is None else "batch_size"
            raise TypeError(
                f"MultiHeadAttention.set_view: {missing!r} must be given with "
                f"{'batch_size' if missing == 'max_length' else 'max_length'} to make the "
                "decoding cache."
            )
        if deterministic is not None:
            self.deterministic = deterministic
        if decode is not None:
            self.decode = decode
            if decode and batch_size is not None and self.cached_key is None:
                batch = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
                self.init_cache((*batch, max_length, self.in_features), self.dtype or jnp.float32)

    def init_cache(self, input_shape: Sequence[int], dtype: Any = jnp.float32) -> None:
        """Make an empty decoding cache for sequences of shape `input_shape`.

        Sets `cached_key` and `cached_value` (`Cache` Variables of shape
        `(batch..., max_length, num_kv_heads, head_dim)`, zeros) and `cache_index` (a
        `Cache` holding the number of positions filled, 0). Call it again to start a new
        sequence.

        Arguments:
            input_shape: the shape of a whole input sequence,
                `(batch..., max_length, features)`.
            dtype: the dtype of the cached keys and values.

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_nn import MultiHeadAttention
            >>> att = MultiHeadAttention(2, 8, decode=True, rngs=0)
            >>> att.init_cache((1, 10, 8))  # batch 1, up to 10 positions
            >>> ys = [att(jnp.ones((1, 1, 8))) for _ in range(3)]  # one position per call
            >>> att.cached_key.value.shape, int(att.cache_index.value)
            ((1, 10, 2, 4), 3)
        """
        shape = tuple(input_shape)
        if len(shape) < 2 or any(
            isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1 for n in shape
        ):
            raise ValueError(
                "MultiHeadAttention.init_cache expects input_shape = (batch..., max_length, "
                f"features), positive ints, got {input_shape!r}."
            )
        if shape[-1] not in (self.in_features, self.in_kv_features):
            raise ValueError(
                "MultiHeadAttention.init_cache expects input_shape = (batch..., max_length, "
                f"features) with features={self.in_features}, got {shape}: its last entry "
                "must be the feature size."
            )
        cache_shape = (*shape[:-1], self.num_kv_heads, self.head_dim)
        self.cached_key = Cache(jnp.zeros(cache_shape, dtype))
        self.cached_value = Cache(jnp.zeros(cache_shape, dtype))
        self.cache_index = Cache(jnp.array(0, jnp.int32))

    def _check_cache(self) -> None:
        """Refuse to decode without a cache, saying how to make one."""
        if self.cached_key is None or self.cached_value is None or self.cache_index is None:
            raise ValueError(
                "MultiHeadAttention: decode mode needs a cache. Call "
                "att.init_cache(input_shape) first, with input_shape = (batch..., "
                "max_length, features)."
            )

    def _write_cache(
        self, query: jax.Array, key: jax.Array, value: jax.Array, mask: Any
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
        """Write the new positions into the cache; the cached keys, values and mask."""
        self._check_cache()
        cached_key = self.cached_key.value
        *batch, max_length, _, _ = cached_key.shape
        if key.shape[:-3] != tuple(batch):
            raise ValueError(
                f"MultiHeadAttention: the inputs' batch axes {key.shape[:-3]} differ from the "
                f"decode cache's {tuple(batch)}; call init_cache with this batch shape."
            )
        length = key.shape[-3]
        if query.shape[-3] != length:
            raise ValueError(
                "MultiHeadAttention: in decode mode inputs_q, inputs_k and inputs_v hold the "
                f"same new positions, but inputs_q has {query.shape[-3]} and inputs_k "
                f"{length}."
            )
        index = self.cache_index.value
        overflow = None
        if isinstance(index, jax.core.Tracer):
            # The position is only known when the compiled code runs: mark the outputs.
            overflow = index + length > max_length
        elif int(index) + length > max_length:
            raise ValueError(
                f"MultiHeadAttention: the decode cache is full: it holds {max_length} "
                f"positions, {int(index)} are filled and this call adds {length}. Call "
                "init_cache again to start a new sequence (with a larger max_length if "
                "needed)."
            )
        zero = jnp.zeros((), index.dtype)
        start = (zero,) * len(batch) + (index, zero, zero)
        key = jax.lax.dynamic_update_slice(cached_key, key.astype(cached_key.dtype), start)
        cached_value = self.cached_value.value
        value = jax.lax.dynamic_update_slice(cached_value, value.astype(cached_value.dtype), start)
        self.cached_key.value = key
        self.cached_value.value = value
        self.cache_index.value = index + length
        # New position i (absolute index + i) sees the cache up to and including itself.
        positions = index + jnp.arange(length, dtype=index.dtype)
        visible = with_rank(jnp.arange(max_length, dtype=index.dtype), 2) <= positions[:, None]
        return key, value, combine_masks(mask, visible, dtype=jnp.bool_), overflow
