"""`eval_shape`: `jax.eval_shape` for functions of object graphs."""

from collections.abc import Callable
from typing import Any

import jax

from ._boundary import Call, Inside
from ._lift import lift_once


def eval_shape(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The output of `fun(*args, **kwargs)` with shapes and dtypes only, computing nothing.

    As `jax.eval_shape`, but the output may hold Modules and Variables: they come back
    holding `jax.ShapeDtypeStruct`s. This is how to see the parameters a model would have
    without allocating them. The objects passed in are left as they are.

    Arguments:
        fun: the function.
        *args: its positional arguments (may hold Modules and Variables).
        **kwargs: its keyword arguments.

    Returns:
        The output, with every array replaced by a `jax.ShapeDtypeStruct`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, eval_shape
        >>> class Linear(Module):
        ...     def __init__(self, n):
        ...         self.w = Param(jnp.ones((n, n)))
        >>> eval_shape(lambda: Linear(1000)).w.value
        ShapeDtypeStruct(shape=(1000, 1000), dtype=float32)
    """
    call = Call(fun)
    lifted = lift_once(call.tree(args, kwargs))

    def pure(values: list[Any]) -> Any:
        inside = Inside(lifted.graphdef, values)
        # New objects throughout, the arguments' included: the output holds no array,
        # and the caller's objects keep theirs.
        return inside.finish(call.run(inside.tree), structure="new_objects")

    outcome, values = jax.eval_shape(pure, lifted.values)
    return lifted.apply(outcome, values)
