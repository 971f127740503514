"""Filtered automatic differentiation: grad, value_and_grad, jvp, vjp and Jacobians."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from pytree_filter import (
    combine,
    flatten_with_mask,
    is_array,
    is_inexact_array,
    is_inexact_array_like,
    partition,
    path_text,
)

from ._errors import check_callable
from ._input_writes import checking_writes
from ._method import ComparedByOptions, method_as_pytree, options_key, register_wrapper
from ._outputs import StaticOutput, split_output
from ._sharing import SplitTree, find_sharing, first_places, has_repeats, selected_once


def _split_first(fun: Callable[..., Any], arg: Any):
    """Wrap `fun(x, *args, **kwargs)` as a function of the selected leaves of `x`.

    `call(x, args, kwargs)` returns `(diff, of_diff, as_grads)`: what to differentiate,
    `fun` as a function of it, and what turns its gradient into a tree shaped like `x`
    (`None` where nothing was differentiated). An object reached by several paths of `x`
    (a tied weight) is differentiated once: its gradient sums every use, and the
    gradient tree holds one object at each of its places.
    """

    def call(x: Any, args: tuple, kwargs: dict):
        leaves, mask, treedef = flatten_with_mask(x, arg)
        sharing = find_sharing(x, treedef) if has_repeats(leaves) else None
        if sharing is None:
            diff, nondiff = partition(x, arg)

            def of_diff(diff: Any) -> Any:
                return fun(combine(diff, nondiff), *args, **kwargs)

            return diff, of_diff, _identity

        mask = selected_once(sharing, x, mask, "differentiated")
        unique = sharing.dedupe(leaves)
        diff_leaves = [leaf for leaf, m in zip(unique, mask, strict=True) if m]

        def of_shared_diff(diff: list[Any]) -> Any:
            it = iter(diff)
            rebuilt = [next(it) if m else leaf for leaf, m in zip(unique, mask, strict=True)]
            return fun(sharing.unflatten(rebuilt), *args, **kwargs)

        def as_grads(grads: list[Any]) -> Any:
            it = iter(grads)
            return sharing.unflatten([next(it) if m else None for m in mask])

        return diff_leaves, of_shared_diff, as_grads

    return call


def _identity(x: Any) -> Any:
    return x


def _aux_splitter(fun: Callable[..., Any], has_aux: bool):
    """Let `fun`'s auxiliary output hold any Python objects: arrays go through JAX, the rest
    in the aux's treedef (see `_outputs`)."""
    if not has_aux:
        return fun, _identity

    @functools.wraps(fun)
    def with_array_aux(*args: Any, **kwargs: Any) -> Any:
        value, aux = fun(*args, **kwargs)
        return value, split_output(aux, is_array, "filter_grad(has_aux=True)")

    def rebuild(split_aux: tuple[list[Any], StaticOutput]) -> Any:
        dynamic, static = split_aux
        return static.rebuild(dynamic)

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
    _check_has_aux(has_aux, "filter_value_and_grad")
    if fun is None:
        return lambda f: filter_value_and_grad(f, arg=arg, has_aux=has_aux, **gradkwargs)
    check_callable(fun, "filter_value_and_grad")
    _refuse_argnums(gradkwargs, "filter_value_and_grad")
    return _Differentiated("filter_value_and_grad", fun, arg, has_aux, gradkwargs)


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
    _check_has_aux(has_aux, "filter_grad")
    if fun is None:
        return lambda f: filter_grad(f, arg=arg, has_aux=has_aux, **gradkwargs)
    check_callable(fun, "filter_grad")
    _refuse_argnums(gradkwargs, "filter_grad")
    return _Differentiated("filter_grad", fun, arg, has_aux, gradkwargs)


