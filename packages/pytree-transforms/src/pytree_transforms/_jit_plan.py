"""`Plan`: how `filter_jit` splits one input structure into traced and static leaves.

A `Plan` is interned per (treedef, mask, types of the static leaves) in each wrapper, and owns
the `jax.jit` that compiles calls of its structure. So the static argument JAX hashes and
compares on every call is just the tuple of static leaves (wrapped in a `KeyedStatics` where
their types alone do not decide equality, see `_static_key`). Plans are shared by every call
of their structure, from any thread: nothing in one changes after it is made, but for its
`jitted`, set once by the wrapper that makes it, before anyone else sees it.
"""

import operator
from collections.abc import Callable, Sequence
from typing import Any

from jax.core import Tracer
from jax.tree_util import PyTreeDef

from ._sharing import Sharing, repeat_test
from ._static_key import KeyedStatics, needs_static_key


def _tuple_getter(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    if len(indices) >= 2:
        return operator.itemgetter(*indices)
    if len(indices) == 1:
        (i,) = indices
        return lambda seq: (seq[i],)
    return lambda seq: ()


class Plan:
    """One input structure of a `filter_jit` function: which leaves are traced, which
    static, which may be donated, and the `jax.jit` its calls go to.

    The structure is a treedef, or for inputs holding shared objects a `Sharing`, whose
    leaves are the unique ones (each shared object's once) and whose `unflatten` rebuilds
    one object for all the places it stands.
    """

    __slots__ = (
        "bind",
        "bound",
        "fixed",
        "get_dynamic",
        "get_static",
        "jitted",
        "kept",
        "keyed",
        "mask",
        "repeat_check",
        "static_types",
        "treedef",
        "types",
    )

    def __init__(
        self,
        treedef: PyTreeDef | Sharing,
        mask: list[Any],
        types: list[type] | None,
        static_types: tuple[type, ...],
        kept_leaves: int,
        fixed: bool,
    ):
        self.treedef = treedef
        self.mask = mask
        # With the default filter, the mask follows from the leaf types (`is_array` is
        # answered per type), so a call whose leaf types equal `types` can reuse the plan
        # without computing a mask. Tracers are the exception (their abstract value
        # decides): with them, `types` is None, so no call matches it.
        if types is not None and any(issubclass(t, Tracer) for t in types):
            types = None
        self.types = types
        self.static_types = static_types
        # Strings, ints and functions of one type are equal only when interchangeable, so
        # they are their own cache key; floats and containers need a `KeyedStatics`.
        self.keyed = needs_static_key(static_types)
        dynamic = [i for i, m in enumerate(mask) if m]
        self.get_dynamic = _tuple_getter(dynamic)
        self.get_static = _tuple_getter([i for i, m in enumerate(mask) if not m])
        # The traced leaves never donated (those of `fun` and of the first argument, with
        # `donate="all-except-first"` or `"warn-except-first"`) come first in flat order:
        # they are the first `kept`.
        self.kept = sum(1 for i in dynamic if i < kept_leaves)
        # The plan's `jax.jit`, set by the wrapper right after making the plan (it is a
        # function of the plan).
        self.jitted: Any = None
        # Whether the static leaves are the same on every call (none, or only a plain
        # function's placeholder) and nothing is donated: then `jitted` takes the traced
        # leaves alone, and JAX has no static argument to hash and compare on each call.
        self.fixed = fixed
        # For other plans of the wrapper's fast path whose static leaves are their own cache
        # key (functions, strings, ints): a `jax.jit` per value of the static leaves, with
        # them bound, made by `bind` (both set by the wrapper), so that JAX has no static
        # part to hash and compare on each call. None where the static leaves go to `jitted`.
        self.bound: dict[tuple[Any, ...], Any] | None = None
        self.bind: Callable[[tuple[Any, ...]], Any] | None = None
        # The test of the traced leaves that says a call may share an object (see
        # `repeat_test`), or None where no two objects of this structure could be one.
        self.repeat_check = None if isinstance(treedef, Sharing) else repeat_test(treedef, mask)

    def static_arg(self, static: tuple[Any, ...]) -> Any:
        """The static argument of this plan's `jax.jit` for these static leaves."""
        return KeyedStatics(static) if self.keyed else static

    def statics(self, static_arg: Any) -> tuple[Any, ...]:
        """The static leaves back from `static_arg`."""
        return static_arg.values if self.keyed else static_arg

    def merge(self, dynamic: Any, static: tuple[Any, ...]) -> list[Any]:
        """Interleave traced and static leaves back into flat order."""
        dynamic, static = iter(dynamic), iter(static)
        return [next(dynamic) if m else next(static) for m in self.mask]

    def donation(self, dynamic: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]]:
        """`(aliases, kept, donated)`: the traced leaves split for a donating `jax.jit`.

        XLA refuses to donate a buffer passed twice, so when one array stands at several
        places each is passed once: donated if every place it stands may be donated, kept
        otherwise. `aliases` (None when every array is distinct, the usual case) gives, for
        each traced leaf, the index of its first place: `undo_donation` rebuilds from it.
        """
        if len({id(x) for x in dynamic}) == len(dynamic):
            return None, dynamic[: self.kept], dynamic[self.kept :]
        first: dict[int, int] = {}
        aliases = tuple(first.setdefault(id(x), i) for i, x in enumerate(dynamic))
        kept_at, donated_at = self._alias_groups(aliases)
        return aliases, tuple(dynamic[i] for i in kept_at), tuple(dynamic[i] for i in donated_at)

    def undo_donation(self, aliases: Any, kept: tuple, donated: tuple) -> Sequence[Any]:
        """The traced leaves in flat order, from what `donation` split."""
        if aliases is None:
            return kept + donated
        kept_at, donated_at = self._alias_groups(aliases)
        by_place = dict(zip(kept_at + donated_at, kept + donated, strict=True))
        return [by_place[i] for i in aliases]

    def _alias_groups(self, aliases: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        keep = {i for place, i in enumerate(aliases) if place < self.kept}
        firsts = sorted(set(aliases))
        kept_at = tuple(i for i in firsts if i in keep)
        return kept_at, tuple(i for i in firsts if i not in keep)
