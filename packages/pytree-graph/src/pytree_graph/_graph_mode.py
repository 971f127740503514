"""`set_graph_mode`, `set_graph_updates`: the default of every `graph=` / `graph_updates=`.

Graph mode (the default) walks an object graph: shared Variables and Modules stay shared,
and a transform writes back whatever the function changed, new attributes included. Tree mode
(`graph=False`) takes each argument as the pytree it already is: faster, and a Variable met
twice is refused. `graph_updates=False` keeps graph mode's sharing but writes back only
Variable values, never structure. The two switches are set as Flax NNX sets them: called, a
switch holds until changed; used with `with` or as a decorator, it holds for that block or
call only.
"""

import functools
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class _Stacks(threading.local):
    # One stack per switch and thread: a thread that sets tree mode leaves other threads'
    # transforms in theirs.
    def __init__(self) -> None:
        self.graph: list[bool] = []
        self.graph_updates: list[bool] = []


_STACKS = _Stacks()


class _Switch:
    """A boolean default set by a call, for a `with` block, or around a decorated function."""

    _name: ClassVar[str]
    _default: ClassVar[bool] = True

    @classmethod
    def _stack(cls) -> list[bool]:
        return getattr(_STACKS, cls._name)

    def __init__(self, value: bool, /) -> None:
        if not isinstance(value, bool):
            raise TypeError(
                f"{type(self).__name__} takes True or False, got {value!r} "
                f"({type(value).__name__})."
            )
        stack = self._stack()
        # Set now, so that a plain call (no `with`) changes the default from here on.
        self._previous = stack[-1] if stack else None
        if stack:
            stack[-1] = value
        else:
            stack.append(value)
        self._value = value

    @classmethod
    def current_value(cls) -> bool:
        """The value in force: the innermost setting, else the default (`True`)."""
        stack = cls._stack()
        return stack[-1] if stack else cls._default

    def __enter__(self) -> None:
        # The constructor replaced the value in force; keep it beneath, to come back to.
        if self._previous is not None:
            self._stack().insert(-1, self._previous)

    def __exit__(self, *exc_info: object) -> None:
        self._stack().pop()

    def __call__(self, fun: F) -> F:
        # As a decorator the setting belongs to each call, not to the moment of decoration:
        # undo what the constructor set, and set it around every call instead.
        stack = self._stack()
        stack.pop()
        if self._previous is not None:
            stack.append(self._previous)
        value = self._value

        @functools.wraps(fun)
        def with_setting(*args: Any, **kwargs: Any) -> Any:
            self._stack().append(value)
            try:
                return fun(*args, **kwargs)
            finally:
                self._stack().pop()

        return with_setting  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._value!r})"


class set_graph_mode(_Switch):
    """Choose graph mode (`True`, the default) or tree mode (`False`) for `graph=None`.

    Every graph transform and graph function takes `graph=`; left as `None` it reads this
    switch. Called, the setting holds until the next call; with `with`, for the block; as a
    decorator, during each call of the function.

    Arguments:
        value: `True` for graph mode, `False` for tree mode.

    The object made is usable as a context manager or a decorator; a plain call needs
    neither.

    Example:
        >>> import pytree_graph as pg
        >>> with pg.set_graph_mode(False):
        ...     pg.set_graph_mode.current_value()
        False
        >>> pg.set_graph_mode.current_value()
        True
    """

    _name = "graph"


class set_graph_updates(_Switch):
    """Choose whether graph mode writes structure back (`True`, the default).

    Read by every `graph_updates=None`.

    With `False`, a graph transform keeps shared references but writes back only Variable
    values: attributes added or replaced inside are not carried out, and gradients come back
    shaped as the Module. Set as `set_graph_mode` is.

    Arguments:
        value: `True` to write structure back, `False` for values only.

    The object made is usable as a context manager or a decorator; a plain call needs
    neither.

    Example:
        >>> import pytree_graph as pg
        >>> @pg.set_graph_updates(False)
        ... def inside():
        ...     return pg.set_graph_updates.current_value()
        >>> inside(), pg.set_graph_updates.current_value()
        (False, True)
    """

    _name = "graph_updates"


def resolve_modes(graph: bool | None, graph_updates: bool | None) -> tuple[bool, bool]:
    """`(graph, graph_updates)` with each `None` read from its switch.

    Called when a transform is built, as Flax NNX reads them: a function wrapped inside a
    `with set_graph_mode(False)` block stays in tree mode after the block.
    """
    if graph is None:
        graph = set_graph_mode.current_value()
    if graph_updates is None:
        graph_updates = set_graph_updates.current_value()
    for name, value in (("graph", graph), ("graph_updates", graph_updates)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}= takes True, False or None; got {value!r}.")
    return graph, graph_updates
