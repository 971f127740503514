"""`List` and `Dict`: containers that are always data, for explicitness."""

from typing import Any

import jax
from jax.tree_util import DictKey, SequenceKey

from ._status import register_data_type


@register_data_type
class List(list):
    """A list that a Module always treats as data, whatever it holds.

    A plain list holding modules or arrays is already data, and so is an empty one; `List`
    documents intent, and also makes a list of plain numbers data (leaves).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import List
        >>> jax.tree.leaves(List([jnp.zeros(2), 1.0]))
        [Array([0., 0.], dtype=float32), 1.0]
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"List({list.__repr__(self)})"


@register_data_type
class Dict(dict):
    """A dict that a Module always treats as data, whatever it holds.

    Flattens like a plain dict (keys sorted, leaves in key order).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Dict
        >>> jax.tree.leaves(Dict(b=2.0, a=jnp.zeros(1)))
        [Array([0.], dtype=float32), 2.0]
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Dict({dict.__repr__(self)})"


def _sorted_keys(d: dict) -> tuple[Any, ...]:
    try:
        return tuple(sorted(d))
    except TypeError:
        return tuple(d)


def _flatten_dict(d: Dict) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    keys = _sorted_keys(d)
    return tuple(d[k] for k in keys), keys


def _flatten_dict_with_keys(d: Dict) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    keys = _sorted_keys(d)
    return tuple((DictKey(k), d[k]) for k in keys), keys


jax.tree_util.register_pytree_with_keys(
    List,
    lambda xs: (tuple((SequenceKey(i), x) for i, x in enumerate(xs)), None),
    lambda _, children: List(children),
    flatten_func=lambda xs: (tuple(xs), None),
)
jax.tree_util.register_pytree_with_keys(
    Dict,
    _flatten_dict_with_keys,
    lambda keys, children: Dict(zip(keys, children, strict=True)),
    flatten_func=_flatten_dict,
)
