"""Every transform refuses a non-callable function with one message naming the fix."""

import re
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import pytest

from pytree_transforms import (
    filter_checkpoint,
    filter_closure_convert,
    filter_custom_jvp,
    filter_custom_vjp,
    filter_eval_shape,
    filter_grad,
    filter_hessian,
    filter_jacfwd,
    filter_jacrev,
    filter_jit,
    filter_jvp,
    filter_make_jaxpr,
    filter_pmap,
    filter_pure_callback,
    filter_value_and_grad,
    filter_vjp,
    filter_vmap,
)

NOT_CALLABLE = 3.5  # what `f(x)` gives, passed by mistake in place of `f`


def _identity(x: Any) -> Any:
    return x


# (transform, argument, spelling of the call with `{}` for the function, the call made)
CASES: list[tuple[str, str, str, Callable[[], Any]]] = [
    ("filter_jit", "fun", "filter_jit({})", lambda: filter_jit(NOT_CALLABLE)),
    ("filter_grad", "fun", "filter_grad({})", lambda: filter_grad(NOT_CALLABLE)),
    (
        "filter_value_and_grad",
        "fun",
        "filter_value_and_grad({})",
        lambda: filter_value_and_grad(NOT_CALLABLE),
    ),
    ("filter_jacfwd", "fun", "filter_jacfwd({})", lambda: filter_jacfwd(NOT_CALLABLE)),
    ("filter_jacrev", "fun", "filter_jacrev({})", lambda: filter_jacrev(NOT_CALLABLE)),
    ("filter_hessian", "fun", "filter_hessian({})", lambda: filter_hessian(NOT_CALLABLE)),
    (
        "filter_jvp",
        "fn",
        "filter_jvp({}, primals, tangents)",
        lambda: filter_jvp(NOT_CALLABLE, (jnp.ones(1),), (jnp.ones(1),)),
    ),
    ("filter_vjp", "fun", "filter_vjp({}, x)", lambda: filter_vjp(NOT_CALLABLE, jnp.ones(1))),
    ("filter_vmap", "fun", "filter_vmap({})", lambda: filter_vmap(NOT_CALLABLE)),
    ("filter_pmap", "fun", "filter_pmap({})", lambda: filter_pmap(NOT_CALLABLE)),
    ("filter_checkpoint", "fun", "filter_checkpoint({})", lambda: filter_checkpoint(NOT_CALLABLE)),
    (
        "filter_closure_convert",
        "fn",
        "filter_closure_convert({}, x)",
        lambda: filter_closure_convert(NOT_CALLABLE, jnp.ones(1)),
    ),
    ("filter_custom_jvp", "fn", "filter_custom_jvp({})", lambda: filter_custom_jvp(NOT_CALLABLE)),
    ("filter_custom_vjp", "fn", "filter_custom_vjp({})", lambda: filter_custom_vjp(NOT_CALLABLE)),
    (
        "filter_pure_callback",
        "callback",
        "filter_pure_callback({}, x, result_shape_dtypes=...)",
        lambda: filter_pure_callback(NOT_CALLABLE, jnp.ones(1), result_shape_dtypes=jnp.ones(1)),
    ),
    ("filter_make_jaxpr", "fun", "filter_make_jaxpr({})", lambda: filter_make_jaxpr(NOT_CALLABLE)),
    (
        "filter_eval_shape",
        "fun",
        "filter_eval_shape({}, x)",
        lambda: filter_eval_shape(NOT_CALLABLE, jnp.ones(1)),
    ),
    (
        "defjvp",
        "jvp_fn",
        "fn.defjvp({})",
        lambda: filter_custom_jvp(_identity).defjvp(NOT_CALLABLE),
    ),
    (
        "defvjp",
        "fn_fwd",
        "fn.defvjp({}, fn_bwd)",
        lambda: filter_custom_vjp(_identity).defvjp(NOT_CALLABLE, _identity),
    ),
    (
        "defvjp",
        "fn_bwd",
        "fn.defvjp(fn_fwd, {})",
        lambda: filter_custom_vjp(_identity).defvjp(_identity, NOT_CALLABLE),
    ),
]


@pytest.mark.parametrize(
    ("transform", "argument", "spelling", "call"),
    CASES,
    ids=[f"{transform}-{argument}" for transform, argument, _, _ in CASES],
)
def test_every_transform_refuses_a_non_callable_naming_the_argument_and_the_fix(
    transform: str, argument: str, spelling: str, call: Callable[[], Any]
) -> None:
    with pytest.raises(TypeError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{transform} expects ")
    assert f"as `{argument}`, but got float 3.5, which is not callable." in message
    assert f"it needs `{argument}` to be a function, a bound method" in message
    fix = (
        "Pass the function itself, not the result of calling it: "
        f"`{spelling.format('f')}`, not `{spelling.format('f(x)')}`."
    )
    assert message.endswith(fix), message


def test_the_message_shows_a_long_value_cut_short() -> None:
    with pytest.raises(TypeError, match=re.escape("but got list [0, 1, 2, 3")) as info:
        filter_jit(list(range(1000)))
    assert "999" not in str(info.value)
