"""Errors JAX raises while tracing a graph transform, told in the caller's terms.

JAX names the function it traces and its arguments in some errors ("while tracing the
function pure at ... because it depends on the value of the argument values[3]"). A
graph transform traces a function of its own, whose arguments are the call's structure
and the values of its Variables and arrays; so such a message names internals. Here it
is rewritten to name the user's function, and each value by its argument and path
(`model.layers[0].kernel`).
"""

import inspect
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from pytree_filter import path_text

from ._boundary import Call
from ._traverse import Path

# The names of the lists of values the traced functions take (`pure_donating` takes two).
_VALUE_NAME = re.compile(r"\b(values|donated|kept)\[(\d+)\]")
_FUNCTION = re.compile(r"the function (pure|pure_donating) at \S+:\d+")


def function_description(fun: Callable[..., Any]) -> str:
    """`name at file:line` of a function, as JAX's messages show functions."""
    fun = inspect.unwrap(fun)
    while isinstance(fun, partial):
        fun = inspect.unwrap(fun.func)
    code = getattr(fun, "__code__", None)
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", repr(fun))
    if code is None:
        return name
    return f"{name} at {code.co_filename}:{code.co_firstlineno}"


def _parameter_names(fun: Callable[..., Any]) -> list[str]:
    try:
        parameters = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters if p.kind in positional]


def argument_path_name(call: Call, fun: Callable[..., Any], path: Path) -> str:
    """A value's place in a call, as the caller would write it: `model.layers[0].w`."""
    argument, relative = call.split_path(path)
    if argument is None:
        return f"the function{path_text(relative) if relative else ''}"
    if isinstance(argument, str):
        name = argument
    else:
        names = _parameter_names(fun)
        name = names[argument] if argument < len(names) else f"args[{argument}]"
    return name + (path_text(relative) if relative else "")


def rename_in_error(
    error: BaseException,
    call: Call,
    fun: Callable[..., Any],
    paths: Sequence[Path],
    lists: dict[str, Sequence[int]],
) -> None:
    """Rewrite `error`'s message in place (it keeps its type and traceback), if it names
    the traced function or its values.

    Arguments:
        error: the error JAX raised.
        call: how the user's function is called.
        fun: the user's function.
        paths: the path of each leaf of the call's tree.
        lists: for each list of values the traced function took ("values", ...), the
            leaf position of each of its entries.
    """
    if not error.args or not isinstance(error.args[0], str):
        return
    message = error.args[0]
    if "the function pure" not in message and not _VALUE_NAME.search(message):
        return

    def value_name(match: re.Match) -> str:
        positions = lists.get(match.group(1))
        index = int(match.group(2))
        if positions is None or index >= len(positions):
            return match.group(0)
        return argument_path_name(call, fun, paths[positions[index]])

    message = _FUNCTION.sub(lambda _: f"the function {function_description(fun)}", message)
    message = _VALUE_NAME.sub(value_name, message)
    error.args = (message, *error.args[1:])
