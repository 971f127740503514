"""Dense layers: `Linear` and `MLP`."""

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from pytree_graph import Param

from . import initializers
from ._checks import check_features, check_input, check_sharding, check_weight
from ._dtypes import promote_dtype, with_rank
from ._flat_draws import flat_when_eager
from ._module import Module
from ._rngs import as_rngs
from ._stacked import stack_layers

default_kernel_init = initializers.lecun_normal()


def sharded_param(value: jax.Array, sharding: tuple[Any, ...] | None) -> Param:
    """A Param, with `sharding` metadata only where a sharding was given (so that models
    built without one keep the metadata, and the checkpoints, they had)."""
    return Param(value) if sharding is None else Param(value, sharding=sharding)


def kernel_and_bias(
    layer: str,
    kernel_init: initializers.Initializer,
    bias_init: initializers.Initializer,
    kernel_shape: tuple[int, ...],
    out_features: int,
    use_bias: bool,
    param_dtype: Any,
    rngs: Any,
    kernel_sharding: Any = None,
    bias_sharding: Any = None,
) -> tuple[Param, Param | None]:
    """A layer's `kernel` and `bias` (None without `use_bias`), keys from `rngs.params`,
    with the shardings given (checked first, so a bad one draws no keys)."""
    kernel_sharding = check_sharding(layer, "kernel_sharding", kernel_sharding, len(kernel_shape))
    bias_sharding = check_sharding(layer, "bias_sharding", bias_sharding, 1)
    kernel_key = rngs.params()
    if math.prod(kernel_shape) == 0:
        # An empty kernel (no input features) has nothing to draw, and fan-in scaled
        # initializers would divide by its zero fan-in. Its key is drawn all the same, so
        # the bias gets the key it would get in any other layer.
        value = jnp.zeros(kernel_shape, param_dtype)
    else:
        value = kernel_init(flat_when_eager(kernel_key), kernel_shape, param_dtype)
    kernel = sharded_param(value, kernel_sharding)
    if not use_bias:
        return kernel, None
    bias_value = bias_init(flat_when_eager(rngs.params()), (out_features,), param_dtype)
    bias = sharded_param(bias_value, bias_sharding)
    return kernel, bias


class Linear(Module):
    """A dense layer, `y = x @ kernel + bias`, over the last axis of any input.

    Arguments:
        in_features: size of the input's last axis; 0 is allowed (an empty kernel of
            shape `(0, out_features)`: the output is the bias).
        out_features: size of the output's last axis; 0 is allowed (an empty output).
        use_bias: whether to add a bias.
        dtype: the dtype to compute in (None: promote the input's and the parameters').
        param_dtype: the dtype of the parameters.
        precision: the matmul precision (`jax.lax.Precision`), or None.
        kernel_init: initializer of the kernel, of shape `(in_features, out_features)`.
        bias_init: initializer of the bias, of shape `(out_features,)`.
        kernel_sharding: how to split the kernel over a device mesh: one entry per
            dimension, a mesh axis name, a tuple of names or None (not split), e.g.
            `(None, "model")`. Stored as the Param's `sharding` metadata, which
            `pytree_graph.get_named_sharding` and `pytree_graph.create_sharded` read.
        bias_sharding: the same for the bias, e.g. `("model",)`.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear
        >>> layer = Linear(3, 4, rngs=0)
        >>> layer(jnp.ones((2, 5, 3))).shape, layer.kernel.value.shape
        ((2, 5, 4), (3, 4))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: initializers.Initializer = default_kernel_init,
        bias_init: initializers.Initializer = initializers.zeros,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        rngs: Any = None,
    ):
        # Zero features are allowed (as in Equinox): no input features give the bias, no
        # output features an empty output.
        check_features("Linear", smallest=0, in_features=in_features, out_features=out_features)
        rngs = as_rngs(rngs, "Linear")
        self.kernel, self.bias = kernel_and_bias(
            "Linear",
            kernel_init,
            bias_init,
            (in_features, out_features),
            out_features,
            use_bias,
            param_dtype,
            rngs,
            kernel_sharding,
            bias_sharding,
        )
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the layer to `x`, of shape `(..., in_features)`."""
        kernel = _checked_kernel(self)
        check_input("Linear", x, -1, self.in_features, "in_features", _local(kernel, 0, self))
        bias = self.bias.value if self.bias is not None else None
        x, kernel, bias = promote_dtype(x, kernel, bias, dtype=self.dtype)
        y = jnp.matmul(x, kernel, precision=self.precision)
        return y if bias is None else y + with_rank(bias, y.ndim)


def _checked_kernel(layer: Linear) -> jax.Array:
    """The kernel's value, checked against `(in_features, out_features)` (a local shard of
    it inside `shard_map`)."""
    sizes = f"in_features={layer.in_features}, out_features={layer.out_features}"
    return check_weight(layer, "kernel", sizes, (layer.in_features, layer.out_features))


def _local(kernel: jax.Array, axis: int, layer: Linear) -> int | None:
    """The kernel's size on its input axis where it is a shard (inside `shard_map`), else None."""
    size = kernel.shape[axis]
    return None if size == layer.in_features else size


