"""Layers with a kernel of any shape: `Einsum` and `LinearGeneral`, as Flax NNX has them."""

import functools
import math
import string
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import initializers
from ._checks import check_metadata, check_weight
from ._dtypes import add_bias, check_preferred_element_type, promote_dtype
from ._linear import default_kernel_init, draw, sharded_param
from ._module import Module
from ._rngs import as_rngs

_LETTERS = frozenset(string.ascii_letters)
_EXAMPLE = "e.g. 'btd,dh->bth' (input subscripts, a comma, the kernel's, '->', the output's)"


def _shape(layer: str, name: str, shape: Any) -> tuple[int, ...]:
    """`shape` as a tuple of ints >= 0, or an error naming the argument."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise TypeError(f"{layer}: {name} must be a tuple of ints, e.g. (4, 8); got {shape!r}.")
    for size in shape:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"{layer}: {name} must be a tuple of ints >= 0, e.g. (4, 8); got {shape!r}."
            )
    return tuple(shape)


# ------------------------------------------------------------------------------ Einsum


class _Equation(NamedTuple):
    """An Einsum equation, checked: the string without spaces and the three subscripts."""

    string: str
    inputs: str
    kernel: str
    output: str


def _check_subscripts(equation: str, role: str, subscripts: str, ellipsis: bool) -> None:
    """Refuse subscripts that are not letters (and one '...' where `ellipsis` allows it)."""
    letters = subscripts.replace("...", "", 1) if ellipsis else subscripts
    bad = sorted(set(letters) - _LETTERS)
    if bad:
        allowed = "letters (and one '...' for any number of axes)" if ellipsis else "letters"
        fix = ""
        if not ellipsis and "..." in subscripts:
            fix = " The kernel has a fixed shape (kernel_shape): name each axis with a letter."
        raise ValueError(
            f"Einsum: einsum_str {equation!r} has {''.join(bad)!r} in the {role}'s subscripts "
            f"{subscripts!r}, which may hold only {allowed}.{fix}"
        )


def _equation(einsum_str: Any, kernel_shape: tuple[int, ...]) -> _Equation:
    """`einsum_str` without spaces and split, after checking that it has the two operands an
    Einsum takes (input, kernel), an explicit output and one letter per kernel axis."""
    if not isinstance(einsum_str, str):
        raise TypeError(f"Einsum: einsum_str must be a string, {_EXAMPLE}; got {einsum_str!r}.")
    return _parsed(einsum_str, kernel_shape)


# Parsed once per string and kernel shape: a layer called eagerly parses nothing twice.
@functools.lru_cache(maxsize=256)
def _parsed(einsum_str: str, kernel_shape: tuple[int, ...]) -> _Equation:
    """`_equation` for a string."""
    equation = einsum_str.replace(" ", "")
    if equation.count("->") != 1:
        problem = "has no '->'" if "->" not in equation else "has more than one '->'"
        raise ValueError(
            f"Einsum: einsum_str {einsum_str!r} {problem}: write the output's subscripts "
            f"explicitly after one '->', {_EXAMPLE}."
        )
    operands, output = equation.split("->")
    if operands.count(",") != 1:
        raise ValueError(
            f"Einsum: einsum_str {einsum_str!r} has {operands.count(',') + 1} operands, but an "
            f"Einsum takes exactly two, the input and the kernel, separated by one comma, "
            f"{_EXAMPLE}."
        )
    inputs, kernel = operands.split(",")
    _check_subscripts(einsum_str, "input", inputs, ellipsis=True)
    _check_subscripts(einsum_str, "kernel", kernel, ellipsis=True)
    _check_subscripts(einsum_str, "output", output, ellipsis=True)
    if "..." in kernel:
        inputs, kernel, output = _name_kernel_ellipsis(
            einsum_str, inputs, kernel, output, kernel_shape
        )
        equation = f"{inputs},{kernel}->{output}"
    if len(kernel) != len(kernel_shape):
        raise ValueError(
            f"Einsum: einsum_str {einsum_str!r} names {len(kernel)} kernel axes ({kernel!r}), "
            f"but kernel_shape={kernel_shape} has {len(kernel_shape)}: give one letter per "
            "kernel axis."
        )
    unknown = sorted(set(output.replace("...", "")) - set(inputs) - set(kernel))
    if unknown:
        raise ValueError(
            f"Einsum: einsum_str {einsum_str!r} has output subscripts {''.join(unknown)!r} "
            "that are in neither the input's nor the kernel's; an output axis must come from "
            "one of them."
        )
    if "..." in output and "..." not in inputs:
        raise ValueError(
            f"Einsum: einsum_str {einsum_str!r} has '...' in the output but not in the input; "
            "write '...' in the input's subscripts too, where the extra axes are."
        )
    return _Equation(equation, inputs, kernel, output)


def _name_kernel_ellipsis(
    einsum_str: str, inputs: str, kernel: str, output: str, kernel_shape: tuple[int, ...]
) -> tuple[str, str, str]:
    """The subscripts with the kernel's '...' written as letters not used elsewhere.

    The kernel has a fixed shape, so its '...' stands for a known number of axes: as in
    NumPy's broadcasting (and Flax NNX), they are the last axes of the input's and the
    output's '...'. Naming them lets the bias cover them, as it covers every output axis
    that comes from the kernel.
    """
    count = len(kernel_shape) - len(kernel.replace("...", ""))
    if count < 0:
        raise ValueError(
            f"Einsum: einsum_str {einsum_str!r} names {len(kernel.replace('...', ''))} kernel "
            f"axes besides '...' ({kernel!r}), but kernel_shape={kernel_shape} has only "
            f"{len(kernel_shape)}: give one letter per kernel axis."
        )
    free = [c for c in sorted(_LETTERS) if c not in inputs + kernel + output]
    if len(free) < count:
        raise ValueError(
            f"Einsum: einsum_str {einsum_str!r} uses too many letters to name the {count} "
            "kernel axes its '...' stands for; name some kernel axes with letters."
        )
    named = "".join(free[:count])
    kernel = kernel.replace("...", named)
    if "..." in inputs:
        return inputs.replace("...", "..." + named), kernel, output.replace("...", "..." + named)
    return inputs, kernel, output.replace("...", named)


def _bias_sizes(equation: _Equation, kernel_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The sizes of the output axes that come from the kernel, in output order: what the bias
    is added over (as in NNX, the other output axes are broadcast)."""
    return tuple(
        kernel_shape[equation.kernel.index(letter)]
        for letter in equation.output
        if letter in equation.kernel
    )


