"""Wrappers that reparametrise a layer's weight: `WeightNorm` and `SpectralNorm`."""

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pytree_module
from pytree_graph import BatchStat, Param, Variable

from ._checks import check_number
from ._module import Module
from ._normalization import _squared_magnitude
from ._rngs import as_rngs
from ._stateful import State

# As in Equinox: the power iterations run at construction, so that the first call already
# starts from a good estimate of the leading singular vectors.
_INITIAL_POWER_ITERATIONS = 15


def _array_attributes(layer: Any) -> list[str]:
    """The names of `layer`'s attributes that hold a Variable or an array."""
    return sorted(
        name
        for name, value in vars(layer).items()
        if isinstance(value, Variable | jax.Array | np.ndarray)
    )


def _checked_weight(wrapper: str, layer: Any, weight_name: Any) -> jax.Array:
    """The value of `layer`'s weight `weight_name`, after checking the layer can be wrapped:
    a pytree_module Module whose attribute is a Param (or array) of floating point values."""
    if not isinstance(layer, pytree_module.Module):
        raise TypeError(
            f"{wrapper} wraps a layer (a Module, such as Linear or Conv), got "
            f"{type(layer).__name__}."
        )
    if not isinstance(weight_name, str):
        raise TypeError(
            f"{wrapper}: weight_name must be the name of the layer's weight attribute (a "
            f"str such as 'kernel'), got {weight_name!r}."
        )
    layer_name = type(layer).__name__
    if weight_name not in vars(layer):
        raise AttributeError(
            f"{wrapper}: {layer_name} has no attribute {weight_name!r}. Pass the name of its "
            f"weight as weight_name=; its arrays are {_array_attributes(layer)} (the "
            "layers of pytree_nn call their weight 'kernel')."
        )
    held = getattr(layer, weight_name)
    value = held.value if isinstance(held, Variable) else held
    if not isinstance(value, jax.Array | np.ndarray) or not jnp.issubdtype(
        value.dtype, jnp.inexact
    ):
        shown = type(value).__name__ if not hasattr(value, "dtype") else f"{value.dtype} array"
        raise TypeError(
            f"{wrapper}: {layer_name}.{weight_name} must be a Param (or array) of floating "
            f"point values, got a {type(held).__name__} holding {shown}. Pass the name of "
            f"the weight as weight_name=; the layer's arrays are {_array_attributes(layer)}."
        )
    return jnp.asarray(value)


def _call_with_weight(
    layer: Any, weight_name: str, weight: jax.Array, *args: Any, **kwargs: Any
) -> Any:
    """Call `layer` with `weight` in place of its weight, leaving `layer` unchanged.

    The call goes to a shallow copy of the layer (through the pickling protocol, so frozen
    Modules can be copied too) whose weight attribute holds a new Variable of the same type
    and metadata. Its other Variables and submodules are the layer's own: whatever else the
    layer updates as it runs (a dropout key counter, a batch statistic) reaches the original,
    and unlike writing the weight into the layer's own Param, nothing is written to it, so a
    layer captured by a `jax.jit` function (rather than passed in) can still be called.
    """
    held = getattr(layer, weight_name)
    replacement = held.replace(value=weight) if isinstance(held, Variable) else weight
    values, data_keys = layer.__getstate__()
    copy = type(layer).__new__(type(layer))
    copy.__setstate__(({**values, weight_name: replacement}, data_keys))
    return copy(*args, **kwargs)


