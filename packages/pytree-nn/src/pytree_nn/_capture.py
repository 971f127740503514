"""`capture`: run a model and return what it sowed (and the perturbations it made), leaving
the model as it was; as Flax NNX's `nnx.capture`."""

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytree_graph as pg
from pytree_graph import Variable

from ._module import CAPTURING, Module


def _parent(root: Any, path: tuple) -> Any:
    node = root
    for key in path:
        node = getattr(node, key) if isinstance(node, Module) else node[key]
    return node


def _put(root: Any, state: pg.State) -> None:
    """Put each Variable of `state` at its path under `root` (as `pop` took it out)."""
    for path, variable in state.flat_state().items():
        parent = _parent(root, path[:-1])
        if isinstance(parent, Module):
            setattr(parent, path[-1], variable)
        else:
            parent[path[-1]] = variable


def _take(module: Any, types: tuple[type, ...]) -> list[pg.State]:
    """Pop the Variables of each type (one State each), leaving the others in place."""
    return [pg.pop(module, t) for t in types]


@contextlib.contextmanager
def _method_outputs(module: Any, variable_type: type[Variable]) -> Iterator[None]:
    """Sow the output of every public method (and `__call__`) of the Modules' classes under
    the method's name, while the block runs; the classes are restored after."""
    wrapped: list[tuple[type, str, Any]] = []
    classes = {type(m) for _, m in pg.iter_modules(module)}
    try:
        for cls in classes:
            for name, method in list(vars(cls).items()):
                if name.startswith("_") and name != "__call__":
                    continue
                if not hasattr(method, "__get__") or isinstance(
                    method, staticmethod | classmethod | property
                ):
                    continue

                def sowing(self: Any, *args: Any, _name=name, _method=method, **kwargs: Any) -> Any:
                    out = _method.__get__(self, type(self))(*args, **kwargs)
                    self.sow(variable_type, _name, out)
                    return out

                wrapped.append((cls, name, method))
                setattr(cls, name, sowing)
        yield
    finally:
        for cls, name, method in reversed(wrapped):
            setattr(cls, name, method)


def capture(
    fn: Any,
    *var_types: type[Variable],
    init: pg.State | None = None,
    method_outputs: type[Variable] | None = None,
) -> Callable[..., Any]:
    """Wrap `fn` to return what the model records while it runs: `(result, *states)`.

    Inside, `Module.sow` records only Variables of the types captured, and `Module.perturb`
    perturbs only those types (others pass the value through); the records made are
    returned, one `State` per type (nested by Module path), and taken out of the model, which
    ends as it began (records it held before are put back). `init` seeds values, typically
    perturbations from an earlier capture: differentiate with respect to it to get the
    gradients of intermediate values. As Flax NNX's `nnx.capture`.

    Arguments:
        fn: a function whose first argument is the model, a bound method of a Module (the
            model is its Module), or a Module (called as is). Or a Variable type: then
            `capture(Intermediate)` returns a decorator taking `fn`.
        *var_types: the Variable types to collect (`Intermediate`, `Perturbation`, ...).
        init: a State of Variables (e.g. `Perturbation`s) to place in the model first; their
            types are captured too.
        method_outputs: a Variable type: every public method (and `__call__`) of the model's
            Modules records its output under the method's name while `fn` runs.

    Returns:
        The wrapped function, returning `fn`'s result and one State per type of `var_types`
        (the result alone when no type is given).

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Intermediate
        >>> from pytree_nn import Linear, Module, Rngs, capture
        >>> class Model(Module):
        ...     def __init__(self, rngs):
        ...         self.linear = Linear(2, 3, rngs=rngs)
        ...     def __call__(self, x):
        ...         h = self.linear(x)
        ...         self.sow(Intermediate, "features", h)
        ...         return h.sum()
        >>> model = Model(Rngs(0))
        >>> y, intermediates = capture(model, Intermediate)(jnp.ones(2))
        >>> intermediates["features"].value[0].shape, hasattr(model, "features")
        ((3,), False)
    """
    if isinstance(fn, type) and issubclass(fn, Variable):
        types = (fn, *var_types)
        return lambda actual: capture(actual, *types, init=init, method_outputs=method_outputs)
    for t in var_types:
        if not (isinstance(t, type) and issubclass(t, Variable)):
            raise TypeError(f"capture: the types to capture are Variable types, got {t!r}.")
    if method_outputs is not None and not (
        isinstance(method_outputs, type) and issubclass(method_outputs, Variable)
    ):
        raise TypeError(f"capture: method_outputs must be a Variable type, got {method_outputs!r}.")
    if init is not None and not isinstance(init, pg.State):
        raise TypeError(f"capture: init must be a State (from an earlier capture), got {init!r}.")
    if not callable(fn):
        raise TypeError(f"capture: expected a function, bound method or Module, got {fn!r}.")
    owner = fn if isinstance(fn, Module) else getattr(fn, "__self__", None)
    owner = owner if isinstance(owner, Module) else None
    seeded = (
        () if init is None else tuple(dict.fromkeys(type(v) for v in init.flat_state().values()))
    )
    types = tuple(
        dict.fromkeys((*var_types, *seeded, *(() if method_outputs is None else (method_outputs,))))
    )

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if owner is not None:
            module = owner
        elif args:
            module = args[0]
        else:
            raise TypeError(
                "capture: the wrapped function takes the model as its first argument; none "
                "was given. Pass the model, or capture a Module or its bound method."
            )
        before = _take(module, types)
        if init is not None:
            _put(
                module,
                pg.State.from_flat_path(
                    {path: type(v)(v.value) for path, v in init.flat_state().items()}
                ),
            )
        token = CAPTURING.set(frozenset(types))
        try:
            with (
                contextlib.nullcontext()
                if method_outputs is None
                else _method_outputs(module, method_outputs)
            ):
                result = fn(*args, **kwargs)
        finally:
            CAPTURING.reset(token)
            made = _take(module, types)
            for state in before:
                _put(module, state)
        if not var_types:
            return result
        states = [made[types.index(t)] for t in var_types]
        return (result, *states)

    return wrapper
