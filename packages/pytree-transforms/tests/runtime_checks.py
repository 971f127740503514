"""How a failed run-time check reaches the caller on each backend, for the tests to assert.

A check (`error_if`, `branched_error_if`, `debug.backward_nan`, `filter_pure_callback`'s
result check) fails inside a host callback of a compiled program. Where the program runs
decides where the failure surfaces:

- On the CPU, JAX runs a program's host callbacks before the call returns, and the call
  itself raises (with asynchronous CPU dispatch on or off).
- On a GPU or TPU the call returns before the program has run. The failure surfaces where the
  caller waits: for a result (`jax.block_until_ready`) or for the program's effects
  (`jax.effects_barrier()`), raised as JAX's error whose text ends with `RuntimeCheckError:
  <message>`. And a backend that goes on past the failed callback leaves what comes out of
  the check poisoned (floating arrays NaN, integers at their largest value, bools True).

`assert_check_fails` asserts the first on the CPU and the second elsewhere, so the tests hold
on both. `simulated_accelerator` makes the CPU behave as an accelerator does, to test that.
The tests import this module by name (conftest.py puts this folder on `sys.path`).
"""

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import pytest

from pytree_transforms import RuntimeCheckError, _error_if

# How JAX reports a callback that raised, inside compiled code: a JaxRuntimeError on the
# call that compiles, a ValueError from its C++ dispatch path on later calls.
COMPILED_FAILURE = (jax.errors.JaxRuntimeError, ValueError)


def raises_at_the_call() -> bool:
    """Whether a failed check raises from the call itself: on the CPU, not on accelerators."""
    return jax.default_backend() == "cpu"


def run_and_wait(call: Callable[[], Any]) -> Any:
    """`call()`, then wait for its results and its callbacks, as a user who reads them does."""
    out = call()
    jax.block_until_ready(out)
    jax.effects_barrier()
    return out


def _poisoned(leaf: Any) -> bool:
    array = np.asarray(leaf)
    if array.size == 0:
        return False
    if np.issubdtype(array.dtype, np.inexact):
        return bool(np.isnan(array).all())
    if np.issubdtype(array.dtype, np.integer):
        return bool((array == np.iinfo(array.dtype).max).all())
    return False


def _message_of(error: BaseException) -> str:
    """The text to match: a check's own message where JAX's error reports a failed check."""
    failure = _error_if.check_failure_in(error)
    return str(failure if failure is not None else error)


def assert_check_fails(
    call: Callable[[], Any],
    match: str,
    errors: type[BaseException] | tuple[type[BaseException], ...] = COMPILED_FAILURE,
) -> BaseException | None:
    """Assert that `call()` fails a run-time check whose message matches `match`.

    On the CPU, `call()` itself must raise one of `errors`, with `match` found in its text.
    On an accelerator, `call()` and the waits of `run_and_wait` must raise one of `errors`
    or JAX's error for a failed callback (raised at a wait), with `match` found in the
    check's message (`RuntimeCheckError: <message>` in JAX's text); or, if nothing raised,
    some array of the result must be poisoned. A check whose result nothing uses leaves
    nothing poisoned: there, only the raise passes.

    Returns the error raised, or None where the result was poisoned instead.
    """
    if raises_at_the_call():
        with pytest.raises(errors, match=match) as info:
            call()
        return info.value
    expected = errors if isinstance(errors, tuple) else (errors,)
    try:
        out = run_and_wait(call)
    except (*expected, *COMPILED_FAILURE) as error:
        message = _message_of(error)
        assert re.search(match, message), f"{match!r} not found in {message!r}"
        return error
    leaves = jax.tree.leaves(out)
    assert any(_poisoned(leaf) for leaf in leaves), (
        "the check did not fail: nothing raised by the time its results were ready, and no "
        f"array of them is poisoned: {leaves}"
    )
    return None


@contextlib.contextmanager
def simulated_accelerator(monkeypatch: pytest.MonkeyPatch, *, raises_at_wait: bool) -> Iterator:
    """Make the CPU report failed checks as an accelerator does, for checks traced inside.

    The call no longer raises: the failing callback's error is kept, and the check's poisoned
    values come out. With `raises_at_wait`, `jax.effects_barrier()` then raises it as JAX's
    error for a failed callback; without, it is lost, as on a backend that goes on past it.
    """
    failures: list[BaseException] = []
    callback = jax.debug.callback

    def keeping(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def kept(*values: Any) -> None:
            try:
                function(*values)
            except RuntimeCheckError as error:
                failures.append(error)

        return callback(kept, *args, **kwargs)

    def barrier() -> None:
        if raises_at_wait and failures:
            error = failures.pop()
            failures.clear()
            raise jax.errors.JaxRuntimeError(
                f"INTERNAL: CpuCallback error: RuntimeCheckError: {error}"
            )

    with monkeypatch.context() as patch:
        patch.setattr(_error_if.jax.debug, "callback", keeping)
        patch.setattr(jax, "effects_barrier", barrier)
        patch.setattr(sys.modules[__name__], "raises_at_the_call", lambda: False)
        yield