class WeightNorm(Module):
    """Weight normalisation: reparametrise a layer's weight as `g * v / ||v||`.

    The direction `v` of each output unit's weights and their length `g` are learned
    separately (Salimans & Kingma, 2016). `v` is the wrapped layer's own weight Param
    (`layer.kernel` by default), and `g` a new Param holding the norms, initialised to
    `||v||` so that the wrapped layer first computes what it computed before. The norm is
    taken over every axis of the weight except `axis`, and `g` has the weight's rank with
    size 1 on those axes. Each call applies the layer with the weight `g * v / ||v||`; the
    layer itself keeps `v`.

    The default `axis=-1` normalises the weights of each output unit for the layers of
    pytree_nn, whose kernels keep the output features last: `Linear`'s kernel is
    `(in, out)`, `Conv`'s and `ConvTranspose`'s `(*kernel_size, in, out)` (for
    `ConvTranspose(transpose_kernel=True)`, whose kernel is `(*kernel_size, out, in)`, pass
    `axis=-2`). Equinox's `axis=0` does the same for its `(out, in, ...)` weights.

    Arguments:
        layer: the layer to wrap (a Module, such as `Linear` or `Conv`).
        weight_name: the name of the layer's weight attribute, a Param (or array).
        axis: the axis that is not normalised over (one norm per entry along it); None
            normalises over the whole weight (one norm).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear, WeightNorm
        >>> layer = WeightNorm(Linear(3, 2, rngs=0))
        >>> layer.g.value.shape  # one norm per output unit
        (1, 2)
        >>> x = jnp.ones((4, 3))
        >>> bool(jnp.allclose(layer(x), layer.layer(x)))  # g starts at ||v||
        True
        >>> layer.g.value = jnp.ones((1, 2))
        >>> jnp.linalg.norm(layer.normalized_weight(), axis=0).round(4).tolist()
        [1.0, 1.0]
    """

    def __init__(self, layer: Module, weight_name: str = "kernel", axis: int | None = -1):
        weight = _checked_weight("WeightNorm", layer, weight_name)
        if axis is not None:
            if isinstance(axis, bool) or not isinstance(axis, int):
                raise TypeError(
                    f"WeightNorm: axis must be an int or None, got {axis!r}; for example "
                    "axis=-1 for one norm per output unit of a pytree_nn layer."
                )
            if not -weight.ndim <= axis < weight.ndim:
                raise ValueError(
                    f"WeightNorm: axis={axis} is out of range for "
                    f"{type(layer).__name__}.{weight_name} of shape {weight.shape} (rank "
                    f"{weight.ndim}); pass an axis in [{-weight.ndim}, {weight.ndim - 1}], "
                    "or None for a single norm."
                )
        self.layer = layer
        self.weight_name = weight_name
        self.axis = axis
        self.g = Param(self._norm(weight))

    def _norm(self, v: jax.Array) -> jax.Array:
        """`||v||` over every axis but `axis`, those axes kept with size 1."""
        axes = tuple(a for a in range(v.ndim) if self.axis is None or a != self.axis % v.ndim)
        return jnp.sqrt(jnp.sum(_squared_magnitude(v), axis=axes, keepdims=True))

    def normalized_weight(self) -> jax.Array:
        """The weight the layer is called with, `g * v / ||v||`.

        Returns:
            An array of the shape of the layer's weight.
        """
        v = _checked_weight("WeightNorm", self.layer, self.weight_name)
        return v * (self.g.value / self._norm(v)).astype(v.dtype)

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        """Apply the layer to `x` (and any further arguments) with the normalised weight."""
        return _call_with_weight(
            self.layer, self.weight_name, self.normalized_weight(), x, *args, **kwargs
        )


def _matrix(weight: jax.Array) -> jax.Array:
    """The weight as a matrix with one column per output feature (its last axis)."""
    return weight.reshape(-1, weight.shape[-1])


def _power_iteration(
    matrix: jax.Array, u: jax.Array, v: jax.Array, eps: float
) -> tuple[jax.Array, jax.Array]:
    """One power iteration towards the leading singular vectors: `u` (one entry per
    column of `matrix`, i.e. per output feature) and `v` (one per row)."""

    def normalize(a: jax.Array) -> jax.Array:
        return a / jnp.maximum(eps, jnp.sqrt(jnp.sum(_squared_magnitude(a))))

    u = normalize(v @ matrix)
    return u, normalize(matrix @ u)


def _divided_by_sigma(weight: jax.Array, u: jax.Array, v: jax.Array) -> jax.Array:
    """`weight` divided by the estimate `sigma = v @ matrix @ u` of its largest singular
    value (by 1 where that is 0: a zero weight stays zero rather than turning into NaN)."""
    u, v = lax.stop_gradient(u), lax.stop_gradient(v)
    sigma = v @ _matrix(weight) @ u
    return weight / jnp.where(sigma == 0, 1, sigma).astype(weight.dtype)


