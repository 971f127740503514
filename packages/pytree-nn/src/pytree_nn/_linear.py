"""Dense layers: `Linear` and `MLP`."""

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp

from pytree_filter import is_array
from pytree_graph import Param
from pytree_transforms import filter_vmap

from . import initializers
from ._checks import check_features, check_input, check_metadata, check_weight
from ._dtypes import add_bias, check_preferred_element_type, promote_dtype
from ._flat_draws import flat_when_eager
from ._module import Module
from ._rngs import as_rngs
from ._stacked import map_arrays, stack_layers

Size = int | Literal["scalar"]

default_kernel_init = initializers.lecun_normal()


def sharded_param(
    value: jax.Array, sharding: tuple[Any, ...] | None, metadata: Mapping[str, Any] | None = None
) -> Param:
    """A Param, with `sharding` metadata only where a sharding was given (so that models
    built without one keep the metadata, and the checkpoints, they had), and the entries
    of `metadata` (checked by `check_metadata`)."""
    metadata = {} if metadata is None else metadata
    return (
        Param(value, **metadata)
        if sharding is None
        else Param(value, sharding=sharding, **metadata)
    )


def draw(
    init: initializers.Initializer, key: jax.Array, shape: tuple[int, ...], dtype: Any
) -> jax.Array:
    """`init(key, shape, dtype)`, or zeros where the shape is empty: there is nothing to
    draw, and fan-in scaled initializers would divide by a zero fan-in."""
    if math.prod(shape) == 0:
        return jnp.zeros(shape, dtype)
    return init(flat_when_eager(key), shape, dtype)


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
    kernel_metadata: Any = None,
    bias_metadata: Any = None,
) -> tuple[Param, Param | None]:
    """A layer's `kernel` and `bias` (None without `use_bias`), keys from `rngs.params`,
    with the shardings and metadata given (checked first, so a bad one draws no keys)."""
    kernel_sharding, kernel_metadata = check_metadata(
        layer,
        "kernel_metadata",
        kernel_metadata,
        "kernel_sharding",
        kernel_sharding,
        len(kernel_shape),
    )
    bias_sharding, bias_metadata = check_metadata(
        layer, "bias_metadata", bias_metadata, "bias_sharding", bias_sharding, 1
    )
    # An empty kernel's key is drawn all the same, so that the bias gets the key it would
    # get in any other layer.
    value = draw(kernel_init, rngs.params(), kernel_shape, param_dtype)
    kernel = sharded_param(value, kernel_sharding, kernel_metadata)
    if not use_bias:
        return kernel, None
    bias_value = draw(bias_init, rngs.params(), (out_features,), param_dtype)
    bias = sharded_param(bias_value, bias_sharding, bias_metadata)
    return kernel, bias


def check_size(layer: str, **sizes: Any) -> None:
    """Refuse sizes that are neither an int >= 0 nor the string "scalar", naming the
    argument."""
    for name, size in sizes.items():
        if isinstance(size, str) and size == "scalar":
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"{layer}: {name} must be an int >= 0, got {size!r}; or the string "
                '"scalar", for inputs or outputs without a feature axis.'
            )


def _features(size: Size) -> int:
    """The size of a kernel's axis for a layer size: 1 for "scalar"."""
    return 1 if size == "scalar" else size


