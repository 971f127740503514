"""`Optimizer`: an optax optimizer whose state lives in Variables, updating a model in place."""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

import pytree_graph
from pytree_filter import Path, is_inexact_array, path_keys, path_text
from pytree_graph import Param, State, Variable
from pytree_module import Dict, data, field, static
from pytree_module import Module as PytreeModule

from ._module import Module

if TYPE_CHECKING:
    # optax is imported where a step runs, not with pytree_nn: importing it costs as much
    # as the rest of the package.
    import optax


class OptState(Variable):
    """State of an `Optimizer`: one leaf of its optax state, or its step counter."""


def _value(leaf: Any) -> Any:
    return leaf.value if isinstance(leaf, Variable) else leaf


def _values_at(flat: Mapping[Path, Any], paths: Any) -> State:
    """A State of bare values at `paths` (in that order), so that optax sees arrays."""
    return State.from_flat_path({path: _value(flat[path]) for path in paths})


def _nest(paths: list[Path], variables: list[OptState]) -> Any:
    """Nested `Dict`s holding `variables` at `paths` (the optax state's leaf paths).

    Dicts keep the Optimizer a tree of Modules, dicts and Variables only, which
    `pytree_graph.jit` can cache between calls (optax's own state classes are arbitrary
    pytree nodes, whose graphs it would have to walk on every call). They are
    `pytree_module.Dict`s, which report their changes, so that a cached call need not
    compare their items on every call, as it must a plain dict's: an Adam state holds
    about twice as many dicts as the model has layers.
    """
    if paths == [()]:
        return variables[0]
    root = Dict()
    for path, variable in zip(paths, variables, strict=True):
        node = root
        for depth, key in enumerate(path):
            last = depth == len(path) - 1
            mixed = bool(node) and type(key) is not type(next(iter(node)))
            if mixed or (key in node and (last or not isinstance(node[key], dict))):
                raise ValueError(
                    f"Optimizer: the optax state has leaves whose paths cannot be told "
                    f"apart, or that mix key types, at {path_text(path[: depth + 1])}. Use "
                    "an optax transformation whose state is made of tuples, named tuples "
                    "and dicts with keys of one type."
                )
            if last:
                node[key] = variable
            else:
                node = node.setdefault(key, Dict())
    return root


def _at(tree: Any, path: Path) -> Any:
    for key in path:
        tree = tree[key]
    return tree


# The default of `Optimizer.update`'s `grads`: a call without it forgot the model.
_NO_GRADS: Any = object()


