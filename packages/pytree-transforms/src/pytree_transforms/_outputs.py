"""Outputs of filtered transforms: traced leaves out through JAX, the rest in the treedef.

This is how every filtered transform gets the static (non-array) parts of an output out of a
trace: the traced function returns its traced leaves together with a `StaticOutput`, a pytree
node without leaves (`jax.tree_util.register_static`), so JAX carries it out in the output's
treedef and the caller rebuilds the output from it. No state outlives the trace, so the same
function may be traced again, or from several threads, at once. (`_axes.MappedOutput` does the
same for mapped outputs. Only `filter_custom_vjp` keeps its output's static part aside; its
module says why.)
"""

from typing import Any

import jax
from jax.tree_util import PyTreeDef

from pytree_filter import flatten_with_mask

from ._sharing import Sharing, find_sharing, has_repeats, selected_once


class StaticOutput:
    """The non-traced part of a transformed function's output.

    It is a pytree node with no children whose treedef entry is itself, so it travels out of
    `jax.jit` (or any transform) inside the output's treedef and comes back as the very
    object that was created while tracing. It compares and hashes by identity: it stands for
    the output of one trace. Where the output holds a shared object (one
    object at several places), `sharing` says so: `mask` and `static` then cover the unique
    leaves only, and rebuilding makes one object for every place it appeared.
    """

    __slots__ = ("mask", "sharing", "single", "static", "treedef")

    def __init__(
        self,
        treedef: PyTreeDef,
        mask: list[Any],
        static: tuple[Any, ...],
        sharing: Sharing | None = None,
    ):
        self.treedef = treedef
        self.mask = mask
        self.static = static
        self.sharing = sharing
        # The common case, one array out, is returned without any rebuilding.
        self.single = treedef.num_leaves == 1 and treedef.num_nodes == 1 and not static

    def rebuild(self, dynamic: list[Any], static_as_none: bool = False) -> Any:
        """The full output, from its traced leaves (with `None` for the static ones if
        `static_as_none`, as for tangents)."""
        if self.single:
            return dynamic[0]
        if self.sharing is None and not self.static:
            return self.treedef.unflatten(dynamic)
        static = (None,) * len(self.static) if static_as_none else self.static
        dynamic_it, static_it = iter(dynamic), iter(static)
        leaves = [next(dynamic_it) if m else next(static_it) for m in self.mask]
        if self.sharing is not None:
            return self.sharing.unflatten(leaves)
        return self.treedef.unflatten(leaves)


jax.tree_util.register_static(StaticOutput)


def split_output(out: Any, out_spec: Any, transform: str) -> tuple[list[Any], StaticOutput]:
    """Split a traced function's output into traced leaves and a `StaticOutput`.

    An object reached by several paths of the output (a tied weight, the model returned as
    aux) leaves once: the traced leaves are the unique ones, and `rebuild` makes one object
    for every place it stands, as the function returned it. (This runs while tracing only.)
    """
    leaves, mask, treedef = flatten_with_mask(out, out_spec)
    # One leaf at two places is the cheap sign that an object may be reached twice.
    sharing = find_sharing(out, treedef) if has_repeats(leaves) else None
    if sharing is not None:
        what = f"returned by {transform} as an array"
        mask = selected_once(sharing, out, mask, what)
        leaves = sharing.dedupe(leaves)
    dynamic = [x for x, m in zip(leaves, mask, strict=True) if m]
    static = tuple(x for x, m in zip(leaves, mask, strict=True) if not m)
    for value in static:
        if isinstance(value, jax.core.Tracer):
            raise ValueError(
                f"{transform}: the output holds a tracer where the `out=` filter says static "
                "(not traced). Mark that part of the output traced in `out=`, or return a "
                "concrete value there."
            )
    return dynamic, StaticOutput(treedef, [bool(m) for m in mask], static, sharing)


class PackedOutput:
    """An output with static parts, as it leaves a jitted function: traced leaves as
    children, the `StaticOutput` in the treedef.

    Outputs whose every leaf is traced leave as they are, so the common case costs nothing
    on the way out; `unpack_output` tells the two apart by type.
    """

    __slots__ = ("dynamic", "static")

    def __init__(self, dynamic: list[Any], static: StaticOutput):
        self.dynamic = dynamic
        self.static = static


jax.tree_util.register_pytree_node(
    PackedOutput, lambda p: ((p.dynamic,), p.static), lambda s, c: PackedOutput(c[0], s)
)


def pack_output(out: Any, out_spec: Any, transform: str) -> Any:
    """`out` itself where the `out=` spec traces all its leaves and no object in it is
    shared, else a `PackedOutput`."""
    dynamic, static = split_output(out, out_spec, transform)
    if not static.static and static.sharing is None:
        return out
    return PackedOutput(dynamic, static)


def unpack_output(result: Any) -> Any:
    """The output as the function returned it, from what `pack_output` gave."""
    if type(result) is PackedOutput:
        return result.static.rebuild(result.dynamic)
    return result
