"""`error_if` and `branched_error_if`: errors raised from run-time values, inside `jit` too.

A traced program cannot raise a Python exception where a value is bad: the value is not
known until the compiled program runs. So the check is compiled in as a `lax.cond` whose
taken branch calls back into Python (`jax.debug.callback`), and the callback raises. XLA
stops the program and JAX re-raises the failure as a `jax.errors.JaxRuntimeError` (a
`ValueError` from its C++ dispatch path, on later calls), whose text holds our
`RuntimeCheckError` and its message. Where the predicate is known when the check is
traced (eagerly, or a Python bool), `RuntimeCheckError` is raised at once.

The check is tied into the program twice. The failing branch's result replaces `x`, so
the check runs before anything that uses the returned `x`. And the callback is an effect
(`jax.debug.callback`'s), which JAX's partial evaluation and dead-code elimination keep and
XLA does not remove: the check runs even where nothing uses the returned `x`. That is what
keeps a check on the forward pass of `jax.jit(jax.grad(f))` for an `f` linear in `x`: the
gradient does not need the primal value, so a check tied to it by data alone (a
`jax.pure_callback`, as Equinox's) is removed there and never runs. The price is JAX's
dispatch: a compiled function with an effect is called through JAX's Python path rather
than its C++ fast path (about 0.1 ms more per call, measured on a CPU).

The behaviour on failure is a check's own `on_error=`, or else read from
`PYTREE_TRANSFORMS_ON_ERROR` each time a check is traced: `raise` (the default), `nan`,
`breakpoint` or `off`.
"""

import functools
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import batching, mlir

from pytree_filter import combine, is_array, partition
from pytree_module.extend import register_error_if


def _hide_this_module_from_tracebacks() -> None:
    """Ask JAX to leave this module's frames out of the tracebacks it filters and of the
    frames `jax.debug.breakpoint` shows, so the innermost frame left is the user's check.

    JAX has no public API for this; without it (a JAX that moved it) only the tracebacks
    are longer.
    """
    try:
        from jax._src import traceback_util
    except ImportError:
        return
    register = getattr(traceback_util, "register_exclusion", None)
    if register is not None:
        register(__file__)


_hide_this_module_from_tracebacks()

ON_ERROR_VARIABLE = "PYTREE_TRANSFORMS_ON_ERROR"
_MODES = ("raise", "nan", "breakpoint", "off")


class RuntimeCheckError(RuntimeError):
    """A check of `error_if`/`branched_error_if` failed.

    Raised as it is when the predicate is known at trace time (eagerly, or a Python
    bool), and by functions compiled with `filter_jit` where the call raises (on the
    CPU). Inside code compiled otherwise (`jax.jit`) it is raised by a host callback, and
    reaches the caller as the error JAX raises for a failed callback,
    `jax.errors.JaxRuntimeError` (or `ValueError`, on later calls of a compiled function),
    whose text contains `RuntimeCheckError: <message>`; so does a failure that surfaces
    only when the result is waited for, as on GPUs and TPUs.
    """

    # Shown as `pytree_transforms.RuntimeCheckError`, where users import it from.
    __module__ = "pytree_transforms"


_MARKER = "RuntimeCheckError: "


def check_failure_in(error: BaseException) -> RuntimeCheckError | None:
    """The failed check an error raised by a compiled call reports, if it reports one.

    A check that fails inside compiled code reaches the caller wrapped in JAX's error for a
    failed callback, whose text is a long traceback of JAX's frames ending in our
    `RuntimeCheckError: <message>`. `filter_jit` raises the `RuntimeCheckError` instead,
    with only the user's message and where the check is, as Equinox's `filter_jit` does.
    """
    if isinstance(error, RuntimeCheckError):
        return None
    text = str(error)
    start = text.rfind(_MARKER)
    if start < 0:
        return None
    return RuntimeCheckError(text[start + len(_MARKER) :].strip())


