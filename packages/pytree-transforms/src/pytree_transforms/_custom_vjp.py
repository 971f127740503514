"""`filter_custom_vjp`: `jax.custom_vjp` with gradients for the first argument only.

The residuals' static parts reach the backward pass in the residuals' treedef, as outputs do
elsewhere (see `_outputs`). The output's static part cannot: JAX checks that the forward
pass's output has the primal function's treedef, and the two build their static parts
separately, as two `StaticOutput`s, which are never equal (each compares by identity). So it
is kept aside instead (`out_static` in `CustomVJP.__call__`).
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from pytree_filter import is_array, is_inexact_array_like, path_text

from ._arguments import leaf_names
from ._custom_jvp import RuleInputs
from ._errors import check_callable
from ._input_writes import check_input_writes, checking_writes, record_inputs
from ._method import BindsAsMethod
from ._outputs import StaticOutput, split_output
from ._sharing import Sharing, first_places


class CustomVJP(BindsAsMethod):
    """A function with a custom VJP rule, as returned by `filter_custom_vjp`.

    Define the rule with `.def_fwd(fn_fwd)` and `.def_bwd(fn_bwd)` (or the older
    `.defvjp(fn_fwd, fn_bwd)`); then call it like the original function.
    """

    def __init__(self, fn: Callable[..., Any]):
        self._fn = fn
        # The rule, in the `def_fwd`/`def_bwd` form; `defvjp` sets adapters of its own.
        self._fwd: Callable[..., Any] | None = None
        self._bwd: Callable[..., Any] | None = None
        # Whether the rule came from `defvjp`, whose backward pass gets zero cotangents of
        # floating-point outputs as arrays rather than as None.
        self._by_defvjp = False
        # The rule as the caller gave it: `defvjp`'s adapters are made anew on every call.
        self._given: tuple[Any, ...] = (None, None)
        functools.update_wrapper(self, fn, updated=())

    def __eq__(self, other: object) -> bool:
        # Equal for equal functions with equal rules, so `filter_jit` of one made again
        # finds the compilations of the first. The hash is the function's alone: it must
        # not change when the rule is set after the wrapper went into a cache.
        return type(other) is CustomVJP and (self._fn, self._by_defvjp, *self._rule()) == (
            other._fn,
            other._by_defvjp,
            *other._rule(),
        )

    def __hash__(self) -> int:
        return hash(self._fn)

    def _rule(self) -> tuple[Any, ...]:
        return self._given if self._by_defvjp else (self._fwd, self._bwd)

    def def_fwd(self, fn_fwd: Callable[..., Any]) -> Callable[..., Any]:
        """Set the forward pass (usable as a decorator).

        Arguments:
            fn_fwd: called as `fn_fwd(perturbed, vjp_arg, *args, **kwargs)`; returns
                `(out, residuals)`, where `out` is what `fn` returns and `residuals` is any
                pytree to keep for the backward pass (its arrays are saved; its other leaves
                are kept as they are). `perturbed` has the structure of `vjp_arg`, with
                `True` at each floating-point array being differentiated and `False` at
                every other leaf (non-arrays, integer arrays, and floating-point arrays
                that do not depend on what is differentiated).

        Returns:
            `fn_fwd` itself.
        """
        check_callable(
            fn_fwd, "def_fwd", "fn_fwd", what="the forward pass", spelling="fn.def_fwd({})"
        )
        self._check_style("def_fwd")
        self._fwd = fn_fwd
        return fn_fwd

    def def_bwd(self, fn_bwd: Callable[..., Any]) -> Callable[..., Any]:
        """Set the backward pass (usable as a decorator).

        Arguments:
            fn_bwd: called as `fn_bwd(residuals, grad_obj, perturbed, vjp_arg, *args,
                **kwargs)`, where `grad_obj` is the cotangent of `out`, with `None` for
                each leaf whose cotangent is zero (every leaf that is not a floating-point
                array, and floating-point arrays the result does not depend on). Returns
                the cotangent of `vjp_arg`: a pytree of its structure, with `None` for
                every leaf that is not perturbed (`None` elsewhere means zero).

        Returns:
            `fn_bwd` itself.
        """
        check_callable(
            fn_bwd, "def_bwd", "fn_bwd", what="the backward pass", spelling="fn.def_bwd({})"
        )
        self._check_style("def_bwd")
        self._bwd = fn_bwd
        return fn_bwd

    def defvjp(self, fn_fwd: Callable[..., Any], fn_bwd: Callable[..., Any]) -> None:
        """Set the forward and backward passes in the older form, without `perturbed`.

        Arguments:
            fn_fwd: called as `fn_fwd(vjp_arg, *args, **kwargs)`; returns `(out, residuals)`,
                as for `def_fwd`.
            fn_bwd: called as `fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs)`, where
                `grad_obj` is the cotangent of `out`: an array (zeros where the result does
                not depend on it) for each floating-point array of `out`, `None` for every
                other leaf. Returns the cotangent of `vjp_arg`, as for `def_bwd`.
        """
        check_callable(fn_fwd, "defvjp", "fn_fwd", spelling="fn.defvjp({}, fn_bwd)")
        check_callable(fn_bwd, "defvjp", "fn_bwd", spelling="fn.defvjp(fn_fwd, {})")
        self._check_style("defvjp")

        @functools.wraps(fn_fwd)
        def fwd(perturbed: Any, vjp_arg: Any, /, *args: Any, **kwargs: Any) -> Any:
            return fn_fwd(vjp_arg, *args, **kwargs)

        @functools.wraps(fn_bwd)
        def bwd(
            residuals: Any,
            grad_obj: Any,
            perturbed: Any,
            vjp_arg: Any,
            /,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            return fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs)

        self._fwd, self._bwd, self._by_defvjp = fwd, bwd, True
        self._given = (fn_fwd, fn_bwd)

    def _check_style(self, method: str) -> None:
        """Refuse to mix `defvjp` with `def_fwd`/`def_bwd` on one function."""
        name = getattr(self._fn, "__name__", "fn")
        has_rule = self._fwd is not None or self._bwd is not None
        if method == "defvjp" and has_rule and not self._by_defvjp:
            raise TypeError(
                f"{name}.defvjp: {name} already has a rule set with `def_fwd`/`def_bwd`. Use "
                f"one of the two forms: `{name}.def_fwd(fn_fwd)` and `{name}.def_bwd(fn_bwd)` "
                "(whose rules take `perturbed`), or `defvjp(fn_fwd, fn_bwd)` alone."
            )
        if method != "defvjp" and self._by_defvjp:
            raise TypeError(
                f"{name}.{method}: {name} already has a rule set with `defvjp`. Use one of the "
                f"two forms: `{name}.defvjp(fn_fwd, fn_bwd)` alone, or `def_fwd` and "
                "`def_bwd` (whose rules take `perturbed`) on a function without one."
            )

    def __call__(self, vjp_arg: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self._fwd is None or self._bwd is None:
            name = getattr(self._fn, "__name__", "fn")
            missing = " and ".join(
                f"`{name}.{method}({name}_{half})`"
                for method, half, rule in (
                    ("def_fwd", "fwd", self._fwd),
                    ("def_bwd", "bwd", self._bwd),
                )
                if rule is None
            )
            raise TypeError(
                f"{name} has no VJP rule yet: it is called before both passes are set. "
                f"Set {missing} first (or both at once with "
                f"`{name}.defvjp({name}_fwd, {name}_bwd)`)."
            )
        fn, fwd, bwd, by_defvjp = self._fn, self._fwd, self._bwd, self._by_defvjp
        vjp_def = jax.tree.structure(vjp_arg)
        inputs = RuleInputs((vjp_arg, args, kwargs), vjp_def.num_leaves)
        # The output's static part, kept aside by whichever of `primal` and `forward` ran
        # last (see the module docstring for why JAX cannot carry it). A list is the one
        # thing both rules can write and the caller read; every call makes its own.
        out_static: list[StaticOutput] = []

        def split(out: Any) -> list[Any]:
            dynamic, static = split_output(out, is_array, "filter_custom_vjp")
            out_static[:] = [static]
            return dynamic

        def primal(diff: list[Any], other: list[Any]) -> list[Any]:
            call_vjp_arg, call_args, call_kwargs = _rebuild(inputs, diff, other)
            out = checking_writes(fn, "filter_custom_vjp")(call_vjp_arg, *call_args, **call_kwargs)
            return split(out)

        def forward(diff: list[Any], other: list[Any]) -> tuple[list[Any], tuple]:
            # With symbolic zeros, JAX passes each input as a `CustomVJPPrimal`, which says
            # whether it is perturbed.
            perturbed = [False] * vjp_def.num_leaves
            for i, x in zip(inputs.diff_index, diff, strict=True):
                perturbed[i] = bool(x.perturbed)
            _refuse_perturbed_others(fn, inputs, other, (vjp_arg, args, kwargs))
            diff, other = [x.value for x in diff], [x.value for x in other]
            perturbed_tree = vjp_def.unflatten(perturbed)
            call_vjp_arg, call_args, call_kwargs = _rebuild(inputs, diff, other)
            # Named after `fn`'s parameters: `fwd` takes `perturbed` first.
            recorded = record_inputs(None, (call_vjp_arg, *call_args), call_kwargs)
            result = fwd(perturbed_tree, call_vjp_arg, *call_args, **call_kwargs)
            check_input_writes(recorded, result, "filter_custom_vjp", fn)
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise TypeError(
                    f"filter_custom_vjp: {_name(fwd)} must return a pair `(out, residuals)`, "
                    f"got {type(result).__name__}."
                )
            out, residuals = result
            # The residuals' static part goes to `backward` in the residuals' treedef.
            split_residuals = split_output(residuals, is_array, "filter_custom_vjp")
            return split(out), (split_residuals, perturbed_tree, diff, other)

        def backward(saved: tuple, cotangents: list[Any]) -> tuple[list[Any], list[None]]:
            (residuals, residuals_static), perturbed, diff, other = saved
            call_vjp_arg, call_args, call_kwargs = _rebuild(inputs, diff, other)
            cotangents = [_cotangent(c, by_defvjp) for c in cotangents]
            grad_obj = out_static[0].rebuild(cotangents, static_as_none=True)
            grads = bwd(
                residuals_static.rebuild(residuals),
                grad_obj,
                perturbed,
                call_vjp_arg,
                *call_args,
                **call_kwargs,
            )
            diff_grads = _diff_cotangents(
                grads, call_vjp_arg, inputs.diff_index, diff, bwd, inputs.sharing
            )
            return diff_grads, [None] * len(other)

        custom = jax.custom_vjp(primal)
        custom.defvjp(forward, backward, symbolic_zeros=True)
        out = custom(*inputs.arrays())
        return out_static[0].rebuild(out)


def _refuse_perturbed_others(
    fn: Callable[..., Any], inputs: RuleInputs, other: list[Any], call: tuple
) -> None:
    """Refuse to differentiate through an array outside `vjp_arg`: the rule gives it no
    gradient, so its part of the derivative would be silently zero."""
    for i, x in zip(inputs.other_index, other, strict=True):
        if x.perturbed and is_inexact_array_like(x.value):
            vjp_arg, args, kwargs = call
            name, _ = leaf_names(fn, (None, (vjp_arg, *args), kwargs))[i]
            raise ValueError(
                f"filter_custom_vjp: {_name(fn)} is differentiated with respect to `{name}`, "
                "which is not in its first argument: only the first argument (`vjp_arg`) "
                "gets gradients from the backward pass, so this one would be silently "
                f"dropped. Move `{name}` into the first argument (pack several objects "
                "together as a tuple: `fn((x, y), ...)`, with a backward pass returning the "
                "cotangent of that tuple), or pass `jax.lax.stop_gradient` of it if it "
                "should get no gradient."
            )


def _cotangent(cotangent: Any, materialise: bool) -> Any:
    """What the backward pass gets for one array of the output: None for a zero cotangent,
    unless `materialise` asks for zeros for a floating-point output (as `defvjp` does)."""
    if type(cotangent) is SymbolicZero:
        aval = cotangent.aval
        if materialise and jnp.issubdtype(aval.dtype, jnp.inexact):
            return jnp.zeros(aval.shape, aval.dtype)
        return None
    return cotangent if is_inexact_array_like(cotangent) else None


def _rebuild(inputs: RuleInputs, diff: list[Any], other: list[Any]) -> Any:
    """The full inputs, with arrays for JAX's values."""
    return inputs.rebuild([_as_array(x) for x in diff], [_as_array(x) for x in other])


