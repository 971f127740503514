"""Low-rank adapters (LoRA): `LoRAParam`, `LoRA` and `LoRALinear`, as in Flax NNX."""

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp

import pytree_module
from pytree_graph import Param, Variable

from . import initializers
from ._checks import check_features, check_input, check_weight
from ._dtypes import promote_dtype
from ._flat_draws import flat_when_eager
from ._linear import Linear
from ._module import Module
from ._rngs import as_rngs

default_a_initializer = initializers.he_uniform()
default_b_initializer = initializers.zeros

_NO_METADATA: Mapping[str, Any] = MappingProxyType({})


class LoRAParam(Param):
    """A LoRA adapter's parameter: a `Param`, so trained by default, and a type of its own.

    Being a `Param`, it is what `pytree_graph.grad` and `Optimizer` train unless told
    otherwise. Its own type selects the adapters alone (`wrt=LoRAParam`), and
    `All(Param, Not(LoRAParam))` (from `pytree_filter`) every other `Param`: the base
    model without its adapters.

    Examples:
        >>> import pytree_graph as pg
        >>> from pytree_filter import All, Not
        >>> from pytree_graph import Param
        >>> from pytree_nn import LoRALinear, LoRAParam
        >>> layer = LoRALinear(3, 4, lora_rank=2, rngs=0)
        >>> sorted(pg.state(layer, LoRAParam).flat_state())
        [('lora', 'lora_a'), ('lora', 'lora_b')]
        >>> sorted(pg.state(layer, All(Param, Not(LoRAParam))).flat_state())
        [('bias',), ('kernel',)]
    """


def _check_lora_param_type(layer: str, lora_param_type: Any) -> None:
    if not (isinstance(lora_param_type, type) and issubclass(lora_param_type, Variable)):
        raise TypeError(
            f"{layer}: lora_param_type must be a Variable type (a subclass of "
            f"pytree_graph.Variable, by default LoRAParam), got {lora_param_type!r}."
        )


def _check_metadata(layer: str, name: str, metadata: Any) -> None:
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise TypeError(
            f"{layer}: {name} must be a mapping of metadata names (str) to values, given to "
            f"the Variable, e.g. {{'sharding': (None, 'model')}}; got {metadata!r}."
        )