class _DropCheckFailureLogs(logging.Filter):
    """Keep a failed check's exception out of JAX's callback log: it is raised anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], RuntimeCheckError))


logging.getLogger("jax._src.callback").addFilter(_DropCheckFailureLogs())
logging.getLogger("jax._src.debugging").addFilter(_DropCheckFailureLogs())


def _unvmap_impl(x: Any, *, reduce: str) -> Any:
    return jnp.any(x) if reduce == "any" else jnp.max(x)


def _unvmap_abstract(x: Any, *, reduce: str) -> Any:
    return jax.core.ShapedArray((), x.dtype)


def _unvmap_batch(args: Any, dims: Any, *, reduce: str) -> tuple[Any, Any]:
    # Reduce over the batch as well: the result is one value for the whole batch.
    return _unvmap_p.bind(args[0], reduce=reduce), None


# `jnp.any`/`jnp.max` that also reduce over `vmap`'s batch axes: a `lax.cond` whose
# predicate is batched runs both branches (as a `select`), and the failing branch calls
# back into Python, so the predicate must be made unbatched first.
_unvmap_p = jax.extend.core.Primitive("unvmap_reduce")
_unvmap_p.def_impl(_unvmap_impl)
_unvmap_p.def_abstract_eval(_unvmap_abstract)
mlir.register_lowering(_unvmap_p, mlir.lower_fun(_unvmap_impl, multiple_results=False))
batching.primitive_batchers[_unvmap_p] = _unvmap_batch


def _dtype(x: Any) -> np.dtype:
    """The dtype of an array, or of the array a Python scalar would make."""
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.result_type(x)


def _poisoned(x: Any) -> Any:
    """`x` made unmistakably bad: NaN for floats, the largest integer, True for bools."""
    dtype = _dtype(x)
    if np.issubdtype(dtype, np.inexact):
        return jnp.full_like(x, np.nan)
    if np.issubdtype(dtype, np.integer):
        return jnp.full_like(x, np.iinfo(dtype).max)
    if np.issubdtype(dtype, np.bool_):
        return jnp.ones_like(x)
    return x


def _poisoned_struct(struct: Any) -> Any:
    """The NumPy version of `_poisoned`, for a `jax.ShapeDtypeStruct`, on the host."""
    dtype = np.dtype(struct.dtype)
    if np.issubdtype(dtype, np.inexact):
        fill: Any = np.nan
    elif np.issubdtype(dtype, np.integer):
        fill = np.iinfo(dtype).max
    else:
        fill = True
    return np.full(struct.shape, fill, dtype)


def _message(msgs: tuple[str, ...], index: Any, where: str) -> str:
    index = int(index)
    if not 0 <= index < len(msgs):
        return (
            f"branched_error_if: the check failed with `index={index}`, but there are only "
            f"{len(msgs)} messages; `index` must pick one of `msgs[0]`..`msgs[{len(msgs) - 1}]`."
            f"{where}"
        )
    return msgs[index] + where


def _on_failure(config: tuple[Any, ...], leaves: list[Any], pred: Any, index: Any) -> list[Any]:
    """The `lax.cond` that does what `mode` says where `pred` is true, else returns `leaves`."""
    msgs, mode, where = config
    structs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]
    if mode == "nan":
        # Unlike the other modes, `pred` is left batched: under `vmap` only the batch
        # elements that fail are replaced.
        return lax.cond(pred, lambda xs: [_poisoned(x) for x in xs], lambda xs: xs, leaves)

    def raises(index: Any) -> Any:
        raise RuntimeCheckError(_message(msgs, index, where))

    def announce(index: Any) -> Any:
        print(f"RuntimeCheckError: {_message(msgs, index, where)}", file=sys.stderr)
        return index

    def poisoned(_: Any) -> list[Any]:
        return [_poisoned_struct(s) for s in structs]

    def fails() -> list[Any]:
        if mode == "raise":
            # An effect, so that the check is kept where the returned `x` is unused (see
            # the module's docstring); `jax.io_callback`'s effect would do too, but JAX
            # 0.10 refuses it inside `custom_jvp` and every JAX inside `jax.checkpoint`.
            jax.debug.callback(raises, index)
            # Should a backend go on past the failed callback (GPUs run programs
            # asynchronously, and the failure reaches Python only when a result is used),
            # what goes on is poisoned values, never `x`'s own, which would look valid.
            return jax.pure_callback(poisoned, structs, index)
        token = jax.pure_callback(announce, jax.ShapeDtypeStruct((), index.dtype), index)
        # One frame, the user's: capturing more frames' variables can fail to trace.
        token = jax.debug.breakpoint(token=token, num_frames=1)
        # Continuing from the debugger goes on with poisoned values, as in mode "nan"; the
        # callback takes the token so that it runs after the debugger is left.
        return jax.pure_callback(poisoned, structs, token)

    return lax.cond(pred, fails, lambda: leaves)


# The `lax.cond` is kept out of autodiff: the check acts on primal values only, and the
# tangents (symbolic zeros included) go through it untouched.
@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _checked(config: tuple[Any, ...], leaves: list[Any], pred: Any, index: Any) -> list[Any]:
    return _on_failure(config, leaves, pred, index)


@_checked.defjvp
def _checked_jvp(config: tuple[Any, ...], primals: Any, tangents: Any) -> tuple[Any, Any]:
    leaves, pred, index = primals
    return _checked(config, leaves, pred, index), tangents[0]


def _on_error_mode(on_error: Any = "default", function: str = "error_if") -> str:
    """What a failure does: `on_error` where the call gives one, else the environment's."""
    if on_error != "default" or type(on_error) is not str:
        if type(on_error) is not str or on_error not in _MODES:
            raise ValueError(
                f"{function}(on_error=...) must be one of "
                f"{', '.join(repr(m) for m in ('default', *_MODES))}, got {on_error!r:.60}. "
                f'"default" follows the environment variable {ON_ERROR_VARIABLE}; the others '
                "override it for this check."
            )
        return on_error
    mode = os.environ.get(ON_ERROR_VARIABLE, "raise")
    if mode not in _MODES:
        raise ValueError(
            f"The environment variable {ON_ERROR_VARIABLE} is {mode!r}, but it must be one of "
            f"{', '.join(repr(m) for m in _MODES)}: set e.g. {ON_ERROR_VARIABLE}=raise, or "
            "unset it for the default (raise)."
        )
    return mode


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep


def _user_location() -> str:
    """Where the check was written: the innermost frame outside this package and JAX."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith((_PACKAGE_DIR, _JAX_DIR)):
            code = frame.f_code
            line = f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
            return f"\n\nThe check is at {line}."
        frame = frame.f_back
    return ""


def _check_arguments(pred: Any, index: Any, msgs: Any, function: str) -> tuple[str, ...]:
    if isinstance(msgs, str) or not isinstance(msgs, Sequence):
        raise TypeError(
            f"{function} expects `msgs` to be a sequence of strings (a list or tuple), but got "
            f"{type(msgs).__name__} {msgs!r:.60}. Pass one message per value of `index`, e.g. "
            '`msgs=["x is negative", "x is too large"]`.'
        )
    if len(msgs) == 0:
        raise ValueError(
            f"{function} got an empty `msgs`: there is no message to raise. Pass at least one "
            "message, one per value of `index`."
        )
    for i, msg in enumerate(msgs):
        if not isinstance(msg, str):
            raise TypeError(
                f"{function} expects every message to be a str, but message {i} is "
                f"{type(msg).__name__} {msg!r:.60}. Format values into the text before the "
                "check (traced values cannot be: they are not known until the program runs)."
            )
    pred_dtype = _dtype(pred)
    if not np.issubdtype(pred_dtype, np.bool_):
        raise TypeError(
            f"{function} expects `pred` to be a boolean array (or a bool), but got one of dtype "
            f"{pred_dtype}. Compare to get one: e.g. `x < 0` rather than `x`, or `x != 0` for "
            "a nonzero test."
        )
    index_dtype = _dtype(index)
    if isinstance(index, bool) or not np.issubdtype(index_dtype, np.integer):
        raise TypeError(
            f"{function} expects `index` to be an integer (a Python int or an integer array), "
            f"but got {type(index).__name__} of dtype {index_dtype}. It picks the message "
            "`msgs[index]`; convert it with `.astype(jnp.int32)` if it was computed as floats."
        )
    return tuple(msgs)


def branched_error_if(
    x: Any, pred: Any, index: Any, msgs: Sequence[str], *, on_error: str = "default"
) -> Any:
    """As `error_if`, with the message picked from `msgs` by a run-time `index`.

    Arguments:
        x: any pytree; returned as it is, with the check tied to its arrays. The check
            runs before anything that uses the returned value, and also where nothing
            does.
        pred: a boolean array of any shape, or a bool; the check fails if any element is
            true. Under `jax.vmap`, it fails if any element of any batch element is true.
        index: an integer scalar (a Python int or an array, traced or not); the message
            raised is `msgs[index]`. Under `jax.vmap`, the largest index among the
            failing batch elements is used.
        msgs: the messages, a sequence of strings.
        on_error: what a failure does, as for `error_if`: `"default"` (what
            `PYTREE_TRANSFORMS_ON_ERROR` says), `"raise"`, `"nan"`, `"breakpoint"` or
            `"off"`.

    Returns:
        `x`, with its arrays tied to the check (in mode `nan`, poisoned where it failed).

    Raises:
        RuntimeCheckError: where `pred` is known when traced (eagerly, or a Python bool)
            and true.
        jax.errors.JaxRuntimeError: inside compiled code, when the check fails (a
            `ValueError` on later calls of a compiled function: JAX's C++ dispatch raises
            that); its text contains `RuntimeCheckError: ` and the message. Raised by the
            call on the CPU, by the first wait for the result on a GPU or TPU (as for
            `error_if`).
        TypeError: `pred` is not boolean, `index` not an integer, or a message not a str.
        ValueError: `msgs` is empty, or `on_error` (or, for `"default"`,
            `PYTREE_TRANSFORMS_ON_ERROR`) is not a known mode.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import branched_error_if
        >>> msgs = ["x is negative", "x is too large"]
        >>> @jax.jit
        ... def checked(x):
        ...     index = jnp.where(x < 0, 0, 1)
        ...     return branched_error_if(x, (x < 0) | (x > 10), index, msgs)
        >>> checked(jnp.array(3.0))
        Array(3., dtype=float32, weak_type=True)
        >>> try:
        ...     checked(jnp.array(30.0))
        ... except (jax.errors.JaxRuntimeError, ValueError) as error:
        ...     print("RuntimeCheckError: x is too large" in str(error))
        True
    """
    msgs = _check_arguments(pred, index, msgs, "branched_error_if")
    mode = _on_error_mode(on_error, "branched_error_if")
    if mode == "off":
        return x
    with jax.ensure_compile_time_eval():
        # Per batch element: did it fail, and which message does it pick (-1: none).
        failed = jnp.any(pred)
        index = jnp.where(failed, index, -1)
        any_failed = _unvmap_p.bind(failed, reduce="any")
        first_index = _unvmap_p.bind(jnp.asarray(index), reduce="max")
    if not isinstance(any_failed, jax.core.Tracer):
        if not any_failed:
            return x
        if not isinstance(first_index, jax.core.Tracer):
            return _fail_now(x, msgs[int(first_index)], mode)
    dynamic, static = partition(x, is_array)
    leaves, treedef = jax.tree.flatten(dynamic)
    if not leaves:
        raise ValueError(
            "branched_error_if needs an array in `x` to tie the check to, but `x` has none "
            f"(got {type(x).__name__} {x!r:.60}). Pass the value(s) whose computation the "
            "check guards, and use the returned value."
        )
    config = (msgs, mode, _user_location())
    failed_now = failed if mode == "nan" else any_failed
    leaves = _checked(config, leaves, failed_now, first_index)
    return combine(jax.tree.unflatten(treedef, leaves), static)


def _stacklevel_outside_package() -> int:
    """The `stacklevel` of `warnings.warn` that names the caller's innermost frame outside
    this package."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        level, frame = level + 1, frame.f_back
    return level


