"""Recurrent layers: the cells `LSTMCell`, `OptimizedLSTMCell`, `GRUCell` and
`SimpleCell`, and `RNN` and `Bidirectional` to run a cell over sequences."""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from . import initializers
from ._checks import check_features, check_input, check_metadata
from ._dtypes import promote_dtype, with_rank
from ._flat_draws import flat_when_eager
from ._linear import Linear, default_kernel_init
from ._module import Module
from ._rngs import as_rngs


def _orthogonal(key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> jax.Array:
    """An orthogonal matrix drawn in float32 and cast to `dtype`.

    The default `recurrent_kernel_init` of the cells: `initializers.orthogonal()` itself
    needs a QR decomposition, which half precision (bfloat16, float16) lacks.
    """
    return initializers.orthogonal()(key, shape, jnp.float32).astype(dtype)


class _Projections:
    """A cell's input and recurrent `Linear`s as its constructor's arguments describe them.

    Every argument is checked when this is made, before the cell draws its first key; then
    each `input(gates)` / `recurrent(gates)` call draws one `Linear` whose outputs are
    `gates` blocks of `hidden_features` (side by side, for fused gates), in call order. The
    bias goes on one side only (`bias_on`): a cell sums the two terms, so a second bias
    would be a redundant parameter.
    """

    def __init__(
        self,
        cell: str,
        in_features: int,
        hidden_features: int,
        *,
        bias_on: str,
        kernel_init: initializers.Initializer,
        recurrent_kernel_init: initializers.Initializer,
        bias_init: initializers.Initializer,
        dtype: Any,
        param_dtype: Any,
        shardings: tuple,
        metadata: tuple,
        rngs: Any,
    ):
        check_features(cell, in_features=in_features, hidden_features=hidden_features)
        kernel, recurrent, bias = [
            check_metadata(cell, f"{name}_metadata", extra, f"{name}_sharding", sharding, ndim)
            for name, ndim, sharding, extra in zip(
                ("kernel", "recurrent_kernel", "bias"), (2, 2, 1), shardings, metadata, strict=True
            )
        ]
        common = {"dtype": dtype, "param_dtype": param_dtype, "rngs": as_rngs(rngs, cell)}
        with_bias = {"bias_init": bias_init, "bias_sharding": bias[0], "bias_metadata": bias[1]}
        self._sides = {
            "input": (in_features, kernel_init, kernel, bias_on == "input"),
            "recurrent": (hidden_features, recurrent_kernel_init, recurrent, bias_on != "input"),
        }
        self._hidden_features = hidden_features
        self._common = common
        self._with_bias = with_bias

    def _draw(self, side: str, gates: int) -> Linear:
        features, kernel_init, (sharding, extra), biased = self._sides[side]
        return Linear(
            features,
            gates * self._hidden_features,
            use_bias=biased,
            kernel_init=kernel_init,
            kernel_sharding=sharding,
            kernel_metadata=extra,
            **(self._with_bias if biased else {}),
            **self._common,
        )

    def input(self, gates: int = 1) -> Linear:
        """A `Linear` from `in_features` to `gates * hidden_features`."""
        return self._draw("input", gates)

    def recurrent(self, gates: int = 1) -> Linear:
        """A `Linear` from `hidden_features` to `gates * hidden_features`."""
        return self._draw("recurrent", gates)


class _Cell(Module):
    """What `LSTMCell` and `GRUCell` share: input and carry checks, `initialize_carry`."""

    def _check_step(self, carry: Any, x: jax.Array) -> list[jax.Array]:
        """The carry's parts, after checking them and `x` against each other."""
        name = type(self).__name__
        check_input(name, x, -1, self.in_features, "in_features")
        parts = self._carry_parts(carry)
        expected = (*jnp.shape(x)[:-1], self.hidden_features)
        for part_name, part in zip(self.carry_names, parts, strict=True):
            if jnp.shape(part) != expected:
                raise ValueError(
                    f"{name}: the carry's {part_name} has shape {jnp.shape(part)}, expected "
                    f"{expected}: (*batch, hidden_features={self.hidden_features}) with the "
                    f"batch dimensions of the input, of shape {jnp.shape(x)}. Make it with "
                    "cell.initialize_carry(x.shape)."
                )
        return parts

    def initialize_carry(
        self,
        input_shape: tuple[int, ...],
        rngs: Any = None,
        carry_init: initializers.Initializer | None = None,
    ) -> Any:
        """The initial carry for inputs of shape `input_shape`: zeros by default.

        Arguments:
            input_shape: the shape of one step's input, `(*batch, in_features)`.
            rngs: an `Rngs`, a PRNG key or an int seed, for `carry_init` (keys from its
                `carry` stream); not needed for zeros.
            carry_init: an initializer `init(key, shape, dtype)` for each part of the
                carry, instead of zeros.

        Returns:
            The carry (arrays of shape `(*batch, hidden_features)` and dtype `param_dtype`).
        """
        name = type(self).__name__
        if not isinstance(input_shape, tuple | list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in input_shape
        ):
            raise TypeError(
                f"{name}.initialize_carry expects the shape of one step's input as a tuple "
                f"of ints, (*batch, in_features), e.g. x.shape; got {input_shape!r}."
            )
        if not input_shape or input_shape[-1] != self.in_features:
            raise ValueError(
                f"{name}.initialize_carry expects the shape of one step's input, (*batch, "
                f"in_features={self.in_features}), got {tuple(input_shape)}."
            )
        shape = (*input_shape[:-1], self.hidden_features)
        if carry_init is None:
            parts = [jnp.zeros(shape, self.param_dtype) for _ in self.carry_names]
        else:
            if rngs is None:
                raise TypeError(
                    f"{name}.initialize_carry needs rngs= to draw the carry with carry_init: "
                    "an Rngs, a PRNG key or an int seed, e.g. rngs=0."
                )
            rngs = as_rngs(rngs, f"{name}.initialize_carry")
            parts = [
                carry_init(flat_when_eager(rngs.carry()), shape, self.param_dtype)
                for _ in self.carry_names
            ]
        return self._carry_from_parts(parts)


class LSTMCell(_Cell):
    """A long short-term memory cell: one step, `cell((c, h), x) -> ((c', h'), h')`.

    With `gate_fn` (sigmoid) and `activation_fn` (tanh), a step computes

    ```text
    i  = gate_fn(x @ ii.kernel + h @ hi.kernel + hi.bias)         input gate
    f  = gate_fn(x @ if_.kernel + h @ hf.kernel + hf.bias)        forget gate
    g  = activation_fn(x @ ig.kernel + h @ hg.kernel + hg.bias)   candidate
    o  = gate_fn(x @ io.kernel + h @ ho.kernel + ho.bias)         output gate
    c' = f * c + i * g
    h' = o * activation_fn(c')
    ```

    `ii`, `if_`, `ig`, `io` are bias-free `Linear`s with kernels of shape
    `(in_features, hidden_features)`; `hi`, `hf`, `hg`, `ho` are `Linear`s with kernels
    of shape `(hidden_features, hidden_features)` and biases. The input may have any
    leading batch dimensions (or none); the carry has those batch dimensions too. The
    step computes in `dtype` (else the promoted type of input, carry and parameters);
    the new carry keeps the dtype of the carry given, the output `h'` is in the
    computation's dtype.

    Arguments:
        in_features: size of the input's last axis.
        hidden_features: size of the carry's parts and of the output.
        gate_fn: the gates' activation.
        activation_fn: the activation of the candidate `g` and of the output.
        kernel_init: initializer of the input kernels.
        recurrent_kernel_init: initializer of the recurrent kernels (orthogonal).
        bias_init: initializer of the biases.
        dtype: the dtype to compute in (None: promote).
        param_dtype: the dtype of the parameters and of the initial carry.
        kernel_sharding: how to split each input kernel over a device mesh, one entry per
            dimension (see `Linear`), e.g. `(None, "model")` to split the hidden units.
        recurrent_kernel_sharding: the same for each recurrent kernel.
        bias_sharding: the same for each bias, e.g. `("model",)`.
        kernel_metadata: more metadata for each input kernel's Param, a mapping of
            names to hashable values (see `Linear`'s `kernel_metadata`).
        recurrent_kernel_metadata: the same for each recurrent kernel.
        bias_metadata: the same for each bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import LSTMCell
        >>> cell = LSTMCell(3, 4, rngs=0)
        >>> x = jnp.ones((2, 3))
        >>> carry = cell.initialize_carry(x.shape)  # (c, h), zeros
        >>> (c, h), y = cell(carry, x)
        >>> c.shape, h.shape, bool((y == h).all())
        ((2, 4), (2, 4), True)
    """

    carry_names = ("c", "h")

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        *,
        gate_fn: Callable[[jax.Array], jax.Array] = jax.nn.sigmoid,
        activation_fn: Callable[[jax.Array], jax.Array] = jnp.tanh,
        kernel_init: initializers.Initializer = default_kernel_init,
        recurrent_kernel_init: initializers.Initializer = _orthogonal,
        bias_init: initializers.Initializer = initializers.zeros,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_sharding: Any = None,
        recurrent_kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        recurrent_kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        layers = _Projections(
            "LSTMCell",
            in_features,
            hidden_features,
            bias_on="recurrent",
            kernel_init=kernel_init,
            recurrent_kernel_init=recurrent_kernel_init,
            bias_init=bias_init,
            dtype=dtype,
            param_dtype=param_dtype,
            shardings=(kernel_sharding, recurrent_kernel_sharding, bias_sharding),
            metadata=(kernel_metadata, recurrent_kernel_metadata, bias_metadata),
            rngs=rngs,
        )
        self.ii, self.if_, self.ig, self.io = [layers.input() for _ in range(4)]
        self.hi, self.hf, self.hg, self.ho = [layers.recurrent() for _ in range(4)]
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.gate_fn = gate_fn
        self.activation_fn = activation_fn
        self.dtype = dtype
        self.param_dtype = param_dtype

    def _carry_parts(self, carry: Any) -> list[Any]:
        if not isinstance(carry, tuple | list) or len(carry) != 2:
            raise TypeError(
                f"{type(self).__name__}: the carry must be a pair (c, h), as "
                "initialize_carry returns; "
                f"got {type(carry).__name__}."
            )
        return list(carry)

    def _carry_from_parts(self, parts: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
        return tuple(parts)

    def __call__(
        self, carry: tuple[jax.Array, jax.Array], x: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        """One step.

        Arguments:
            carry: the pair `(c, h)`, each of shape `(*batch, hidden_features)`.
            x: the step's input, of shape `(*batch, in_features)`.

        Returns:
            `((c', h'), h')`: the new carry and the output.
        """
        c, h = self._check_step(carry, x)
        x, c_in, h_in = promote_dtype(x, c, h, self.ii.kernel.value, dtype=self.dtype)[:3]
        i = self.gate_fn(self.ii(x) + self.hi(h_in))
        f = self.gate_fn(self.if_(x) + self.hf(h_in))
        g = self.activation_fn(self.ig(x) + self.hg(h_in))
        o = self.gate_fn(self.io(x) + self.ho(h_in))
        new_c = f * c_in + i * g
        new_h = o * self.activation_fn(new_c)
        return (new_c.astype(c.dtype), new_h.astype(h.dtype)), new_h


class OptimizedLSTMCell(_Cell):
    """An `LSTMCell` whose four gates are one fused matmul: the same step, faster.

    A step computes what `LSTMCell`'s does, with the input kernels of the four gates side
    by side in one kernel and the recurrent kernels and biases likewise, in the order
    input, forget, candidate, output (`[i | f | g | o]`):

    ```text
    y = x @ dense_i.kernel + h @ dense_h.kernel + dense_h.bias   # (*batch, 4 * hidden)
    i, f, g, o = split(y, 4)
    c' = gate_fn(f) * c + gate_fn(i) * activation_fn(g)
    h' = gate_fn(o) * activation_fn(c')
    ```

    `dense_i` is a bias-free `Linear` with a kernel of shape
    `(in_features, 4 * hidden_features)`, `dense_h` a `Linear` with a kernel of shape
    `(hidden_features, 4 * hidden_features)` and a bias, as in Flax NNX. An `LSTMCell`'s
    weights concatenated in that order (`dense_i.kernel = [ii | if_ | ig | io]`,
    `dense_h.kernel = [hi | hf | hg | ho]`, `dense_h.bias` likewise) give the same
    numbers: two matmuls per step instead of eight. The carry, batch dimensions and
    dtypes are as in `LSTMCell`. The kernels are drawn whole (one draw per kernel), so
    the same `rngs` does not give an `LSTMCell`'s values.

    Arguments:
        in_features: size of the input's last axis.
        hidden_features: size of the carry's parts and of the output.
        gate_fn: the gates' activation.
        activation_fn: the activation of the candidate `g` and of the output.
        kernel_init: initializer of the input kernel, of shape
            `(in_features, 4 * hidden_features)`.
        recurrent_kernel_init: initializer of the recurrent kernel (orthogonal), of
            shape `(hidden_features, 4 * hidden_features)`.
        bias_init: initializer of the bias.
        dtype: the dtype to compute in (None: promote).
        param_dtype: the dtype of the parameters and of the initial carry.
        kernel_sharding: how to split the input kernel over a device mesh, one entry per
            dimension (see `Linear`).
        recurrent_kernel_sharding: the same for the recurrent kernel.
        bias_sharding: the same for the bias.
        kernel_metadata: more metadata for the input kernel's Param (see `Linear`'s
            `kernel_metadata`).
        recurrent_kernel_metadata: the same for the recurrent kernel.
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import OptimizedLSTMCell
        >>> cell = OptimizedLSTMCell(3, 4, rngs=0)
        >>> x = jnp.ones((2, 3))
        >>> (c, h), y = cell(cell.initialize_carry(x.shape), x)
        >>> c.shape, cell.dense_i.kernel.value.shape, cell.dense_h.kernel.value.shape
        ((2, 4), (3, 16), (4, 16))
    """

    carry_names = ("c", "h")

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        *,
        gate_fn: Callable[[jax.Array], jax.Array] = jax.nn.sigmoid,
        activation_fn: Callable[[jax.Array], jax.Array] = jnp.tanh,
        kernel_init: initializers.Initializer = default_kernel_init,
        recurrent_kernel_init: initializers.Initializer = _orthogonal,
        bias_init: initializers.Initializer = initializers.zeros,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_sharding: Any = None,
        recurrent_kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        recurrent_kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        layers = _Projections(
            "OptimizedLSTMCell",
            in_features,
            hidden_features,
            bias_on="recurrent",
            kernel_init=kernel_init,
            recurrent_kernel_init=recurrent_kernel_init,
            bias_init=bias_init,
            dtype=dtype,
            param_dtype=param_dtype,
            shardings=(kernel_sharding, recurrent_kernel_sharding, bias_sharding),
            metadata=(kernel_metadata, recurrent_kernel_metadata, bias_metadata),
            rngs=rngs,
        )
        self.dense_i = layers.input(4)
        self.dense_h = layers.recurrent(4)
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.gate_fn = gate_fn
        self.activation_fn = activation_fn
        self.dtype = dtype
        self.param_dtype = param_dtype

    _carry_parts = LSTMCell._carry_parts
    _carry_from_parts = LSTMCell._carry_from_parts

    def __call__(
        self, carry: tuple[jax.Array, jax.Array], x: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        """One step.

        Arguments:
            carry: the pair `(c, h)`, each of shape `(*batch, hidden_features)`.
            x: the step's input, of shape `(*batch, in_features)`.

        Returns:
            `((c', h'), h')`: the new carry and the output.
        """
        c, h = self._check_step(carry, x)
        x, c_in, h_in = promote_dtype(x, c, h, self.dense_i.kernel.value, dtype=self.dtype)[:3]
        i, f, g, o = jnp.split(self.dense_i(x) + self.dense_h(h_in), 4, axis=-1)
        new_c = self.gate_fn(f) * c_in + self.gate_fn(i) * self.activation_fn(g)
        new_h = self.gate_fn(o) * self.activation_fn(new_c)
        return (new_c.astype(c.dtype), new_h.astype(h.dtype)), new_h


class GRUCell(_Cell):
    """A gated recurrent unit: one step, `cell(h, x) -> (h', h')`.

    With `gate_fn` (sigmoid) and `activation_fn` (tanh), and the kernels and biases split
    in three column blocks `[r | z | n]`, a step computes

    ```text
    r  = gate_fn(x @ dense_i.kernel[r] + dense_i.bias[r] + h @ dense_h.kernel[r])
    z  = gate_fn(x @ dense_i.kernel[z] + dense_i.bias[z] + h @ dense_h.kernel[z])
    n  = activation_fn(x @ dense_i.kernel[n] + dense_i.bias[n] + r * (h @ dense_h.kernel[n]))
    h' = (1 - z) * n + z * h
    ```

    The input kernels and biases are one `Linear`, `dense_i`, of shape
    `(in_features, 3 * hidden_features)` (columns in the order r, z, n); the recurrent
    kernels one bias-free `Linear`, `dense_h`, of shape
    `(hidden_features, 3 * hidden_features)`. Batch dimensions and dtypes as in
    `LSTMCell`.

    Arguments:
        in_features: size of the input's last axis.
        hidden_features: size of the carry and of the output.
        gate_fn: the gates' activation.
        activation_fn: the activation of the candidate `n`.
        kernel_init: initializer of the input kernel.
        recurrent_kernel_init: initializer of the recurrent kernel (orthogonal).
        bias_init: initializer of the bias.
        dtype: the dtype to compute in (None: promote).
        param_dtype: the dtype of the parameters and of the initial carry.
        kernel_sharding: how to split the input kernel over a device mesh, one entry per
            dimension (see `Linear`).
        recurrent_kernel_sharding: the same for the recurrent kernel.
        bias_sharding: the same for the bias.
        kernel_metadata: more metadata for the input kernel's Param, a mapping of names
            to hashable values (see `Linear`'s `kernel_metadata`).
        recurrent_kernel_metadata: the same for the recurrent kernel.
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import GRUCell
        >>> cell = GRUCell(3, 4, rngs=0)
        >>> h = cell.initialize_carry((3,))  # unbatched: shape (hidden_features,)
        >>> h, y = cell(h, jnp.ones(3))
        >>> h.shape, cell.dense_i.kernel.value.shape
        ((4,), (3, 12))
    """

    carry_names = ("h",)

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        *,
        gate_fn: Callable[[jax.Array], jax.Array] = jax.nn.sigmoid,
        activation_fn: Callable[[jax.Array], jax.Array] = jnp.tanh,
        kernel_init: initializers.Initializer = default_kernel_init,
        recurrent_kernel_init: initializers.Initializer = _orthogonal,
        bias_init: initializers.Initializer = initializers.zeros,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_sharding: Any = None,
        recurrent_kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        recurrent_kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        layers = _Projections(
            "GRUCell",
            in_features,
            hidden_features,
            bias_on="input",
            kernel_init=kernel_init,
            recurrent_kernel_init=recurrent_kernel_init,
            bias_init=bias_init,
            dtype=dtype,
            param_dtype=param_dtype,
            shardings=(kernel_sharding, recurrent_kernel_sharding, bias_sharding),
            metadata=(kernel_metadata, recurrent_kernel_metadata, bias_metadata),
            rngs=rngs,
        )
        self.dense_i = layers.input(3)
        self.dense_h = layers.recurrent(3)
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.gate_fn = gate_fn
        self.activation_fn = activation_fn
        self.dtype = dtype
        self.param_dtype = param_dtype

    def _carry_parts(self, carry: Any) -> list[Any]:
        if isinstance(carry, tuple | list | dict):
            raise TypeError(
                f"{type(self).__name__}: the carry must be one array h, as "
                "initialize_carry returns; got a "
                f"{type(carry).__name__}."
            )
        return [carry]

    def _carry_from_parts(self, parts: list[jax.Array]) -> jax.Array:
        return parts[0]

    def __call__(self, carry: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One step.

        Arguments:
            carry: `h`, of shape `(*batch, hidden_features)`.
            x: the step's input, of shape `(*batch, in_features)`.

        Returns:
            `(h', h')`: the new carry and the output.
        """
        (h,) = self._check_step(carry, x)
        x, h_in = promote_dtype(x, h, self.dense_i.kernel.value, dtype=self.dtype)[:2]
        x_r, x_z, x_n = jnp.split(self.dense_i(x), 3, axis=-1)
        h_r, h_z, h_n = jnp.split(self.dense_h(h_in), 3, axis=-1)
        r = self.gate_fn(x_r + h_r)
        z = self.gate_fn(x_z + h_z)
        n = self.activation_fn(x_n + r * h_n)
        new_h = (1 - z) * n + z * h_in
        return new_h.astype(h.dtype), new_h


class SimpleCell(_Cell):
    """An Elman recurrent cell: one step, `cell(h, x) -> (h', h')`, with

    ```text
    h' = activation_fn(x @ dense_i.kernel + dense_i.bias + h @ dense_h.kernel)
    ```

    (`+ h` inside the activation with `residual=True`). `dense_i` is a `Linear` with a
    kernel of shape `(in_features, hidden_features)` and a bias, `dense_h` a bias-free
    `Linear` with a kernel of shape `(hidden_features, hidden_features)`, as in Flax NNX
    (which draws `dense_h`'s kernel first; so does this cell). Run it over sequences with
    `RNN`. Batch dimensions and dtypes as in `LSTMCell`.

    Arguments:
        in_features: size of the input's last axis.
        hidden_features: size of the carry and of the output.
        residual: add the carry `h` to the pre-activation (a residual connection).
        activation_fn: the activation (tanh).
        kernel_init: initializer of the input kernel.
        recurrent_kernel_init: initializer of the recurrent kernel (orthogonal).
        bias_init: initializer of the bias.
        dtype: the dtype to compute in (None: promote).
        param_dtype: the dtype of the parameters and of the initial carry.
        kernel_sharding: how to split the input kernel over a device mesh, one entry per
            dimension (see `Linear`).
        recurrent_kernel_sharding: the same for the recurrent kernel.
        bias_sharding: the same for the bias.
        kernel_metadata: more metadata for the input kernel's Param (see `Linear`'s
            `kernel_metadata`).
        recurrent_kernel_metadata: the same for the recurrent kernel.
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import RNN, SimpleCell
        >>> cell = SimpleCell(3, 5, rngs=0)
        >>> h, y = cell(cell.initialize_carry((3,)), jnp.ones(3))
        >>> h.shape, RNN(cell)(jnp.ones((2, 7, 3))).shape
        ((5,), (2, 7, 5))
    """

    carry_names = ("h",)

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        *,
        residual: bool = False,
        activation_fn: Callable[[jax.Array], jax.Array] = jnp.tanh,
        kernel_init: initializers.Initializer = default_kernel_init,
        recurrent_kernel_init: initializers.Initializer = _orthogonal,
        bias_init: initializers.Initializer = initializers.zeros,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_sharding: Any = None,
        recurrent_kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        recurrent_kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        if not isinstance(residual, bool):
            raise TypeError(f"SimpleCell: residual must be True or False, got {residual!r}.")
        layers = _Projections(
            "SimpleCell",
            in_features,
            hidden_features,
            bias_on="input",
            kernel_init=kernel_init,
            recurrent_kernel_init=recurrent_kernel_init,
            bias_init=bias_init,
            dtype=dtype,
            param_dtype=param_dtype,
            shardings=(kernel_sharding, recurrent_kernel_sharding, bias_sharding),
            metadata=(kernel_metadata, recurrent_kernel_metadata, bias_metadata),
            rngs=rngs,
        )
        # Drawn in NNX's order: the recurrent kernel first.
        self.dense_h = layers.recurrent()
        self.dense_i = layers.input()
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.residual = residual
        self.activation_fn = activation_fn
        self.dtype = dtype
        self.param_dtype = param_dtype

    _carry_parts = GRUCell._carry_parts
    _carry_from_parts = GRUCell._carry_from_parts

    def __call__(self, carry: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One step.

        Arguments:
            carry: `h`, of shape `(*batch, hidden_features)`.
            x: the step's input, of shape `(*batch, in_features)`.

        Returns:
            `(h', h')`: the new carry and the output.
        """
        (h,) = self._check_step(carry, x)
        x, h_in = promote_dtype(x, h, self.dense_i.kernel.value, dtype=self.dtype)[:2]
        pre = self.dense_i(x) + self.dense_h(h_in)
        new_h = self.activation_fn(pre + h_in if self.residual else pre)
        return new_h.astype(h.dtype), new_h


def _flip(x: jax.Array, lengths: jax.Array | None) -> jax.Array:
    """Reverse a time-first array; with lengths, each sequence's steps before its length
    and, separately, its padding after it (so the padding stays at the end)."""
    if lengths is None:
        return jnp.flip(x, 0)
    steps = x.shape[0]
    t = jnp.arange(steps).reshape((steps,) + (1,) * lengths.ndim)
    lengths = with_rank(lengths, t.ndim)
    source = jnp.where(t < lengths, lengths - 1 - t, steps - 1 + lengths - t)
    source = source.reshape(source.shape + (1,) * (x.ndim - source.ndim))
    return jnp.take_along_axis(x, source, axis=0)


def _where_batch(valid: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    """`new` where `valid` (of the batch shape, leading `new`'s), else `old`."""
    return jnp.where(valid.reshape(valid.shape + (1,) * (new.ndim - valid.ndim)), new, old)


def _describe(tree: Any) -> str:
    return str(jax.tree.map(lambda a: tuple(jnp.shape(a)), tree))


class RNN(Module):
    """Run a cell over the time axis of a sequence, with `scan`.

    Inputs have shape `(*batch, time, features)`, or `(time, *batch, features)` with
    `time_major=True`; any number of batch dimensions (or none). The cell is called
    once per step as `cell(carry, x_t) -> (carry, y_t)` and the outputs `y_t` are
    stacked along the time axis. The loop is a `jax.lax.scan` that reads the cell's
    parameters as constants: a cell must not write Variables while it runs.

    With `seq_lengths` (one length per sequence, of the batch shape), sequences are
    padded at the end: the final carry is each sequence's carry after its last step, as
    if it stopped there (lengths are clipped to `[0, time]`). The cell still runs over
    the padding, so outputs past a sequence's length are the cell's outputs on the
    padding: mask them. With `reverse=True` the sequence is read from its last step
    (with `seq_lengths`, from each sequence's last valid step, the padding staying at
    the end); the outputs then come in the order they were computed, unless
    `keep_order=True` puts them back in the inputs' order.

    Arguments:
        cell: the cell, e.g. an `LSTMCell` or `GRUCell`: called as `cell(carry, x)`,
            with `cell.initialize_carry(input_shape)` giving the default initial carry.
        time_major: whether the time axis comes first.
        return_carry: return `(final_carry, outputs)` instead of the outputs.
        reverse: run from the end of the sequence to its start.
        keep_order: with `reverse`, return the outputs in the inputs' order.
        unroll: how many steps the compiled loop unrolls.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import GRUCell, RNN
        >>> rnn = RNN(GRUCell(3, 5, rngs=0))
        >>> x = jnp.ones((2, 7, 3))  # (batch, time, features)
        >>> rnn(x).shape
        (2, 7, 5)
        >>> carry, y = rnn(x, seq_lengths=jnp.array([7, 4]), return_carry=True)
        >>> bool(jnp.allclose(carry[1], y[1, 3]))  # the carry after step 4
        True
    """

    def __init__(
        self,
        cell: Callable[..., Any],
        *,
        time_major: bool = False,
        return_carry: bool = False,
        reverse: bool = False,
        keep_order: bool = False,
        unroll: int | bool = 1,
    ):
        if not callable(cell) or not callable(getattr(cell, "initialize_carry", None)):
            raise TypeError(
                f"RNN expects a cell, such as LSTMCell or GRUCell: called as cell(carry, x) "
                f"and with a method initialize_carry(input_shape); got {type(cell).__name__}."
            )
        if not isinstance(unroll, int) or (not isinstance(unroll, bool) and unroll < 1):
            raise ValueError(f"RNN: unroll must be an int >= 1 or a bool, got {unroll!r}.")
        self.cell = cell
        self.time_major = bool(time_major)
        self.return_carry = bool(return_carry)
        self.reverse = bool(reverse)
        self.keep_order = bool(keep_order)
        self.unroll = unroll

    def __call__(
        self,
        inputs: jax.Array,
        *,
        initial_carry: Any = None,
        seq_lengths: jax.Array | None = None,
        return_carry: bool | None = None,
        time_major: bool | None = None,
        reverse: bool | None = None,
        keep_order: bool | None = None,
    ) -> Any:
        """Run the cell over `inputs`.

        Arguments:
            inputs: of shape `(*batch, time, features)` (or `(time, *batch, features)`).
            initial_carry: the carry before the first step (default: the cell's
                `initialize_carry`, zeros); it keeps its dtype through the loop.
            seq_lengths: integer lengths of the sequences, of shape `batch`.
            return_carry: override the layer's `return_carry` for this call.
            time_major: override the layer's `time_major` for this call.
            reverse: override the layer's `reverse` for this call.
            keep_order: override the layer's `keep_order` for this call.

        Returns:
            The outputs, of shape `(*batch, time, hidden)` (time first if `time_major`),
            or `(final_carry, outputs)` with `return_carry`.
        """
        return_carry = self.return_carry if return_carry is None else return_carry
        time_major = self.time_major if time_major is None else time_major
        reverse = self.reverse if reverse is None else reverse
        keep_order = self.keep_order if keep_order is None else keep_order

        inputs = jnp.asarray(inputs)
        layout = "(time, *batch, features)" if time_major else "(*batch, time, features)"
        if inputs.ndim < 2:
            raise ValueError(
                f"RNN expects inputs of shape {layout}, got shape {inputs.shape}. "
                "Set time_major to say where the time axis is."
            )
        in_features = getattr(self.cell, "in_features", None)
        if isinstance(in_features, int) and inputs.shape[-1] != in_features:
            raise ValueError(
                f"RNN: inputs of shape {inputs.shape} have {inputs.shape[-1]} features, but "
                f"the cell ({type(self.cell).__name__}) takes in_features={in_features}. "
                f"Inputs have shape {layout}."
            )
        time_axis = 0 if time_major else inputs.ndim - 2
        xs = jnp.moveaxis(inputs, time_axis, 0)
        steps, batch = xs.shape[0], xs.shape[1:-1]
        lengths = self._check_lengths(seq_lengths, batch, steps)

        if initial_carry is None:
            carry = self.cell.initialize_carry(xs.shape[1:])
        else:
            carry = initial_carry
            expected = jax.eval_shape(lambda: self.cell.initialize_carry(xs.shape[1:]))
            if jax.tree.structure(carry) != jax.tree.structure(expected) or [
                jnp.shape(a) for a in jax.tree.leaves(carry)
            ] != [a.shape for a in jax.tree.leaves(expected)]:
                raise ValueError(
                    f"RNN: initial_carry has shapes {_describe(carry)}, expected "
                    f"{_describe(expected)} (what cell.initialize_carry returns for steps "
                    f"of shape {xs.shape[1:]}, from inputs of shape {inputs.shape})."
                )

        if reverse:
            xs = _flip(xs, lengths)
        # The carry at each sequence's end is tracked only when it is returned.
        track = lengths is not None and return_carry

        cell = self.cell

        # The cell is only read inside the loop (its parameters are constants of it), so
        # a plain `lax.scan` over a closure suffices, and the RNN also works when captured
        # by a JAX transform rather than passed to it.
        def step(state: tuple, scanned: tuple) -> tuple:
            carry, final = state
            t, x = scanned
            carry, y = cell(carry, x)
            if track:
                final = jax.tree.map(
                    lambda new, old: _where_batch(t < lengths, new, old), carry, final
                )
            return (carry, final), y

        (carry, final), ys = jax.lax.scan(
            step, (carry, carry if track else None), (jnp.arange(steps), xs), unroll=self.unroll
        )
        if reverse and keep_order:
            ys = jax.tree.map(lambda y: _flip(y, lengths), ys)
        outputs = jax.tree.map(lambda y: jnp.moveaxis(y, 0, time_axis), ys)
        if return_carry:
            return (final if track else carry), outputs
        return outputs

    @staticmethod
    def _check_lengths(seq_lengths: Any, batch: tuple[int, ...], steps: int) -> Any:
        """`seq_lengths` as an integer array of the batch shape, clipped to `[0, steps]`."""
        if seq_lengths is None:
            return None
        lengths = jnp.asarray(seq_lengths)
        if not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise TypeError(
                f"RNN: seq_lengths must hold integers, got dtype {lengths.dtype}; e.g. "
                "jnp.array([5, 3])."
            )
        if lengths.shape != batch:
            raise ValueError(
                f"RNN: seq_lengths must have the batch shape {batch} (one length per "
                f"sequence), got shape {lengths.shape}."
            )
        return jnp.clip(lengths, 0, steps)


def _concatenate(a: jax.Array, b: jax.Array) -> jax.Array:
    """Join two outputs along their last axis."""
    return jnp.concatenate([a, b], axis=-1)


class Bidirectional(Module):
    """Run one RNN forwards and another backwards over a sequence, and merge outputs.

    The backward RNN reads each sequence from its last (valid) step and its outputs are
    put back in the inputs' order, so step `t` of the result merges what the forward RNN
    saw up to `t` with what the backward RNN saw from the end down to `t`.

    Arguments:
        forward_rnn: an `RNN` run forwards.
        backward_rnn: an `RNN` run backwards (its own `reverse` is ignored).
        merge_fn: `merge_fn(forward_outputs, backward_outputs)`; by default they are
            concatenated along the last axis.
        time_major: whether the time axis comes first.
        return_carry: return `((forward_carry, backward_carry), outputs)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Bidirectional, GRUCell, LSTMCell, RNN
        >>> layer = Bidirectional(RNN(LSTMCell(3, 4, rngs=0)), RNN(GRUCell(3, 2, rngs=1)))
        >>> layer(jnp.ones((5, 3))).shape  # unbatched: (time, features)
        (5, 6)
    """

    def __init__(
        self,
        forward_rnn: RNN,
        backward_rnn: RNN,
        *,
        merge_fn: Callable[[Any, Any], Any] = _concatenate,
        time_major: bool = False,
        return_carry: bool = False,
    ):
        for name, rnn in (("forward_rnn", forward_rnn), ("backward_rnn", backward_rnn)):
            if not isinstance(rnn, RNN):
                raise TypeError(
                    f"Bidirectional: {name} must be an RNN, e.g. RNN(LSTMCell(...)); got "
                    f"{type(rnn).__name__}."
                )
        if not callable(merge_fn):
            raise TypeError(f"Bidirectional: merge_fn must be callable, got {merge_fn!r}.")
        self.forward_rnn = forward_rnn
        self.backward_rnn = backward_rnn
        self.merge_fn = merge_fn
        self.time_major = bool(time_major)
        self.return_carry = bool(return_carry)

    def __call__(
        self,
        inputs: jax.Array,
        *,
        initial_carry: tuple[Any, Any] | None = None,
        seq_lengths: jax.Array | None = None,
        return_carry: bool | None = None,
        time_major: bool | None = None,
    ) -> Any:
        """Run both RNNs over `inputs` and merge their outputs.

        Arguments:
            inputs: of shape `(*batch, time, features)` (or `(time, *batch, features)`).
            initial_carry: a pair `(forward_carry, backward_carry)`, or None for zeros.
            seq_lengths: integer lengths of the sequences, of shape `batch`.
            return_carry: override the layer's `return_carry` for this call.
            time_major: override the layer's `time_major` for this call.

        Returns:
            The merged outputs, or `((forward_carry, backward_carry), outputs)`.
        """
        return_carry = self.return_carry if return_carry is None else return_carry
        time_major = self.time_major if time_major is None else time_major
        if initial_carry is None:
            forward_carry = backward_carry = None
        elif isinstance(initial_carry, tuple | list) and len(initial_carry) == 2:
            forward_carry, backward_carry = initial_carry
        else:
            raise TypeError(
                "Bidirectional: initial_carry must be a pair (forward_carry, "
                f"backward_carry), got {type(initial_carry).__name__}."
            )
        common = dict(seq_lengths=seq_lengths, return_carry=True, time_major=time_major)
        carry_f, out_f = self.forward_rnn(
            inputs, initial_carry=forward_carry, reverse=False, **common
        )
        carry_b, out_b = self.backward_rnn(
            inputs, initial_carry=backward_carry, reverse=True, keep_order=True, **common
        )
        outputs = jax.tree.map(self.merge_fn, out_f, out_b)
        if return_carry:
            return (carry_f, carry_b), outputs
        return outputs
