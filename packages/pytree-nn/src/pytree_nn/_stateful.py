"""Equinox-style state passing: `StateIndex`, `State` and `make_with_state`.

The layers of pytree_nn keep their state (a BatchNorm's running averages, a SpectralNorm's
power-iteration vectors) in Variables inside the model, updated in place. Code written for
Equinox passes that state explicitly instead: `y, state = model(x, state)`. Both work on
the same model. A stateful layer (one that defines `_state_variables`, the names of its
state Variables) keeps a static `state_key`, the key of its entry in a `State`; called
with a `State`, it reads and writes its entry there, and leaves its Variables as they are.
"""

import types
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
from jax.tree_util import DictKey

import pytree_graph
from pytree_module import data, tree_pformat

from ._module import Module

P = ParamSpec("P")
T = TypeVar("T")


class StateIndex(Module):
    """A key into a `State`, and the initial value of the state it stands for.

    A layer that passes its state Equinox's way holds a `StateIndex` and reads and writes
    the state through the `State` it is called with: `state.get(self.index)` and
    `state.set(self.index, value)`. The layers of pytree_nn that have state (`BatchNorm`,
    `SpectralNorm`) need none: their Variables play that part.

    Arguments:
        init: the initial value of the state: an array or a pytree of arrays (numbers
            become arrays).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Module, StateIndex, make_with_state
        >>> class Counter(Module):
        ...     def __init__(self):
        ...         self.index = StateIndex(jnp.array(0))
        ...     def __call__(self, x, state):
        ...         count = state.get(self.index)
        ...         return x + count, state.set(self.index, count + 1)
        >>> counter, state = make_with_state(Counter)()
        >>> y, state = counter(jnp.array(10), state)
        >>> y, state = counter(jnp.array(10), state)
        >>> int(y), int(state.get(counter.index))
        (11, 2)
    """

    def __init__(self, init: Any):
        if isinstance(init, types.FunctionType):
            raise ValueError(
                "StateIndex takes the initial value of the state, not a function that "
                f"makes it; got the function {init.__name__!r}. Call it first: "
                "StateIndex(make_init())."
            )
        # Stands for this index until `make_with_state` gives it a key from its path.
        self.marker = object()
        self.init = data(jax.tree.map(jnp.asarray, init))


def _key_name(key: Any) -> str:
    return f"[{key}]" if isinstance(key, int) else f".{key}"


def _path_key(root: Any, path: tuple[Any, ...]) -> str:
    """The key of the state at `path` of `root`: as Equinox makes it, the root's class name
    and the path, e.g. `Model.layers[1]`."""
    return type(root).__name__ + "".join(_key_name(key) for key in path)


def _stateful(node: Any) -> bool:
    return isinstance(node, Module) and hasattr(type(node), "_state_variables")


def takes_state(layer: Any) -> bool:
    """Whether `layer` is called `y, state = layer(x, state)`: a stateful layer of
    pytree_nn, or a layer whose `is_stateful()` says so (Equinox's `StatefulLayer`)."""
    if _stateful(layer):
        return True
    is_stateful = getattr(layer, "is_stateful", None)
    return callable(is_stateful) and bool(is_stateful())


def _layer_state(layer: Any) -> dict[str, Any]:
    return {name: getattr(layer, name).value for name in type(layer)._state_variables}


def _describe(item: Any) -> str:
    if isinstance(item, StateIndex):
        return f"StateIndex {item.marker!r}" if isinstance(item.marker, str) else "StateIndex"
    return type(item).__name__


_OLD_STATE = (
    "This State was already used: `state.set` and `state.update` return a new State and "
    "retire the one they were called on, so that an update cannot be lost. Use the State "
    "they returned (`state = state.set(index, value)`; `y, state = layer(x, state)`). To "
    "keep an old State on purpose, copy it first: "
    "`jax.tree.unflatten(*reversed(jax.tree.flatten(state)))`."
)