class Optimizer(Module):
    """An optax optimizer for a model, with its state held in Variables.

    `update(model, grads)` runs one optax step and writes the new parameters into the
    model's Variables in place. The optimizer's own state is held in `OptState` Variables,
    so the whole training step runs under `pytree_graph.jit`: pass the model and the
    optimizer (which holds the same model) as arguments, and every update is written back.

    Attributes:
        model: the model (the very object given, not a copy).
        tx: the optax transformation.
        wrt: the filter of what is optimized.
        opt_state: the optax state, as nested dicts (`pytree_module.Dict`s) of
            `OptState` Variables mirroring its paths (e.g. `opt_state[0]["mu"]["kernel"]`
            for Adam's first moment of the parameter `kernel`). A leaf shaped like a
            parameter carries that parameter's metadata (its `sharding`, for instance).
        step: an `OptState` counting the updates made.

    Arguments:
        model: the model to train (a Module, or any graph of Modules and Variables).
        tx: an optax `GradientTransformation` (e.g. `optax.adam(1e-3)`).
        wrt: which Variables to optimize, as for `pytree_graph.grad`: a Variable type
            (default `Param`), a filter object (e.g. `PathContains("head")`) or a
            predicate on the Variable. They must hold floating-point arrays.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> import pytree_graph as pg
        >>> from pytree_nn import Linear, Optimizer
        >>> model = Linear(2, 1, rngs=0)
        >>> optimizer = Optimizer(model, optax.sgd(0.1))
        >>> @pg.jit
        ... def train_step(model, optimizer, x, y):
        ...     loss_fn = lambda model: jnp.mean((model(x) - y) ** 2)
        ...     loss, grads = pg.value_and_grad(loss_fn)(model)
        ...     optimizer.update(model, grads)
        ...     return loss
        >>> x, y = jnp.ones((4, 2)), jnp.zeros((4, 1))
        >>> losses = [float(train_step(model, optimizer, x, y)) for _ in range(20)]
        >>> losses[-1] < 1e-3 * losses[0], int(optimizer.step.value)
        (True, 20)
    """

    _param_paths: tuple[Path, ...] = field(static=True, repr=False)
    _treedef: Any = field(static=True, repr=False)
    _state_paths: tuple[Path, ...] = field(static=True, repr=False)

    def __init__(self, model: Any, tx: "optax.GradientTransformation", wrt: Any = Param):
        if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
            raise TypeError(
                f"Optimizer: tx must be an optax GradientTransformation (with `init` and "
                f"`update`), got {type(tx).__name__}. Build one with optax, e.g. "
                "`optax.adam(1e-3)`."
            )
        flat = pytree_graph.state(model, wrt).flat_state()
        if not flat:
            raise ValueError(
                f"Optimizer: nothing in the {type(model).__name__} matches wrt={wrt!r}, so "
                "there is nothing to optimize. Check `wrt` (default `Param`)."
            )
        for path, leaf in flat.items():
            if not is_inexact_array(_value(leaf)):
                raise TypeError(
                    f"Optimizer: the {type(leaf).__name__} at {path_text(path)} matches "
                    f"wrt={wrt!r} but does not hold a floating-point array, so it cannot be "
                    "trained. Narrow `wrt` (e.g. `wrt=Param`) to leave it out."
                )
        keyed, treedef = jax.tree_util.tree_flatten_with_path(tx.init(_values_at(flat, flat)))
        paths = [path_keys(key_path) for key_path, _ in keyed]
        variables = [
            OptState(leaf, **_metadata_of(path, leaf, flat))
            for path, (_, leaf) in zip(paths, keyed, strict=True)
        ]
        self.model = model
        self.tx = static(tx)
        self.wrt = static(wrt)
        self.opt_state = data(_nest(paths, variables))
        self.step = OptState(jnp.array(0, jnp.uint32))
        self._param_paths = tuple(flat)
        self._treedef = treedef
        self._state_paths = tuple(paths)

    def update(self, model: Any, grads: Any = _NO_GRADS, /, **kwargs: Any) -> None:
        """Apply one optimizer step to `model`'s parameters, in place.

        Computes `tx.update(grads, opt_state, params, **kwargs)`, adds the updates to the
        parameters, and writes the new parameters, optimizer state and step back into
        their Variables. Everything is checked and computed before anything is written.

        Arguments:
            model: the model this optimizer was built with (the same object).
            grads: the gradients, as `pytree_graph.grad(loss)(model, ...)` returns them: a
                `State` holding a gradient at the path of every optimized Variable. A
                gradient tree shaped like the model, as `filter_grad(loss)(model, ...)`
                returns it (the model's Variables holding gradients), is read the same way:
                its Variables that `wrt` selects, by path (as Flax NNX's `Optimizer` reads
                `nnx.state(grads, wrt)`).
            **kwargs: extra arguments of the optax transformation, e.g. `value=loss` for
                `optax.contrib.reduce_on_plateau`, or `value`, `grad` and `value_fn` for
                `optax.lbfgs`. A `State` passed here (such as `grad=grads`) is given to
                optax as values, like `grads`.

        Raises:
            TypeError: the model is missing (`update(grads)`), or `grads` is neither a
                `State` nor a gradient tree shaped like the model.
            ValueError: `model` is another object, or `grads` does not match the
                optimized Variables (a missing or extra path, or another shape).
        """
        if grads is _NO_GRADS:
            raise TypeError(
                f"Optimizer.update takes the model first, then the gradients: "
                f"`optimizer.update(model, grads)`; it got one argument, a "
                f"{type(model).__name__}. Pass the model this Optimizer was built with "
                "(`optimizer.model`) before the gradients."
            )
        if grads is self.model and model is not self.model:
            raise TypeError(
                "Optimizer.update takes the model first, then the gradients: "
                "`optimizer.update(model, grads)`; the model was passed second."
            )
        if model is not self.model:
            raise ValueError(
                f"Optimizer.update: the {type(model).__name__} passed is not the model this "
                "Optimizer was built with (another object). Pass `optimizer.model`, or "
                "build the Optimizer with this model. Under `pytree_graph.jit`, pass the "
                "model and the optimizer as arguments, so they stay shared inside."
            )
        flat = pytree_graph.state(model, self.wrt).flat_state()
        order = self._param_paths
        if flat.keys() != set(order):
            raise ValueError(
                "Optimizer.update: the Variables of the model that wrt selects are not "
                "those the Optimizer was built with. "
                + _differences(flat, order, "New: {}. ", "Gone: {}. ")
                + "Build a new Optimizer for the changed model."
            )
        grads_flat = _grads_flat(grads, self.wrt)
        _check_grads(flat, grads_flat)
        params = _values_at(flat, order)
        variables = [_at(self.opt_state, path) for path in self._state_paths]
        opt_state = self._treedef.unflatten([v.value for v in variables])
        kwargs = {name: _as_values(value, order) for name, value in kwargs.items()}
        updates, new_state = self.tx.update(
            _values_at(grads_flat, order), opt_state, params, **kwargs
        )
        import optax

        new_params = optax.apply_updates(params, updates)
        new_leaves, new_treedef = jax.tree.flatten(new_state)
        if new_treedef != self._treedef:
            raise ValueError(
                "Optimizer.update: the optax transformation returned a state of another "
                f"structure than its `init` made ({new_treedef} instead of "
                f"{self._treedef}). Use a transformation whose state keeps its structure."
            )
        pytree_graph.update(model, new_params)
        for variable, leaf in zip(variables, new_leaves, strict=True):
            variable.value = leaf
        self.step.value = self.step.value + 1


