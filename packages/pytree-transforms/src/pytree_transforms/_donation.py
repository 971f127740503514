"""Buffer donation for `filter_jit` and `filter_pmap`: which traced inputs may have their
buffers reused for the outputs.

The choices are Equinox's spellings. The "warn" ones name the same donation as the others:
a buffer that cannot be reused is not an error, and JAX warns of it for every value here.
How one call's arrays are split into kept and donated ones (passing an array that stands at
several places once) is `Plan.donation`, shared by both transforms.
"""

from typing import Any

from jax.tree_util import PyTreeDef

DONATE = ("none", "all", "all-except-first", "warn", "warn-except-first")
# The choices that keep the arrays of the first argument (and of the function itself).
KEEP_FIRST = ("all-except-first", "warn-except-first")


def check_donate(transform: str, donate: Any) -> None:
    """Refuse a `donate=` that is not one of `DONATE`."""
    if donate not in DONATE:
        raise ValueError(
            f"{transform}(donate=...) must be one of {', '.join(map(repr, DONATE))}; got "
            f'{donate!r}. To donate only some arguments, use donate="all-except-first" '
            "and pass what must be kept in the first argument."
        )


def kept_leaves(donate: str, treedef: PyTreeDef, has_args: bool) -> int:
    """How many leaves at the start of a flat call `(fun, args, kwargs)` are never
    donated: with `donate` in `KEEP_FIRST`, those of `fun` and of the first argument."""
    if donate not in KEEP_FIRST:
        return 0
    fun_def, args_def, _ = treedef.children()
    return fun_def.num_leaves + (args_def.children()[0].num_leaves if has_args else 0)