@jax.tree_util.register_pytree_with_keys_class
class State:
    """The state of a model's stateful layers, passed in and out as Equinox does.

    A mapping from the keys of the model's `StateIndex`es and stateful layers (BatchNorm,
    SpectralNorm) to their values, and a pytree whose leaves are those values (the keys are
    static), so it passes through `jax.jit`, `filter_jit`, `filter_vmap` and the rest.
    Make it with `make_with_state(Model)(...)`, which gives every index and stateful layer
    a key from its path, so that two models built alike have interchangeable states.

    `set` and `update` return a new State and retire the old one (its `get`, `set`,
    `substate` and `update` raise), as in Equinox, so that `state.set(...)` without
    `state = ...` is caught.

    Not to be confused with `pytree_graph.State`, the Variables of a split model.

    Arguments:
        model: any pytree or graph of Modules. Each `StateIndex` in it gives an entry
            holding its initial value, each stateful layer one holding its Variables'
            current values (a dict by Variable name, e.g. `{"mean": ..., "var": ...}`).
            A stateful layer without a key gets one from its path (the layer is changed
            in place); `make_with_state` has already given them one.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import BatchNorm, State
        >>> norm = BatchNorm(2, momentum=0.5, rngs=0)
        >>> state = State(norm)
        >>> y, state = norm(jnp.array([[0.0, 4.0], [2.0, 6.0]]), state)
        >>> state.get(norm)["mean"].tolist(), norm.mean.value.tolist()  # the layer keeps its own
        ([0.5, 2.5], [0.0, 0.0])
    """

    def __init__(self, model: Any):
        entries: dict[Any, Any] = {}
        for path, node in pytree_graph.iter_graph(model):
            if isinstance(node, StateIndex):
                entries[node.marker] = jax.tree.map(jnp.asarray, node.init)
            elif _stateful(node):
                if node.state_key is None:
                    node.state_key = _path_key(model, path)
                entries[node.state_key] = _layer_state(node)
        self._entries = entries
        self._retired = False

    @classmethod
    def _of(cls, entries: dict[Any, Any]) -> "State":
        state = object.__new__(cls)
        state._entries = entries
        state._retired = False
        return state

    def _live(self) -> dict[Any, Any]:
        if self._retired:
            raise ValueError(_OLD_STATE)
        return self._entries

    def _key(self, item: Any, method: str) -> Any:
        if isinstance(item, StateIndex):
            key = item.marker
        elif _stateful(item):
            key = item.state_key
        else:
            raise TypeError(
                f"State.{method} takes a StateIndex or a stateful layer (BatchNorm, "
                f"SpectralNorm), got {type(item).__name__}."
            )
        if key is None or key not in self._live():
            raise ValueError(
                f"State.{method}: this {_describe(item)} has no entry in the State. Make the "
                "model and its state together, `model, state = make_with_state(Model)(...)` "
                "(or `state = State(model)`), and pass the State made from the model that "
                "holds it."
            )
        return key

    def get(self, item: Any) -> Any:
        """The value of the state of `item`.

        Arguments:
            item: a `StateIndex`, or a stateful layer (its entry is a dict of its state
                Variables' values by name).

        Returns:
            The current value.
        """
        return self._live()[self._key(item, "get")]

    def set(self, item: Any, value: Any) -> "State":
        """A new State in which `item`'s state is `value`; this State is retired.

        Arguments:
            item: a `StateIndex` or a stateful layer.
            value: the new value, of the structure, shapes and dtypes of the old one.

        Returns:
            The new State (use it in place of this one, which can no longer be used).
        """
        key = self._key(item, "set")
        entries = self._live()
        old = entries[key]
        value = jax.tree.map(jnp.asarray, value)
        if _signature(old) != _signature(value):
            raise ValueError(
                f"State.set: the new value of {key!r} must have the structure, shapes and "
                f"dtypes of the old one, {_shapes(old)}; got {_shapes(value)}."
            )
        self._retired = True
        return State._of({**entries, key: value})

    def substate(self, pytree: Any) -> "State":
        """The part of this State that the indexes and stateful layers in `pytree` hold.

        Arguments:
            pytree: part of the model (any pytree or graph of Modules).

        Returns:
            A smaller State (this one stays usable); give it back with `update`.
        """
        entries = self._live()
        keys = [self._key(item, "substate") for item in _state_holders(pytree)]
        return State._of({key: entries[key] for key in keys})

    def update(self, substate: "State") -> "State":
        """A new State with the entries of `substate` (from `substate`) in place of this
        one's; this State is retired.

        Arguments:
            substate: a State whose keys are among this one's.

        Returns:
            The new State.
        """
        if not isinstance(substate, State):
            raise TypeError(f"State.update takes a State, got {type(substate).__name__}.")
        entries = self._live()
        extra = [key for key in substate._live() if key not in entries]
        if extra:
            raise ValueError(
                f"State.update: the entries {extra} are not in this State; pass a State "
                "made with `state.substate(...)` from this one."
            )
        self._retired = True
        return State._of({**entries, **substate._live()})

    def __repr__(self) -> str:
        retired = ", retired by set or update" if self._retired else ""
        return f"State({tree_pformat(self._entries)}{retired})"

    def tree_flatten_with_keys(self) -> tuple[list[tuple[DictKey, Any]], tuple[Any, ...]]:
        # A retired State still flattens (transforms look at their inputs after the
        # call); only reading and updating it through its methods is refused.
        entries = self._entries
        keys = tuple(entries)
        return [(DictKey(key), entries[key]) for key in keys], keys

    @classmethod
    def tree_unflatten(cls, keys: tuple[Any, ...], values: Iterable[Any]) -> "State":
        return cls._of(dict(zip(keys, values, strict=True)))


