"""`filter_custom_jvp`: `jax.custom_jvp` for functions of any pytrees, no `nondiff_argnums`."""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.tree_util import PyTreeDef

from pytree_filter import is_array, is_inexact_array, is_inexact_array_like, path_text

from ._errors import check_callable
from ._input_writes import checking_writes
from ._method import BindsAsMethod
from ._sharing import Sharing, find_sharing, has_repeats

_PYTHON_NUMBERS = (bool, int, float, complex)


class CustomJVP(BindsAsMethod):
    """A function with a custom JVP rule, as returned by `filter_custom_jvp`.

    Define the rule with `.defjvp(jvp_fn)` (or its other spelling `.def_jvp(jvp_fn)`, named
    like `filter_custom_vjp`'s `def_fwd`/`def_bwd`); then call it like the original function.
    """

    def __init__(self, fn: Callable[..., Any]):
        self._fn = fn
        self._jvp: Callable[..., Any] | None = None
        functools.update_wrapper(self, fn, updated=())

    def __eq__(self, other: object) -> bool:
        # Equal for equal functions with equal rules, so `filter_jit` of one made again
        # finds the compilations of the first. The hash is the function's alone: it must
        # not change when the rule is set after the wrapper went into a cache.
        return type(other) is CustomJVP and (self._fn, self._jvp) == (other._fn, other._jvp)

    def __hash__(self) -> int:
        return hash(self._fn)

    def defjvp(self, jvp_fn: Callable[..., Any]) -> Callable[..., Any]:
        """Set the JVP rule (usable as a decorator).

        Arguments:
            jvp_fn: called as `jvp_fn(primals, tangents, **kwargs)`, where `primals` is the
                tuple of positional arguments, `tangents` has the same structure with a
                tangent for every floating-point array being differentiated and `None` for
                every other leaf (a zero tangent), and `kwargs` are the call's keyword
                arguments. It returns
                `(primal_out, tangent_out)`; `tangent_out` has the structure of
                `primal_out`, and may hold `None` for a zero tangent.

        Returns:
            `jvp_fn` itself.
        """
        return self._set_jvp(jvp_fn, "defjvp")

    def def_jvp(self, jvp_fn: Callable[..., Any]) -> Callable[..., Any]:
        """Set the JVP rule: the same as `defjvp`, under the name that matches
        `filter_custom_vjp`'s `def_fwd`/`def_bwd` (and Equinox's `def_jvp`).

        Arguments:
            jvp_fn: the rule, called as `jvp_fn(primals, tangents, **kwargs)` (see `defjvp`).

        Returns:
            `jvp_fn` itself, so it works as a decorator.

        Example:
            ```python
            @filter_custom_jvp
            def f(x):
                return 2 * x

            @f.def_jvp
            def f_jvp(primals, tangents):
                (x,), (tx,) = primals, tangents
                return f(x), 2 * tx
            ```
        """
        return self._set_jvp(jvp_fn, "def_jvp")

    def _set_jvp(self, jvp_fn: Callable[..., Any], method: str) -> Callable[..., Any]:
        check_callable(jvp_fn, method, "jvp_fn", what="the JVP rule", spelling=f"fn.{method}({{}})")
        self._jvp = jvp_fn
        return jvp_fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._jvp is None:
            name = getattr(self._fn, "__name__", "fn")
            raise TypeError(
                f"{name} has no JVP rule yet. Define one before calling it:\n"
                f"    @{name}.defjvp\n"
                f"    def {name}_jvp(primals, tangents):\n"
                "        ...\n"
                "        return primal_out, tangent_out"
            )
        inputs = RuleInputs((args, kwargs), jax.tree.structure(args).num_leaves)
        # The output's structure, set by whichever of `primal` and `rule` ran last: they
        # return its unique leaves (each shared object's once), and the caller rebuilds one
        # object for every place a shared object stood. Every call makes its own list.
        out_structure: list[Any] = []

        def primal(diff: list[Any], other: list[Any]) -> Any:
            call_args, call_kwargs = inputs.rebuild(diff, other)
            out = checking_writes(self._fn, "filter_custom_jvp")(*call_args, **call_kwargs)
            _check_output(out, self._fn)
            return _unique_leaves(out, out_structure)

        def rule(primals: tuple[list, list], tangents: tuple[list, list]) -> tuple[Any, Any]:
            call_args, call_kwargs = inputs.rebuild(*primals)
            tangent_leaves: list[Any] = [None] * inputs.treedef.num_leaves
            for i, t in zip(inputs.diff_index, tangents[0], strict=True):
                # An input that is not being differentiated has a symbolic zero tangent.
                tangent_leaves[i] = None if type(t) is SymbolicZero else t
            call_tangents, _ = inputs.unflatten(tangent_leaves)
            result = self._jvp(call_args, call_tangents, **call_kwargs)
            out, tangent_out = _complete_tangents(result, self._jvp)
            structure = _structure(out)
            leaves = _unique_leaves(out, out_structure)
            tangent_leaves = jax.tree.structure(out).flatten_up_to(tangent_out)
            if isinstance(structure, Sharing):
                tangent_leaves = structure.dedupe(tangent_leaves)
            return leaves, tangent_leaves

        custom = jax.custom_jvp(primal)
        custom.defjvp(rule, symbolic_zeros=True)
        out = custom(*inputs.arrays())
        return out_structure[0].unflatten(out)


