"""Filtered automatic differentiation: grad, value_and_grad, jvp, vjp and Jacobians."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from pytree_filter import combine, is_array, is_inexact_array, is_inexact_array_like, partition

from ._outputs import split_output


def _split_first(fun: Callable[..., Any], arg: Any):
    """Wrap `fun(x, *args, **kwargs)` as a function of the selected leaves of `x`."""

    def call(x: Any, args: tuple, kwargs: dict):
        diff, nondiff = partition(x, arg)

        def of_diff(diff: Any) -> Any:
            return fun(combine(diff, nondiff), *args, **kwargs)

        return diff, of_diff

    return call


def _aux_splitter(fun: Callable[..., Any], has_aux: bool):
    """Let `fun`'s auxiliary output hold any Python objects: arrays go through JAX."""
    if not has_aux:
        return fun, lambda aux: aux
    holder: list[Any] = []

    @functools.wraps(fun)
    def with_array_aux(*args: Any, **kwargs: Any) -> Any:
        value, aux = fun(*args, **kwargs)
        dynamic, static = split_output(aux, is_array, "filter_grad(has_aux=True)")
        holder[:] = [static]
        return value, dynamic

    def rebuild(dynamic: list[Any]) -> Any:
        return holder[0].rebuild(dynamic)

    return with_array_aux, rebuild


def filter_value_and_grad(
    fun: Callable[..., Any] | None = None,
    *,
    arg: Any = is_inexact_array,
    has_aux: bool = False,
    **gradkwargs: Any,
) -> Any:
    """`jax.value_and_grad` for functions of any pytrees: differentiate the first argument.

    The leaves of the first argument selected by `arg` (by default floating-point arrays)
    are differentiated; its other leaves, and all other arguments, may be anything and get
    no gradient (`None` in their place).

    Arguments:
        fun: a function `fun(x, *args, **kwargs)` returning a scalar (or `(scalar, aux)`
            with `has_aux=True`). Omit it to get a decorator.
        arg: filter spec (a prefix of the first argument) of what to differentiate.
        has_aux: whether `fun` returns `(value, aux)`; `aux` may hold any objects.
        **gradkwargs: passed to `jax.value_and_grad` (`holomorphic`, `allow_int`, ...).

    Returns:
        A function returning `(value, grads)`, or `((value, aux), grads)`. `grads` has the
        structure of the first argument, with `None` for leaves not differentiated.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_value_and_grad
        >>> def loss(params, scale):
        ...     return scale * jnp.sum(params["w"] ** 2)
        >>> value, grads = filter_value_and_grad(loss)({"w": jnp.ones(2), "name": "w"}, 3.0)
        >>> value, grads
        (Array(6., dtype=float32), {'name': None, 'w': Array([6., 6.], dtype=float32)})
    """
    if fun is None:
        return lambda f: filter_value_and_grad(f, arg=arg, has_aux=has_aux, **gradkwargs)
    _check_callable(fun, "filter_value_and_grad")
    _refuse_argnums(gradkwargs, "filter_value_and_grad")
    inner, rebuild_aux = _aux_splitter(fun, has_aux)
    split = _split_first(inner, arg)

    @functools.wraps(fun)
    def value_and_grad(x: Any, /, *args: Any, **kwargs: Any) -> Any:
        diff, of_diff = split(x, args, kwargs)
        value, grads = jax.value_and_grad(of_diff, has_aux=has_aux, **gradkwargs)(diff)
        if has_aux:
            value, aux = value
            return (value, rebuild_aux(aux)), grads
        return value, grads

    return value_and_grad


def filter_grad(
    fun: Callable[..., Any] | None = None,
    *,
    arg: Any = is_inexact_array,
    has_aux: bool = False,
    **gradkwargs: Any,
) -> Any:
    """`jax.grad` for functions of any pytrees: the gradient of the first argument.

    As `filter_value_and_grad`, returning only the gradients (and `aux` with `has_aux`).

    Arguments:
        fun: a function `fun(x, *args, **kwargs)` returning a scalar (or `(scalar, aux)`).
        arg: filter spec (a prefix of the first argument) of what to differentiate; by
            default every floating-point array.
        has_aux: whether `fun` returns `(value, aux)`.
        **gradkwargs: passed to `jax.grad`.

    Returns:
        A function returning `grads` (or `(grads, aux)`), shaped like the first argument,
        with `None` for leaves not differentiated.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_grad
        >>> model = {"w": jnp.array(2.0), "steps": jnp.array(3), "act": "relu"}
        >>> filter_grad(lambda m, x: m["w"] * x)(model, 5.0)
        {'act': None, 'steps': None, 'w': Array(5., dtype=float32, weak_type=True)}
    """
    if fun is None:
        return lambda f: filter_grad(f, arg=arg, has_aux=has_aux, **gradkwargs)
    _check_callable(fun, "filter_grad")
    value_and_grad = filter_value_and_grad(fun, arg=arg, has_aux=has_aux, **gradkwargs)

    @functools.wraps(fun)
    def grad(x: Any, /, *args: Any, **kwargs: Any) -> Any:
        value, grads = value_and_grad(x, *args, **kwargs)
        if has_aux:
            return grads, value[1]
        return grads

    return grad