def _signature(tree: Any) -> Any:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, [(jnp.shape(leaf), jnp.result_type(leaf)) for leaf in leaves]


def _shapes(tree: Any) -> str:
    return tree_pformat(
        jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)
    )


def _state_holders(pytree: Any) -> list[Any]:
    return [
        node
        for _, node in pytree_graph.iter_graph(pytree)
        if isinstance(node, StateIndex) or _stateful(node)
    ]


def make_with_state(make_model: Callable[P, T]) -> Callable[P, tuple[T, State]]:
    """Build a model and its `State`, as Equinox's `eqx.nn.make_with_state`.

    `make_with_state(Model)(*args, **kwargs)` calls `Model(*args, **kwargs)`, gives every
    `StateIndex` and stateful layer in the model (`BatchNorm`, `SpectralNorm`) a key made
    from its path (e.g. `"Model.norm"`), and collects their initial values in a `State`.
    The model's layers keep their Variables, which still hold the initial values: the same
    model can be called Equinox's way (`y, state = model(x, state)`, the layers reading
    and writing the State) or in place (`y = model(x)`, the layers updating their
    Variables); `State(model)` gives the initial state again. A layer shared at two places
    is one layer with one entry.

    Arguments:
        make_model: a callable returning the model (usually its class).

    Returns:
        A callable taking `make_model`'s arguments and returning `(model, state)`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_nn import BatchNorm, Linear, Module, make_with_state
        >>> from pytree_transforms import filter_vmap
        >>> class Model(Module):
        ...     def __init__(self):
        ...         self.linear = Linear(3, 2, rngs=0)
        ...         self.norm = BatchNorm(2, axis_name="batch", rngs=0)
        ...     def __call__(self, x, state):
        ...         return self.norm(self.linear(x), state)
        >>> model, state = make_with_state(Model)()
        >>> batched = filter_vmap(
        ...     model, in_axes=(0, None), out_axes=(0, None), axis_name="batch"
        ... )
        >>> y, state = batched(jnp.ones((5, 3)), state)
        >>> y.shape, state.get(model.norm)["mean"].shape, model.norm.state_key
        ((5, 2), (2,), 'Model.norm')
    """

    def make(*args: P.args, **kwargs: P.kwargs) -> tuple[T, State]:
        model = make_model(*args, **kwargs)
        for path, node in pytree_graph.iter_graph(model):
            if isinstance(node, StateIndex):
                node.marker = _path_key(model, path)
            elif _stateful(node):
                node.state_key = _path_key(model, path)
        return model, State(model)

    return make
