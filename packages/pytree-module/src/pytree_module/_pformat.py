"""Readable text for pytrees: `tree_pformat` and `tree_pprint`."""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

# wadler_lindig is imported by the functions that use it, when text is first made: importing
# it with pytree_module would cost every program, most of which never print a tree.

_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)


def _short_array(x: Any) -> Any:
    """`f32[3,4]` for arrays and shape structs, with no library suffix."""
    import wadler_lindig

    if isinstance(x, _ARRAYS):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            # PRNG keys have no NumPy dtype: show `key<fry>[2]`.
            shape = ",".join(map(str, np.shape(x)))
            return wadler_lindig.TextDoc(f"{x.dtype}[{shape}]")
        return wadler_lindig.array_summary(np.shape(x), np.dtype(x.dtype).name, None)
    return None


# Functions with custom derivatives (`jax.nn.relu`, `jax.nn.gelu`, ...) are callable objects,
# not functions: show them by name, as plain functions are shown.
_CUSTOM_DERIVATIVES = (jax.custom_jvp, jax.custom_vjp)


def _never(x: Any) -> bool:
    """The default `truncate_leaf`: show everything in full."""
    return False


def _custom_doc(
    x: Any, short_arrays: bool, struct_as_array: bool, truncate_leaf: Callable[[Any], bool]
) -> Any:
    """The document for what wadler-lindig would not show well, or None for its default."""
    import wadler_lindig

    if truncate_leaf(x):
        return wadler_lindig.TextDoc(f"{type(x).__name__}(...)")
    if isinstance(x, _CUSTOM_DERIVATIVES) and isinstance(getattr(x, "__name__", None), str):
        return wadler_lindig.TextDoc(f"<function {x.__name__}>")
    if not short_arrays or (isinstance(x, jax.ShapeDtypeStruct) and not struct_as_array):
        return None
    return _short_array(x)


def tree_pformat(
    tree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = True,
    truncate_leaf: Callable[[Any], bool] = _never,
) -> str:
    """Format a pytree (Modules included) as compact, readable text.

    Arrays print as their dtype and shape (`f32[3,4]`) unless `short_arrays=False`.

    Arguments:
        tree: any Python object; Modules, lists, dicts, dataclasses and arrays are laid
            out structurally.
        width: line width to fit within before breaking onto several lines.
        indent: spaces per nesting level when broken over several lines.
        short_arrays: show arrays as `dtype[shape]` instead of their values.
        struct_as_array: with `short_arrays`, show a `jax.ShapeDtypeStruct` as the array
            it stands for (`f32[2,3]`); `False` shows it as
            `ShapeDtypeStruct(shape=(2, 3), dtype=float32)`.
        truncate_leaf: called on every object met (leaves, Modules, containers);
            where it returns true the object prints as `TypeName(...)`.

    Returns:
        The formatted text.

    Raises:
        TypeError: `struct_as_array` is not a bool, or `truncate_leaf` is not callable.

    Examples:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from pytree_module import tree_pformat
        >>> tree_pformat({"w": jnp.zeros((3, 4)), "n": 2})
        "{'w': f32[3,4], 'n': 2}"
        >>> tree_pformat(jax.ShapeDtypeStruct((2, 3), jnp.float32), struct_as_array=False)
        'ShapeDtypeStruct(shape=(2, 3), dtype=float32)'
        >>> tree_pformat([{"a": 1}, 2], truncate_leaf=lambda x: isinstance(x, dict))
        '[dict(...), 2]'
    """
    _check_options("tree_pformat", struct_as_array, truncate_leaf)
    return _formatted(tree, width, indent, short_arrays, struct_as_array, truncate_leaf)


def tree_pprint(
    tree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = True,
    truncate_leaf: Callable[[Any], bool] = _never,
) -> None:
    """Print `tree_pformat(tree, ...)`.

    Arguments:
        tree: any Python object.
        width: line width to fit within.
        indent: spaces per nesting level.
        short_arrays: show arrays as `dtype[shape]` instead of their values.
        struct_as_array: with `short_arrays`, show a `jax.ShapeDtypeStruct` as `f32[2,3]`.
        truncate_leaf: where it returns true for an object, print it as `TypeName(...)`.

    Raises:
        TypeError: as `tree_pformat`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import tree_pprint
        >>> tree_pprint([jnp.ones(2, dtype=jnp.int32), "x"])
        [i32[2], 'x']
    """
    _check_options("tree_pprint", struct_as_array, truncate_leaf)
    print(_formatted(tree, width, indent, short_arrays, struct_as_array, truncate_leaf))


def _check_options(caller: str, struct_as_array: Any, truncate_leaf: Any) -> None:
    """Raise a `TypeError` naming the option of `caller` that has a wrong type."""
    if struct_as_array is not True and struct_as_array is not False:
        raise TypeError(
            f"{caller}(struct_as_array=...) must be True or False, got {struct_as_array!r}."
        )
    if not callable(truncate_leaf):
        raise TypeError(
            f"{caller}(truncate_leaf=...) must be a function of one object returning "
            f"whether to print it as `TypeName(...)`, got {truncate_leaf!r}; e.g. "
            "`truncate_leaf=lambda x: isinstance(x, Linear)`."
        )


def _formatted(
    tree: Any,
    width: int,
    indent: int,
    short_arrays: bool,
    struct_as_array: bool,
    truncate_leaf: Callable[[Any], bool],
) -> str:
    """`tree_pformat` once its options are known to be right."""
    import wadler_lindig

    return wadler_lindig.pformat(
        tree,
        width=width,
        indent=indent,
        short_arrays=short_arrays,
        custom=lambda x: _custom_doc(x, short_arrays, struct_as_array, truncate_leaf),
    )


def constructor_pdoc(obj: Any, items: list[tuple[str, Any]], **kwargs: Any) -> Any:
    """The wadler-lindig document `ClassName(name=value, ...)` for `obj`'s `__pdoc__`."""
    import wadler_lindig

    return wadler_lindig.bracketed(
        begin=wadler_lindig.TextDoc(f"{type(obj).__name__}("),
        docs=wadler_lindig.named_objs(items, **kwargs),
        sep=wadler_lindig.comma,
        end=wadler_lindig.TextDoc(")"),
        indent=kwargs.get("indent", 2),
    )