def _refuse_argnums(kwargs: dict[str, Any], transform: str) -> None:
    if "argnums" in kwargs:
        raise TypeError(
            f"{transform} differentiates its first argument only, so it takes no `argnums`. "
            "To differentiate several objects, pass them together as a tuple in the first "
            "argument."
        )


def _check_callable(fun: Any, transform: str) -> None:
    if not callable(fun):
        raise TypeError(f"{transform} expects a function, got {fun!r}.")


def filter_jvp(
    fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]
) -> tuple[Any, Any]:
    """`jax.jvp` for functions of any pytrees.

    Arguments:
        fn: the function, called as `fn(*primals)`; it may take and return anything.
        primals: the arguments, a sequence (one entry per positional parameter).
        tangents: the same structure as `primals`, with a tangent for each floating-point
            array or Python float and `None` everywhere else.

    Returns:
        `(primals_out, tangents_out)`; `tangents_out` has `None` for every output leaf that
        is not a floating-point array.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jvp
        >>> out, tangent = filter_jvp(lambda x, n: x**n, (jnp.array(3.0), 2), (1.0, None))
        >>> out, tangent
        (Array(9., dtype=float32, weak_type=True), Array(6., dtype=float32, weak_type=True))
    """
    if not isinstance(primals, tuple | list) or not isinstance(tangents, tuple | list):
        raise TypeError("filter_jvp expects `primals` and `tangents` as tuples (or lists).")
    primals = tuple(primals)
    diff, nondiff = partition(primals, is_inexact_array_like)
    try:
        diff_tangents = jax.tree.structure(diff).flatten_up_to(tuple(tangents))
    except (ValueError, TypeError):
        raise ValueError(
            "filter_jvp: `tangents` must have the structure of `primals`, with an array for "
            "every floating-point array (or Python float) and None everywhere else."
        ) from None
    diff_tangents = jax.tree.structure(diff).unflatten(diff_tangents)
    holder: list[Any] = []

    def of_diff(diff: Any) -> Any:
        out = fn(*combine(diff, nondiff))
        dynamic, static = split_output(out, is_inexact_array, "filter_jvp")
        holder[:] = [static]
        return dynamic

    out, tangent_out = jax.jvp(of_diff, (diff,), (diff_tangents,))
    static = holder[0]
    return static.rebuild(out), static.rebuild(tangent_out, static_as_none=True)


def filter_vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple:
    """`jax.vjp` for functions of any pytrees.

    Arguments:
        fun: called as `fun(*primals)`; may return any pytree (or `(out, aux)`).
        *primals: the arguments.
        has_aux: whether `fun` returns `(out, aux)`.

    Returns:
        `(out, vjp_fn)` or `(out, vjp_fn, aux)`. `vjp_fn(cotangent)` takes a cotangent with
        arrays for the floating-point array leaves of `out` and `None` elsewhere, and returns
        a tuple of cotangents for `primals` (`None` for leaves that are not floating-point).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_vjp
        >>> out, vjp_fn = filter_vjp(lambda x, name: (x * 2, name), jnp.ones(2), "x")
        >>> out
        (Array([2., 2.], dtype=float32), 'x')
        >>> vjp_fn((jnp.ones(2), None))
        (Array([2., 2.], dtype=float32), None)
    """
    diff, nondiff = partition(primals, is_inexact_array)
    holder: list[Any] = []

    def of_diff(diff: Any) -> Any:
        result = fun(*combine(diff, nondiff))
        out, aux = result if has_aux else (result, None)
        dynamic, static = split_output(out, is_inexact_array, "filter_vjp")
        holder[:] = [static]
        return (dynamic, aux) if has_aux else dynamic

    if has_aux:
        out, vjp, aux = jax.vjp(of_diff, diff, has_aux=True)
    else:
        out, vjp = jax.vjp(of_diff, diff)
    static = holder[0]

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        try:
            leaves = static.treedef.flatten_up_to(cotangent)
        except (ValueError, TypeError):
            raise ValueError(
                "filter_vjp: the cotangent must have the structure of the output, with an "
                "array for each floating-point array leaf and None elsewhere."
            ) from None
        dynamic = [c for c, m in zip(leaves, static.mask, strict=True) if m]
        (grads,) = vjp(dynamic)
        return grads

    if has_aux:
        return static.rebuild(out), vjp_fn, aux
    return static.rebuild(out), vjp_fn