class LoRA(Module):
    """A low-rank adapter: `y = x @ lora_a @ lora_b`, plus `base_module(x)` if one is given.

    `lora_a` has shape `(in_features, lora_rank)` and `lora_b` `(lora_rank, out_features)`.
    With the default initializers `lora_b` starts at zero, so a fresh adapter adds
    nothing: wrapped around a layer, it starts as that layer. Both are `lora_param_type`
    Variables (`LoRAParam` by default), so `Optimizer(model, tx, wrt=LoRAParam)` trains
    only them.

    Arguments:
        in_features: size of the input's last axis (a positive int).
        lora_rank: the rank of the adapter (a positive int).
        out_features: size of the output's last axis (a positive int).
        base_module: a Module to call on the same input and add to the adapter's output
            (e.g. the `Linear` being adapted), or None. It is held as it is, so a layer
            also used elsewhere in the model stays one layer. A plain function can be
            wrapped in `pytree_nn.Lambda`.
        dtype: the dtype to compute in (None: promote the input's and the adapter's).
            The base module gets the input in that dtype too, as in Flax NNX.
        param_dtype: the dtype of `lora_a` and `lora_b`.
        a_initializer: initializer of `lora_a` (default He uniform, as NNX's).
        b_initializer: initializer of `lora_b` (default zeros).
        lora_param_type: the Variable type of `lora_a` and `lora_b`.
        rngs: an `Rngs`, a PRNG key or an int seed (two keys from its `params` stream:
            `lora_a`'s, then `lora_b`'s).
        a_metadata: metadata of `lora_a`'s Variable (e.g. `{"sharding": (None, None)}`).
        b_metadata: metadata of `lora_b`'s Variable.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear, LoRA
        >>> adapter = LoRA(3, 2, 4, rngs=0)
        >>> adapter.lora_a.value.shape, adapter.lora_b.value.shape
        ((3, 2), (2, 4))
        >>> base = Linear(3, 4, rngs=0)
        >>> wrapped = LoRA(3, 2, 4, base_module=base, rngs=1)
        >>> x = jnp.ones((5, 3))
        >>> bool(jnp.array_equal(wrapped(x), base(x)))  # lora_b starts at zero
        True
    """

    def __init__(
        self,
        in_features: int,
        lora_rank: int,
        out_features: int,
        *,
        base_module: Any = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        a_initializer: initializers.Initializer = default_a_initializer,
        b_initializer: initializers.Initializer = default_b_initializer,
        lora_param_type: type[Variable] = LoRAParam,
        rngs: Any = None,
        a_metadata: Mapping[str, Any] = _NO_METADATA,
        b_metadata: Mapping[str, Any] = _NO_METADATA,
    ):
        check_features(
            "LoRA", in_features=in_features, lora_rank=lora_rank, out_features=out_features
        )
        if base_module is not None and not (
            isinstance(base_module, pytree_module.Module) and callable(base_module)
        ):
            raise TypeError(
                f"LoRA: base_module must be None or a callable Module (e.g. a Linear), got "
                f"{type(base_module).__name__}: {base_module!r}. Wrap a plain function in "
                "pytree_nn.Lambda."
            )
        _check_lora_param_type("LoRA", lora_param_type)
        _check_metadata("LoRA", "a_metadata", a_metadata)
        _check_metadata("LoRA", "b_metadata", b_metadata)
        rngs = as_rngs(rngs, "LoRA")
        a_key = flat_when_eager(rngs.params())
        a_value = a_initializer(a_key, (in_features, lora_rank), param_dtype)
        b_value = b_initializer(
            flat_when_eager(rngs.params()), (lora_rank, out_features), param_dtype
        )
        self.in_features = in_features
        self.lora_rank = lora_rank
        self.out_features = out_features
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.lora_param_type = lora_param_type
        # A child even while None, so that a base can be given later (an adapter built
        # stacked, then wrapped around a stacked Linear).
        self.base_module = pytree_module.data(base_module)
        self.lora_a = lora_param_type(a_value, **a_metadata)
        self.lora_b = lora_param_type(b_value, **b_metadata)

    def __call__(self, x: jax.Array, **kwargs: Any) -> jax.Array:
        """Apply the adapter (and the base module) to `x`, of shape `(..., in_features)`.

        Keyword arguments go to the base module; without one there is nowhere for them to
        go, and they raise a TypeError."""
        if kwargs and self.base_module is None:
            raise TypeError(
                f"LoRA got keyword arguments {sorted(kwargs)}, which go to the base module, "
                "but it has none (base_module=None). Leave them out."
            )
        check_input("LoRA", x, -1, self.in_features, "in_features")
        sizes = (
            f"in_features={self.in_features}, lora_rank={self.lora_rank}, "
            f"out_features={self.out_features}"
        )
        lora_a = check_weight(self, "lora_a", sizes, (self.in_features, self.lora_rank))
        lora_b = check_weight(self, "lora_b", sizes, (self.lora_rank, self.out_features))
        x, lora_a, lora_b = promote_dtype(x, lora_a, lora_b, dtype=self.dtype)
        y = x @ lora_a @ lora_b
        if self.base_module is not None:
            y = y + self.base_module(x, **kwargs)
        return y


# The keyword arguments LoRALinear passes on to Linear.
_LINEAR_KEYWORDS = frozenset(inspect.signature(Linear.__init__).parameters) - {
    "self",
    "in_features",
    "out_features",
    "rngs",
}


