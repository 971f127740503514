"""`EMA`: an exponential moving average of a model's Variables, held in Variables."""

from typing import Any, TypeVar

import jax.numpy as jnp

import pytree_graph
from pytree_filter import Path, is_inexact_array, path_text
from pytree_graph import State, Variable
from pytree_module import Module as PytreeModule
from pytree_module import data, field, static

M = TypeVar("M")


class EMA(PytreeModule):
    """An exponential moving average of a model's floating-point Variables.

    `EMA(model, decay)` copies the Variables that `only` selects (every one by default) into
    new Variables of the same types and metadata, in `ema.params`. `ema.update(model)` then
    moves each copy towards the model's value, `ema = decay * ema + (1 - decay) * value`,
    in place, so it runs inside a `pytree_graph.jit` training step and is written back.
    `ema.apply_to(model)` gives a model that reads the averages: evaluate with that one.

    Only Variables holding floating-point arrays are averaged: random-key Variables and
    integer counters that `only` selects are left out (the model's own are used by
    `apply_to`). A Variable the model holds at two places (a tied weight) is averaged once,
    and `apply_to` keeps it tied.

    Arguments:
        model: the model (any graph of Modules and Variables), or a `State` of Variables.
        decay: the weight of the old average at each update, in `[0, 1]`; e.g. `0.999`.
        only: a filter selecting the Variables to average (`...`, every floating-point
            Variable, by default; `Param` for the parameters only).
        debias: if true, the average starts from zero and each update divides by
            `1 - decay**step`, as `optax.ema(decay, debias=True)`; after the first update
            the average is then the model's value, not mostly the starting one. Before any
            update, `params` holds the model's values.

    Attributes:
        params: a `State` of the averaged Variables, at the model's paths.
        decay: as given.
        only: as given.
        debias: as given.
        count: a `Variable` counting the updates.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> import pytree_graph as pg
        >>> from pytree_nn import EMA, Linear, Optimizer
        >>> model = Linear(2, 2, rngs=0)
        >>> optimizer = Optimizer(model, optax.sgd(0.1))
        >>> ema = EMA(model, decay=0.9)
        >>> ema_model = ema.apply_to(model)  # reads ema.params: follows every update
        >>> @pg.jit
        ... def train_step(model, optimizer, ema, x, y):
        ...     grads = pg.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        ...     optimizer.update(model, grads)
        ...     ema.update(model)
        >>> x, y = jnp.ones((1, 2)), jnp.ones((1, 2))
        >>> before = ema_model.kernel.value
        >>> train_step(model, optimizer, ema, x, y)
        >>> expected = 0.9 * before + 0.1 * model.kernel.value
        >>> bool(jnp.allclose(ema_model.kernel.value, expected))
        True
        >>> ema_model.kernel is ema.params["kernel"]
        True
    """

    _paths: tuple[Path, ...] = field(static=True, repr=False)

    def __init__(self, model: Any, decay: float, *, only: Any = ..., debias: bool = False):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)):
            raise TypeError(
                f"EMA: decay must be a float in [0, 1] (e.g. 0.999), got "
                f"{type(decay).__name__} {decay!r}."
            )
        if not 0.0 <= decay <= 1.0 or (debias and decay == 1.0):
            raise ValueError(
                "EMA: decay must be in [0, 1]"
                + (" and below 1 with debias=True" if debias else "")
                + f", got {decay}. It is the weight of the old average: 0.999 keeps the "
                "average of about the last thousand updates."
            )
        flat = _tracked(model, only)
        if not flat:
            raise ValueError(
                f"EMA: the {type(model).__name__} has no floating-point Variable that "
                f"only={_filter_text(only)} selects, so there is nothing to average. Check `only`."
            )
        self.decay = float(decay)
        self.only = static(only)
        self.debias = bool(debias)
        self.params = data(
            State.from_flat_path(
                {
                    path: type(variable)(jnp.copy(variable.value), **variable.metadata)
                    for path, variable in flat.items()
                }
            )
        )
        self.count = Variable(jnp.array(0, jnp.uint32))
        self._paths = tuple(flat)

    def update(self, model: Any) -> None:
        """Move the averages towards `model`'s values, in place.

        Each average becomes `decay * average + (1 - decay) * value` (with `debias`, the
        decay of step `t` is `decay * (1 - decay**(t-1)) / (1 - decay**t)`, which gives
        optax's debiased average). Everything is checked before anything is written.

        Arguments:
            model: the model the EMA was built from (or one of the same structure), or a
                `State` of its Variables.

        Raises:
            ValueError: the model's Variables are not those the EMA averages (a missing or
                extra path, or another shape).
        """
        flat = self._matching(model, "update")
        if self.debias:
            step = self.count.value.astype(jnp.float32)
            decay = jnp.float32(self.decay)
            weight = decay * (1 - decay**step) / (1 - decay ** (step + 1))
        else:
            weight = self.decay
        averages = self.params.flat_state()
        new = {
            path: weight * averages[path].value + (1.0 - weight) * flat[path].value
            for path in self._paths
        }
        for path, value in new.items():
            average = averages[path]
            average.value = value.astype(average.value.dtype)
        self.count.value = self.count.value + 1

    def apply_to(self, model: M) -> M:
        """A new model like `model` that holds the averages in place of its Variables.

        The averaged Variables of the result are those of `ema.params` (the same objects),
        so the result follows every later `update`; the Variables the EMA does not average
        (random streams, counters, those `only` leaves out) are the model's own. Sharing is
        kept: a Variable or Module tied in `model` is tied in the result.

        Arguments:
            model: the model the EMA was built from, or one of the same structure.

        Returns:
            A model of the same structure as `model`.

        Raises:
            ValueError: `model` lacks a Variable the EMA averages, or has one of another
                shape.
        """
        self._matching(model, "apply_to")
        graphdef, state = pytree_graph.split(model)
        return pytree_graph.merge(graphdef, State.merge(state, self.params))

    def _matching(self, model: Any, method: str) -> dict[Path, Variable]:
        """`model`'s averaged Variables by path, checked against the EMA's."""
        flat = _tracked(model, self.only)
        if flat.keys() != set(self._paths):
            new = [path_text(p) for p in flat if p not in self._paths]
            gone = [path_text(p) for p in self._paths if p not in flat]
            raise ValueError(
                f"EMA.{method}: the floating-point Variables of the {type(model).__name__} "
                f"that only={_filter_text(self.only)} selects are not those the EMA averages. "
                + (f"New: {', '.join(new)}. " if new else "")
                + (f"Missing: {', '.join(gone)}. " if gone else "")
                + "Pass the model the EMA was built from, or build a new EMA."
            )
        averages = self.params.flat_state()
        for path, variable in flat.items():
            shape, expected = jnp.shape(variable.value), jnp.shape(averages[path].value)
            if shape != expected:
                raise ValueError(
                    f"EMA.{method}: the Variable at {path_text(path)} has shape {shape}, "
                    f"but its average has shape {expected}."
                )
        return flat


def _tracked(model: Any, only: Any) -> dict[Path, Variable]:
    """The floating-point Variables of `model` that `only` selects, by path (each once)."""
    flat = pytree_graph.state(model, only).flat_state()
    return {
        path: variable
        for path, variable in flat.items()
        if isinstance(variable, Variable) and is_inexact_array(variable.value)
    }


def _filter_text(only: Any) -> str:
    return "..." if only is ... else repr(only)
