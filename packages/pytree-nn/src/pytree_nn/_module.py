"""`Module`: pytree_module's Module with the conveniences of a neural-network library."""

import contextvars
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

import pytree_graph
import pytree_module
from pytree_graph import Perturbation, Variable

# The Variable types the innermost `capture` collects, or None outside any capture: there
# `sow` records, and `perturb` perturbs, only those types.
CAPTURING: contextvars.ContextVar[frozenset[type] | None] = contextvars.ContextVar(
    "capturing", default=None
)


def _append(collected: tuple, value: Any) -> tuple:
    return (*collected, value)


def _not_of_type(method: str, module: Any, name: str, current: Any, variable_type: type) -> str:
    """The error for `sow`/`perturb` under a name held by something else (Flax NNX's
    words first, then where it is and what to do)."""
    got = type(current).__name__
    opening = (
        f"Expected '{name}' to be of type '{variable_type.__name__}', got '{got}'"
        if isinstance(current, Variable)
        else f"Expected '{name}' to be a Variable, got {got}"
    )
    return (
        f"{opening}: {method} found {type(module).__name__}.{name} holding a {got}, not a "
        f"Variable of type {variable_type.__name__}. {method.capitalize()} under another "
        "name, or remove the attribute first."
    )


class Module(pytree_module.Module):
    """A Module for neural networks: pytree_module's `Module` with a few conveniences.

    Everything of `pytree_module.Module` holds (instances are pytrees; NNX-style inferred
    or Equinox-style declared fields; mutable unless `frozen=True`). Added here:
    `sow` and `perturb` to record intermediate values and their gradients,
    `train()`/`eval()` (and `set_attributes`) to switch dropout and batch norm between
    training and evaluation, and `split`/`update` as methods. Modules start in training
    mode.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Intermediate, pop
        >>> from pytree_nn import Module
        >>> class Double(Module):
        ...     def __call__(self, x):
        ...         self.sow(Intermediate, "seen", x)
        ...         return 2 * x
        >>> m = Double()
        >>> _ = m(jnp.ones(2)); _ = m(jnp.zeros(2))
        >>> len(pop(m, Intermediate)["seen"].value)  # one entry per call
        2
    """

    def sow(
        self,
        variable_type: type[Variable],
        name: str,
        value: Any,
        reduce_fn: Callable[[Any, Any], Any] = _append,
        init_fn: Callable[[], Any] = tuple,
    ) -> bool:
        """Record `value` in the Variable attribute `name` (made on first use).

        The Variable holds `reduce_fn(previous, value)`, starting from `init_fn()`: by
        default a tuple with one entry per call. Take the records out with
        `pytree_graph.pop(model, variable_type)`.

        Arguments:
            variable_type: the Variable type to record in (e.g. `Intermediate`).
            name: the attribute name.
            value: the value to record.
            reduce_fn: how to combine the records so far with `value`.
            init_fn: the records before the first call.

        Returns:
            Whether `value` was recorded (inside `capture`, only the types it collects
            are, as in Flax NNX).

        Raises:
            ValueError: `name` is an attribute that is not a Variable of that type (as
                Flax NNX raises).
        """
        capturing = CAPTURING.get()
        if capturing is not None and variable_type not in capturing:
            return False
        if name in vars(self):
            current = getattr(self, name)
            if not isinstance(current, variable_type):
                raise ValueError(_not_of_type("sow", self, name, current, variable_type))
            current.value = reduce_fn(current.value, value)
        else:
            setattr(self, name, variable_type(reduce_fn(init_fn(), value)))
        return True

    def perturb(self, name: str, value: Any, variable_type: type[Variable] = Perturbation) -> Any:
        """Add a zero perturbation to `value`, so that its gradient can be taken.

        The first call makes the attribute `name`, a `Perturbation` of zeros shaped like
        `value`; every call returns `value + perturbation`. Differentiating with respect
        to the Perturbations (`pytree_graph.grad(..., wrt=Perturbation)`) then gives the
        gradient of the loss with respect to the intermediate value.

        Arguments:
            name: the attribute name.
            value: the intermediate value.
            variable_type: the Variable type (default `Perturbation`).

        Returns:
            `value` plus the perturbation (numerically `value`). Inside `capture` a type
            it does not collect is not perturbed: `value` comes back as is.
        """
        capturing = CAPTURING.get()
        if capturing is not None and variable_type not in capturing:
            return value
        if name not in vars(self):
            setattr(self, name, variable_type(jnp.zeros_like(value)))
        perturbation = getattr(self, name)
        if not isinstance(perturbation, variable_type):
            raise ValueError(_not_of_type("perturb", self, name, perturbation, variable_type))
        return value + perturbation.value

    def set_attributes(
        self,
        *filters: Any,
        raise_if_not_found: bool = True,
        graph: bool | None = None,
        **attributes: Any,
    ) -> "Module":
        """Set attributes on this Module and every Module in it that has them
        (`pytree_graph.set_attributes` on `self`).

        Arguments:
            *filters: which Modules to change (a Module type, a predicate, a filter
                object seeing `(path, module)`); all of them when none is given.
            raise_if_not_found: raise if no selected Module has one of the attributes.
            graph: `False` for tree mode (a Variable reached twice raises); `None` reads
                `pytree_graph.set_graph_mode`.
            **attributes: the attributes to set, e.g. `deterministic=True`.

        Returns:
            This Module.

        Raises:
            ValueError: no selected Module has one of the attributes (with
                `raise_if_not_found`), or a frozen Module has one. Nothing is changed.
        """
        pytree_graph.set_attributes(
            self, *filters, raise_if_not_found=raise_if_not_found, graph=graph, **attributes
        )
        return self

    def train(self) -> "Module":
        """Switch to training mode: dropout on, batch norm using batch statistics.

        Returns:
            This Module (changed in place).
        """
        return self.set_attributes(
            deterministic=False, use_running_average=False, raise_if_not_found=False
        )

    def eval(self) -> "Module":
        """Switch to evaluation mode: dropout off, batch norm using running statistics.

        Returns:
            This Module (changed in place).
        """
        return self.set_attributes(
            deterministic=True, use_running_average=True, raise_if_not_found=False
        )

    def split(self, *filters: Any) -> tuple[Any, ...]:
        """`pytree_graph.split(self, *filters)`."""
        return pytree_graph.split(self, *filters)

    def update(self, *states: Any) -> None:
        """`pytree_graph.update(self, *states)`."""
        pytree_graph.update(self, *states)