class LoRALinear(Linear):
    """A `Linear` whose output gets a low-rank adapter's added: `x @ kernel + bias +
    x @ lora_a @ lora_b`.

    It is a `Linear` (same `kernel`, `bias` and arguments, so its state holds a Linear's
    and more), with the adapter a `LoRA` under the attribute `lora`, as in Flax NNX:
    `layer.lora.lora_a` and `layer.lora.lora_b`. A fresh one computes what its `Linear`
    does (`lora_b` starts at zero). Fine-tune only the adapter with
    `Optimizer(model, tx, wrt=LoRAParam)`; train the rest with
    `wrt=All(Param, Not(LoRAParam))`.

    Arguments:
        in_features: size of the input's last axis (a positive int).
        out_features: size of the output's last axis (a positive int).
        lora_rank: the rank of the adapter (a positive int).
        lora_dtype: the dtype the adapter computes in (None: promote).
        lora_param_dtype: the dtype of `lora_a` and `lora_b`.
        a_initializer: initializer of `lora_a` (default He uniform).
        b_initializer: initializer of `lora_b` (default zeros).
        lora_param_type: the Variable type of `lora_a` and `lora_b` (default `LoRAParam`).
        a_metadata: metadata of `lora_a`'s Variable.
        b_metadata: metadata of `lora_b`'s Variable.
        rngs: an `Rngs`, a PRNG key or an int seed; keys from its `params` stream, in NNX's
            order: the kernel's, the bias's, then `lora_a`'s and `lora_b`'s.
        **kwargs: the other arguments of `Linear` (`use_bias`, `dtype`, `param_dtype`,
            `precision`, `kernel_init`, `bias_init`, `kernel_sharding`, ...).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear, LoRALinear
        >>> layer = LoRALinear(3, 4, lora_rank=2, rngs=0)
        >>> layer.kernel.value.shape, layer.lora.lora_a.value.shape
        ((3, 4), (3, 2))
        >>> x = jnp.ones((5, 3))
        >>> bool(jnp.array_equal(layer(x), Linear(3, 4, rngs=0)(x)))  # same kernel, lora_b = 0
        True
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        lora_rank: int,
        lora_dtype: Any = None,
        lora_param_dtype: Any = jnp.float32,
        a_initializer: initializers.Initializer = default_a_initializer,
        b_initializer: initializers.Initializer = default_b_initializer,
        lora_param_type: type[Variable] = LoRAParam,
        rngs: Any = None,
        a_metadata: Mapping[str, Any] = _NO_METADATA,
        b_metadata: Mapping[str, Any] = _NO_METADATA,
        **kwargs: Any,
    ):
        # Everything is checked before the Linear draws its keys, so a bad argument leaves
        # the Rngs as it was.
        unknown = sorted(set(kwargs) - _LINEAR_KEYWORDS)
        if unknown:
            raise TypeError(
                f"LoRALinear got unexpected keyword argument(s) {', '.join(unknown)}: besides "
                "the adapter's (lora_rank, lora_dtype, lora_param_dtype, a_initializer, "
                "b_initializer, lora_param_type, a_metadata, b_metadata) it takes Linear's: "
                f"{', '.join(sorted(_LINEAR_KEYWORDS))}."
            )
        check_features(
            "LoRALinear", in_features=in_features, out_features=out_features, lora_rank=lora_rank
        )
        _check_lora_param_type("LoRALinear", lora_param_type)
        _check_metadata("LoRALinear", "a_metadata", a_metadata)
        _check_metadata("LoRALinear", "b_metadata", b_metadata)
        rngs = as_rngs(rngs, "LoRALinear")
        super().__init__(in_features, out_features, rngs=rngs, **kwargs)
        self.lora = LoRA(
            in_features,
            lora_rank,
            out_features,
            dtype=lora_dtype,
            param_dtype=lora_param_dtype,
            a_initializer=a_initializer,
            b_initializer=b_initializer,
            lora_param_type=lora_param_type,
            rngs=rngs,
            a_metadata=a_metadata,
            b_metadata=b_metadata,
        )

    def __call__(self, x: jax.Array, **kwargs: Any) -> jax.Array:
        """Apply the layer and its adapter to `x`, of shape `(..., in_features)`.

        Keyword arguments go to `Linear.__call__`."""
        return super().__call__(x, **kwargs) + self.lora(x)