def _fail_now(x: Any, msg: str, mode: str) -> Any:
    """A failure known at trace time: act on it in Python, now."""
    if mode == "nan":
        warnings.warn(
            f"A check failed at trace time, so `x` is replaced by NaNs now (its mode is "
            f"`nan`, from `on_error=` or {ON_ERROR_VARIABLE}): {msg}",
            stacklevel=_stacklevel_outside_package(),
        )
        return jax.tree.map(lambda leaf: _poisoned(leaf) if is_array(leaf) else leaf, x)
    if mode == "breakpoint":
        print(f"RuntimeCheckError: {msg}", file=sys.stderr)
        breakpoint()
        return x
    raise RuntimeCheckError(msg)


def error_if(x: Any, pred: Any, msg: str, *, on_error: str = "default") -> Any:
    """Raise an error where `pred` is true, from run-time values: works inside `jax.jit`.

    The check is compiled into the program: it runs when the program runs, under
    `jax.jit`/`filter_jit`, `jax.vmap`, `lax.scan`/`while_loop`/`cond`, and on the forward
    pass of `jax.grad` (the returned value differentiates as the identity). It is never
    removed as dead code: it runs even where nothing uses the returned value, as on the
    forward pass of `jax.jit(jax.grad(f))` for an `f` linear in `x`. A compiled function
    holding a check is called through JAX's Python dispatch rather than its C++ fast path
    (about 0.1 ms more per call on a CPU). Where `pred` is known when traced (eagerly, or a
    Python/NumPy bool) it is decided at once, and costs nothing at run time if false.

    What a failure does is `on_error`, or for `"default"` the environment variable
    `PYTREE_TRANSFORMS_ON_ERROR`, read when the check is traced: `raise` (the default)
    raises; `nan` returns `x` with its floating arrays NaN (integers their largest value,
    bools True) where the check failed and carries on; `breakpoint` prints the message and
    opens `jax.debug.breakpoint`; `off` removes the check. A check given its own
    `on_error` ignores the environment variable.

    Arguments:
        x: any pytree; returned as it is, with the check tied to its arrays: the check
            runs before anything that uses the returned value (and also where nothing
            does).
        pred: a boolean array of any shape, or a bool; the check fails if any element is
            true (under `jax.vmap`, in any batch element).
        msg: the error message.
        on_error: `"default"`, `"raise"`, `"nan"`, `"breakpoint"` or `"off"` (see above).

    Returns:
        `x`, with its arrays tied to the check.

    Raises:
        RuntimeCheckError: where `pred` is known when traced and true.
        jax.errors.JaxRuntimeError: inside compiled code, when the check fails (a
            `ValueError` on later calls of a compiled function: JAX's C++ dispatch raises
            that); its text contains `RuntimeCheckError: `, the message and the line of
            the check. On the CPU the call raises it; on a GPU or TPU, which run the
            program after the call returns, the first wait for the result does
            (`jax.block_until_ready`, reading a value, or `jax.effects_barrier()`).
        TypeError: `pred` is not boolean, or `msg` not a str.
        ValueError: `on_error` is not one of the values above.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import error_if
        >>> @jax.jit
        ... def safe_log(x):
        ...     x = error_if(x, x <= 0, "safe_log needs positive inputs")
        ...     return jnp.log(x)
        >>> safe_log(jnp.array([1.0, 2.0]))
        Array([0.       , 0.6931472], dtype=float32)
        >>> try:
        ...     safe_log(jnp.array([1.0, -2.0]))
        ... except (jax.errors.JaxRuntimeError, ValueError) as error:
        ...     print("RuntimeCheckError: safe_log needs positive inputs" in str(error))
        True
        >>> error_if(jnp.array(-1.0), jnp.array(-1.0) < 0, "negative")
        Traceback (most recent call last):
        ...
        pytree_transforms.RuntimeCheckError: negative
        >>> poisoned = jax.jit(lambda x: error_if(x, x < 0, "negative", on_error="nan"))
        >>> poisoned(jnp.array([-1.0, 2.0]))  # this check returns NaNs rather than raising
        Array([nan, nan], dtype=float32)
    """
    if not isinstance(msg, str):
        raise TypeError(
            f"error_if expects `msg` to be a str, but got {type(msg).__name__} {msg!r:.60}. "
            "Format values into the text before the check; for a message picked at run "
            "time, use `branched_error_if(x, pred, index, msgs)`."
        )
    if on_error != "default" or type(on_error) is not str:
        _on_error_mode(on_error, "error_if")  # refused here, naming this function
    return branched_error_if(x, pred, 0, [msg], on_error=on_error)


# `Enumeration` members' `error_if` is this check (pytree_module cannot import it).
register_error_if(branched_error_if)