@register_wrapper
class _Differentiated(ComparedByOptions):
    """The function `filter_grad` or `filter_value_and_grad` returns.

    Two made around the same function with the same options compare (and hash) equal, so
    `filter_jit(filter_grad(f))` built again, in a loop say, finds the compilations of the
    first instead of tracing again.
    """

    def __init__(
        self,
        transform: str,
        fun: Callable[..., Any],
        arg: Any,
        has_aux: bool,
        gradkwargs: dict[str, Any],
    ):
        self._transform = transform
        fun = method_as_pytree(fun)
        self._fun = fun
        self._arg = arg
        self._has_aux = has_aux
        self._gradkwargs = gradkwargs
        # Keyword arguments have no order, so they are keyed sorted by name.
        self._options_key = options_key((arg, has_aux, sorted(gradkwargs.items())))
        inner, self._rebuild_aux = _aux_splitter(checking_writes(fun, transform, 1), has_aux)
        self._split = _split_first(inner, arg)
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, x: Any, /, *args: Any, **kwargs: Any) -> Any:
        diff, of_diff, as_grads = self._split(x, args, kwargs)
        differentiate = jax.value_and_grad(of_diff, has_aux=self._has_aux, **self._gradkwargs)
        value, grads = differentiate(diff)
        grads = as_grads(grads)
        if self._transform == "filter_grad":
            return (grads, self._rebuild_aux(value[1])) if self._has_aux else grads
        if self._has_aux:
            value, aux = value
            return (value, self._rebuild_aux(aux)), grads
        return value, grads

    def _key(self) -> tuple[Any, ...]:
        return self._transform, self._fun, self._options_key

    def _options(self) -> tuple[Any, tuple[Any, ...]]:
        """The key of the options and the arguments but `fun` (see `register_wrapper`)."""
        arguments = (self._transform, self._arg, self._has_aux, self._gradkwargs)
        return (self._transform, self._options_key), (arguments, self._options_key)

    @classmethod
    def _rebuild(cls, arguments: tuple[Any, ...], fun: Any) -> "_Differentiated":
        (transform, arg, has_aux, gradkwargs), key = arguments
        wrapper = cls(transform, fun, arg, has_aux, gradkwargs)
        wrapper._options_key = key  # a token stands for unhashable options: keep it
        return wrapper


def _refuse_argnums(kwargs: dict[str, Any], transform: str) -> None:
    if "argnums" in kwargs:
        raise TypeError(
            f"{transform} differentiates its first argument only, so it takes no `argnums`. "
            "To differentiate several objects, pass them together as a tuple in the first "
            "argument."
        )


def _check_has_aux(has_aux: Any, transform: str) -> None:
    if not isinstance(has_aux, bool):
        raise TypeError(
            f"{transform}(has_aux=...) takes True or False, got {has_aux!r}. Pass "
            "`has_aux=True` when the function returns `(value, aux)`, and leave it out when "
            "it returns the value alone."
        )


