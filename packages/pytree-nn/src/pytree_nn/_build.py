"""`build`: a model built by one compiled program, cached between calls."""

from collections.abc import Callable
from typing import Any

import pytree_graph

from ._flat_draws import drawing_flat


def build(make: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Build a model in one compiled program: `make(*args, **kwargs)` under `pytree_graph.jit`.

    Built eagerly, a model runs each initializer op by op, and each draw is dispatched (and,
    the first time for its shape, compiled) on its own. `build` traces `make` once and runs
    one program that computes every parameter; the program is kept, so building the same
    model again (the same `make`, arguments of the same structure and static values) only
    runs it. The random draws are computed in the form that XLA compiles fastest, with the
    values of eager construction.

    The first call compiles the whole construction as one program, which on CPU takes longer
    than building eagerly (XLA compiles each random draw of the program anew); every later
    build of the same model in the process runs the kept program, in a fraction of the eager
    time.

    The model is the one `make` would build eagerly: the same values for the same seed (the
    same random bits; XLA may round their turning into floats differently in the last bit),
    Variables and Modules shared where `make` shares them (a tied embedding and head stay one
    Variable), and an `Rngs` passed in advanced as eager construction advances it.

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
    return _built(make, args, kwargs)


@pytree_graph.jit
def _built(make: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    # `make` is static: one program per model (and structure of its arguments), kept by jit.
    # The draws are flat here: in a program on one device nothing gains from their shape, and
    # XLA on CPU compiles a threefry hash over several small axes many times slower.
    with drawing_flat():
        return make(*args, **kwargs)