class RuleInputs:
    """The inputs of a call to a function with a custom rule, split for JAX.

    The floating-point arrays among the first `n_diff` leaves are differentiated. Every other
    array is an input too, so that tracers reach JAX as inputs rather than as closed-over
    values, but the rule declares no derivative for it. Non-array leaves are closed over as
    they are.

    An object reached by several paths (a tied weight) reaches the functions as one object:
    its leaves are passed to JAX at each of its places (the same values, with the same
    tangents), and the functions get it rebuilt from its first place.
    """

    __slots__ = ("diff_index", "leaves", "other_index", "sharing", "treedef")

    def __init__(self, tree: Any, n_diff: int):
        self.leaves, self.treedef = jax.tree.flatten(tree)
        self.sharing = find_sharing(tree, self.treedef) if has_repeats(self.leaves) else None
        self.diff_index = [i for i in range(n_diff) if is_inexact_array(self.leaves[i])]
        diff = set(self.diff_index)
        self.other_index = [i for i, x in enumerate(self.leaves) if is_array(x) and i not in diff]

    def arrays(self) -> tuple[list[Any], list[Any]]:
        """The differentiated arrays and the other arrays, the inputs of the JAX rule."""
        return [self.leaves[i] for i in self.diff_index], [self.leaves[i] for i in self.other_index]

    def rebuild(self, diff: list[Any], other: list[Any]) -> Any:
        """The full inputs, with JAX's values in place of the arrays."""
        full = list(self.leaves)
        for i, x in zip(self.diff_index, diff, strict=True):
            full[i] = x
        for i, x in zip(self.other_index, other, strict=True):
            full[i] = x
        return self.unflatten(full)

    def unflatten(self, leaves: list[Any]) -> Any:
        """The tree from one value per leaf, each shared object one object (built from the
        values at its first place)."""
        if self.sharing is None:
            return self.treedef.unflatten(leaves)
        return self.sharing.unflatten(self.sharing.dedupe(leaves))


def _check_output(out: Any, fn: Callable[..., Any]) -> None:
    """Refuse outputs that `jax.custom_jvp` cannot return, naming the offending leaf."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
        if not (is_array(leaf) or isinstance(leaf, _PYTHON_NUMBERS)):
            where = path_text(path)
            raise TypeError(
                f"filter_custom_jvp: {getattr(fn, '__name__', 'the function')} returned a "
                f"{type(leaf).__name__} at {where} of its output, but a function with a "
                "custom JVP may return only JAX arrays (and Python numbers). Return the "
                "other objects from a wrapper around it instead."
            )


def _structure(out: Any) -> PyTreeDef | Sharing:
    """The output's treedef, or its `Sharing` where an object in it is reached twice."""
    leaves, treedef = jax.tree.flatten(out)
    sharing = find_sharing(out, treedef) if has_repeats(leaves) else None
    return treedef if sharing is None else sharing


