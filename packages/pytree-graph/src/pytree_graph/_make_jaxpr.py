"""`make_jaxpr` for functions of object graphs."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from ._boundary import Call, Inside
from ._errors import check_callable
from ._lift import lift_once


def make_jaxpr(fun: Callable[..., Any], **make_jaxpr_kwargs: Any) -> Callable[..., Any]:
    """`jax.make_jaxpr` for functions of Modules and Variables.

    The jaxpr is that of the function on the values: its inputs are the values of
    every Variable and array of the arguments (each shared one once, in the order the
    arguments are walked: by position, attributes by name), its outputs the arrays of
    the output, then the new values of the Variables the function wrote (of every
    Variable and array, if it changed the objects' structure).
    Nothing is written back: the objects passed are left as they are.

    Arguments:
        fun: the function.
        **make_jaxpr_kwargs: passed on to `jax.make_jaxpr` (e.g. `axis_env`,
            `return_shape`).

    Returns:
        A function taking `fun`'s arguments and returning the `ClosedJaxpr`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, make_jaxpr
        >>> class Scale(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.array(3.0))
        >>> jaxpr = make_jaxpr(lambda m, x: m.w.value * x)(Scale(), jnp.ones(2))
        >>> len(jaxpr.in_avals), [e.primitive.name for e in jaxpr.eqns][-1]
        (2, 'mul')
    """
    check_callable(fun, "make_jaxpr")
    call = Call(fun)

    @functools.wraps(fun)
    def jaxpr_of(*args: Any, **kwargs: Any) -> Any:
        lifted = lift_once(call.tree(args, kwargs))

        def pure(values: list[Any]) -> Any:
            inside = Inside(lifted.graphdef, values)
            inside.finish(call.run(inside.tree))
            after = inside.after
            # After a structural change every value of the arguments is new.
            written = [after.values[p] for p in after.changed] if after.same else after.values
            return after.out_values, written

        return jax.make_jaxpr(pure, **make_jaxpr_kwargs)(lifted.values)

    return jaxpr_of
