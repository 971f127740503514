"""`filter_make_jaxpr` and `filter_eval_shape`: trace functions of any pytrees.

Also `is_shaped`, what these two (and the transforms built on them) trace: a leaf with a shape
and a dtype.
"""

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytree_filter import is_array

from ._errors import check_callable
from ._input_writes import checking_writes
from ._outputs import StaticOutput, split_output
from ._sharing import SplitTree


def is_shaped(x: Any) -> bool:
    """Whether `x` stands for an array: it has `.shape` and `.dtype` (`jax.ShapeDtypeStruct`s
    included)."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def filter_make_jaxpr(fun: Callable[..., Any]) -> Callable[..., tuple[Any, Any, Any]]:
    """`jax.make_jaxpr` for functions of any pytrees.

    Leaves with `.shape` and `.dtype` (arrays, `jax.ShapeDtypeStruct`) are traced; all other
    leaves, Python numbers included, are static.

    Arguments:
        fun: the function, called as `fun(*args, **kwargs)`.

    Returns:
        A function that, given example arguments, returns `(jaxpr, out_shapes, out_static)`:
        the `ClosedJaxpr`, a pytree of `jax.ShapeDtypeStruct` for the array outputs (`None`
        elsewhere), and a pytree of the non-array outputs (`None` for arrays).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import filter_make_jaxpr
        >>> jaxpr, shapes, static = filter_make_jaxpr(lambda x, n: (x * n, "tag"))(jnp.ones(3), 2)
        >>> shapes
        (ShapeDtypeStruct(shape=(3,), dtype=float32), None)
        >>> static
        (None, 'tag')
    """

    check_callable(fun, "filter_make_jaxpr")

    @functools.wraps(fun)
    def make_jaxpr(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        inputs = SplitTree((args, kwargs), is_shaped, "traced")
        dynamic = inputs.selected()

        def traced(dynamic: Any) -> tuple[list[Any], StaticOutput]:
            call_args, call_kwargs = inputs.rebuild(dynamic)
            out = checking_writes(fun, "filter_make_jaxpr")(*call_args, **call_kwargs)
            return split_output(out, is_array, "filter_make_jaxpr")

        # Weak types kept, as `jax.make_jaxpr` keeps them: they decide the dtypes of
        # what the function computes from its arguments.
        shapes = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, weak_type=bool(getattr(x, "weak_type", False))
            ),
            dynamic,
        )
        jaxpr, (out_shapes, out_static) = jax.make_jaxpr(traced, return_shape=True)(shapes)
        return (
            jaxpr,
            out_static.rebuild(out_shapes, static_as_none=True),
            out_static.rebuild([None] * len(out_shapes)),
        )

    return make_jaxpr


def filter_eval_shape(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`jax.eval_shape` for functions of any pytrees: the output's shapes, nothing computed.

    Arguments:
        fun: the function.
        *args: its arguments; arrays may be `jax.ShapeDtypeStruct`s. Non-array leaves are
            passed through as they are.
        **kwargs: its keyword arguments.

    Returns:
        The output, with every array replaced by a `jax.ShapeDtypeStruct` and every other
        leaf as `fun` returned it.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import filter_eval_shape
        >>> filter_eval_shape(lambda x, name: {"y": x @ x.T, "name": name},
        ...                   jax.ShapeDtypeStruct((4, 2), jnp.float32), "out")
        {'name': 'out', 'y': ShapeDtypeStruct(shape=(4, 4), dtype=float32)}
    """
    check_callable(fun, "filter_eval_shape", spelling="filter_eval_shape({}, x)")
    inputs = SplitTree((args, kwargs), is_shaped, "traced")
    dynamic = inputs.selected()

    def traced(dynamic: Any) -> tuple[list[Any], StaticOutput]:
        call_args, call_kwargs = inputs.rebuild(dynamic)
        out = checking_writes(fun, "filter_eval_shape")(*call_args, **call_kwargs)
        return split_output(out, is_array, "filter_eval_shape")

    shapes, out_static = jax.eval_shape(traced, dynamic)
    return out_static.rebuild(shapes)