def _as_array(x: Any) -> Any:
    # JAX may hand the rules concrete values as typed Python scalars; the functions see
    # arrays, as their caller passed them.
    return x if is_array(x) else jnp.asarray(x)


def _name(rule: Callable[..., Any]) -> str:
    return getattr(rule, "__name__", "the rule")


def _diff_cotangents(
    grads: Any,
    vjp_arg: Any,
    diff_index: list[int],
    diff: list[Any],
    bwd: Callable[..., Any],
    sharing: Sharing | None,
) -> list[Any]:
    """The cotangents of the differentiated leaves of `vjp_arg` from the backward pass's
    result: checked against `vjp_arg`, with zeros for `None`.

    The leaves of a shared object are JAX inputs at each of its places (see `RuleInputs`),
    and JAX adds up their cotangents; the object has one cotangent (see `first_places`),
    so it goes to its first place, and the others get zero.
    """
    vjp_def = jax.tree.structure(vjp_arg)
    try:
        leaves = vjp_def.flatten_up_to(grads)
    except (ValueError, TypeError):
        raise ValueError(
            f"filter_custom_vjp: {_name(bwd)} must return the cotangent of `vjp_arg`, of "
            f"structure {vjp_def}, with None for leaves that are not floating-point arrays; "
            f"got {jax.tree.structure(grads)}."
        ) from None
    if sharing is not None:
        padded = leaves + [None] * (len(sharing.repeats) - len(leaves))
        firsts = dict(zip(sharing.unique, first_places(sharing, padded), strict=True))
        leaves = [firsts.get(i) for i in range(len(leaves))]
    cotangents = []
    for i, primal in zip(diff_index, diff, strict=True):
        grad, shape = leaves[i], np.shape(primal)
        if grad is None:
            grad = jnp.zeros_like(primal)
        elif not (is_array(grad) or isinstance(grad, float | int)) or np.shape(grad) != shape:
            path = jax.tree_util.tree_flatten_with_path(vjp_arg)[0][i][0]
            raise ValueError(
                f"filter_custom_vjp: {_name(bwd)} returned {_describe(grad)} as the cotangent "
                f"at {path_text(path)} of `vjp_arg`, where an "
                f"array of shape {shape} (or None, for zero) was expected."
            )
        cotangents.append(grad)
    return cotangents


