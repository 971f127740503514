"""Readable text for pytrees: `tree_pformat` and `tree_pprint`."""

from typing import Any

import jax
import numpy as np
import wadler_lindig

_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)


def _short_array(x: Any) -> Any:
    """`f32[3,4]` for arrays and shape structs, with no library suffix."""
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


def _custom_doc(x: Any, short_arrays: bool) -> Any:
    """The document for what wadler-lindig would not show well, or None for its default."""
    if isinstance(x, _CUSTOM_DERIVATIVES) and isinstance(getattr(x, "__name__", None), str):
        return wadler_lindig.TextDoc(f"<function {x.__name__}>")
    return _short_array(x) if short_arrays else None


def tree_pformat(tree: Any, *, width: int = 80, indent: int = 2, short_arrays: bool = True) -> str:
    """Format a pytree (Modules included) as compact, readable text.

    Arrays print as their dtype and shape (`f32[3,4]`) unless `short_arrays=False`.

    Arguments:
        tree: any Python object; Modules, lists, dicts, dataclasses and arrays are laid
            out structurally.
        width: line width to fit within before breaking onto several lines.
        indent: spaces per nesting level when broken over several lines.
        short_arrays: show arrays as `dtype[shape]` instead of their values.

    Returns:
        The formatted text.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import tree_pformat
        >>> tree_pformat({"w": jnp.zeros((3, 4)), "n": 2})
        "{'w': f32[3,4], 'n': 2}"
    """
    return wadler_lindig.pformat(
        tree,
        width=width,
        indent=indent,
        short_arrays=short_arrays,
        custom=lambda x: _custom_doc(x, short_arrays),
    )


def tree_pprint(tree: Any, *, width: int = 80, indent: int = 2, short_arrays: bool = True) -> None:
    """Print `tree_pformat(tree, ...)`.

    Arguments:
        tree: any Python object.
        width: line width to fit within.
        indent: spaces per nesting level.
        short_arrays: show arrays as `dtype[shape]` instead of their values.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import tree_pprint
        >>> tree_pprint([jnp.ones(2, dtype=jnp.int32), "x"])
        [i32[2], 'x']
    """
    print(tree_pformat(tree, width=width, indent=indent, short_arrays=short_arrays))


def constructor_pdoc(obj: Any, items: list[tuple[str, Any]], **kwargs: Any) -> Any:
    """The wadler-lindig document `ClassName(name=value, ...)` for `obj`'s `__pdoc__`."""
    return wadler_lindig.bracketed(
        begin=wadler_lindig.TextDoc(f"{type(obj).__name__}("),
        docs=wadler_lindig.named_objs(items, **kwargs),
        sep=wadler_lindig.comma,
        end=wadler_lindig.TextDoc(")"),
        indent=kwargs.get("indent", 2),
    )