def _identity(x: Any) -> Any:
    return x


class MLP(Module):
    """A multi-layer perceptron, as Equinox's: `depth` hidden layers of `width_size`.

    With `scan=True` (and `depth >= 1`), the `depth - 1` hidden layers of shape
    `width_size -> width_size` are held as one stacked `Linear`, whose `kernel` and `bias`
    have a leading layer axis, and run with `jax.lax.scan`: the traced program (and so
    the compile time) stays the same size for any depth. `layers` is then always
    `(first, stacked, last)`, as in Equinox: `layers[1].kernel.value` has shape
    `(depth - 1, width_size, width_size)` (length 0 for `depth=1`, where the scan runs no
    step). With `depth=0` (a single `Linear`) there is nothing to stack, and `scan` changes
    nothing. The layers draw their keys in the same order either way, so for the same
    `rngs` the parameters, outputs and gradients are those of `scan=False`, stacked.
    Call the stacked layer through the MLP (or `jax.lax.scan`): called on its own, it
    raises an error saying so (its kernel has a layer axis).

    Arguments:
        in_size: size of the input's last axis (0 allowed, see `Linear`).
        out_size: size of the output's last axis (0 allowed).
        width_size: size of each hidden layer (0 allowed).
        depth: the number of hidden layers (0: a single `Linear`).
        activation: applied after each hidden layer.
        final_activation: applied to the output.
        use_bias: whether the hidden layers have biases.
        use_final_bias: whether the last layer has one.
        dtype: the dtype to compute in (None: promote).
        param_dtype: the dtype of the parameters.
        scan: hold the `width_size -> width_size` layers stacked, and run them with
            `jax.lax.scan` (see above).
        kernel_sharding: how to split every layer's kernel over a device mesh, one entry
            per dimension (see `Linear`), e.g. `("data", None)` to shard each kernel's
            rows (fully sharded data parallel). The stacked kernel of `scan=True` gets
            None for its layer axis: `(None, "data", None)`.
        bias_sharding: the same for every bias.
        rngs: an `Rngs`, a PRNG key or an int seed.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import MLP
        >>> mlp = MLP(2, 1, width_size=8, depth=2, rngs=0)
        >>> len(mlp.layers), mlp(jnp.ones((5, 2))).shape
        (3, (5, 1))
        >>> deep = MLP(2, 1, width_size=8, depth=50, scan=True, rngs=0)
        >>> len(deep.layers), deep.layers[1].kernel.value.shape
        (3, (49, 8, 8))
        >>> deep(jnp.ones((5, 2))).shape
        (5, 1)
    """

    def __init__(
        self,
        in_size: int,
        out_size: int,
        width_size: int,
        depth: int,
        activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
        final_activation: Callable[[jax.Array], jax.Array] = _identity,
        use_bias: bool = True,
        use_final_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        *,
        scan: bool = False,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        rngs: Any = None,
    ):
        # Zero sizes are allowed, as in Equinox (see Linear).
        check_features("MLP", smallest=0, in_size=in_size, out_size=out_size, width_size=width_size)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"MLP: depth must be an int >= 0, got {depth!r}.")
        # Checked before the first layer draws a key.
        kernel_sharding = check_sharding("MLP", "kernel_sharding", kernel_sharding, 2)
        bias_sharding = check_sharding("MLP", "bias_sharding", bias_sharding, 1)
        if not isinstance(scan, bool):
            raise TypeError(f"MLP: scan must be True or False, got {scan!r}.")
        rngs = as_rngs(rngs, "MLP")

        def linear(din: int, dout: int, bias: bool, rngs: Any) -> Linear:
            return Linear(
                din,
                dout,
                use_bias=bias,
                dtype=dtype,
                param_dtype=param_dtype,
                kernel_sharding=kernel_sharding,
                bias_sharding=bias_sharding,
                rngs=rngs,
            )

        if scan and depth >= 1:
            # Built in the order of the unstacked layers, so they draw the same keys.
            first = linear(in_size, width_size, use_bias, rngs)
            stacked = stack_layers(
                lambda rngs: linear(width_size, width_size, use_bias, rngs), depth - 1, rngs
            )
            self.layers = (first, stacked, linear(width_size, out_size, use_final_bias, rngs))
        else:
            sizes = [in_size] + [width_size] * depth + [out_size]
            last = len(sizes) - 2
            self.layers = tuple(
                linear(din, dout, use_final_bias if i == last else use_bias, rngs)
                for i, (din, dout) in enumerate(itertools.pairwise(sizes))
            )
        self.activation = activation
        self.final_activation = final_activation
        self.in_size = in_size
        self.out_size = out_size
        self.width_size = width_size
        self.depth = depth
        self.scan = scan

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the network to `x`, of shape `(..., in_size)`."""
        if self.scan and self.depth >= 1:
            first, stacked, last = self.layers

            def hidden(x: jax.Array, layer: Linear) -> tuple[jax.Array, None]:
                return self.activation(layer(x)), None

            x, _ = jax.lax.scan(hidden, self.activation(first(x)), stacked)
            return self.final_activation(last(x))
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.final_activation(self.layers[-1](x))