class Linear(Module):
    """A dense layer, `y = x @ kernel + bias`, over the last axis of any input.

    Either size may be the string `"scalar"`, as in Equinox: with
    `in_features="scalar"` the input has no feature axis (each of its elements is one
    input, so a 0-d input gives one output vector, and an input of shape `(batch,)` a
    batch of them); with `out_features="scalar"` the output has none (a 0-d output for
    a 0-d or 1-d input). The kernel then has size 1 on that axis, and the bias, with
    `out_features="scalar"`, shape `(1,)`.

    Arguments:
        in_features: size of the input's last axis; 0 is allowed (an empty kernel of
            shape `(0, out_features)`: the output is the bias), and so is `"scalar"`
            (inputs without a feature axis).
        out_features: size of the output's last axis; 0 is allowed (an empty output),
            and so is `"scalar"` (outputs without a feature axis).
        use_bias: whether to add a bias.
        dtype: the dtype to compute in (None: promote the input's and the parameters').
        param_dtype: the dtype of the parameters.
        precision: the matmul precision (`jax.lax.Precision`), or None.
        preferred_element_type: the dtype the matmul accumulates in and returns (None:
            the operands' dtype), e.g. `jnp.float32` for bfloat16 inputs; the bias is
            then added in the wider of this dtype and the bias's, as in Flax NNX.
        kernel_init: initializer of the kernel, of shape `(in_features, out_features)`.
        bias_init: initializer of the bias, of shape `(out_features,)`.
        kernel_sharding: how to split the kernel over a device mesh: one entry per
            dimension, a mesh axis name, a tuple of names or None (not split), e.g.
            `(None, "model")`. Stored as the Param's `sharding` metadata, which
            `pytree_graph.get_named_sharding` and `pytree_graph.create_sharded` read.
        bias_sharding: the same for the bias, e.g. `("model",)`.
        kernel_metadata: more metadata for the kernel's Param, a mapping of names to
            hashable values, as Flax NNX's (`{"tag": "proj"}` gives `kernel.tag`). Its
            `sharding` entry (or NNX's name, `out_sharding`) is the kernel's sharding,
            another way to give `kernel_sharding` (give one of them).
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear
        >>> layer = Linear(3, 4, rngs=0)
        >>> layer(jnp.ones((2, 5, 3))).shape, layer.kernel.value.shape
        ((2, 5, 4), (3, 4))
        >>> to_scalar = Linear(3, "scalar", rngs=0)
        >>> to_scalar(jnp.ones(3)).shape, to_scalar.kernel.value.shape
        ((), (3, 1))
        >>> Linear("scalar", 4, rngs=0)(jnp.ones(())).shape
        (4,)
    """

    def __init__(
        self,
        in_features: Size,
        out_features: Size,
        *,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        preferred_element_type: Any = None,
        kernel_init: initializers.Initializer = default_kernel_init,
        bias_init: initializers.Initializer = initializers.zeros,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        # Zero features are allowed (as in Equinox): no input features give the bias, no
        # output features an empty output.
        # Errors name the class made (a subclass such as LoRALinear shares these checks).
        layer = type(self).__name__
        check_size(layer, in_features=in_features, out_features=out_features)
        check_preferred_element_type(layer, preferred_element_type)
        if not isinstance(use_bias, bool):
            raise TypeError(f"{layer}: use_bias must be True or False, got {use_bias!r}.")
        rngs = as_rngs(rngs, layer)
        self.kernel, self.bias = kernel_and_bias(
            layer,
            kernel_init,
            bias_init,
            (_features(in_features), _features(out_features)),
            _features(out_features),
            use_bias,
            param_dtype,
            rngs,
            kernel_sharding,
            bias_sharding,
            kernel_metadata,
            bias_metadata,
        )
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.preferred_element_type = preferred_element_type

    def __call__(self, x: jax.Array, out_sharding: Any = None) -> jax.Array:
        """Apply the layer to `x`, of shape `(..., in_features)` (any shape with
        `in_features="scalar"`); the output has shape `(..., out_features)` (`(...)` with
        `out_features="scalar"`).

        Arguments:
            x: the input.
            out_sharding: None, or the sharding of the output (a `PartitionSpec` or a
                `NamedSharding`, one entry per output dimension), under a mesh with
                explicit axes (`jax.sharding.AxisType.Explicit`), as in Flax NNX: the
                matmul computes the output in that layout.

        Returns:
            The output.
        """
        kernel = _checked_kernel(self)
        if self.in_features == "scalar":
            x = jnp.expand_dims(jnp.asarray(x), -1)
        else:
            check_input(
                type(self).__name__,
                x,
                -1,
                self.in_features,
                "in_features",
                _local(kernel, 0, self),
            )
        bias = self.bias.value if self.bias is not None else None
        x, kernel, bias = promote_dtype(x, kernel, bias, dtype=self.dtype)
        scalar_out = self.out_features == "scalar"
        y = jnp.matmul(
            x,
            kernel,
            precision=self.precision,
            preferred_element_type=self.preferred_element_type,
            out_sharding=None if scalar_out else out_sharding,
        )
        y = add_bias(y, bias)
        if not scalar_out:
            return y
        # The output sharding names the dimensions left once the size-1 axis is dropped.
        y = y[..., 0]
        return y if out_sharding is None else jax.sharding.reshard(y, out_sharding)


def _checked_kernel(layer: Linear) -> jax.Array:
    """The kernel's value, checked against `(in_features, out_features)` (a local shard of
    it inside `shard_map`)."""
    sizes = f"in_features={layer.in_features!r}, out_features={layer.out_features!r}"
    expected = (_features(layer.in_features), _features(layer.out_features))
    return check_weight(layer, "kernel", sizes, expected)


def _local(kernel: jax.Array, axis: int, layer: Linear) -> int | None:
    """The kernel's size on its input axis where it is a shard (inside `shard_map`), else None."""
    size = kernel.shape[axis]
    return None if size == layer.in_features else size


def _identity(x: Any) -> Any:
    return x


def _has_arrays(activation: Any) -> bool:
    """Whether an activation holds arrays (a parametrised activation such as `PReLU`)."""
    return any(is_array(leaf) for leaf in jax.tree.leaves(activation))


def _replicated(activation: Any, *sizes: int) -> Any:
    """A copy of `activation` whose every array has the leading axes `sizes`, each entry a
    copy of the original (new Variables: nothing is shared with `activation`)."""

    def replicate(leaf: Any) -> Any:
        return jnp.broadcast_to(leaf, (*sizes, *jnp.shape(leaf))) if is_array(leaf) else leaf

    return map_arrays(replicate, activation)


def _entry(activation: Any, index: Any) -> Any:
    """The activation held at `index` of the leading axis of every array of `activation`."""
    return map_arrays(lambda leaf: leaf[index] if is_array(leaf) else leaf, activation)


@filter_vmap(in_axes=(0, -1), out_axes=-1)
def _per_neuron(activation: Any, x: jax.Array) -> jax.Array:
    """Each neuron (entry of the last axis of `x`) through its own copy of the activation
    (the entry of the activation's leading axis)."""
    return activation(x)


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

    A parametrised activation (a Module holding arrays, such as `PReLU()`) is copied for
    every neuron of every hidden layer, as in Equinox: `mlp.activation` holds the copies,
    every array with the leading axes `(depth, width_size)` (so `PReLU()`'s scalar slope
    becomes a Param of shape `(depth, width_size)`, each layer's and neuron's own, trained
    separately), and neuron `j` of hidden layer `i` goes through copy `[i, j]`. Likewise a
    parametrised `final_activation` gets one copy per output neuron, leading axis
    `(out_size,)` (none with `out_size="scalar"`). The copies start from the values of the
    activation passed, which is left as it was and shares nothing with the MLP.
    Activations without arrays (functions such as `jax.nn.relu`) are used as given and
    applied to the whole layer output.

    Arguments:
        in_size: size of the input's last axis (0 allowed, see `Linear`), or `"scalar"`
            for inputs without a feature axis.
        out_size: size of the output's last axis (0 allowed), or `"scalar"` for outputs
            without one.
        width_size: size of each hidden layer (0 allowed).
        depth: the number of hidden layers (0: a single `Linear`).
        activation: applied after each hidden layer (copied per neuron if it holds
            arrays, see above).
        final_activation: applied to the output (copied per output neuron if it holds
            arrays).
        use_bias: whether the hidden layers have biases.
        use_final_bias: whether the last layer has one.
        dtype: the dtype to compute in (None: promote).
        param_dtype: the dtype of the parameters.
        scan: hold the `width_size -> width_size` layers stacked, and run them with
            `jax.lax.scan` (see above).
        preferred_element_type: the dtype every layer's matmul accumulates in and returns
            (see `Linear`), or None.
        kernel_sharding: how to split every layer's kernel over a device mesh, one entry
            per dimension (see `Linear`), e.g. `("data", None)` to shard each kernel's
            rows (fully sharded data parallel). The stacked kernel of `scan=True` gets
            None for its layer axis: `(None, "data", None)`.
        bias_sharding: the same for every bias.
        kernel_metadata: more metadata for every layer's kernel (see `Linear`).
        bias_metadata: the same for every bias.
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
        >>> from pytree_nn import PReLU
        >>> learnt = MLP("scalar", "scalar", width_size=4, depth=2, activation=PReLU(), rngs=0)
        >>> learnt(jnp.ones(())).shape, learnt.activation.negative_slope.value.shape
        ((), (2, 4))
    """

    def __init__(
        self,
        in_size: Size,
        out_size: Size,
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
        preferred_element_type: Any = None,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        # Zero sizes are allowed, as in Equinox (see Linear).
        check_size("MLP", in_size=in_size, out_size=out_size)
        check_features("MLP", smallest=0, width_size=width_size)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"MLP: depth must be an int >= 0, got {depth!r}.")
        # Checked before the first layer draws a key.
        kernel_sharding, kernel_metadata = check_metadata(
            "MLP", "kernel_metadata", kernel_metadata, "kernel_sharding", kernel_sharding, 2
        )
        bias_sharding, bias_metadata = check_metadata(
            "MLP", "bias_metadata", bias_metadata, "bias_sharding", bias_sharding, 1
        )
        if not isinstance(scan, bool):
            raise TypeError(f"MLP: scan must be True or False, got {scan!r}.")
        check_preferred_element_type("MLP", preferred_element_type)
        rngs = as_rngs(rngs, "MLP")

        def linear(din: int, dout: int, bias: bool, rngs: Any) -> Linear:
            return Linear(
                din,
                dout,
                use_bias=bias,
                dtype=dtype,
                param_dtype=param_dtype,
                preferred_element_type=preferred_element_type,
                kernel_sharding=kernel_sharding,
                bias_sharding=bias_sharding,
                kernel_metadata=kernel_metadata,
                bias_metadata=bias_metadata,
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
        # A learnt activation gets its own parameters for every neuron, as in Equinox.
        self.per_neuron_activation = _has_arrays(activation)
        self.per_neuron_final_activation = out_size != "scalar" and _has_arrays(final_activation)
        self.activation = (
            _replicated(activation, depth, width_size) if self.per_neuron_activation else activation
        )
        self.final_activation = (
            _replicated(final_activation, out_size)
            if self.per_neuron_final_activation
            else final_activation
        )
        self.in_size = in_size
        self.out_size = out_size
        self.width_size = width_size
        self.depth = depth
        self.scan = scan
        self.preferred_element_type = preferred_element_type

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the network to `x`, of shape `(..., in_size)` (any shape with
        `in_size="scalar"`); the output has shape `(..., out_size)` (`(...)` with
        `out_size="scalar"`)."""
        if self.scan and self.depth >= 1:
            first, stacked, last = self.layers
            x = self._activate(0, first(x))
            if self.per_neuron_activation:

                def hidden(x: jax.Array, layer_and_activation: Any) -> tuple[jax.Array, None]:
                    layer, activation = layer_and_activation
                    return _per_neuron(activation, layer(x)), None

                hidden_activations = _entry(self.activation, slice(1, self.depth))
                x, _ = jax.lax.scan(hidden, x, (stacked, hidden_activations))
            else:

                def hidden(x: jax.Array, layer: Linear) -> tuple[jax.Array, None]:
                    return self.activation(layer(x)), None

                x, _ = jax.lax.scan(hidden, x, stacked)
            return self._finish(last(x))
        for i, layer in enumerate(self.layers[:-1]):
            x = self._activate(i, layer(x))
        return self._finish(self.layers[-1](x))

    def _activate(self, i: int, x: jax.Array) -> jax.Array:
        """The activation after hidden layer `i`."""
        if self.per_neuron_activation:
            return _per_neuron(_entry(self.activation, i), x)
        return self.activation(x)

    def _finish(self, x: jax.Array) -> jax.Array:
        """The final activation."""
        if self.per_neuron_final_activation:
            return _per_neuron(self.final_activation, x)
        return self.final_activation(x)
