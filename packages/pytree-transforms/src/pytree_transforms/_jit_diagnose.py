"""How `filter_jit` names the user's leaves in errors: the diagnosis after JAX refuses an
input, and the names JAX's own tracing errors give the traced leaves."""

from typing import Any

from pytree_filter import is_array_like

from ._arguments import leaf_names
from ._errors import describe_leaf
from ._jit_plan import Plan
from ._sharing import Sharing


def traced_leaf_names(fun: Any, structure: Any, mask: tuple[Any, ...]) -> list[str]:
    """The names of a plan's traced leaves, as the user's call spells them.

    `fun` is the plain function called, or None where the function is a callable pytree,
    which is part of the call (`structure` rebuilds it).
    """
    tree = structure.unflatten(range(structure.num_leaves))
    if fun is None:
        fun = tree[0]
    names = {index: name for name, index in leaf_names(fun, tree)}
    return [names[i] for i, traced in enumerate(mask) if traced]


def diagnose_inputs(tree: Any, leaves: list[Any], plan: Plan, static: tuple) -> None:
    """After JAX refused the inputs, say which leaf was at fault and how to fix it.

    Returns without raising where no leaf explains the refusal: the caller re-raises JAX's
    error then.
    """
    # With shared objects, `leaves` are the unique ones: name them by their first place.
    places = plan.treedef.unique if isinstance(plan.treedef, Sharing) else range(len(leaves))
    for index, (leaf, traced) in enumerate(zip(leaves, plan.mask, strict=True)):
        if traced and not is_array_like(leaf):
            raise TypeError(
                f"filter_jit: {describe_leaf(tree, places[index], ('fun', 'args', 'kwargs'))} is "
                f"marked to be traced, but {type(leaf).__name__} {leaf!r:.60} is not a JAX "
                "type. Only arrays and Python scalars can be traced: mark it static with a "
                "`False` in the `args=`/`kwargs=`/`default=` specs."
            ) from None
    static_places = plan.get_static(range(len(leaves)))
    for value, place in zip(static, static_places, strict=True):
        try:
            hash(value)
        except TypeError:
            index = places[place]
            raise TypeError(
                f"filter_jit: {describe_leaf(tree, index, ('fun', 'args', 'kwargs'))} is "
                f"static (not an array), so it must be hashable, but {type(value).__name__} "
                "is not. Make it hashable, turn it into an array, or mark it traced."
            ) from None
