"""`filter_checkpoint`: `jax.checkpoint` (rematerialisation) for functions of any pytrees."""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_filter import is_array

from ._errors import check_callable
from ._input_writes import checking_writes
from ._method import ComparedByOptions, method_as_pytree, options_key, register_wrapper
from ._outputs import split_output
from ._sharing import SplitTree


def filter_checkpoint(
    fun: Callable[..., Any] | None = None,
    *,
    prevent_cse: bool = True,
    policy: Callable[..., bool] | None = None,
) -> Any:
    """`jax.checkpoint` for functions of any pytrees: recompute activations on the backward
    pass instead of storing them.

    Arrays in the arguments are inputs of the checkpointed computation; every other leaf is
    passed through unchanged, and non-array outputs are returned as they are.

    Arguments:
        fun: the function. Omit it to get a decorator.
        prevent_cse: as for `jax.checkpoint`.
        policy: a `jax.checkpoint_policies` policy saying which values may be saved.

    Returns:
        The checkpointed function.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_checkpoint
        >>> block = filter_checkpoint(lambda p, x: jnp.tanh(p["w"] * x))
        >>> grad = jax.grad(lambda w: block({"w": w, "name": "b"}, 2.0))(1.0)
        >>> round(float(grad), 4)
        0.1413
    """
    if fun is None:
        return lambda f: filter_checkpoint(f, prevent_cse=prevent_cse, policy=policy)
    check_callable(fun, "filter_checkpoint")
    return _Checkpointed(fun, prevent_cse, policy)


@register_wrapper
class _Checkpointed(ComparedByOptions):
    """The function `filter_checkpoint` returns; two made around equal functions with equal
    options compare (and hash) equal (see `ComparedByOptions`)."""

    def __init__(self, fun: Callable[..., Any], prevent_cse: bool, policy: Any, key: Any = None):
        fun = method_as_pytree(fun)
        self._fun = fun
        self._prevent_cse = prevent_cse
        self._policy = policy
        self._options_key = options_key((prevent_cse, policy)) if key is None else key
        self._checked = checking_writes(fun, "filter_checkpoint")
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = SplitTree((args, kwargs), is_array, "traced")
        checked = self._checked

        def inner(dynamic: Any) -> Any:
            call_args, call_kwargs = inputs.rebuild(dynamic)
            out = checked(*call_args, **call_kwargs)
            return split_output(out, is_array, "filter_checkpoint")

        checkpointed = jax.checkpoint(inner, prevent_cse=self._prevent_cse, policy=self._policy)
        out, static_out = checkpointed(inputs.selected())
        return static_out.rebuild(out)

    def _key(self) -> tuple[Any, ...]:
        return self._fun, self._options_key

    def _options(self) -> tuple[Any, tuple[Any, ...]]:
        """The key of the options and the arguments but `fun` (see `register_wrapper`)."""
        return self._options_key, (self._prevent_cse, self._policy, self._options_key)

    @classmethod
    def _rebuild(cls, arguments: tuple[Any, ...], fun: Any) -> "_Checkpointed":
        return cls(fun, *arguments)
