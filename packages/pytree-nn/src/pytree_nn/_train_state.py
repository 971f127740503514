"""`TrainState`: an immutable training state (graph definition, parameters, optax state, step)."""

import dataclasses
from typing import TYPE_CHECKING, Any, Self

import jax
import jax.numpy as jnp

from pytree_filter import path_text
from pytree_graph import GraphDef, State
from pytree_module import Module as PytreeModule
from pytree_module import field

if TYPE_CHECKING:
    # optax is imported where a step runs, not with pytree_nn (see `_optimizer`).
    import optax


class TrainState(PytreeModule, frozen=True):
    """An immutable training state, as Flax NNX's `nnx.TrainState`: the functional style.

    It holds a model split in two, its `graphdef` and its `params` (a `State`), with the
    optax state and a step counter; `apply_gradients(grads)` returns a new `TrainState`.
    It is a pytree, so a training step is a pure function under `jax.jit` (or
    `filter_jit`). Subclass it to carry more, e.g. a `batch_stats: State` field, passed to
    `create` by keyword. For the in-place style, use `Optimizer` (or `ModelAndOptimizer`).

    Attributes:
        graphdef: the model's `GraphDef` (from `pytree_graph.split`).
        params: the trained `State`.
        opt_state: the optax state of `tx` for `params`.
        step: the number of `apply_gradients` calls, an integer array.
        tx: the optax `GradientTransformation` (static).

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> import pytree_graph as pg
        >>> from pytree_graph import Param
        >>> from pytree_nn import Linear, TrainState
        >>> graphdef, params = pg.split(Linear(2, 1, rngs=0), Param)
        >>> state = TrainState.create(graphdef, params=params, tx=optax.sgd(0.1))
        >>> @jax.jit
        ... def train_step(state, x, y):
        ...     def loss_fn(params):
        ...         prediction, _ = state.apply(params)(x)
        ...         return jnp.mean((prediction - y) ** 2)
        ...     loss, grads = jax.value_and_grad(loss_fn)(state.params)
        ...     return state.apply_gradients(grads), loss
        >>> x, y = jnp.ones((4, 2)), jnp.zeros((4, 1))
        >>> for _ in range(50):
        ...     state, loss = train_step(state, x, y)
        >>> int(state.step), bool(loss < 1e-3)
        (50, True)
    """

    graphdef: GraphDef
    params: State
    opt_state: Any
    step: jax.Array
    tx: "optax.GradientTransformation" = field(static=True)

    @classmethod
    def create(
        cls,
        graphdef: GraphDef,
        *,
        params: State,
        tx: "optax.GradientTransformation",
        step: int = 0,
        **kwargs: Any,
    ) -> Self:
        """A new state with `opt_state = tx.init(params)`.

        Arguments:
            graphdef: the model's `GraphDef`.
            params: the trained `State` (e.g. the `Param`s from `pytree_graph.split`).
            tx: an optax `GradientTransformation`.
            step: the starting step (default 0).
            **kwargs: the fields a subclass adds (e.g. `batch_stats=`).

        Returns:
            The new state.
        """
        if not isinstance(graphdef, GraphDef):
            raise TypeError(
                f"{cls.__name__}.create: graphdef must be a GraphDef (the first result of "
                f"`pytree_graph.split(model, ...)`), got {type(graphdef).__name__}."
            )
        if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
            raise TypeError(
                f"{cls.__name__}.create: tx must be an optax GradientTransformation (with "
                f"`init` and `update`), got {type(tx).__name__}, e.g. `optax.adam(1e-3)`."
            )
        return cls(
            graphdef=graphdef,
            params=params,
            opt_state=tx.init(params),
            step=jnp.asarray(step),
            tx=tx,
            **kwargs,
        )

    def apply(self, state: State | str, *states: State | str) -> Any:
        """Call the model built from `graphdef` and the States, as a pure function.

        `state.apply(params)(x)` (or `.apply(params, batch_stats).method(x)`) returns
        `(out, (graphdef, new_state))`: the model's output, and the graph and State after
        the call (with any Variables the call changed). A string names a field holding a
        State: `apply("params", "batch_stats")`.

        Arguments:
            state: a `State`, or the name of a field holding one.
            *states: more States (or names) filling the rest of the graph.

        Returns:
            A caller: call it (or a method of it) with the model's arguments.

        Raises:
            TypeError: a name is not a field holding a State.
        """
        return self.graphdef.apply(*(self._state(s) for s in (state, *states)))

    def _state(self, state: State | str) -> State:
        if not isinstance(state, str):
            return state
        value = getattr(self, state, None)
        if not isinstance(value, State):
            raise TypeError(
                f"{type(self).__name__}.apply: '{state}' must name a field holding a State, "
                f"got {type(value).__name__}. Pass the State itself, or one of "
                + ", ".join(
                    repr(f.name)
                    for f in dataclasses.fields(self)
                    if isinstance(getattr(self, f.name), State)
                )
                + "."
            )
        return value

    def apply_gradients(self, grads: State, **kwargs: Any) -> Self:
        """One optax step: a new state with the updated `params`, `opt_state` and `step`.

        Arguments:
            grads: the gradients of the loss with respect to `params` (e.g.
                `jax.grad(loss_fn)(state.params)`), of the same structure.
            **kwargs: new values for other fields (e.g. `batch_stats=`).

        Returns:
            The new state; this one is unchanged.

        Raises:
            ValueError: `grads` is not structured like `params`.
        """
        if jax.tree.structure(grads) != jax.tree.structure(self.params):
            raise ValueError(
                f"{type(self).__name__}.apply_gradients: grads are not structured like "
                f"params. {_differences(grads, self.params)}Take the gradients of a loss of "
                "`state.params` (`jax.grad(loss_fn)(state.params)`)."
            )
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        import optax

        params = optax.apply_updates(self.params, updates)
        return self.replace(params=params, opt_state=opt_state, step=self.step + 1, **kwargs)

    def replace(self, **changes: Any) -> Self:
        """A copy with the given fields changed (`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)


def _differences(grads: Any, params: Any) -> str:
    """Text naming the paths of `grads` and `params` that the other lacks."""
    if isinstance(grads, State) and isinstance(params, State):
        grad_paths, param_paths = set(grads.flat_state()), set(params.flat_state())
        extra = sorted(path_text(p) for p in grad_paths - param_paths)
        missing = sorted(path_text(p) for p in param_paths - grad_paths)
        if extra or missing:
            return (f"Gradients for what is not trained: {', '.join(extra)}. " if extra else "") + (
                f"No gradient for: {', '.join(missing)}. " if missing else ""
            )
    return (
        f"Got a {type(grads).__name__} of structure {jax.tree.structure(grads)}, expected "
        f"{jax.tree.structure(params)}. "
    )