def _check_bias_shape(
    equation: _Equation, kernel_shape: tuple[int, ...], bias_shape: tuple[int, ...]
) -> None:
    """Refuse a bias that does not have one entry per element of the kernel's output axes."""
    sizes = _bias_sizes(equation, kernel_shape)
    if math.prod(bias_shape) != math.prod(sizes):
        kept = "".join(letter for letter in equation.output if letter in equation.kernel)
        raise ValueError(
            f"Einsum: bias_shape={bias_shape} does not fit einsum_str {equation.string!r}: "
            f"the output axes that come from the kernel ({kept!r}) have sizes {sizes}, so "
            f"give bias_shape={sizes} (or None, for no bias)."
        )


class Einsum(Module):
    """A layer that applies `jnp.einsum(einsum_str, inputs, kernel)` and adds a bias, as
    Flax NNX's `nnx.Einsum`.

    `einsum_str` has two operands, the input and the kernel, and an explicit output, e.g.
    `"btd,dnh->btnh"` (a projection to `n` heads of size `h`). The kernel has
    `kernel_shape`, one size per letter of its subscripts; the input's letters that the
    kernel shares must have the kernel's sizes. `"..."` in the input and the output stands
    for any number of axes (batch axes); in the kernel it stands for the kernel axes its
    letters leave unnamed, which are the last axes of the input's and the output's `"..."`
    (as NumPy broadcasts them, and as in NNX: `"d...ab,bc...->ad...c"`). Spaces are
    ignored.

    The bias (with `bias_shape`) is added over the output axes that come from the kernel
    and broadcast over the others, as in NNX: for `"nta,hab->nthb"` and kernel shape
    `(8, 2, 4)` the bias has shape `(8, 4)`, the sizes of `h` and `b`. NNX reshapes the
    bias to those axes, so a `bias_shape` with as many elements in another shape works
    too.

    Arguments:
        einsum_str: the equation, `"<input>,<kernel>-><output>"`; None to give it at each
            call instead.
        kernel_shape: the kernel's shape, one size per letter of the kernel's subscripts.
        bias_shape: the bias's shape (see above), or None for no bias.
        dtype: the dtype to compute in (None: promote the input's and the parameters').
        param_dtype: the dtype of the parameters.
        precision: the einsum's precision (`jax.lax.Precision`), or None.
        kernel_init: initializer of the kernel, called with `kernel_shape` (LeCun normal
            by default, whose fans are the last two axes, as in NNX).
        bias_init: initializer of the bias, called with `bias_shape`.
        preferred_element_type: the dtype the einsum accumulates in and returns (None: the
            operands' dtype), e.g. `jnp.float32` for bfloat16 inputs; the bias is then
            added in the wider of this dtype and the bias's, as in Flax NNX.
        kernel_sharding: how to split the kernel over a device mesh: one entry per kernel
            dimension (a mesh axis name, a tuple of names or None), as for `Linear`.
        bias_sharding: the same for the bias, one entry per bias dimension.
        kernel_metadata: more metadata for the kernel's Param, a mapping of names to
            hashable values (see `Linear`'s `kernel_metadata`).
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream: the
            kernel's, then the bias's, as in NNX).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Einsum
        >>> layer = Einsum("nta,hab->nthb", (8, 2, 4), (8, 4), rngs=0)
        >>> layer.kernel.value.shape, layer.bias.value.shape
        ((8, 2, 4), (8, 4))
        >>> layer(jnp.ones((16, 11, 2))).shape
        (16, 11, 8, 4)
        >>> heads = Einsum("...d,dnh->...nh", (6, 2, 3), rngs=0)
        >>> heads(jnp.ones((5, 7, 6))).shape
        (5, 7, 2, 3)
    """

    def __init__(
        self,
        einsum_str: str | None,
        kernel_shape: Sequence[int],
        bias_shape: Sequence[int] | None = None,
        *,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: initializers.Initializer = default_kernel_init,
        bias_init: initializers.Initializer = initializers.zeros,
        preferred_element_type: Any = None,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        kernel_shape = _shape("Einsum", "kernel_shape", kernel_shape)
        bias_shape = None if bias_shape is None else _shape("Einsum", "bias_shape", bias_shape)
        if einsum_str is not None:
            equation = _equation(einsum_str, kernel_shape)
            if bias_shape is not None:
                _check_bias_shape(equation, kernel_shape, bias_shape)
            einsum_str = equation.string
        check_preferred_element_type("Einsum", preferred_element_type)
        kernel_sharding, kernel_metadata = check_metadata(
            "Einsum",
            "kernel_metadata",
            kernel_metadata,
            "kernel_sharding",
            kernel_sharding,
            len(kernel_shape),
        )
        if bias_shape is None and (bias_sharding is not None or bias_metadata):
            given = "bias_sharding" if bias_sharding is not None else "bias_metadata"
            raise ValueError(
                f"Einsum: {given} was given but bias_shape is None (no bias); give "
                f"bias_shape=..., or leave {given} out."
            )
        if bias_shape is not None:
            bias_sharding, bias_metadata = check_metadata(
                "Einsum",
                "bias_metadata",
                bias_metadata,
                "bias_sharding",
                bias_sharding,
                len(bias_shape),
            )
        rngs = as_rngs(rngs, "Einsum")
        kernel = draw(kernel_init, rngs.params(), kernel_shape, param_dtype)
        self.kernel = sharded_param(kernel, kernel_sharding, kernel_metadata)
        if bias_shape is None:
            self.bias = None
        else:
            bias = draw(bias_init, rngs.params(), bias_shape, param_dtype)
            self.bias = sharded_param(bias, bias_sharding, bias_metadata)
        self.einsum_str = einsum_str
        self.kernel_shape = kernel_shape
        self.bias_shape = bias_shape
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.preferred_element_type = preferred_element_type

    def __call__(self, inputs: jax.Array, einsum_str: str | None = None) -> jax.Array:
        """Apply the layer to `inputs`.

        Arguments:
            inputs: an array whose axes the input's subscripts name.
            einsum_str: an equation to use for this call instead of the layer's (as NNX
                allows); it must fit the layer's kernel and bias shapes.

        Returns:
            `jnp.einsum(einsum_str, inputs, kernel)` plus the bias, broadcast over the
            output axes that do not come from the kernel.
        """
        if einsum_str is None:
            einsum_str = self.einsum_str
            if einsum_str is None:
                raise ValueError(
                    "Einsum: this layer was built with einsum_str=None, so each call must "
                    f"give one: layer(inputs, einsum_str=...), {_EXAMPLE}."
                )
        equation = _equation(einsum_str, self.kernel_shape)
        if self.bias_shape is not None and einsum_str != self.einsum_str:
            _check_bias_shape(equation, self.kernel_shape, self.bias_shape)
        kernel = check_weight(
            self, "kernel", f"kernel_shape={self.kernel_shape}", self.kernel_shape
        )
        bias = None
        if self.bias is not None:
            bias = check_weight(self, "bias", f"bias_shape={self.bias_shape}", self.bias_shape)
        _check_einsum_input(equation, inputs, kernel)
        inputs, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        y = jnp.einsum(
            equation.string,
            inputs,
            kernel,
            precision=self.precision,
            preferred_element_type=self.preferred_element_type,
        )
        if bias is None:
            return y
        return add_bias(y, jnp.reshape(bias, _bias_broadcast_shape(equation, kernel, y.ndim)))


def _check_einsum_input(equation: _Equation, inputs: Any, kernel: jax.Array) -> None:
    """Refuse an input of another rank than its subscripts name, or whose axes shared with
    the kernel differ in size from the kernel's, naming the axis and the letter."""
    shape = jnp.shape(inputs)
    named = equation.inputs.replace("...", "")
    if "..." in equation.inputs:
        if len(shape) < len(named):
            raise ValueError(
                f"Einsum: einsum_str {equation.string!r} names at least {len(named)} input "
                f"axes ({equation.inputs!r}), got an input of shape {shape}."
            )
        before, after = equation.inputs.split("...")
        positions = {c: i for i, c in enumerate(before)}
        positions.update({c: len(shape) - len(after) + i for i, c in enumerate(after)})
    else:
        if len(shape) != len(named):
            raise ValueError(
                f"Einsum: einsum_str {equation.string!r} names {len(named)} input axes "
                f"({equation.inputs!r}), got an input of shape {shape} ({len(shape)} axes)."
            )
        positions = {c: i for i, c in enumerate(named)}
    kernel_shape = jnp.shape(kernel)
    for letter, axis in positions.items():
        if letter in equation.kernel:
            want = kernel_shape[equation.kernel.index(letter)]
            if shape[axis] != want:
                raise ValueError(
                    f"Einsum: the input's axis {axis} ({letter!r} in {equation.string!r}) has "
                    f"size {shape[axis]}, but the kernel's axis {letter!r} has size {want} "
                    f"(kernel shape {kernel_shape}); give an input of size {want} there."
                )


def _bias_broadcast_shape(equation: _Equation, kernel: jax.Array, ndim: int) -> tuple[int, ...]:
    """The bias's shape as added to an output of rank `ndim`: the kernel's size on output
    axes that come from the kernel, 1 elsewhere ('...' axes included)."""
    sizes = []
    for letter in equation.output.replace("...", "."):
        if letter == ".":
            sizes.extend([1] * (ndim - len(equation.output) + 3))
        elif letter in equation.kernel:
            sizes.append(jnp.shape(kernel)[equation.kernel.index(letter)])
        else:
            sizes.append(1)
    return tuple(sizes)


# ------------------------------------------------------------------------------ LinearGeneral


def _int_tuple(layer: str, name: str, value: Any, smallest: int, example: str) -> tuple[int, ...]:
    """An int or a non-empty sequence of ints (each >= `smallest`), as a tuple."""
    values = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(values, Sequence)
        or isinstance(values, str)
        or not values
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        or any(v < smallest for v in values)
    ):
        wanted = "ints" if smallest < 0 else f"ints >= {smallest}"
        raise ValueError(
            f"{layer}: {name} must be an int or a non-empty tuple of {wanted}, e.g. "
            f"{example}; got {value!r}."
        )
    return tuple(values)