def _describe(value: Any) -> str:
    if is_array(value):
        return f"an array of shape {value.shape}"
    return f"a {type(value).__name__}"


def filter_custom_vjp(fn: Callable[..., Any]) -> CustomVJP:
    """`jax.custom_vjp` for functions of any pytrees, differentiated in their first argument.

    Only the first argument, `vjp_arg`, gets gradients: those of its floating-point arrays
    come from the backward pass you define. Its other leaves, and all other arguments (which
    may hold anything, arrays included), get no gradient: differentiating through an array
    of another argument (`jax.grad(lambda x: fn(x, x))`) is a `ValueError` that names it,
    as its part of the derivative would be lost. The output may be any pytree: its arrays
    are outputs of the custom rule, its other leaves are returned as they are.

    Usage:

        @filter_custom_vjp
        def fn(vjp_arg, *args, **kwargs):
            return out

        @fn.def_fwd
        def fn_fwd(perturbed, vjp_arg, *args, **kwargs):
            return out, residuals

        @fn.def_bwd
        def fn_bwd(residuals, grad_obj, perturbed, vjp_arg, *args, **kwargs):
            return grad_vjp_arg

    `perturbed` has the structure of `vjp_arg`: `True` at each floating-point array being
    differentiated, `False` at every other leaf, so the backward pass can skip the
    gradients nobody asked for (returning `None` for them). The backward pass gets all the
    forward pass's inputs as well as the residuals, and `grad_obj` has `None` for every
    leaf of `out` whose cotangent is zero (every leaf that is not a floating-point array,
    and arrays the result does not depend on). To differentiate several objects, pack them
    together as a tuple in `vjp_arg`.

    The older form `fn.defvjp(fn_fwd, fn_bwd)` sets both passes at once, with rules that
    take no `perturbed` (`fn_fwd(vjp_arg, *args, **kwargs)`,
    `fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs)`), and a `grad_obj` whose
    floating-point arrays are always arrays (zeros where the cotangent is zero). One
    function takes one form or the other.

    As with `jax.custom_vjp`, the arguments must not hide traced arrays inside non-array
    leaves (a function closing over a tracer, say): convert such a function with
    `filter_closure_convert`, which makes those arrays leaves.

    Arguments:
        fn: the function, called as `fn(vjp_arg, *args, **kwargs)`.

    Returns:
        A `CustomVJP`, called like `fn`; set its rule with `.def_fwd(fn_fwd)` and
        `.def_bwd(fn_bwd)` (decorators) before calling it.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_custom_vjp
        >>> @filter_custom_vjp
        ... def clip_gradient(x, bound):
        ...     return x  # the identity, whose backward pass clips the gradient
        >>> @clip_gradient.def_fwd
        ... def clip_fwd(perturbed, x, bound):
        ...     return x, None
        >>> @clip_gradient.def_bwd
        ... def clip_bwd(residuals, grad_obj, perturbed, x, bound):
        ...     clip = lambda g, p: jnp.clip(g, -bound, bound) if p and g is not None else None
        ...     return jax.tree.map(clip, grad_obj, perturbed, is_leaf=lambda g: g is None)
        >>> def loss(w):
        ...     out = clip_gradient({"w": w, "name": "w"}, 1.0)
        ...     return jnp.sum(10 * out["w"])
        >>> jax.grad(loss)(jnp.array([1.0, -2.0]))
        Array([1., 1.], dtype=float32)
    """
    check_callable(fn, "filter_custom_vjp", "fn")
    return CustomVJP(fn)
