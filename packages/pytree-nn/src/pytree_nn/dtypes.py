"""The dtype a layer computes in, for layers of your own: `canonicalize_dtype` and
`promote_dtype`, with Flax NNX's signatures (`flax.nnx.nn.dtypes`).

A layer with `dtype=None` computes in the type its input and parameters promote to; with
`dtype` set, in that type (e.g. bfloat16 activations from float32 parameters). With
`inexact=True` (the default) the result is a floating or complex type: integers are promoted
to at least float32, for operations such as a mean that make no sense on integers.

Example:
    >>> import jax.numpy as jnp
    >>> from pytree_nn import dtypes
    >>> x, kernel = dtypes.promote_dtype((jnp.ones(3, jnp.bfloat16), jnp.ones((3, 2))))
    >>> x.dtype, kernel.dtype
    (dtype('float32'), dtype('float32'))
"""

from typing import Any, TypeVar

import jax.numpy as jnp

__all__ = ["canonicalize_dtype", "promote_dtype"]

T = TypeVar("T", bound=tuple)


def canonicalize_dtype(*args: Any, dtype: Any = None, inexact: bool = True) -> Any:
    """The dtype that `args` are to be computed in.

    Arguments:
        *args: arrays, or values `jnp.asarray` takes; None entries are ignored.
        dtype: None to infer the dtype from `args` (`jnp.result_type`), or the dtype to
            use, returned as given (checked against `inexact`).
        inexact: require a floating or complex result: an inferred integer or boolean
            dtype is promoted with float32, and a given one is refused.

    Returns:
        The dtype.

    Raises:
        ValueError: `inexact` and a `dtype` given that is not floating or complex.

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_nn.dtypes import canonicalize_dtype
        >>> canonicalize_dtype(jnp.ones(2, jnp.int32), None)
        dtype('float32')
        >>> canonicalize_dtype(jnp.ones(2, jnp.int32), inexact=False)
        dtype('int32')
    """
    if dtype is None:
        present = [jnp.asarray(x) for x in args if x is not None]
        if not present:
            raise ValueError(
                "canonicalize_dtype: nothing to infer a dtype from (no arguments, or only "
                "None); give dtype=..."
            )
        dtype = jnp.result_type(*present)
        if inexact and not jnp.issubdtype(dtype, jnp.inexact):
            dtype = jnp.promote_types(jnp.float32, dtype)
    if inexact and not jnp.issubdtype(dtype, jnp.inexact):
        # NNX's words first, so code that matches its message keeps working.
        raise ValueError(
            f"Dtype must be inexact: {jnp.dtype(dtype).name} (canonicalize_dtype with "
            "inexact=True asks for a floating or complex dtype); give a floating dtype "
            "(e.g. jnp.float32), or inexact=False."
        )
    return dtype


def promote_dtype(args: T, /, *, dtype: Any = None, inexact: bool = True) -> T:
    """Cast every entry of the tuple `args` to one dtype (`canonicalize_dtype`'s).

    Unlike a variadic function, it takes the values as one tuple, as Flax NNX's does, so
    that `x, kernel, bias = promote_dtype((x, kernel, bias), dtype=self.dtype)` reads as
    one assignment.

    Arguments:
        args: a tuple of arrays or values `jnp.asarray` takes; None entries (a missing
            bias) are returned as None.
        dtype: the dtype to cast to, or None to infer it (see `canonicalize_dtype`).
        inexact: require a floating or complex dtype (see `canonicalize_dtype`).

    Returns:
        A tuple of arrays of that dtype (and the Nones), in the order of `args`.

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_nn.dtypes import promote_dtype
        >>> x, bias = promote_dtype((jnp.ones(2), None), dtype=jnp.bfloat16)
        >>> x.dtype, bias
        (dtype(bfloat16), None)
    """
    if not isinstance(args, tuple):
        raise TypeError(
            f"promote_dtype takes the values as one tuple, e.g. promote_dtype((x, kernel)); "
            f"got a {type(args).__name__}."
        )
    dtype = canonicalize_dtype(*args, dtype=dtype, inexact=inexact)
    return tuple(None if x is None else jnp.asarray(x, dtype) for x in args)  # type: ignore[return-value]
