"""`store_dce` and `inspect_dce`: which arrays the compiler removed as dead code.

Each array given to `store_dce` passes through an identity host callback. A pure callback
whose result is unused is removed with the dead code, so the callbacks that do run, when
the compiled program runs, record exactly the arrays that survived.
"""

from collections.abc import Hashable
from typing import Any

import jax
import numpy as np

from pytree_filter import combine, is_array, partition
from pytree_module import tree_pformat

# name -> one entry per traced `store_dce` call: (surviving leaf index -> its shape and
# dtype, the arrays' treedef, the non-array leaves).
_stored: dict[Hashable, list[tuple[dict[int, jax.ShapeDtypeStruct], Any, Any]]] = {}


class _Removed:
    """Stands for an array removed as dead code, in `inspect_dce`'s printout."""

    def __repr__(self) -> str:
        return "<DCE'd>"


def _in_trace() -> bool:
    """Whether this code is being traced (an operation gives a tracer, not a value)."""
    return isinstance(jax.numpy.asarray(1) + 1, jax.core.Tracer)


def store_dce(x: Any, name: Hashable = None) -> Any:
    """Record which arrays of `x` survive dead code elimination, inside a `jax.jit`.

    The identity, to be used inside a jitted function: when the compiled function runs,
    each array of `x` that the compiler kept (because something uses it) is recorded.
    `inspect_dce` then prints which were kept and which removed.

    Arguments:
        x: any pytree; its arrays are recorded, its other leaves kept for the printout.
        name: any hashable label for this call site; `inspect_dce(name)` prints the calls
            stored under it.

    Returns:
        `x`, unchanged. Use this returned value: it is what is checked for being used.

    Raises:
        RuntimeError: outside a jitted function (nothing is removed as dead code there).

    Examples:
        >>> import jax
        >>> from pytree_transforms.debug import inspect_dce, store_dce
        >>> @jax.jit
        ... def f(x):
        ...     square, _ = store_dce((x**2, x + 1), name="example")
        ...     return square
        >>> f(2.0).item()
        4.0
        >>> inspect_dce("example")
        Found 1 call to `pytree_transforms.debug.store_dce`.
        Entry 0:
        (f32[], <DCE'd>)
    """
    dynamic, static = partition(x, is_array)
    leaves, treedef = jax.tree.flatten(dynamic)
    if not _in_trace():
        raise RuntimeError(
            "store_dce must be used inside a jitted function (`jax.jit`/`filter_jit`), with "
            "traced arrays: dead code is only removed by the compiler. Move the call into "
            "the function that is jitted."
        )
    alive: dict[int, jax.ShapeDtypeStruct] = {}
    _stored.setdefault(name, []).append((alive, treedef, static))

    def record(i: int) -> Any:
        def identity(value: np.ndarray) -> np.ndarray:
            alive[i] = jax.ShapeDtypeStruct(np.shape(value), value.dtype)
            return value

        return identity

    # `expand_dims`: under `vmap` the callback sees the whole batch at once.
    leaves = [
        jax.pure_callback(record(i), leaf, leaf, vmap_method="expand_dims")
        for i, leaf in enumerate(leaves)
    ]
    return combine(jax.tree.unflatten(treedef, leaves), static)


def inspect_dce(name: Hashable = None) -> None:
    """Print, for each `store_dce(x, name)` call traced so far, which arrays survived.

    Surviving arrays print as their dtype and shape (`f32[3]`), removed ones as `<DCE'd>`,
    other leaves as they are. Call it outside jitted code, after the jitted function ran.

    Arguments:
        name: the label given to `store_dce`; the default, None, picks the calls made
            without one.

    Returns:
        None; the report is printed.

    Raises:
        RuntimeError: inside traced code.

    Examples:
        See `store_dce`.
    """
    if _in_trace():
        raise RuntimeError(
            "inspect_dce must be called outside jitted code, after the jitted function ran: "
            "it reports what the compiled program kept."
        )
    entries = _stored.get(name, [])
    plural = "" if len(entries) == 1 else "s"
    print(f"Found {len(entries)} call{plural} to `pytree_transforms.debug.store_dce`.")
    for i, (alive, treedef, static) in enumerate(entries):
        leaves = [alive.get(j, _Removed()) for j in range(treedef.num_leaves)]
        print(f"Entry {i}:")
        print(tree_pformat(combine(jax.tree.unflatten(treedef, leaves), static)))
