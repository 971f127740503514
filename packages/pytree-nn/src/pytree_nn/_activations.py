"""Activation layers with parameters: `PReLU`."""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from pytree_graph import Param

from ._checks import check_features, check_input, check_metadata
from ._dtypes import promote_dtype, with_rank
from ._module import Module


class PReLU(Module):
    """A leaky ReLU with a learnt slope: `where(x >= 0, x, negative_slope * x)`.

    The slope is a `Param` named `negative_slope`. By default it is a scalar shared by
    every element (as in Equinox); with `num_parameters=n` it holds one slope per
    channel, of shape `(n,)`, over the last (channels) axis of inputs of shape
    `(..., n)`.

    Arguments:
        init_alpha: the initial slope: a number, or (without `num_parameters`) an array
            whose shape broadcasts to the inputs' shape, e.g. `(channels,)`. Named as in
            Equinox's `PReLU(init_alpha=0.25)`; None (the default) means 0.25.
        num_parameters: None (the slope has the shape of `init_alpha`), or the number of
            channels, for one slope per channel, each starting at `init_alpha`.
        negative_slope_init: Flax NNX's name for `init_alpha` (`PReLU(negative_slope_init=0.01)`);
            give one of the two. Its default here is `init_alpha`'s, 0.25 (NNX's is 0.01).
        dtype: the dtype to compute in (None: promote the input's and the slope's).
        param_dtype: the dtype of the slope.
        negative_slope_metadata: more metadata for the slope's Param, a mapping of names
            to hashable values (see `Linear`'s `kernel_metadata`).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import PReLU
        >>> PReLU()(jnp.array([-2.0, 3.0])).tolist()
        [-0.5, 3.0]
        >>> layer = PReLU(0.1, num_parameters=2)
        >>> layer.negative_slope.value.shape, layer(-jnp.ones((5, 2))).shape
        ((2,), (5, 2))
        >>> float(PReLU(negative_slope_init=0.01).negative_slope.value)  # NNX's spelling
        0.009999999776482582
    """

    def __init__(
        self,
        init_alpha: Any = None,
        num_parameters: int | None = None,
        *,
        negative_slope_init: Any = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        negative_slope_metadata: Mapping[str, Any] | None = None,
    ):
        if init_alpha is not None and negative_slope_init is not None:
            raise TypeError(
                f"PReLU got init_alpha={init_alpha!r:.40} and negative_slope_init="
                f"{negative_slope_init!r:.40}: two names (negative_slope_init is Flax NNX's) "
                "for the initial slope. Give one of them."
            )
        if init_alpha is None:
            init_alpha = 0.25 if negative_slope_init is None else negative_slope_init
        init_dtype = getattr(init_alpha, "dtype", None)
        if not (
            (isinstance(init_alpha, int | float) and not isinstance(init_alpha, bool))
            or (init_dtype is not None and jnp.issubdtype(init_dtype, jnp.number))
        ):
            raise TypeError(
                "PReLU(init_alpha=...) must be a number or a numeric array (the initial "
                f"slope), got {type(init_alpha).__name__} {init_alpha!r:.60}; e.g. "
                "PReLU(init_alpha=0.25)."
            )
        if num_parameters is None:
            slope = jnp.asarray(init_alpha, param_dtype)
        else:
            check_features("PReLU", num_parameters=num_parameters)
            if jnp.ndim(init_alpha) != 0:
                raise ValueError(
                    f"PReLU: with num_parameters={num_parameters}, init_alpha must be a "
                    f"number (each channel's first slope), got an array of shape "
                    f"{jnp.shape(init_alpha)}. Pass the array without num_parameters."
                )
            slope = jnp.full((num_parameters,), init_alpha, param_dtype)
        # The slope has no sharding argument: a `sharding` entry is the only way to give one.
        sharding, metadata = check_metadata(
            "PReLU",
            "negative_slope_metadata",
            negative_slope_metadata,
            "sharding",
            None,
            slope.ndim,
        )
        if sharding is not None:
            metadata["sharding"] = sharding
        self.negative_slope = Param(slope, **metadata)
        self.num_parameters = num_parameters
        self.dtype = dtype
        self.param_dtype = param_dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the activation to `x`; the output has the shape of `x`."""
        if self.num_parameters is not None:
            check_input("PReLU", x, -1, self.num_parameters, "num_parameters")
        slope = self.negative_slope.value
        shape = jnp.shape(x)
        # A slope that would broadcast the input to a larger shape is a mistake in the
        # slope's shape, not a request for more outputs.
        try:
            fits = jnp.broadcast_shapes(shape, slope.shape) == shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(
                f"PReLU: the slope of shape {slope.shape} does not broadcast to the input "
                f"of shape {shape}; give init_alpha a shape that does, e.g. "
                f"(channels,) = {shape[-1:]}."
            )
        x, slope = promote_dtype(x, with_rank(slope, len(shape)), dtype=self.dtype)
        return jnp.where(x >= 0, x, slope * x)
