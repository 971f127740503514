"""`RotaryPositionalEmbedding`: rotary position embeddings (RoPE) for queries and keys."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_features
from ._dtypes import promote_dtype, with_rank
from ._module import Module


class RotaryPositionalEmbedding(Module):
    """Rotary position embeddings (RoPE, Su et al. 2021), applied to queries or keys.

    Each pair of features `(x[i], x[i + embedding_size // 2])` of the vector at position
    `p` is rotated by the angle `p * theta ** (-2 i / embedding_size)`. A query rotated
    at position `m` and a key rotated at position `n` then have a dot product that
    depends on `m - n` only, which gives attention a sense of relative position without
    any parameter. The pairing is the "rotate half" convention (first half against
    second half) of GPT-NeoX, Hugging Face's Llama and Equinox, not the interleaved
    `(x[2i], x[2i + 1])` one of the RoFormer paper and Meta's original Llama code;
    weights trained with one need their features permuted to be used with the other.

    Unlike Equinox's layer, which takes one sequence `(seq_len, embedding_size)`, it
    takes any leading axes, `(..., seq_len, embedding_size)` (batch, heads, ...), and
    the positions may be given, e.g. `cache_index + arange(seq_len)` when decoding one
    token at a time. The layer has no parameters. The sines and cosines are computed
    on each call (under `jit` they are constants that the compiler folds), from
    float32 angles; the rotation is computed in at least float32 and returned in the
    compute dtype.

    Arguments:
        embedding_size: the size of the rotated last axis (the head size in attention);
            it must be even.
        theta: the base of the rotation frequencies (10000 in the paper; larger values,
            e.g. 500000 in Llama 3, suit longer contexts).
        dtype: the dtype of the outputs (None: the input's).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import RotaryPositionalEmbedding
        >>> rope = RotaryPositionalEmbedding(4)
        >>> x = jnp.ones((2, 3, 4))  # (batch, seq_len, embedding_size)
        >>> rope(x).shape
        (2, 3, 4)
        >>> rope(x)[0, 0].tolist()  # position 0 is not rotated
        [1.0, 1.0, 1.0, 1.0]
        >>> q, k = rope(x, positions=jnp.array([5, 6, 7])), rope(x)
        >>> bool(jnp.allclose((q * q).sum(-1), (k * k).sum(-1)))  # rotations keep norms
        True
    """

    def __init__(self, embedding_size: int, *, theta: float = 10000.0, dtype: Any = None):
        check_features("RotaryPositionalEmbedding", embedding_size=embedding_size)
        if embedding_size % 2:
            raise ValueError(
                "RotaryPositionalEmbedding: embedding_size must be even (features are "
                f"rotated in pairs), got embedding_size={embedding_size}. In attention it "
                "is the head size, qkv_features // num_heads."
            )
        if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
            raise ValueError(
                f"RotaryPositionalEmbedding: theta must be a positive number, got {theta!r}."
            )
        self.embedding_size = embedding_size
        self.theta = float(theta)
        self.dtype = dtype

    def __call__(self, x: jax.Array, positions: Any = None) -> jax.Array:
        """Rotate the features of `x` by its positions.

        Arguments:
            x: an array of shape `(..., seq_len, embedding_size)`.
            positions: the position of each vector, integers (or floats) of shape
                `(seq_len,)` or any shape that broadcasts to `(..., seq_len)`, e.g.
                `(batch, seq_len)` for packed or left-padded sequences; None:
                `arange(seq_len)`.

        Returns:
            The rotated array, of the shape of `x`.
        """
        shape = jnp.shape(x)
        if len(shape) < 2 or shape[-1] != self.embedding_size:
            raise ValueError(
                "RotaryPositionalEmbedding expects x of shape (..., seq_len, "
                f"embedding_size) with embedding_size={self.embedding_size}, got shape "
                f"{shape}."
            )
        (x,) = promote_dtype(x, dtype=self.dtype)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"RotaryPositionalEmbedding rotates floating-point arrays, got x of dtype "
                f"{x.dtype}. Cast it, or pass dtype=jnp.float32 to the layer."
            )
        positions = self._check_positions(positions, shape[:-1])
        # Same float32 arithmetic as Equinox's layer, so the two agree to the last bit.
        inverse_frequencies = 1.0 / (
            self.theta
            ** (jnp.arange(0, self.embedding_size, 2, dtype=jnp.float32) / self.embedding_size)
        )
        positions = positions.astype(jnp.float32)[..., None]
        angles = positions * with_rank(inverse_frequencies, positions.ndim)
        # At least float32, chosen without `jnp.promote_types`, which the setting
        # `jax_numpy_dtype_promotion="strict"` makes refuse bfloat16 with float32.
        compute_dtype = x.dtype if jnp.finfo(x.dtype).bits >= 32 else jnp.dtype(jnp.float32)
        cos = with_rank(jnp.cos(angles).astype(compute_dtype), x.ndim)
        sin = with_rank(jnp.sin(angles).astype(compute_dtype), x.ndim)
        first, second = jnp.split(x.astype(compute_dtype), 2, axis=-1)
        rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], -1)
        return rotated.astype(x.dtype)

    def _check_positions(self, positions: Any, target: tuple[int, ...]) -> jax.Array:
        """The positions as an array broadcastable to `target`, or an error naming them."""
        if positions is None:
            return jnp.arange(target[-1], dtype=jnp.int32)
        positions = jnp.asarray(positions)
        if not (
            jnp.issubdtype(positions.dtype, jnp.integer)
            or jnp.issubdtype(positions.dtype, jnp.floating)
        ):
            raise TypeError(
                "RotaryPositionalEmbedding expects integer positions, got an array of dtype "
                f"{positions.dtype}."
            )
        try:
            fits = np.broadcast_shapes(positions.shape, target) == target
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(
                f"RotaryPositionalEmbedding: positions of shape {positions.shape} do not "
                f"broadcast to x's (..., seq_len) axes {target}; give one position per "
                f"vector, e.g. shape ({target[-1]},)."
            )
        return positions