class SpectralNorm(Module):
    """Spectral normalisation: divide a layer's weight by its largest singular value.

    The largest singular value `sigma` is estimated by power iteration (Miyato et al.,
    2018), so the wrapped layer is called with `weight / sigma`, whose spectral norm is
    about 1. The weight is read as a matrix with one column per output feature: its last
    axis, the output features of pytree_nn's `Linear` `(in, out)` and `Conv`
    `(*kernel_size, in, out)`, with all other axes flattened in order into the rows
    (`kernel.reshape(-1, out)`). The estimate of the leading singular vectors is state:
    `u` (one entry per output feature) and `v` (one per row), BatchStat Variables drawn
    from `rngs` and refined by 15 power iterations when the layer is built.

    In training mode (how every Module starts; `model.train()`) each call first runs
    `num_power_iterations` more power iterations and writes the new `u` and `v` back in
    place, as BatchNorm does its running averages (so `pytree_graph.jit` and the other
    graph transforms carry the update out). In evaluation mode (`model.eval()`, or
    `use_running_average=True`) the stored vectors are used and left unchanged. The
    iterations see the weight under `lax.stop_gradient`; `sigma = v @ matrix @ u` is then
    differentiated with the weight, as in Equinox.

    Equinox's way works too: called as `y, state = layer(x, state)` with a `State` (from
    `make_with_state`), it reads `u` and `v` from the State and returns the updated State,
    leaving its Variables as they are.

    Arguments:
        layer: the layer to wrap (a Module, such as `Linear` or `Conv`).
        weight_name: the name of the layer's weight attribute, a Param (or array) of at
            least two dimensions.
        num_power_iterations: the power iterations of each call in training mode (>= 1).
        eps: the smallest norm a vector is divided by while it is normalised.
        use_running_average: start in evaluation mode.
        rngs: an `Rngs`, a PRNG key or an int seed (the initial vectors are drawn with a
            key from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear, SpectralNorm
        >>> layer = SpectralNorm(Linear(4, 3, rngs=0), rngs=1)
        >>> layer.u.value.shape, layer.v.value.shape
        ((3,), (4,))
        >>> y = layer(jnp.ones((2, 4)))  # training mode: u and v are updated
        >>> round(float(jnp.linalg.norm(layer.normalized_weight(), ord=2)), 4)
        1.0
        >>> u = layer.u.value
        >>> y = layer.eval()(jnp.ones((2, 4)))  # evaluation mode: u and v are kept
        >>> bool((layer.u.value == u).all())
        True
    """

    # The Variables an Equinox-style State holds for it (see `make_with_state`).
    _state_variables = ("u", "v")

    def __init__(
        self,
        layer: Module,
        weight_name: str = "kernel",
        num_power_iterations: int = 1,
        eps: float = 1e-12,
        *,
        use_running_average: bool = False,
        rngs: Any = None,
    ):
        weight = _checked_weight("SpectralNorm", layer, weight_name)
        if weight.ndim < 2:
            raise ValueError(
                f"SpectralNorm: {type(layer).__name__}.{weight_name} has shape "
                f"{weight.shape}, but spectral normalisation needs a weight of at least two "
                "dimensions (a matrix, or a convolution kernel). Pass the name of such a "
                "weight as weight_name=."
            )
        if (
            isinstance(num_power_iterations, bool)
            or not isinstance(num_power_iterations, int)
            or num_power_iterations < 1
        ):
            raise ValueError(
                "SpectralNorm: num_power_iterations must be an int >= 1, got "
                f"{num_power_iterations!r}. To keep the vectors fixed, use evaluation mode "
                "(model.eval() or use_running_average=True) instead."
            )
        eps = check_number("SpectralNorm", "eps", eps, 0.0, math.inf)
        if not isinstance(use_running_average, bool):
            raise TypeError(
                "SpectralNorm: use_running_average must be True or False, got "
                f"{use_running_average!r}."
            )
        key = as_rngs(rngs, "SpectralNorm").params()
        matrix = lax.stop_gradient(_matrix(weight))
        u_key, v_key = jax.random.split(key)
        u = jax.random.normal(u_key, matrix.shape[1:], matrix.dtype)
        v = jax.random.normal(v_key, matrix.shape[:1], matrix.dtype)
        for _ in range(_INITIAL_POWER_ITERATIONS):
            u, v = _power_iteration(matrix, u, v, eps)
        self.layer = layer
        self.weight_name = weight_name
        self.num_power_iterations = num_power_iterations
        self.eps = eps
        self.use_running_average = use_running_average
        self.u = BatchStat(u)
        self.v = BatchStat(v)
        # The key of its entry in an Equinox-style State (see make_with_state).
        self.state_key = None

    def normalized_weight(self) -> jax.Array:
        """The weight divided by the largest singular value estimated from the stored `u`
        and `v` (without running any power iteration).

        Returns:
            An array of the shape of the layer's weight.
        """
        weight = _checked_weight("SpectralNorm", self.layer, self.weight_name)
        return _divided_by_sigma(weight, self.u.value, self.v.value)

    def __call__(
        self, x: Any, *args: Any, use_running_average: bool | None = None, **kwargs: Any
    ) -> Any:
        """Apply the layer to `x` (and any further arguments) with the normalised weight.

        Arguments:
            x: the layer's input.
            *args: further arguments of the layer's call; a `State` first (Equinox's
                `y, state = layer(x, state)`) holds `u` and `v` in place of the Variables,
                and the call returns `(y, new_state)`.
            use_running_average: override the mode for this call (True: use the stored
                `u` and `v` and keep them; False: run the power iterations and update them).
            **kwargs: further keyword arguments of the layer's call.

        Returns:
            The layer's output; with a `State`, the pair `(output, new_state)`.
        """
        state = None
        if args and isinstance(args[0], State):
            state, args = args[0], args[1:]
        if use_running_average is None:
            use_running_average = self.use_running_average
        elif not isinstance(use_running_average, bool):
            raise TypeError(
                "SpectralNorm: use_running_average must be True, False or None, got "
                f"{use_running_average!r}."
            )
        weight = _checked_weight("SpectralNorm", self.layer, self.weight_name)
        if state is None:
            u, v = self.u.value, self.v.value
        else:
            vectors = state.get(self)
            u, v = vectors["u"], vectors["v"]
        if not use_running_average:
            matrix = lax.stop_gradient(_matrix(weight))
            for _ in range(self.num_power_iterations):
                u, v = _power_iteration(matrix, u, v, self.eps)
            if state is None:
                self.u.value, self.v.value = u, v
            else:
                state = state.set(self, {"u": u, "v": v})
        normalized = _divided_by_sigma(weight, u, v)
        y = _call_with_weight(self.layer, self.weight_name, normalized, x, *args, **kwargs)
        return y if state is None else (y, state)
