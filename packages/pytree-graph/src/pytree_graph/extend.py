"""The extension surface of pytree_graph, for libraries that write graph transforms.

`pytree_graph`'s top level is for users; this module is for library authors who want a
graph-aware version of some JAX transform (one whose function may take and change Modules
and Variables, as `pytree_graph.jit` does). Everything here is declared and tested: a patch
release of pytree_graph never changes it, a minor release may add to it, and only a major
release may change or remove a name (see the "Versions" page of the docs). Nothing outside
pytree_graph should reach into its underscore modules.

Every graph transform is the same few lines:

1. `call = Call(fun)`: how the function is called (a bound method's Module is lifted too).
2. `lifted = lift(call.tree(args, kwargs))`, outside: a `LiftedCall`, the call's
   structure (`lifted.graphdef`, static) and values (`lifted.values`, dynamic, in the
   graphdef's leaf order).
3. Inside the JAX transform, `inside = Inside(lifted.graphdef, values)` rebuilds the
   objects (under `jax.jit`, pass `lifted.jit_inputs()` and give `Inside` the pair it
   gives: the values come in the order they are read fastest, and `Inside` puts them
   back in leaf order); `call.run(inside.tree)` runs the function on them; `inside.finish(out)`
   returns `(outcome, values)`: a static outcome (`ValuesChanged` or `StructureChanged`,
   leafless pytrees) and the values it refers to. Pass `structure="fixed"` to a
   transform that maps every value (as vmap does): the function may then change values
   only, and the values returned are every argument leaf's, then the output's.
4. Outside again, `lifted.apply(outcome, values)` writes the changes back into the
   caller's objects and returns the output. (`outcome is NOTHING_CHANGED`: nothing was
   written and the output is `values[0]`, a shortcut for hot paths.)

Examples:
    A graph-aware `jax.named_call`:

    >>> import jax, jax.numpy as jnp
    >>> from pytree_module import Module
    >>> from pytree_graph import Variable
    >>> from pytree_graph.extend import Call, Inside, lift
    >>> def named_call(fun, name):
    ...     call = Call(fun)
    ...     def wrapped(*args, **kwargs):
    ...         lifted = lift(call.tree(args, kwargs))
    ...         def pure(values):
    ...             inside = Inside(lifted.graphdef, values)
    ...             return inside.finish(call.run(inside.tree))
    ...         outcome, values = jax.named_call(pure, name=name)(lifted.values)
    ...         return lifted.apply(outcome, values)
    ...     return wrapped
    >>> class Counter(Module):
    ...     def __init__(self):
    ...         self.count = Variable(jnp.array(0))
    ...     def __call__(self, x):
    ...         self.count.value += 1
    ...         return x * 2
    >>> counter = Counter()
    >>> step = named_call(lambda m, x: m(x), "step")
    >>> float(step(counter, 1.5)), int(counter.count.value)
    (3.0, 1)
"""

from typing import Any

from ._boundary import Call as Call
from ._boundary import Inside as Inside
from ._lift import LiftedCall as LiftedCall
from ._lift_cache import lift_cache
from ._outcome import NOTHING_CHANGED as NOTHING_CHANGED
from ._outcome import Outcome as Outcome
from ._outcome import StructureChanged as StructureChanged
from ._outcome import ValuesChanged as ValuesChanged

__all__ = [
    "NOTHING_CHANGED",
    "Call",
    "Inside",
    "LiftedCall",
    "Outcome",
    "StructureChanged",
    "ValuesChanged",
    "lift",
]


def lift(tree: Any) -> LiftedCall:
    """Walk a call's arguments: their structure and current values, outside a transform.

    A repeat call with the same objects reuses the earlier walk (see
    `PYTREE_GRAPH_CHECK_LIFT_CACHE` in the docs to check that reuse in tests).

    Arguments:
        tree: the tree to lift, usually `Call(fun).tree(args, kwargs)`.

    Returns:
        A `LiftedCall`: `graphdef` (static), `values` (dynamic, in the graphdef's leaf
        order), `paths`, `leaves`, `objects`, and `apply(outcome, values)`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param
        >>> from pytree_graph.extend import lift
        >>> lifted = lift({"w": Param(jnp.ones(2))})
        >>> lifted.paths, lifted.graphdef.num_leaves
        ((('w',),), 1)
    """
    return lift_cache.find(tree)
