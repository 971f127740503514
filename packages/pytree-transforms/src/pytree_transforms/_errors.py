"""Error helpers shared by the filtered transforms: naming a leaf by its path, refusing
non-callables and graph objects, and making the traced function look like the user's."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax

from pytree_filter import path_keys, path_text
from pytree_module import Module
from pytree_module.extend import is_pytree_class


def describe_leaf(tree: Any, index: int, names: tuple[str, ...]) -> str:
    """Name the leaf at flat `index` of `tree` (a tuple), e.g. `args[0].weight`."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if index >= len(paths):
        return f"leaf {index}"
    keys = path_keys(paths[index])
    text = names[keys[0]] if keys and isinstance(keys[0], int) and keys[0] < len(names) else ""
    text += path_text(keys[1:], root="")
    return f"the leaf at {text or 'the top level'}"


def check_callable(
    value: Any,
    transform: str,
    argument: str = "fun",
    *,
    what: str = "a function",
    spelling: str | None = None,
) -> None:
    """Refuse a `value` that is not callable, passed where `transform` takes a function.

    The message names the transform and the argument, shows what was passed, and shows the
    fix for the usual mistake, passing a function's result instead of the function:
    `spelling` is how the call is written, with `{}` where the function goes (by default
    `transform({})`).
    """
    if callable(value):
        return
    spelling = spelling or f"{transform}({{}})"
    raise TypeError(
        f"{transform} expects {what} as `{argument}`, but got {type(value).__name__} "
        f"{value!r:.60}, which is not callable. It expects a callable: it needs `{argument}` "
        "to be a function, a bound method or another object with `__call__` (a Module, say). "
        "Pass the function itself, not the result of calling it: "
        f"`{spelling.format('f')}`, not `{spelling.format('f(x)')}`."
    )


def check_pytree_objects(values: tuple[Any, ...], transform: str) -> None:
    """Refuse `pytree=False` Modules: they are graph objects, not pytrees."""
    for value in values:
        if isinstance(value, Module) and not is_pytree_class(type(value)):
            kind = type(value).__name__
            raise TypeError(
                f"{transform} got a {kind}, which is declared `pytree=False`: it is not a "
                "pytree, so a filtered transform cannot see its arrays. Use the graph "
                f"transforms of pytree_graph (e.g. pytree_graph.jit), or declare {kind} "
                "without `pytree=False`."
            )


def source_function(fun: Callable[..., Any]) -> Callable[..., Any] | None:
    """The Python function whose code calling `fun` runs: `fun` itself, the function it
    wraps, a method's function, or a callable object's `__call__` (None if there is none)."""
    try:
        fun = inspect.unwrap(fun)
    except ValueError:  # a cycle of `__wrapped__`
        return None
    while isinstance(fun, functools.partial):
        fun = fun.func
    call = type(fun).__dict__.get("__call__") or getattr(type(fun), "__call__", None)  # noqa: B004
    for candidate in (fun, getattr(fun, "__func__", None), call):
        if hasattr(candidate, "__code__"):
            return candidate
    return None


def present_like(
    traced: Callable[..., Any], presented: Callable[..., Any], signature: inspect.Signature
) -> None:
    """Give `traced` the name and source of `presented`, made by `present_as` for the same
    user function, with its own `signature` (without holding the user's function, which a
    callable pytree would be)."""
    traced.__name__ = presented.__name__
    traced.__qualname__ = presented.__qualname__
    if hasattr(presented, "__wrapped__"):
        traced.__wrapped__ = presented.__wrapped__  # type: ignore[attr-defined]
    traced.__signature__ = signature  # type: ignore[attr-defined]


def present_as(
    traced: Callable[..., Any],
    fun: Callable[..., Any],
    signature: inspect.Signature | None,
) -> None:
    """Make `traced`, the function a transform hands to JAX, look like the user's `fun`.

    JAX's errors ("while tracing the function f at model.py:12 ... depends on the value of
    the argument params['w']") and the lowered program's name come from the traced
    function's `__name__`, the function it wraps (for the source line) and its signature
    (for argument names), so these are set to the user's.
    """
    source = source_function(fun)
    named = fun if hasattr(fun, "__name__") else source
    traced.__name__ = getattr(named, "__name__", type(fun).__name__)
    traced.__qualname__ = getattr(named, "__qualname__", type(fun).__qualname__)
    if source is not None:
        traced.__wrapped__ = source  # type: ignore[attr-defined]
    if signature is not None:
        traced.__signature__ = signature  # type: ignore[attr-defined]
