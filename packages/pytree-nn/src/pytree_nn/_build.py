"""`build`: a model built by one compiled program, cached between calls."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

import pytree_graph

from ._batched_draws import Row, eval_batching_draws
from ._flat_draws import drawing_flat


def build(make: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Build a model in one compiled program: `make(*args, **kwargs)`, traced once and kept.

    Built eagerly, a model runs each initializer op by op, and each draw is dispatched (and,
    the first time for its shape, compiled) on its own. `build` traces `make` once and runs
    one program that computes every parameter; the program is kept, so building the same
    model again (the same `make`, arguments of the same structure and static values) only
    runs it.

    In that program the random draws are batched, since XLA on CPU compiles each threefry
    hash of a program anew: the keys taken from `Rngs` streams are folded in one hash, and
    the draws of one sampler and shape are one draw vmapped over their keys, the bits of
    each the same. The first call of the benchmarks' 24-block transformer (384 keys, 144
    draws) compiles four hashes instead of 528, and takes about as long as building it
    eagerly: 1.1-1.5 s against 1.0-1.5 s on a 2-core CPU (11-14 s unbatched); each later
    build of the same model in the process runs the kept program, in 0.04-0.08 s.

    The model is the one `make` would build eagerly: the same values for the same seed (the
    same random bits; XLA may round their turning into floats differently in the last bit),
    Variables and Modules shared where `make` shares them (a tied embedding and head stay one
    Variable), and an `Rngs` passed in advanced as eager construction advances it (and the
    caller's own object where `make` stores it).

    Arguments:
        make: builds the model: a Module class, or any function returning Modules and
            Variables. Pass its randomness as an argument (an `Rngs`, a key or an int seed).
        *args: `make`'s positional arguments. Arrays, Modules, Variables and `Rngs` are
            traced; other values (sizes, names, flags) are static, part of the program's key.
        **kwargs: `make`'s keyword arguments, as `args`.

    Returns:
        What `make` returns, its arrays computed.

    Raises:
        TypeError: `make` is not callable.

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear, Rngs, build
        >>> layer = build(Linear, 3, 4, rngs=Rngs(0))
        >>> eager = Linear(3, 4, rngs=Rngs(0))
        >>> bool(jnp.allclose(layer.kernel.value, eager.kernel.value))
        True
        >>> layer.kernel.value.shape
        (3, 4)
    """
    if not callable(make):
        raise TypeError(
            f"build takes the function that builds the model first, got "
            f"{type(make).__name__}: build(Model, *args, rngs=Rngs(0)) builds "
            "Model(*args, rngs=Rngs(0))."
        )
    # An update context carries the inputs (an `Rngs`) through the program: their new
    # values written back in place, and the caller's own objects where `make` stored them.
    with pytree_graph.update_context(_BUILD):
        with pytree_graph.split_context(_BUILD) as split:
            graphdef, values = split.flatten((args, kwargs), with_paths=False)
        built, arrays = _program(make, graphdef, values)
        with pytree_graph.merge_context(_BUILD, inner=False) as merge:
            _, out = merge.unflatten(built.graphdef, built.values(arrays))
    return out


# The update context linking `build`'s splits and merges (see `pytree_graph.update_context`).
_BUILD = "pytree_nn.build"


@dataclasses.dataclass(frozen=True)
class _Built:
    """What a build's program gives besides its arrays (static, kept with the program):
    the graphdef of `((args, kwargs), model)` and where each of its values is, in the
    program's arrays: at a position, or in a row of a stacked array (a batch of draws)."""

    graphdef: pytree_graph.GraphDef
    treedef: Any
    places: tuple[int | tuple[int, int], ...]

    def values(self, arrays: list[jax.Array]) -> Any:
        """The values, in the graphdef's leaf order, from the program's arrays."""
        leaves = [
            arrays[place] if isinstance(place, int) else _row(arrays[place[0]], place[1])
            for place in self.places
        ]
        return jax.tree.unflatten(self.treedef, leaves)


jax.tree_util.register_static(_Built)


@jax.jit
def _row(stacked: jax.Array, index: int) -> jax.Array:
    # The index is traced: one small program per stacked shape, run for each row. Slicing
    # the rows apart in the build's program would cost XLA a kernel to compile for each.
    return jax.lax.dynamic_index_in_dim(stacked, index, keepdims=False)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _program(make: Callable[..., Any], graphdef: Any, values: list[Any]) -> tuple[_Built, list]:
    """The construction as one program: `make` traced on the inputs' values, its draws
    batched (see `_batched_draws`); `make` and the inputs' structure are its key."""
    built = []

    def construct(values: list[Any]) -> list[Any]:
        with pytree_graph.merge_context(_BUILD, inner=True) as merge:
            args, kwargs = merge.unflatten(graphdef, values)
        # Drawn flat: in a program on one device nothing gains from a draw's shape, and XLA
        # on CPU compiles a threefry hash over several small axes many times slower.
        with drawing_flat():
            out = make(*args, **kwargs)
        with pytree_graph.split_context(_BUILD) as split:
            out_graphdef, out_values = split.flatten(((args, kwargs), out), with_paths=False)
        built.append(out_graphdef)
        return out_values

    jaxpr, shapes = jax.make_jaxpr(construct, return_shape=True)(values)
    arrays: list[Any] = []
    places: list[int | tuple[int, int]] = []
    stacks: dict[int, int] = {}  # a stacked array's id -> its position in `arrays`
    for result in eval_batching_draws(jaxpr, *jax.tree.leaves(values)):
        if isinstance(result, Row):
            if id(result.stacked) not in stacks:
                stacks[id(result.stacked)] = len(arrays)
                arrays.append(result.stacked)
            places.append((stacks[id(result.stacked)], result.index))
        else:
            places.append(len(arrays))
            arrays.append(result)
    return _Built(built[0], jax.tree.structure(shapes), tuple(places)), arrays
