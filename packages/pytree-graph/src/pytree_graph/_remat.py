"""`remat`: `jax.checkpoint` for functions of object graphs."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_transforms.extend import BindsAsMethod

from ._boundary import Call, Inside
from ._errors import check_callable
from ._graph_mode import resolve_modes
from ._graphdef import GraphDef
from ._initialise import Initialiser, initialising, without_self
from ._lift import lift_once
from ._static_args import static_arguments
from ._tree_transforms import simple_wrap


class _GraphRemat(BindsAsMethod):
    """The function `remat` returns."""

    def __init__(
        self, fun: Callable[..., Any], checkpoint_kwargs: dict[str, Any], static_argnums: Any
    ):
        self._call = call = Call(fun)
        self._checkpoint_kwargs = checkpoint_kwargs
        static_args = self._static = static_arguments(fun, static_argnums, None, "remat")

        def pure(graphdef: GraphDef, values: list[Any], statics: Any) -> Any:
            inside = Inside(graphdef, values)
            if statics is None:
                return inside.finish(call.run(inside.tree))
            # The static arguments go back where the lifted tree holds `None` for them.
            *fun_part, args, kwargs = inside.tree
            out = call.run((*fun_part, *static_args.insert(args, kwargs, statics)))
            return inside.finish(out)

        self._pure = pure
        self._static_argnums = static_argnums
        self._initialise = Initialiser(fun, "remat", self._constructor)
        functools.update_wrapper(self, fun, updated=())

    def _constructor(self, construct: Callable[..., Any], class_name: str) -> "_GraphRemat":
        """`construct` (see `Initialiser`) rematerialised with this remat's options."""
        options = {"static_argnums": self._static_argnums}
        static_argnums = without_self("remat", class_name, options, ("static_argnums",))
        return _GraphRemat(construct, self._checkpoint_kwargs, static_argnums["static_argnums"])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if initialising(args):  # a decorated `__init__`
            return self._initialise(self, args[0], args[1:], kwargs)
        static_args = self._static
        statics = None
        if static_args is not None:
            # Taken out of what is lifted, and given to `jax.checkpoint` as one static
            # argument (hashable, as `jax.checkpoint` wants its static arguments).
            args, kwargs, statics = static_args.split(args, kwargs)
            static_args.check(statics)
        lifted = lift_once(self._call.tree(args, kwargs))
        checkpointed = jax.checkpoint(
            functools.partial(self._pure, lifted.graphdef),
            static_argnums=(1,),
            **self._checkpoint_kwargs,
        )
        outcome, values = checkpointed(lifted.values, statics)
        return lifted.apply(outcome, values)


def remat(
    fun: Callable[..., Any] | None = None,
    *,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
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
        static_argnums: as in `jax.checkpoint`: the positional arguments passed as
            Python values (hashable, neither Modules nor Variables), e.g. sizes that
            the function branches on. A method's `self` is argument 0.
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
            remat,
            prevent_cse=prevent_cse,
            static_argnums=static_argnums,
            policy=policy,
            graph=graph,
            graph_updates=graph_updates,
        )
    check_callable(fun, "remat")
    if not (graph and graph_updates):
        return simple_wrap(
            fun,
            graph,
            "remat",
            jax.checkpoint,
            prevent_cse=prevent_cse,
            static_argnums=static_argnums,
            policy=policy,
        )
    return _GraphRemat(fun, {"prevent_cse": prevent_cse, "policy": policy}, static_argnums)
