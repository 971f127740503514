"""Warnings about Module definitions and attribute values that are likely mistakes.

Two, as Equinox gives them: a `__post_init__` that will never run because a hand-written
`__init__` replaces the generated one, and a JAX-transformed callable (`jax.vmap(layer)`,
`jax.jit(module)`, ...) stored as an attribute, which hides the parameters it wraps from the
Module's pytree. Both are `UserWarning`s pointing at the user's line.
"""

import sys
import warnings
from types import CodeType, FunctionType
from typing import Any

import jax

from pytree_filter import is_array_like


def _identity(x: Any) -> Any:
    return x


# The types of the callables JAX's transforms return. Most are plain functions (made with
# `functools.wraps`, so they carry `__wrapped__`); `jax.jit` returns its own C++ type. Worked
# out from JAX itself, so a release that changes a type is still covered.
TRANSFORMED_TYPES: frozenset[type] = frozenset(
    {
        FunctionType,
        jax.custom_jvp,
        jax.custom_vjp,
        *(
            type(transform(_identity))
            for transform in (
                jax.jit,
                jax.grad,
                jax.value_and_grad,
                jax.vmap,
                jax.jacfwd,
                jax.jacrev,
                jax.hessian,
                jax.checkpoint,
            )
        ),
    }
)

_PACKAGE = __name__.partition(".")[0]


def warn_at_user_code(message: str, skip: tuple[CodeType, ...] = ()) -> None:
    """`warnings.warn(message)` attributed to the first caller outside this package.

    Frames running code in `skip` (a generated `__init__`, say) are passed over as well, so
    the warning names the line the user wrote, however deep inside the package it is found.
    """
    level = 2
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        frame.f_globals.get("__name__", "").partition(".")[0] == _PACKAGE or frame.f_code in skip
    ):
        frame = frame.f_back
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


# ------------------------------------------------------------------------- __post_init__


def calls_post_init(init: Any) -> bool:
    """Whether the code of `init` mentions `__post_init__`: it then runs it deliberately."""
    code = getattr(init, "__code__", None)
    return code is not None and "__post_init__" in code.co_names


def warn_post_init_skipped(cls: type) -> None:
    """Warn that `cls.__post_init__` will not run: `cls` has a hand-written `__init__`."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    warn_at_user_code(
        f"Class `{name}` has both a hand-written `__init__` (its own or inherited) and a "
        "`__post_init__`, so `__post_init__` will not run: only the `__init__` generated from "
        "the fields calls it, and a hand-written one replaces that. Either:\n"
        "  1. call `self.__post_init__()` at the end of `__init__`, or move its code there;\n"
        "  2. rename it `__check_init__` if it only checks invariants: that runs after "
        "every `__init__`, hand-written or generated;\n"
        "  3. or remove `__init__`, to use the generated one."
    )


# ------------------------------------------------------------------ transformed callables


def warn_if_wrapping_parameters(
    cls: type, name: str, value: Any, skip: tuple[CodeType, ...] = ()
) -> None:
    """Warn if `value`, a JAX-transformed callable, wraps a pytree holding array-likes.

    Callers test first that `type(value)` is in `TRANSFORMED_TYPES`, so most values cost
    one set lookup. The `__wrapped__` chain is followed (`jax.jit(jax.vmap(layer))`); the
    transforms' own callables and plain functions hold no parameters and are not flattened.
    """
    seen = {id(value)}
    wrapped = getattr(value, "__wrapped__", None)
    while wrapped is not None and id(wrapped) not in seen:
        seen.add(id(wrapped))
        if type(wrapped) not in TRANSFORMED_TYPES and _holds_array_likes(wrapped):
            warn_at_user_code(_transformed_message(cls, name, wrapped), skip)
            return
        wrapped = getattr(wrapped, "__wrapped__", None)


def _holds_array_likes(tree: Any) -> bool:
    try:
        leaves = jax.tree_util.tree_leaves(tree)
    except Exception:
        # A Module still running its `__init__` cannot be flattened yet, and a user's
        # flatten function may fail: either way there is nothing to warn about.
        return False
    return any(is_array_like(leaf) for leaf in leaves)


def _transformed_message(cls: type, name: str, wrapped: Any) -> str:
    return (
        f"Attribute '{name}' of {cls.__module__}.{cls.__qualname__} holds a JAX-transformed "
        "callable (made by jax.jit, jax.vmap, jax.grad or the like) that wraps a "
        f"{type(wrapped).__name__} holding arrays. The callable JAX returns is not a pytree, "
        "so those arrays are hidden from this Module: gradients, optimizers, tree_at and "
        "pytree_graph do not see or update them. Either store the wrapped object itself "
        f"(`self.{name} = layer`) and apply the transform when calling it "
        f"(`jax.vmap(self.{name})(x)`), or use the filtered transforms of pytree_transforms "
        "(`filter_vmap(layer)`, `filter_jit(layer)`), which return pytrees."
    )
