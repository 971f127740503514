"""`filter_closure_convert`: hoist the arrays a function closes over into a pytree."""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from pytree_filter import combine
from pytree_module import Module, field

from ._errors import check_callable
from ._shapes import filter_make_jaxpr, is_shaped


class _Program:
    """What a closure-converted function keeps besides its constants: the jaxpr, and the
    structure its inputs must have and its outputs are rebuilt with.

    Hashed by identity: it is the static part of a `ClosureConverted`'s treedef.
    """

    __slots__ = (
        "in_avals",
        "in_mask",
        "in_static",
        "in_treedef",
        "jaxpr",
        "name",
        "out_shapes",
        "out_static",
        "out_treedef",
    )

    def __init__(
        self,
        name: str,
        jaxpr: Any,
        in_treedef: PyTreeDef,
        in_mask: list[bool],
        in_avals: list[tuple[tuple[int, ...], Any]],
        in_static: list[Any],
        out_shapes: Any,
        out_static: Any,
    ):
        self.name = name
        self.jaxpr = jaxpr
        self.in_treedef = in_treedef
        self.in_mask = in_mask
        self.in_avals = in_avals
        self.in_static = in_static
        self.out_shapes = out_shapes
        self.out_treedef = jax.tree.structure(out_shapes)
        self.out_static = out_static

    def __repr__(self) -> str:
        return f"<program of {self.name}>"

    def array_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The array leaves of a call's arguments, after checking they match the example."""
        leaves, treedef = jax.tree.flatten((args, kwargs))
        if treedef != self.in_treedef:
            raise ValueError(
                f"This closure-converted {self.name} was built for arguments of structure "
                f"{self.in_treedef}, and cannot be called with {treedef}. Convert it again "
                "with example arguments of the new structure."
            )
        mask = [is_shaped(x) for x in leaves]
        arrays = [x for x, m in zip(leaves, mask, strict=True) if m]
        static = [x for x, m in zip(leaves, mask, strict=True) if not m]
        avals = [(tuple(x.shape), x.dtype) for x in arrays]
        if mask != self.in_mask or avals != self.in_avals:
            raise ValueError(
                f"This closure-converted {self.name} was built for array arguments of shapes "
                f"and dtypes {_describe(self.in_avals)}, and cannot be called with "
                f"{_describe(avals)}. Convert it again with example arguments like these."
            )
        if not _all_equal(static, self.in_static):
            raise ValueError(
                f"This closure-converted {self.name} was built for the non-array arguments "
                f"{self.in_static}, which are baked into it, and cannot be called with "
                f"{static}. Convert it again with these values."
            )
        return arrays


def _describe(avals: list[tuple[tuple[int, ...], Any]]) -> str:
    return "[" + ", ".join(f"{np.dtype(d).name}{list(s)}" for s, d in avals) + "]"


def _all_equal(values: list[Any], expected: list[Any]) -> bool:
    if len(values) != len(expected):
        return False
    for value, other in zip(values, expected, strict=True):
        if value is other:
            continue
        try:
            if not bool(value == other):
                return False
        except Exception:  # objects whose comparison does not give one truth value
            return False
    return True


class ClosureConverted(Module, frozen=True):
    """A function whose closed-over arrays are leaves of this pytree, in `consts`.

    Made by `filter_closure_convert`; call it as the original function.
    """

    consts: list[Any]
    program: _Program = field(static=True)

    @property
    def in_struct(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The `(args, kwargs)` it takes: a `jax.ShapeDtypeStruct` for each array of the
        example arguments, and every other leaf as it was (it is baked in)."""
        program = self.program
        statics = iter(program.in_static)
        avals = iter(program.in_avals)
        leaves = []
        for shaped in program.in_mask:
            if shaped:
                shape, dtype = next(avals)
                leaves.append(jax.ShapeDtypeStruct(shape, dtype))
            else:
                leaves.append(next(statics))
        return program.in_treedef.unflatten(leaves)

    @property
    def out_struct(self) -> Any:
        """What a call returns: a `jax.ShapeDtypeStruct` for each array output, and every
        other output as `fn` returned it when traced (as Equinox's `out_struct`)."""
        return combine(self.program.out_shapes, self.program.out_static)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        program = self.program
        arrays = program.array_inputs(args, kwargs)
        out = jax.core.eval_jaxpr(program.jaxpr, self.consts, *arrays)
        return combine(program.out_treedef.unflatten(out), program.out_static)


def filter_closure_convert(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ClosureConverted:
    """`jax.closure_convert` for functions of any pytrees: make closed-over arrays explicit.

    `fn` is traced once, at example arguments, and every JAX array or tracer it closes over
    (of any dtype, not only floating-point ones) is hoisted out into the `consts` of the
    returned pytree. Use this before handing a function across an API boundary that must
    see every traced value, such as `jax.custom_vjp`, `filter_custom_vjp` or
    `filter_custom_jvp`: as a pytree argument, its closed-over values become ordinary
    array leaves.

    Arguments:
        fn: the function, called as `fn(*args, **kwargs)`; it may take and return any
            pytrees.
        *args: example arguments. Array leaves (and `jax.ShapeDtypeStruct`s) stand only for
            their shape and dtype: `fn` is traced, not evaluated, with them. Every other
            leaf, Python numbers included, is baked in as it is.
        **kwargs: example keyword arguments, likewise.

    Returns:
        A `ClosureConverted` pytree, called like `fn` with arguments of the example's
        structure, array shapes and dtypes and the same non-array values. Its `consts` lists
        the hoisted arrays and tracers. Non-array outputs of `fn` are returned as they were
        at tracing time. Its `out_struct` is the output's structure (a
        `jax.ShapeDtypeStruct` for each array output, the non-array outputs as they are),
        and its `in_struct` the `(args, kwargs)` it takes, likewise.

    Examples:
        >>> import jax
        >>> from pytree_transforms import filter_closure_convert
        >>> @jax.grad
        ... def f(x, y):
        ...     z = x + y
        ...     g = lambda a: z + a  # closes over the tracer z
        ...     g2 = filter_closure_convert(g, 1)
        ...     assert [id(b) for b in g2.consts] == [id(z)]
        ...     return g2(1)
        >>> f(1.0, 1.0)
        Array(1., dtype=float32, weak_type=True)
    """
    check_callable(fn, "filter_closure_convert", "fn", spelling="filter_closure_convert({}, x)")
    closed, out_shapes, out_static = filter_make_jaxpr(fn)(*args, **kwargs)
    leaves, in_treedef = jax.tree.flatten((args, kwargs))
    in_mask = [is_shaped(x) for x in leaves]
    program = _Program(
        name=getattr(fn, "__name__", type(fn).__name__),
        jaxpr=closed.jaxpr,
        in_treedef=in_treedef,
        in_mask=in_mask,
        in_avals=[(tuple(x.shape), x.dtype) for x, m in zip(leaves, in_mask, strict=True) if m],
        in_static=[x for x, m in zip(leaves, in_mask, strict=True) if not m],
        out_shapes=out_shapes,
        out_static=out_static,
    )
    return ClosureConverted(list(closed.consts), program)
