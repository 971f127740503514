"""`remat`: `jax.checkpoint` for functions of object graphs."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_transforms.extend import BindsAsMethod

from ._boundary import Call, Inside
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._lift import lift_once
from ._tree_transforms import simple_wrap


class _GraphRemat(BindsAsMethod):
    """The function `remat` returns."""

    def __init__(self, fun: Callable[..., Any], checkpoint_kwargs: dict[str, Any]):
        self._call = Call(fun)
        self._checkpoint_kwargs = checkpoint_kwargs
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._call
        lifted = lift_once(call.tree(args, kwargs))

        def pure(values: list[Any]) -> Any:
            inside = Inside(lifted.graphdef, values)
            return inside.finish(call.run(inside.tree))

        outcome, values = jax.checkpoint(pure, **self._checkpoint_kwargs)(lifted.values)
        return lifted.apply(outcome, values)


def remat(
    fun: Callable[..., Any] | None = None,
    *,
    prevent_cse: bool = True,
    policy: Callable[..., bool] | None = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """`jax.checkpoint` (rematerialisation) for functions of Modules and Variables.

    Under differentiation, the function's intermediate values are recomputed on the
    backward pass instead of stored, trading compute for memory (e.g. per block of a deep
    network). Changes to the objects passed in are written back, as `jit` does.

    Arguments:
        fun: the function. Omit it to get a decorator.
        prevent_cse: as in `jax.checkpoint`.
        policy: as in `jax.checkpoint` (e.g. `jax.checkpoint_policies.dots_saveable`).
        graph: `False` for tree mode: `jax.checkpoint` over the arguments as pytrees;
            only Variable values are written back, and a Variable met twice is refused.
            `None` reads `set_graph_mode`. See "Tree mode".
        graph_updates: `False` keeps graph mode's sharing, writing back values only.
            `None` reads `set_graph_updates`.

    Returns:
        The function, rematerialised.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, grad, remat
        >>> class Block(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(2.0))
        ...     @remat
        ...     def __call__(self, x):
        ...         return jnp.sin(self.w.value * x)
        >>> float(grad(lambda m, x: m(x))(Block(), 0.0)["w"].value)
        0.0
    """
    graph, graph_updates = resolve_modes(graph, graph_updates)
    if fun is None:
        return functools.partial(
            remat, prevent_cse=prevent_cse, policy=policy, graph=graph, graph_updates=graph_updates
        )
    check_callable(fun, "remat")
    if not (graph and graph_updates):
        return simple_wrap(
            fun, graph, "remat", jax.checkpoint, prevent_cse=prevent_cse, policy=policy
        )
    return _GraphRemat(fun, {"prevent_cse": prevent_cse, "policy": policy})