def _metadata_of(path: Path, leaf: Any, params: Mapping[Path, Any]) -> dict[str, Any]:
    """The metadata of the parameter an optax state leaf belongs to (by the end of its
    path and its shape), so that moments are sharded like their parameters."""
    for start in range(len(path)):
        param = params.get(path[start:])
        if param is not None:
            if isinstance(param, Variable) and np.shape(param.value) == np.shape(leaf):
                return dict(param.metadata)
            return {}
    return {}


def _grads_flat(grads: Any, wrt: Any) -> dict[Path, Any]:
    if isinstance(grads, State):
        return grads.flat_state()
    if isinstance(grads, Mapping):
        return State(grads).flat_state()
    if isinstance(grads, PytreeModule):
        # A gradient tree shaped like the model (`filter_grad`'s): its Variables hold the
        # gradients at the paths of the model's.
        return pytree_graph.state(grads, wrt).flat_state()
    raise TypeError(
        f"Optimizer.update expects the gradients as a State (what "
        f"`pytree_graph.grad(loss)(model, ...)` returns) or as a tree shaped like the model "
        f"(what `filter_grad(loss)(model, ...)` returns), got {type(grads).__name__} "
        f"{grads!r:.80}. Call it as `optimizer.update(model, grads)`."
    )


def _differences(found: Any, expected: Any, extra_text: str, missing_text: str) -> str:
    """Text naming the paths in `found` but not `expected`, and the other way round."""
    extra = [path_text(p) for p in found if p not in expected]
    missing = [path_text(p) for p in expected if p not in found]
    return (extra_text.format(", ".join(extra)) if extra else "") + (
        missing_text.format(", ".join(missing)) if missing else ""
    )


def _check_grads(params: Mapping[Path, Any], grads: Mapping[Path, Any]) -> None:
    if grads.keys() != params.keys():
        raise ValueError(
            "Optimizer.update: the gradients do not match the optimized Variables. "
            + _differences(
                grads, params, "Gradients for what is not optimized: {}. ", "No gradient for: {}. "
            )
            + "Take the gradients with `pytree_graph.grad` of the same model, with the "
            "same `wrt` as the Optimizer."
        )
    for path, param in params.items():
        shape, grad_shape = np.shape(_value(param)), np.shape(_value(grads[path]))
        if shape != grad_shape:
            raise ValueError(
                f"Optimizer.update: the gradient at {path_text(path)} has shape "
                f"{grad_shape}, but the parameter has shape {shape}."
            )


def _as_values(value: Any, order: tuple[Path, ...]) -> Any:
    """A State argument as values, in the parameters' order when it has their paths."""
    if not isinstance(value, State):
        return value
    flat = value.flat_state()
    return _values_at(flat, order if flat.keys() == set(order) else flat)


class ModelAndOptimizer(Optimizer):
    """An `Optimizer` whose `update` takes only the gradients, as Flax NNX's
    `nnx.ModelAndOptimizer`: it updates the model it holds, `optimizer.model`.

    Our `Optimizer` already holds its model (NNX 0.12's does not, and takes it in `update`);
    this class only changes `update`'s arguments, for code written against NNX's
    `ModelAndOptimizer` (or NNX before 0.11).

    Arguments:
        model: the model to train; kept as `self.model` (the same object).
        tx: an optax `GradientTransformation`.
        wrt: which Variables to optimize (default `Param`), as `Optimizer`'s.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> import pytree_graph as pg
        >>> from pytree_nn import Linear, ModelAndOptimizer
        >>> state = ModelAndOptimizer(Linear(2, 1, rngs=0), optax.sgd(0.1))
        >>> @pg.jit
        ... def train_step(state, x, y):
        ...     loss_fn = lambda model: jnp.mean((model(x) - y) ** 2)
        ...     loss, grads = pg.value_and_grad(loss_fn)(state.model)
        ...     state.update(grads)
        ...     return loss
        >>> x, y = jnp.ones((4, 2)), jnp.zeros((4, 1))
        >>> losses = [float(train_step(state, x, y)) for _ in range(20)]
        >>> losses[-1] < 1e-3 * losses[0], int(state.step.value)
        (True, 20)
    """

    def __init__(self, model: Any, tx: "optax.GradientTransformation", *, wrt: Any = Param):
        super().__init__(model, tx, wrt)

    def update(self, grads: Any = _NO_GRADS, /, *rest: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Apply one optimizer step to `self.model`'s parameters, in place.

        Arguments:
            grads: the gradients of `self.model` (see `Optimizer.update`).
            **kwargs: extra arguments of the optax transformation (see `Optimizer.update`).

        Raises:
            TypeError: called with the model as well (`update(model, grads)`, `Optimizer`'s
                form), or without gradients.
        """
        if rest or grads is self.model or grads is _NO_GRADS:
            raise TypeError(
                "ModelAndOptimizer.update takes the gradients only: "
                "`optimizer.update(grads)`; it updates `optimizer.model`. (`Optimizer` takes "
                "the model first: `Optimizer(model, tx).update(model, grads)`.)"
            )
        super().update(self.model, grads, **kwargs)
