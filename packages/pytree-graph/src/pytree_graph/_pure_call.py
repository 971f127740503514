"""Pure functions of a split graph: `call` (a method of `(graphdef, state)`, returning the
new state) and `map` (a new graph from a function of each leaf)."""

from collections.abc import Callable
from typing import Any

from pytree_filter import Path
from pytree_module import Module

from ._graphdef import PURE_CALL, GraphDef, build, merge
from ._split_merge import _child, _lift, split


class PureCall:
    """What `call` returns: reach a method by attribute or index, then call it.

    `call(gs).encode(x)`, `call(gs)["layers"][0](x)` and `call(gs)(x)` each build a copy
    of the graph, call the method on it, and return `(out, (graphdef, new_state))`.
    """

    __slots__ = ("_accessors", "_graphdef", "_states")

    def __init__(self, graphdef: GraphDef, states: tuple[Any, ...], accessors: tuple = ()):
        self._graphdef = graphdef
        self._states = states
        self._accessors = accessors

    def __getattr__(self, name: str) -> "PureCall":
        if name.startswith("__"):
            raise AttributeError(name)
        return PureCall(self._graphdef, self._states, (*self._accessors, (True, name)))

    def __getitem__(self, key: Any) -> "PureCall":
        return PureCall(self._graphdef, self._states, (*self._accessors, (False, key)))

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, tuple[GraphDef, Any]]:
        # Copies of the Variables: the method's writes go to them, not to the States given.
        node = merge(self._graphdef, *self._states, copy=True)
        target = node
        for depth, (is_attribute, key) in enumerate(self._accessors):
            try:
                target = getattr(target, key) if is_attribute else _child(target, key)
            except (AttributeError, KeyError, IndexError, TypeError):
                shown = "".join(
                    f".{k}" if attr else f"[{k!r}]" for attr, k in self._accessors[: depth + 1]
                )
                raise AttributeError(
                    f"call: the graph has nothing at `{shown}` (a {type(target).__name__} "
                    f"has no {'attribute' if is_attribute else 'item'} {key!r})."
                ) from None
        if not callable(target):
            raise TypeError(
                f"call: `{type(target).__name__}` reached through the accessors is not "
                "callable. Name a method, e.g. `call((graphdef, state)).encode(x)`."
            )
        out = target(*args, **kwargs)
        return out, split(node)

    def __repr__(self) -> str:
        shown = "".join(f".{k}" if attr else f"[{k!r}]" for attr, k in self._accessors)
        return f"PureCall({self._graphdef!r}){shown}"


def call(graphdef_and_states: tuple[Any, ...], /) -> PureCall:
    """Call a method of a split graph as a pure function: `(graphdef, state)` in,
    `(out, (graphdef, new_state))` out.

    The graph is built from copies of the State's Variables, so the method may change
    its state (counters, batch statistics, caches) without touching the State passed
    in (or the model it came from): the changes are in the returned State. Reach the
    method by attribute or index (`call(gs).encode(x)`, `call(gs)["decoder"](x)`); call
    `call(gs)` itself for `__call__`. It suits code that threads the state explicitly,
    such as a plain `jax.jit` or `jax.lax.scan` body.

    Arguments:
        graphdef_and_states: `(graphdef, state)` as `split` returns it (or
            `(graphdef, state_1, ..., state_n)` for a split with filters).

    Returns:
        A `PureCall`: index or get attributes to reach the method, then call it; the
        call returns `(out, (graphdef, new_state))`.

    Raises:
        TypeError: `graphdef_and_states` does not start with a GraphDef.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, Variable, call, split
        >>> class Counter(Module):
        ...     def __init__(self):
        ...         self.scale = Param(jnp.array(2.0))
        ...         self.count = Variable(jnp.array(0))
        ...     def __call__(self, x):
        ...         self.count.value += 1
        ...         return x * self.scale.value
        >>> gs = split(Counter())
        >>> y, new_gs = jax.jit(lambda gs, x: call(gs)(x))(gs, 3.0)
        >>> float(y), int(new_gs[1].count.value), int(gs[1].count.value)
        (6.0, 1, 0)
    """
    if not (
        isinstance(graphdef_and_states, tuple)
        and graphdef_and_states
        and isinstance(graphdef_and_states[0], GraphDef)
    ):
        raise TypeError(
            "call expects the tuple `(graphdef, state)` that `split` returns, got a "
            f"{type(graphdef_and_states).__name__}. Call it as `call(split(model))(x)` or "
            "`call((graphdef, state)).method(x)`."
        )
    return PureCall(graphdef_and_states[0], graphdef_and_states[1:])


PURE_CALL.append(call)


def map(
    fn: Callable[[Path, Any], Any],
    node: Any,
    /,
    *,
    graph: bool | None = None,
    recreate_variables: bool = True,
) -> Any:
    """A new graph whose leaves are `fn(path, leaf)` of the leaves of `node`.

    `fn` is called once per Variable (or array) of `node`'s state, shared ones once, as
    `split` gives them: with the Variable itself. What it returns takes the leaf's place
    in a new graph of the same structure: a Variable is placed as it is (so returning
    the argument shares it with `node`); a bare value gets a new Variable of the leaf's
    type and metadata. The Modules are new and `node` is not changed.

    Arguments:
        fn: called as `fn(path, leaf)`; returns a Variable or a value.
        node: a Module (or a list, dict or tuple of them).
        graph: `False` for tree mode (see `split`); `None` reads `set_graph_mode`.
        recreate_variables: with False, a bare value `fn` returns is placed as it is,
            not put in a new Variable (`fn` returning arrays gives a graph of arrays).

    Returns:
        The new graph.

    Raises:
        TypeError: `fn` is not callable (or is a Module: the graph comes second).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> import pytree_graph as pg
        >>> class Linear(Module):
        ...     def __init__(self):
        ...         self.w = pg.Param(jnp.ones(2))
        >>> model = Linear()
        >>> zeros = pg.map(lambda path, v: jnp.zeros_like(v.value), model)
        >>> type(zeros.w).__name__, zeros.w.value.tolist(), model.w.value.tolist()
        ('Param', [0.0, 0.0], [1.0, 1.0])
    """
    if not callable(fn) or isinstance(fn, Module):
        raise TypeError(
            f"map expects a function `fn(path, leaf)` as its first argument, got a "
            f"{type(fn).__name__}. The graph comes second: `map(fn, node)`."
        )
    lifted = _lift(node, "map", graph)
    graphdef = lifted.graphdef
    return build(
        graphdef,
        [fn(p, leaf) for p, leaf in zip(graphdef.paths, lifted.leaves, strict=True)],
        recreate_variables=recreate_variables,
    )
