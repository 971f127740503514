"""Which JAX trace is current: the token the trace-level guard compares."""

from collections.abc import Callable
from typing import Any


def _find_trace_state() -> Any:
    """JAX's thread-local "current trace" setting, if this JAX version has it as expected.

    Its `.value` is the current trace's weak reference to itself: reading it is one C call
    that allocates nothing, which matters because every unflatten records the current trace.
    """
    try:
        from jax._src.core import trace_ctx, trace_state

        if trace_state.value is not trace_ctx.trace._weakref:
            return None
    except (ImportError, AttributeError):
        return None
    return trace_state


# Generated unflatten code reads `trace_state.value` inline when this is set.
trace_state = _find_trace_state()


def make_current_trace_token(state: Any) -> Callable[[], Any]:
    """Pick the cheapest way to identify the current trace (`state` from `_find_trace_state`)."""
    if state is None:
        from jax.extend.core import get_opaque_trace_state

        def current_trace_token() -> Any:
            return get_opaque_trace_state(convention="pytree_module")

        return current_trace_token

    def current_trace_token() -> Any:
        return state.value

    return current_trace_token


current_trace_token = make_current_trace_token(trace_state)
current_trace_token.__doc__ = "Return a token that compares equal only for the same JAX trace."


def same_trace(token: Any) -> bool:
    """Whether `token` was taken in the trace that is current now."""
    current = current_trace_token()
    return token is current or token == current