def filter_jvp(
    fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any], **kwargs: Any
) -> tuple[Any, Any]:
    """`jax.jvp` for functions of any pytrees.

    Arguments:
        fn: the function, called as `fn(*primals, **kwargs)`; it may take and return
            anything.
        primals: the arguments, a sequence (one entry per positional parameter).
        tangents: the same structure as `primals`, with a tangent for each floating-point
            array or Python float to perturb and `None` everywhere else. `None` is a zero
            tangent; it may stand for a whole argument.
        **kwargs: keyword arguments for `fn`, not differentiated.

    Returns:
        `(primals_out, tangents_out)`; `tangents_out` has the structure of `primals_out`,
        with `None` for every output leaf whose tangent is zero by construction: leaves
        that are not floating-point arrays, and those that do not depend on any perturbed
        input.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_jvp
        >>> def f(x, y, n):
        ...     return x**n, y * 2, "done"
        >>> primals = (jnp.array(3.0), jnp.array(1.0), 2)
        >>> out, tangents = filter_jvp(f, primals, (1.0, None, None))
        >>> tangents
        (Array(6., dtype=float32, weak_type=True), None, None)
    """
    check_callable(fn, "filter_jvp", "fn", spelling="filter_jvp({}, primals, tangents)")
    if not isinstance(primals, tuple | list) or not isinstance(tangents, tuple | list):
        raise TypeError("filter_jvp expects `primals` and `tangents` as tuples (or lists).")
    primals = tuple(primals)
    leaves, treedef = jax.tree.flatten(primals)
    perturbed = _perturbed_leaves(primals, tuple(tangents))
    if not perturbed:
        out = fn(*primals, **kwargs)
        return out, jax.tree.map(lambda _: None, out)

    def of_perturbed(values: list[Any]) -> tuple[list[Any], StaticOutput]:
        # The inputs are tracers of this JVP; outputs carried by other values (constants,
        # unperturbed inputs, tracers of an enclosing transform) have a symbolic zero
        # tangent, returned as None.
        trace = values[0]._trace
        full = list(leaves)
        for i, value in zip(perturbed, values, strict=True):
            full[i] = value
        out = checking_writes(fn, "filter_jvp", len(primals))(*treedef.unflatten(full), **kwargs)
        out_leaves, out_def = jax.tree.flatten(out)
        mask = [isinstance(x, jax.core.Tracer) and x._trace is trace for x in out_leaves]
        static = tuple(x for x, m in zip(out_leaves, mask, strict=True) if not m)
        dynamic = [x for x, m in zip(out_leaves, mask, strict=True) if m]
        return dynamic, StaticOutput(out_def, mask, static)

    (out, static), (tangent_out, _) = jax.jvp(
        of_perturbed, ([leaves[i] for i in perturbed],), (list(perturbed.values()),)
    )
    return static.rebuild(out), static.rebuild(tangent_out, static_as_none=True)


def _is_none(x: Any) -> bool:
    return x is None


def _perturbed_leaves(primals: tuple, tangents: tuple) -> dict[int, Any]:
    """The given tangents of `primals`' leaves, by flat index, checked against them;
    `None` in `tangents` means a zero tangent for every leaf below it."""
    tangent_leaves, tangent_def = jax.tree.flatten(tangents, is_leaf=_is_none)
    try:
        subtrees = tangent_def.flatten_up_to(primals)
    except (ValueError, TypeError):
        raise ValueError(
            "filter_jvp: `tangents` must have the structure of `primals`, with a tangent for "
            "each floating-point array (or Python float) to perturb and None everywhere "
            f"else; got {tangent_def} for primals of structure {jax.tree.structure(primals)}."
        ) from None
    perturbed: dict[int, Any] = {}
    index = 0
    for n, (tangent, subtree) in enumerate(zip(tangent_leaves, subtrees, strict=True)):
        below = jax.tree.leaves(subtree)
        if tangent is not None:
            if not (len(below) == 1 and below[0] is subtree and is_inexact_array_like(subtree)):
                # A TypeError, as `jax.jvp` raises for a tangent whose primal cannot have one
                # (an integer primal given a float tangent).
                raise TypeError(
                    f"filter_jvp: {_tangent_path(tangents, n)} is a tangent, but the primal "
                    f"there is {_describe(subtree)}, which cannot be perturbed: only "
                    "floating-point arrays and Python floats can. Pass None there."
                )
            if np.shape(tangent) != np.shape(subtree):
                raise ValueError(
                    f"filter_jvp: {_tangent_path(tangents, n)} has shape {np.shape(tangent)}, "
                    f"but its primal has shape {np.shape(subtree)}."
                )
            perturbed[index] = tangent
        index += len(below)
    return perturbed


def _tangent_path(tangents: tuple, n: int) -> str:
    path = jax.tree_util.tree_flatten_with_path(tangents, is_leaf=_is_none)[0][n][0]
    return "tangents" + path_text(path, root="")