def _unique_leaves(out: Any, out_structure: list[Any]) -> list[Any]:
    """The output's leaves, each shared object's once; its structure goes to
    `out_structure`."""
    structure = _structure(out)
    out_structure[:] = [structure]
    leaves = jax.tree.leaves(out)
    return structure.dedupe(leaves) if isinstance(structure, Sharing) else leaves


def _complete_tangents(result: Any, jvp_fn: Callable[..., Any]) -> tuple[Any, Any]:
    """Check the rule's `(primal_out, tangent_out)`, turning `None` tangents into zeros."""
    name = getattr(jvp_fn, "__name__", "the JVP rule")
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise TypeError(
            f"filter_custom_jvp: {name} must return a pair `(primal_out, tangent_out)`, "
            f"got {type(result).__name__}."
        )
    out, tangent_out = result
    _check_output(out, jvp_fn)
    out_leaves, out_def = jax.tree.flatten(out)
    try:
        tangent_leaves = out_def.flatten_up_to(tangent_out)
    except (ValueError, TypeError):
        raise ValueError(
            f"filter_custom_jvp: the tangent_out returned by {name} must have the structure "
            f"of its primal_out ({out_def}), with a tangent (or None, for zero) in place of "
            f"each leaf; got {jax.tree.structure(tangent_out)}."
        ) from None
    tangents = [_tangent(x, t) for x, t in zip(out_leaves, tangent_leaves, strict=True)]
    return out, out_def.unflatten(tangents)


def _tangent(primal: Any, tangent: Any) -> Any:
    """The tangent JAX expects for `primal`: float0 zeros for integer and boolean outputs
    (whose tangent is zero whatever the rule says), zeros in place of `None`."""
    if not is_inexact_array_like(primal):
        return np.zeros(np.shape(primal), dtype=jax.dtypes.float0)
    if tangent is None:
        return jnp.zeros_like(primal)
    return tangent


def filter_custom_jvp(fn: Callable[..., Any]) -> CustomJVP:
    """`jax.custom_jvp` for functions of any pytrees, without `nondiff_argnums`.

    The positional arguments are split automatically: their floating-point arrays are
    differentiable, every other leaf (integer arrays, Python numbers, functions, strings, any
    object) is not and gets the tangent `None`. A floating-point array that is not being
    differentiated (it does not depend on what `jax.jvp` or `jax.grad` perturbs) gets
    `None` too: its tangent is zero, so the rule need not compute with it. The rule sees the
    values JAX gives it, Python floats included. Keyword arguments are never differentiated:
    they are passed to the rule unchanged, as keyword arguments, and the rule declares no
    derivative with respect to them. The output must hold only JAX arrays (or Python
    numbers).

    As with `jax.custom_jvp`, reverse mode (`jax.grad`) needs a rule linear in the tangents,
    and the arguments must not hide traced arrays inside non-array leaves (a function
    closing over a tracer, say): convert such a function with `filter_closure_convert`,
    which makes those arrays leaves.

    Arguments:
        fn: the function, called as `fn(*args, **kwargs)`.

    Returns:
        A `CustomJVP`, called like `fn`. Set its rule with `.defjvp(jvp_fn)` (a decorator),
        where `jvp_fn(primals, tangents, **kwargs)` returns `(primal_out, tangent_out)`:
        `primals` is the tuple of positional arguments and `tangents` matches it, with
        `None` for every non-differentiable leaf. In `tangent_out`, `None` means a zero
        tangent; tangents of integer or boolean outputs are always zero.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_custom_jvp
        >>> @filter_custom_jvp
        ... def call(fn, x):
        ...     return fn(x)
        >>> @call.defjvp
        ... def call_jvp(primals, tangents):
        ...     fn, x = primals
        ...     _, tx = tangents  # the tangent of `fn`, not an array, is None
        ...     return call(fn, x), 3 * tx
        >>> jax.jvp(lambda x: call(jnp.sin, x), (jnp.zeros(2),), (jnp.ones(2),))
        (Array([0., 0.], dtype=float32), Array([3., 3.], dtype=float32))
        >>> jax.grad(lambda x: call(jnp.sin, x))(0.0)
        Array(3., dtype=float32, weak_type=True)
    """
    check_callable(fn, "filter_custom_jvp", "fn")
    return CustomJVP(fn)
