"""`assert_max_traces` and `get_num_traces`: count how often a function is traced.

The wrapper goes inside a jit (`filter_jit(assert_max_traces(f, max_traces=1))`): there its
body runs once per trace, not once per call, so counting calls counts traces.
"""

import functools
import threading
from collections.abc import Callable
from typing import Any

import jax

from ._method import BindsAsMethod
from ._retraces import current_retrace


class _Count:
    """The number of traces of one wrapper, shared by every copy that flattening and
    unflattening the wrapper makes (they hold the same `_Count` in their static data)."""

    __slots__ = ("lock", "value")

    def __init__(self) -> None:
        self.value = 0
        # Traces may run from several threads; their increments must not be lost.
        self.lock = threading.Lock()


@jax.tree_util.register_pytree_node_class
class _AssertMaxTraces(BindsAsMethod):
    """The callable `assert_max_traces` returns: `fn`, counting its calls.

    A pytree whose child is `fn`, so a Module wrapped in it keeps its arrays traced by the
    jit outside.
    """

    def __init__(self, fn: Callable[..., Any], max_traces: int | None, count: _Count):
        self.fn = fn
        self.max_traces = max_traces
        self.count = count
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.count.lock:
            self.count.value += 1
            traces = self.count.value
        if self.max_traces is not None and traces > self.max_traces:
            message = (
                f"{_name(self.fn)} may be traced at most {self.max_traces} time(s) "
                f"(assert_max_traces), and this is trace {traces}. A jitted function is "
                "traced again when an array argument changes shape or dtype, when a "
                "non-array (static) argument changes value, or when the jit wrapper is made "
                "anew with different options. Pass values that vary as arrays, keep shapes "
                "fixed, or raise `max_traces` if the traces are expected."
            )
            # The jit tracing this call says what changed since its closest earlier trace.
            retrace = current_retrace()
            if retrace is not None:
                message += "\nWhat changed:\n" + retrace.message()
            raise RuntimeError(message)
        return self.fn(*args, **kwargs)

    def tree_flatten(self) -> tuple[tuple[Any], tuple[Any, ...]]:
        return (self.fn,), (self.max_traces, self.count)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any]) -> "_AssertMaxTraces":
        return cls(children[0], *aux)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def assert_max_traces(fn: Callable[..., Any] | None = None, *, max_traces: int | None) -> Any:
    """Raise when `fn` is traced more than `max_traces` times: a guard against retracing.

    Place it inside the jit: `@filter_jit` above `@assert_max_traces(max_traces=1)`. Each
    wrapper counts on its own; copies of it made by flattening (a jit does this) share the
    count.

    Arguments:
        fn: the function to wrap (a Module or any callable). Omit it to get a decorator.
        max_traces: the most traces allowed, or None to only count them (read the count
            with `get_num_traces`).

    Returns:
        `fn` wrapped to count its traces.

    Raises:
        RuntimeError: from the wrapper, on the trace after the `max_traces`-th. Under
            `filter_jit`, `pytree_graph.jit` or `jit_partial` its message ends with what
            changed since the closest earlier trace of that jit, by argument path (as
            `explain_retraces` logs it).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jit
        >>> from pytree_transforms.debug import assert_max_traces, get_num_traces
        >>> @filter_jit
        ... @assert_max_traces(max_traces=1)
        ... def double(x):
        ...     return 2 * x
        >>> _ = double(jnp.ones(2)); _ = double(jnp.zeros(2))
        >>> get_num_traces(double)
        1
        >>> double(jnp.ones(3))
        Traceback (most recent call last):
        ...
        RuntimeError: ...double may be traced at most 1 time(s) ...
        What changed:
        filter_jit(double): retraced (trace 2): args[0]: shape (2,) -> (3,) ...
    """
    if fn is None:
        return functools.partial(assert_max_traces, max_traces=max_traces)
    if max_traces is not None and (
        not isinstance(max_traces, int) or isinstance(max_traces, bool) or max_traces < 0
    ):
        raise ValueError(
            f"assert_max_traces(max_traces=...) takes a count of traces (an int >= 0) or "
            f"None to only count them; got {max_traces!r}."
        )
    return _AssertMaxTraces(fn, max_traces, _Count())


def get_num_traces(fn: Any) -> int:
    """How many times a function wrapped in `assert_max_traces` has been traced.

    Arguments:
        fn: the wrapper `assert_max_traces` returned, or a wrapper around it (one with a
            `__wrapped__` leading to it, such as `filter_jit`'s).

    Returns:
        The number of traces so far.

    Raises:
        ValueError: when `fn` does not lead to an `assert_max_traces` wrapper.

    Examples:
        >>> from pytree_transforms.debug import assert_max_traces, get_num_traces
        >>> counted = assert_max_traces(abs, max_traces=None)
        >>> counted(-1), counted(2), get_num_traces(counted)
        (1, 2, 2)
    """
    found = fn
    while not isinstance(found, _AssertMaxTraces):
        found = getattr(found, "__wrapped__", None)
        if found is None:
            raise ValueError(
                f"get_num_traces: {fn!r} is not wrapped in `assert_max_traces`, so its traces "
                "are not counted. Wrap the function inside the jit: "
                "`filter_jit(assert_max_traces(f, max_traces=None))`."
            )
    return found.count.value
