"""`jit`: `jax.jit` for functions of object graphs, writing changes back to the caller."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_transforms._method import BindsAsMethod

from ._boundary import _ONLY_AN_ARRAY, Call, Inside, Reordered
from ._graphdef import GraphDef
from ._lift_cache import lift_cache


class _GraphJit(BindsAsMethod):
    """The function `jit` returns."""

    def __init__(self, fun: Callable[..., Any], jit_kwargs: dict[str, Any]):
        self._call = call = Call(fun)
        donate = jit_kwargs.pop("donate_argnums", ())
        self._donate = frozenset((donate,) if isinstance(donate, int) else donate)

        def pure(graphdef: GraphDef | Reordered, values: list[Any]) -> Any:
            inside = Inside(graphdef, values)
            return inside.outcome(call.run(inside.tree))

        def pure_donating(graphdef: GraphDef, donated: list[Any], kept: list[Any], mask: tuple):
            donated_values, kept_values = iter(donated), iter(kept)
            return pure(graphdef, [next(donated_values if d else kept_values) for d in mask])

        self._jitted = jax.jit(pure, **jit_kwargs)
        self._jitted_donating = jax.jit(
            pure_donating, static_argnums=3, donate_argnums=1, **jit_kwargs
        )
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        found = lift_cache.find(self._call.tree(args, kwargs))
        if not self._donate:
            outcome, values = self._jitted(*found.jit_inputs())
            if outcome is _ONLY_AN_ARRAY:  # the usual forward pass: nothing to write back
                return values[0]
            return found.lifted().apply(outcome, values)
        lifted = found.lifted()
        split = self._call.split_path
        mask = tuple(split(path)[0] in self._donate for path in lifted.paths)
        donated = [v for v, d in zip(lifted.values, mask, strict=True) if d]
        kept = [v for v, d in zip(lifted.values, mask, strict=True) if not d]
        outcome, values = self._jitted_donating(lifted.graphdef, donated, kept, mask)
        return lifted.apply(outcome, values)


def jit(fun: Callable[..., Any] | None = None, **jit_kwargs: Any) -> Any:
    """`jax.jit` for functions of Modules and Variables, with sharing and updates kept.

    The arguments are walked as one object graph: Modules and Variables shared between
    them (a model and an optimizer holding it, tied weights) are shared inside too.
    Whatever the function changes is written back to the caller's objects when it
    returns: Variable values, and also new attributes, replaced submodules and changed
    metadata. Objects the function returns are the caller's own where they came in.

    The compiled function is reused while the arguments keep their structure (classes,
    static attributes, Variable types and metadata, shapes and dtypes of arrays): new
    values do not retrace, a new structure does. Arguments that are not arrays, Modules
    or Variables are static, as with `filter_jit`. Mutating an object the function closes
    over (instead of taking it as an argument) raises `TraceContextError`.

    Arguments:
        fun: the function. Omit it to get a decorator.
        **jit_kwargs: passed on to `jax.jit` (e.g. `donate_argnums`, which donates every
            array and Variable value of those arguments).

    Returns:
        The compiled function. As a class attribute it binds like a method.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, Variable, jit
        >>> class Counter(Module):
        ...     def __init__(self):
        ...         self.w = Param(jnp.ones(2))
        ...         self.count = Variable(jnp.array(0))
        ...     def __call__(self, x):
        ...         self.count.value += 1
        ...         return x * self.w.value
        >>> model = Counter()
        >>> step = jit(lambda m, x: m(x))
        >>> step(model, jnp.ones(2)).tolist(), int(model.count.value)
        ([1.0, 1.0], 1)
        >>> _ = step(model, jnp.ones(2)); int(model.count.value)
        2
    """
    for option, why in _REFUSED_OPTIONS.items():
        if option in jit_kwargs:
            raise TypeError(f"pytree_graph.jit does not take `{option}`: {why}")
    if fun is None:
        return functools.partial(jit, **jit_kwargs)
    if not callable(fun):
        raise TypeError(f"jit expects a function, got {type(fun).__name__}: {fun!r}.")
    return _GraphJit(fun, jit_kwargs)


# jax.jit options that name the arguments of the function it compiles: here that function
# takes the call's structure and values, not the user's arguments.
_REFUSED_OPTIONS = {
    "static_argnums": "every argument that is not an array, Module or Variable is "
    "static already (and arrays are always traced).",
    "static_argnames": "every argument that is not an array, Module or Variable is "
    "static already (and arrays are always traced).",
    "donate_argnames": "donate by position with `donate_argnums`.",
    "in_shardings": "place the arrays before the call (e.g. `jax.device_put` with "
    "`get_named_sharding`); compiled code follows their shardings.",
    "out_shardings": "constrain values inside the function with "
    "`jax.lax.with_sharding_constraint`.",
}
