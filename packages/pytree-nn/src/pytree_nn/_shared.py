"""`Shared`: Equinox's explicit tying of nodes, over the native sharing of Variables."""

from collections.abc import Callable
from typing import Any

import jax

from pytree_graph import Variable
from pytree_module import tree_at, tree_pformat
from pytree_transforms import filter_eval_shape

from ._module import Module


class SharedNode(Module):
    """What stands in a `Shared` pytree where a node is computed from another at each call.

    Where that node was a Variable, it keeps the Variable's type and metadata (static), so
    that the value computed goes into a Variable like it and layers still read `.value`.
    """

    def __init__(self, variable: Variable | None = None):
        self.kind = None if variable is None else type(variable)
        self.metadata = None if variable is None else dict(variable.metadata)

    def fill(self, value: Any) -> Any:
        """`value`, in a Variable of the type and metadata of the node replaced, if it was
        one and `value` is not a Variable already."""
        if self.kind is None or isinstance(value, Variable):
            return value
        return self.kind(value, **self.metadata)

    def __repr__(self) -> str:
        return "SharedNode" if self.kind is None else f"SharedNode({self.kind.__name__})"


def _placeholder(node: Any) -> SharedNode:
    return SharedNode(node if isinstance(node, Variable) else None)


def _several(nodes: Any, like: Any) -> bool:
    """Whether `where`'s result names several nodes: a list or tuple, as `get`'s is."""
    return (
        isinstance(nodes, list | tuple)
        and isinstance(like, list | tuple)
        and len(nodes) == len(like)
    )


def _signature(tree: Any) -> Any:
    """The structure, shapes and dtypes of `tree` (of abstract values), Variables read
    through to their values (a tied Param may carry other metadata than the one it replaces)."""
    tree = jax.tree.map(
        lambda x: x.value if isinstance(x, Variable) else x,
        tree,
        is_leaf=lambda x: isinstance(x, Variable),
    )
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, [(getattr(x, "shape", None), getattr(x, "dtype", type(x))) for x in leaves]


class Shared(Module):
    """Tie nodes of a pytree together, as Equinox's `eqx.nn.Shared`.

    In pytree_nn the same Variable or layer may simply be assigned at two places: every
    transform and optimizer keeps it one object (see "Shared layers stay shared" in the
    migration guide). `Shared` is Equinox's spelling of that, for code that uses it:
    `Shared(pytree, where, get)()` returns `pytree` with the node(s) `get(pytree)` in
    place of the node(s) `where(pytree)`, the same objects.

    When `get` picks Variables or Modules (`lambda pair: pair[0].embedding`), the tie is
    made once, natively: the Shared holds one copy of `pytree` in which the very same
    Variable stands at both places, and each call returns that copy. Gradients of both
    uses add up in it, optimizers update it once, and in-place updates made through the
    returned layers (running averages, key counters) are kept. When `get` computes a new
    value (`lambda pair: pair[0].embedding.value.T`), the Shared holds `pytree` without
    the nodes at `where` (a `SharedNode` stands there, holding nothing to train), and each
    call computes them anew, as Equinox does: the copy returned is new at each call, and a
    computed value put where a Variable was goes into a Variable of the same type and
    metadata.

    Arguments:
        pytree: the pytree (e.g. a tuple of layers) to tie nodes of.
        where: a function of `pytree` giving the node, or a list or tuple of nodes, to
            replace (as `tree_at`'s `where`).
        get: a function of `pytree` giving the value(s) to put there: of the same
            structure, shapes and dtypes as the node(s) replaced.

    Raises:
        ValueError: the nodes at `where` and the values of `get` differ in structure,
            shape or dtype.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Embedding, Linear, Shared
        >>> embedding, linear = Embedding(10, 4, rngs=0), Linear(4, 10, rngs=1)
        >>> shared = Shared(
        ...     (embedding, linear),
        ...     where=lambda pair: pair[1].kernel,
        ...     get=lambda pair: pair[0].embedding.value.T,
        ... )
        >>> embedding, linear = shared()
        >>> bool((linear.kernel.value == embedding.embedding.value.T).all())
        True
        >>> tied = Shared(
        ...     (Linear(4, 4, rngs=0), Linear(4, 4, rngs=1)),
        ...     where=lambda pair: pair[1].kernel,
        ...     get=lambda pair: pair[0].kernel,
        ... )
        >>> first, second = tied()
        >>> second.kernel is first.kernel
        True
    """

    def __init__(self, pytree: Any, where: Callable[[Any], Any], get: Callable[[Any], Any]):
        if not callable(where) or not callable(get):
            raise TypeError(
                "Shared(pytree, where, get): `where` and `get` must be functions of the "
                "pytree, e.g. where=lambda pair: pair[1].kernel, "
                f"get=lambda pair: pair[0].kernel; got {where!r} and {get!r}."
            )
        targets = filter_eval_shape(where, pytree)
        sources = filter_eval_shape(get, pytree)
        if _signature(targets) != _signature(sources):
            raise ValueError(
                "Shared: every node tied together must have the structure, shapes and "
                "dtypes of the value put in its place. `where` gives\n"
                f"{tree_pformat(targets)}\nand `get` gives\n{tree_pformat(sources)}."
            )
        values = get(pytree)
        several = _several(where(pytree), values)
        given = tuple(values) if several else (values,)
        if all(isinstance(value, Variable | Module) for value in given):
            # The same object at both places: every transform keeps it one.
            def both(tree: Any) -> tuple[Any, ...]:
                nodes, picked = where(tree), get(tree)
                return (*nodes, *picked) if several else (nodes, picked)

            self.pytree = tree_at(both, pytree, given + given)
            self.tied = True
        else:
            self.pytree = tree_at(where, pytree, replace_fn=_placeholder)
            self.tied = False
        self.where = where
        self.get = get

    def __call__(self) -> Any:
        """The pytree, with the value(s) of `get` in place of the node(s) at `where`.

        Returns:
            A pytree of the structure of the one given.
        """
        if self.tied:
            return self.pytree
        values = self.get(self.pytree)
        if _several(self.where(self.pytree), values):
            filled = type(values)(
                node.fill(value)
                for node, value in zip(self.where(self.pytree), values, strict=True)
            )
        else:
            filled = self.where(self.pytree).fill(values)
        return tree_at(self.where, self.pytree, filled)