def _describe(value: Any) -> str:
    if is_array(value):
        return f"an array of dtype {value.dtype}"
    return f"a {type(value).__name__}"


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
    check_callable(fun, "filter_vjp", spelling="filter_vjp({}, x)")
    _check_has_aux(has_aux, "filter_vjp")
    inputs = SplitTree(primals, is_inexact_array, "differentiated")
    diff = inputs.selected()
    checked = checking_writes(fun, "filter_vjp")

    def of_diff(diff: Any) -> Any:
        result = checked(*inputs.rebuild(diff))
        out, aux = result if has_aux else (result, None)
        split_out = split_output(out, is_inexact_array, "filter_vjp")
        if has_aux:
            return split_out, split_output(aux, is_array, "filter_vjp(has_aux=True)")
        return split_out

    if has_aux:
        (out, static), vjp, (aux, aux_static) = jax.vjp(of_diff, diff, has_aux=True)
    else:
        (out, static), vjp = jax.vjp(of_diff, diff)

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        try:
            leaves = static.treedef.flatten_up_to(cotangent)
        except (ValueError, TypeError):
            raise ValueError(
                "filter_vjp: the cotangent must have the structure of the output, with an "
                "array for each floating-point array leaf and None elsewhere."
            ) from None
        if static.sharing is not None:
            leaves = first_places(static.sharing, leaves)
        dynamic = [c for c, m in zip(leaves, static.mask, strict=True) if m]
        # The cotangent's treedef must be the output's, `StaticOutput` included.
        (grads,) = vjp((dynamic, static))
        return inputs.selected_tree(grads)

    if has_aux:
        return static.rebuild(out), vjp_fn, aux_static.rebuild(aux)
    return static.rebuild(out), vjp_fn


def _jacobian(
    jax_transform: Callable[..., Any],
    name: str,
    fun: Callable[..., Any] | None,
    has_aux: bool,
    kwargs: dict[str, Any],
) -> Any:
    _check_has_aux(has_aux, name)
    if fun is None:
        return lambda f: _jacobian(jax_transform, name, f, has_aux, kwargs)
    check_callable(fun, name)
    _refuse_argnums(kwargs, name)
    return _Jacobian(jax_transform, name, fun, has_aux, kwargs)


@register_wrapper
class _Jacobian(ComparedByOptions):
    """The function `filter_jacfwd`, `filter_jacrev` or `filter_hessian` returns; two made
    around equal functions with equal options compare (and hash) equal."""

    def __init__(
        self,
        jax_transform: Callable[..., Any],
        name: str,
        fun: Callable[..., Any],
        has_aux: bool,
        kwargs: dict[str, Any],
    ):
        fun = method_as_pytree(fun)
        self._jax_transform = jax_transform
        self._name = name
        self._fun = fun
        self._has_aux = has_aux
        self._kwargs = kwargs
        self._options_key = options_key((has_aux, sorted(kwargs.items())))
        self._checked = checking_writes(fun, name, 1)
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, x: Any, /, *args: Any, **kw: Any) -> Any:
        diff, nondiff = partition(x, is_inexact_array)
        checked = self._checked

        def of_diff(diff: Any) -> Any:
            return checked(combine(diff, nondiff), *args, **kw)

        return self._jax_transform(of_diff, has_aux=self._has_aux, **self._kwargs)(diff)

    def _key(self) -> tuple[Any, ...]:
        # Keyword arguments have no order, so they are keyed sorted by name.
        return self._name, self._fun, self._options_key

    def _options(self) -> tuple[Any, tuple[Any, ...]]:
        """The key of the options and the arguments but `fun` (see `register_wrapper`)."""
        arguments = (self._jax_transform, self._name, self._has_aux, self._kwargs)
        return (self._name, self._options_key), (arguments, self._options_key)

    @classmethod
    def _rebuild(cls, arguments: tuple[Any, ...], fun: Any) -> "_Jacobian":
        (jax_transform, name, has_aux, kwargs), key = arguments
        wrapper = cls(jax_transform, name, fun, has_aux, kwargs)
        wrapper._options_key = key  # a token stands for unhashable options: keep it
        return wrapper


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
