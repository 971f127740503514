"""`Embedding`: a table of vectors looked up by integer index."""

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from . import initializers
from ._checks import check_features, check_input, check_metadata, check_weight
from ._dtypes import promote_dtype
from ._flat_draws import flat_when_eager
from ._linear import sharded_param
from ._module import Module
from ._rngs import as_rngs

default_embedding_init = initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)


class Embedding(Module):
    """A table of `num_embeddings` vectors of size `features`, looked up by index.

    `embedding(indices)` gives `embedding.embedding[indices]`: integer indices of any
    shape `s` give vectors of shape `(*s, features)`. Negative indices count from the
    end; indices `>= num_embeddings` give NaN vectors (no error, as it cannot be checked
    inside compiled code), except in a table of one vector, which every index gives (as
    in Flax NNX: a single learned vector broadcast to the input's shape). `attend(query)`
    is the transposed use of the same table, `query @ embedding.T`, the output layer of a
    language model with tied weights.

    Arguments:
        num_embeddings: the number of vectors (e.g. the vocabulary size; 0 allowed).
        features: the size of each vector (0 allowed).
        dtype: the dtype of the outputs (None: the parameters' dtype, promoted with the
            query's in `attend`).
        param_dtype: the dtype of the table.
        embedding_init: initializer of the table, of shape `(num_embeddings, features)`;
            by default normal with variance `1 / features`.
        embedding_sharding: how to split the table over a device mesh, one entry per
            dimension, e.g. `("model", None)` (see `Linear`'s `kernel_sharding`).
        embedding_metadata: more metadata for the table's Param, a mapping of names to
            hashable values (see `Linear`'s `kernel_metadata`).
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Embedding
        >>> embed = Embedding(10, 4, rngs=0)
        >>> tokens = jnp.array([[1, 2, 3], [4, 5, 6]])
        >>> embed(tokens).shape, embed.attend(embed(tokens)).shape
        ((2, 3, 4), (2, 3, 10))
    """

    def __init__(
        self,
        num_embeddings: int,
        features: int,
        *,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        embedding_init: initializers.Initializer = default_embedding_init,
        embedding_sharding: Any = None,
        embedding_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        # Zero sizes are allowed, as in Equinox.
        check_features("Embedding", smallest=0, num_embeddings=num_embeddings, features=features)
        sharding, metadata = check_metadata(
            "Embedding",
            "embedding_metadata",
            embedding_metadata,
            "embedding_sharding",
            embedding_sharding,
            2,
        )
        rngs = as_rngs(rngs, "Embedding")
        key, shape = rngs.params(), (num_embeddings, features)
        # An empty table has nothing to draw (and fan-scaled initializers would divide by
        # its zero size): zeros, with its key drawn all the same, as `Linear`'s kernel.
        if num_embeddings and features:
            value = embedding_init(flat_when_eager(key), shape, param_dtype)
        else:
            value = jnp.zeros(shape, param_dtype)
        self.embedding = sharded_param(value, sharding, metadata)
        self.num_embeddings = num_embeddings
        self.features = features
        self.dtype = dtype
        self.param_dtype = param_dtype

    def __call__(self, inputs: Any, out_sharding: Any = None) -> jax.Array:
        """Look up the vectors of `inputs`, integer indices of any shape.

        Arguments:
            inputs: integer indices, of any shape `s`.
            out_sharding: None, or the sharding of the output (a `PartitionSpec` or a
                `NamedSharding`, one entry per output dimension), under a mesh with
                explicit axes, as in Flax NNX (the lookup runs under
                `jax.sharding.auto_axes`, as `jnp.take` takes no output sharding).

        Returns:
            The vectors, of shape `(*s, features)`.
        """
        inputs = jnp.asarray(inputs)
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise TypeError(
                f"Embedding expects integer indices, got an array of dtype {inputs.dtype}. "
                "Convert them first, e.g. inputs.astype(jnp.int32)."
            )
        (embedding,) = promote_dtype(self._checked_embedding(), dtype=self.dtype)
        if self.num_embeddings == 1:
            # Flax NNX's rule for a one-vector table: every index reads it.
            shape = (*inputs.shape, embedding.shape[1])
            if out_sharding is not None:
                broadcast = functools.partial(jnp.broadcast_to, shape=shape)
                return jax.sharding.auto_axes(broadcast, out_sharding=out_sharding)(embedding)
            return jnp.broadcast_to(embedding, shape)
        if out_sharding is not None:
            return jax.sharding.auto_axes(_take, out_sharding=out_sharding)(embedding, inputs)
        return jnp.take(embedding, inputs, axis=0)

    def _checked_embedding(self) -> jax.Array:
        """The table's value, checked against `(num_embeddings, features)` (a local shard of
        it inside `shard_map`)."""
        sizes = f"num_embeddings={self.num_embeddings}, features={self.features}"
        return check_weight(self, "embedding", sizes, (self.num_embeddings, self.features))

    def attend(self, query: jax.Array, out_sharding: Any = None) -> jax.Array:
        """Score `query` against every vector of the table: `query @ embedding.T`.

        Arguments:
            query: an array of shape `(..., features)`.
            out_sharding: None, or the sharding of the output under a mesh with explicit
                axes (see `Linear.__call__`).

        Returns:
            The scores, of shape `(..., num_embeddings)` (e.g. logits over a vocabulary).
        """
        table = self._checked_embedding()
        local = None if table.shape[1] == self.features else table.shape[1]
        check_input("Embedding.attend", query, -1, self.features, "features", local)
        query, embedding = promote_dtype(query, table, dtype=self.dtype)
        return jnp.matmul(query, embedding.T, out_sharding=out_sharding)


def _take(embedding: jax.Array, inputs: jax.Array) -> jax.Array:
    return jnp.take(embedding, inputs, axis=0)