def _batch_axis(batch_axis: Any) -> dict[int, int]:
    """`batch_axis` checked: a mapping from the leading axes 0, 1, ... to their sizes."""
    if not isinstance(batch_axis, Mapping):
        raise TypeError(
            "LinearGeneral: batch_axis must be a mapping from axis to size, e.g. {0: 4} for "
            f"a leading batch axis of size 4 with its own kernel per entry; got {batch_axis!r}."
        )
    for axis, size in batch_axis.items():
        for value in (axis, size):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    "LinearGeneral: batch_axis must map int axes to int sizes, e.g. {0: 4}; "
                    f"got {dict(batch_axis)!r}."
                )
        if size < 1:
            raise ValueError(
                f"LinearGeneral: batch_axis gives axis {axis} the size {size}; sizes must be "
                "positive."
            )
    if set(batch_axis) != set(range(len(batch_axis))):
        raise ValueError(
            f"LinearGeneral: batch_axis has axes {sorted(batch_axis)}, but batch axes must be "
            "the leading ones, 0, 1, ... (as in Flax NNX): move them to the front of the "
            f"input, e.g. batch_axis={{0: ...}}; got {dict(batch_axis)!r}."
        )
    return {axis: batch_axis[axis] for axis in sorted(batch_axis)}


class LinearGeneral(Module):
    """A dense layer over any axes of its input, with any number of output axes, as Flax
    NNX's `nnx.LinearGeneral`.

    The input's axes `axis` (sizes `in_features`) are contracted with a kernel of shape
    `(*batch sizes, *in_features, *out_features)`; the output has the input's other axes,
    then `out_features`. As in NNX, `in_features` lists the sizes of the contracted axes
    in increasing axis order (after negative axes are counted from the end): with
    `axis=(1, -1)` on a rank-3 input, `in_features[0]` is the size of axis 1.

    `batch_axis` (a mapping from the input's leading axes 0, 1, ... to their sizes) gives
    each entry of those axes its own kernel and bias (a batched matmul): the kernel and
    bias get those sizes in front.

    The kernel is drawn as NNX draws it: the initializer is called on the flattened shape
    `(batch * prod(in_features), prod(out_features))` and the draw reshaped, so that
    fan-in and fan-out are the total input and output sizes, and the same key gives NNX's
    numbers; the bias likewise, drawn flat.

    Arguments:
        in_features: the sizes of the contracted axes: an int or a tuple.
        out_features: the sizes of the output's new trailing axes: an int or a tuple.
        axis: the input axes to contract (an int or a tuple, negative counting from the
            end), as many as `in_features`.
        batch_axis: a mapping from the input's leading axes to their sizes, for a kernel
            per entry of those axes (default: none).
        use_bias: whether to add a bias, of shape `(*batch sizes, *out_features)`.
        dtype: the dtype to compute in (None: promote the input's and the parameters').
        param_dtype: the dtype of the parameters.
        kernel_init: initializer of the kernel, called with the flattened shape (above).
        bias_init: initializer of the bias, called with the flattened shape.
        precision: the matmul precision (`jax.lax.Precision`), or None.
        preferred_element_type: the dtype the matmul accumulates in and returns (None: the
            operands' dtype), e.g. `jnp.float32` for bfloat16 inputs; the bias is then
            added in the wider of this dtype and the bias's, as in Flax NNX.
        kernel_sharding: how to split the kernel over a device mesh: one entry per kernel
            dimension (a mesh axis name, a tuple of names or None), as for `Linear`.
        bias_sharding: the same for the bias.
        kernel_metadata: more metadata for the kernel's Param (see `Linear`).
        bias_metadata: the same for the bias.
        rngs: an `Rngs`, a PRNG key or an int seed (keys from its `params` stream).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import LinearGeneral
        >>> layer = LinearGeneral((2, 3), (4, 5), axis=(1, -1), rngs=0)
        >>> layer.kernel.value.shape, layer.bias.value.shape
        ((2, 3, 4, 5), (4, 5))
        >>> layer(jnp.ones((16, 2, 3))).shape
        (16, 4, 5)
        >>> per_head = LinearGeneral(6, 2, batch_axis={0: 3}, rngs=0)
        >>> per_head.kernel.value.shape, per_head(jnp.ones((3, 7, 6))).shape
        ((3, 6, 2), (3, 7, 2))
    """

    def __init__(
        self,
        in_features: int | Sequence[int],
        out_features: int | Sequence[int],
        *,
        axis: int | Sequence[int] = -1,
        batch_axis: Mapping[int, int] | None = None,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_init: initializers.Initializer = default_kernel_init,
        bias_init: initializers.Initializer = initializers.zeros,
        precision: Any = None,
        preferred_element_type: Any = None,
        kernel_sharding: Any = None,
        bias_sharding: Any = None,
        kernel_metadata: Mapping[str, Any] | None = None,
        bias_metadata: Mapping[str, Any] | None = None,
        rngs: Any = None,
    ):
        layer = "LinearGeneral"
        in_features = _int_tuple(layer, "in_features", in_features, 1, "8 or (4, 2)")
        out_features = _int_tuple(layer, "out_features", out_features, 1, "8 or (4, 2)")
        axis = _int_tuple(layer, "axis", axis, -math.inf, "-1 or (-2, -1)")
        if len(axis) != len(in_features):
            raise ValueError(
                f"LinearGeneral: axis={axis} names {len(axis)} axes but in_features="
                f"{in_features} gives {len(in_features)} sizes; give one size per "
                "contracted axis."
            )
        if len(set(axis)) != len(axis):
            raise ValueError(f"LinearGeneral: axis={axis} names an axis twice.")
        batch = _batch_axis({} if batch_axis is None else batch_axis)
        overlap = sorted(set(axis) & set(batch))
        if overlap:
            raise ValueError(
                f"LinearGeneral: axis {overlap[0]} is both contracted (axis={axis}) and a "
                f"batch axis (batch_axis={batch}); an axis can be only one of them."
            )
        if not isinstance(use_bias, bool):
            raise TypeError(f"LinearGeneral: use_bias must be True or False, got {use_bias!r}.")
        check_preferred_element_type(layer, preferred_element_type)
        batch_shape = tuple(batch.values())
        kernel_shape = (*batch_shape, *in_features, *out_features)
        bias_shape = (*batch_shape, *out_features)
        kernel_sharding, kernel_metadata = check_metadata(
            layer,
            "kernel_metadata",
            kernel_metadata,
            "kernel_sharding",
            kernel_sharding,
            len(kernel_shape),
        )
        bias_sharding, bias_metadata = check_metadata(
            layer, "bias_metadata", bias_metadata, "bias_sharding", bias_sharding, len(bias_shape)
        )
        rngs = as_rngs(rngs, layer)
        # NNX draws the kernel as a matrix of (all inputs, all outputs) and reshapes it, so
        # that the initializer's fans are the total sizes (not those of the last two axes).
        flat = (math.prod(batch_shape) * math.prod(in_features), math.prod(out_features))
        kernel = draw(kernel_init, rngs.params(), flat, param_dtype).reshape(kernel_shape)
        self.kernel = sharded_param(kernel, kernel_sharding, kernel_metadata)
        if use_bias:
            flat_bias = (math.prod(bias_shape),)
            bias = draw(bias_init, rngs.params(), flat_bias, param_dtype).reshape(bias_shape)
            self.bias = sharded_param(bias, bias_sharding, bias_metadata)
        else:
            self.bias = None
        self.in_features = in_features
        self.out_features = out_features
        self.axis = axis
        self.batch_axis = batch
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.preferred_element_type = preferred_element_type

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Apply the layer to `inputs`, whose axes `axis` have sizes `in_features` and whose
        leading axes have the sizes `batch_axis` gives.

        Arguments:
            inputs: the input array.

        Returns:
            An array with the input's axes other than `axis`, then `out_features`.
        """
        batch_shape = tuple(self.batch_axis.values())
        kernel_shape = (*batch_shape, *self.in_features, *self.out_features)
        sizes = (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"batch_axis={self.batch_axis}"
        )
        kernel = check_weight(self, "kernel", sizes, kernel_shape)
        bias = None
        if self.bias is not None:
            bias = check_weight(self, "bias", sizes, (*batch_shape, *self.out_features))
        n_batch = len(batch_shape)
        # The kernel's own sizes: inside `shard_map` it holds its local shard, and so do the
        # inputs.
        local = jnp.shape(kernel)
        axes = self._contracted_axes(inputs, local[n_batch : n_batch + len(self.in_features)])
        shape = jnp.shape(inputs)
        batch_axes = tuple(range(n_batch))
        inputs, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        y = lax.dot_general(
            inputs,
            kernel,
            ((axes, tuple(range(n_batch, n_batch + len(axes)))), (batch_axes, batch_axes)),
            precision=self.precision,
            preferred_element_type=self.preferred_element_type,
        )
        if bias is None:
            return y
        # The output is (batch axes, the input's other axes, out_features): the bias has
        # the batch sizes in front and is broadcast over the other axes.
        kept = [shape[a] if a < n_batch else 1 for a in range(len(shape)) if a not in axes]
        out = local[n_batch + len(self.in_features) :]
        return add_bias(y, jnp.reshape(bias, (*kept, *out)))

    def _contracted_axes(self, inputs: Any, in_sizes: tuple[int, ...]) -> tuple[int, ...]:
        """The contracted axes of `inputs`, counted from 0 and in increasing order, after
        checking them and the batch axes against the input's shape."""
        shape = jnp.shape(inputs)
        ndim = len(shape)
        if any(not -ndim <= a < ndim for a in self.axis) or len(self.batch_axis) > ndim:
            raise ValueError(
                f"LinearGeneral: axis={self.axis} (with batch_axis={self.batch_axis}) does not "
                f"fit an input of shape {shape} ({ndim} axes)."
            )
        axes = tuple(sorted(a % ndim for a in self.axis))
        if len(set(axes)) != len(axes) or set(axes) & set(self.batch_axis):
            raise ValueError(
                f"LinearGeneral: axis={self.axis} gives the axes {axes} of an input of shape "
                f"{shape}, which repeat an axis or include a batch axis "
                f"(batch_axis={self.batch_axis}); each axis may be contracted once, and not "
                "be a batch axis."
            )
        for a, size in self.batch_axis.items():
            if shape[a] != size:
                raise ValueError(
                    f"LinearGeneral expects inputs whose batch axis {a} has size {size} "
                    f"(batch_axis={self.batch_axis}), got an input of shape {shape}."
                )
        got = tuple(shape[a] for a in axes)
        if got != in_sizes:
            split = (
                ""
                if in_sizes == self.in_features
                else f" split over the mesh ({in_sizes} in each shard)"
            )
            raise ValueError(
                f"LinearGeneral expects inputs whose axes {axes} (axis={self.axis}, in "
                f"increasing order) have sizes in_features={self.in_features}{split}, got an "
                f"input of shape {shape}, whose sizes there are {got}."
            )
        return axes
