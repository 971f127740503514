"""The graph transforms in graph mode with structural updates, whatever the switches say.

As Flax NNX's `nnx.compat`: each name here is the transform of the same name in
`pytree_graph` with `graph=True` and `graph_updates=True` as defaults, so code written for
graph mode keeps working inside a `with pytree_graph.set_graph_mode(False):` block, or in a
program that switched tree mode on. Each can still be given `graph=` / `graph_updates=`.

Example:
    >>> import jax.numpy as jnp
    >>> import pytree_graph as pg
    >>> from pytree_module import Module
    >>> class Tied(Module):
    ...     def __init__(self):
    ...         self.encoder = pg.Param(jnp.ones(2))
    ...         self.decoder = self.encoder
    >>> with pg.set_graph_mode(False):
    ...     out = pg.compat.jit(lambda t: t.decoder.value.sum())(Tied())  # sharing is fine
    >>> float(out)
    2.0
"""

import functools
from collections.abc import Callable
from typing import Any

from ._ad_pairs import jvp as _jvp
from ._ad_pairs import vjp as _vjp
from ._autodiff import grad as _grad
from ._autodiff import value_and_grad as _value_and_grad
from ._checkify import checkify as _checkify
from ._control_flow import cond as _cond
from ._control_flow import fori_loop as _fori_loop
from ._control_flow import scan as _scan
from ._control_flow import switch as _switch
from ._control_flow import while_loop as _while_loop
from ._custom_vjp import custom_vjp as _custom_vjp
from ._eval_shape import eval_shape as _eval_shape
from ._jit import jit as _jit
from ._jit_partial import jit_partial as _jit_partial
from ._pmap import pmap as _pmap
from ._remat import remat as _remat
from ._shard_map import shard_map as _shard_map
from ._vmap import vmap as _vmap


def _graph_mode(transform: Callable[..., Any]) -> Any:
    partial = functools.partial(transform, graph=True, graph_updates=True)
    name = transform.__name__
    partial.__name__ = partial.__qualname__ = name  # type: ignore[attr-defined]
    partial.__doc__ = (
        f"`pytree_graph.{name}` with `graph=True` and `graph_updates=True` as defaults "
        f"(whatever `set_graph_mode` and `set_graph_updates` say).\n\n"
        f"Takes the arguments of `pytree_graph.{name}` and returns what it returns."
    )
    return partial


jit = _graph_mode(_jit)
grad = _graph_mode(_grad)
value_and_grad = _graph_mode(_value_and_grad)
vmap = _graph_mode(_vmap)
pmap = _graph_mode(_pmap)
scan = _graph_mode(_scan)
remat = _graph_mode(_remat)
cond = _graph_mode(_cond)
switch = _graph_mode(_switch)
fori_loop = _graph_mode(_fori_loop)
while_loop = _graph_mode(_while_loop)
eval_shape = _graph_mode(_eval_shape)
checkify = _graph_mode(_checkify)
vjp = _graph_mode(_vjp)
custom_vjp = _graph_mode(_custom_vjp)
jvp = _graph_mode(_jvp)
jit_partial = _graph_mode(_jit_partial)
shard_map = _graph_mode(_shard_map)

__all__ = [
    "checkify",
    "cond",
    "custom_vjp",
    "eval_shape",
    "fori_loop",
    "grad",
    "jit",
    "jit_partial",
    "jvp",
    "pmap",
    "remat",
    "scan",
    "shard_map",
    "switch",
    "value_and_grad",
    "vjp",
    "vmap",
    "while_loop",
]