def _jacobian(
    jax_transform: Callable[..., Any],
    name: str,
    fun: Callable[..., Any] | None,
    has_aux: bool,
    kwargs: dict[str, Any],
) -> Any:
    if fun is None:
        return lambda f: _jacobian(jax_transform, name, f, has_aux, kwargs)
    _check_callable(fun, name)
    _refuse_argnums(kwargs, name)

    @functools.wraps(fun)
    def jacobian(x: Any, /, *args: Any, **kw: Any) -> Any:
        diff, nondiff = partition(x, is_inexact_array)

        def of_diff(diff: Any) -> Any:
            return fun(combine(diff, nondiff), *args, **kw)

        return jax_transform(of_diff, has_aux=has_aux, **kwargs)(diff)

    return jacobian


def filter_jacfwd(
    fun: Callable[..., Any] | None = None, *, has_aux: bool = False, **kwargs: Any
) -> Any:
    """`jax.jacfwd` with respect to the first argument's floating-point arrays.

    The first argument's other leaves, and all other arguments, may be anything.

    Arguments:
        fun: a function `fun(x, *args, **kwargs)` returning arrays (or `(out, aux)`).
        has_aux: whether `fun` returns `(out, aux)`.
        **kwargs: passed to `jax.jacfwd`.

    Returns:
        A function returning the Jacobian over the first argument's structure, with `None`
        for leaves that are not floating-point arrays.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jacfwd
        >>> filter_jacfwd(lambda p: p["w"] ** 2)({"w": jnp.array([1.0, 2.0]), "tag": "w"})["w"]
        Array([[2., 0.],
               [0., 4.]], dtype=float32)
    """
    return _jacobian(jax.jacfwd, "filter_jacfwd", fun, has_aux, kwargs)


def filter_jacrev(
    fun: Callable[..., Any] | None = None, *, has_aux: bool = False, **kwargs: Any
) -> Any:
    """`jax.jacrev` with respect to the first argument's floating-point arrays.

    The first argument's other leaves, and all other arguments, may be anything.

    Arguments:
        fun: a function `fun(x, *args, **kwargs)` returning arrays (or `(out, aux)`).
        has_aux: whether `fun` returns `(out, aux)`.
        **kwargs: passed to `jax.jacrev`.

    Returns:
        A function returning the Jacobian over the first argument's structure, with `None`
        for leaves that are not floating-point arrays.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jacrev
        >>> filter_jacrev(lambda p: p["w"] ** 2)({"w": jnp.array([1.0, 2.0]), "tag": "w"})["w"]
        Array([[2., 0.],
               [0., 4.]], dtype=float32)
    """
    return _jacobian(jax.jacrev, "filter_jacrev", fun, has_aux, kwargs)


def filter_hessian(
    fun: Callable[..., Any] | None = None, *, has_aux: bool = False, **kwargs: Any
) -> Any:
    """`jax.hessian` with respect to the first argument's floating-point arrays.

    Arguments:
        fun: a function `fun(x, *args, **kwargs)` returning a scalar (or `(out, aux)`).
        has_aux: whether `fun` returns `(out, aux)`.
        **kwargs: passed to `jax.hessian`.

    Returns:
        A function returning the Hessian over the first argument's structure (nested twice),
        with `None` for leaves that are not floating-point arrays.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_hessian
        >>> filter_hessian(lambda p: jnp.sum(p["w"] ** 3))({"w": jnp.array([1.0, 2.0])})["w"]["w"]
        Array([[ 6.,  0.],
               [ 0., 12.]], dtype=float32)
    """
    return _jacobian(jax.hessian, "filter_hessian", fun, has_aux, kwargs)
