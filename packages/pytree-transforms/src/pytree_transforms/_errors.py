"""Error helpers shared by the filtered transforms."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax

from pytree_filter import path_keys
from pytree_module import Module


def describe_leaf(tree: Any, index: int, names: tuple[str, ...]) -> str:
    """Name the leaf at flat `index` of `tree` (a tuple), e.g. `args[0].weight`."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if index >= len(paths):
        return f"leaf {index}"
    keys = path_keys(paths[index])
    text = names[keys[0]] if keys and isinstance(keys[0], int) and keys[0] < len(names) else ""
    for key in keys[1:]:
        text += f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
    return f"the leaf at {text or 'the top level'}"


def check_pytree_objects(values: tuple[Any, ...], transform: str) -> None:
    """Refuse `pytree=False` Modules: they are graph objects, not pytrees."""
    for value in values:
        if isinstance(value, Module) and not type(value).__module_pytree__:
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
