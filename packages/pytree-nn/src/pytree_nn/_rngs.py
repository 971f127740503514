"""`Rngs`: named streams of PRNG keys, carried in a model like any other state."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_graph import Variable

from ._module import Module


class RngKey(Variable):
    """The root key of a random stream."""


class RngCount(Variable):
    """How many keys a random stream has given out."""


def _as_key(seed_or_key: Any, where: str) -> jax.Array:
    """A typed PRNG key from an int seed or a key (typed, or raw uint32 data)."""
    if isinstance(seed_or_key, bool) or seed_or_key is None:
        raise TypeError(f"{where}: expected an int seed or a PRNG key, got {seed_or_key!r}.")
    if isinstance(seed_or_key, int | np.integer):
        return jax.random.key(int(seed_or_key))
    if isinstance(seed_or_key, jax.Array | np.ndarray):
        if jnp.issubdtype(seed_or_key.dtype, jax.dtypes.prng_key):
            return seed_or_key
        if seed_or_key.dtype == jnp.uint32 and seed_or_key.shape[-1:] == (2,):
            return jax.random.wrap_key_data(seed_or_key)
        if seed_or_key.shape == () and jnp.issubdtype(seed_or_key.dtype, jnp.integer):
            return jax.random.key(seed_or_key)
    raise TypeError(
        f"{where}: expected an int seed or a PRNG key (from jax.random.key), got "
        f"{type(seed_or_key).__name__} {getattr(seed_or_key, 'dtype', '')}".rstrip()
        + "."
    )


class RngStream(Module):
    """One named stream: a root key and a counter; each call gives a new key.

    Arguments:
        key: an int seed or a PRNG key.
    """

    def __init__(self, key: Any):
        key = _as_key(key, "RngStream")
        self.key = RngKey(key)
        self.count = RngCount(jnp.zeros(key.shape, jnp.uint32))

    def __call__(self) -> jax.Array:
        """A new key: the root key folded with the count, which then goes up by one."""
        key = _fold_in(self.key.value, self.count.value)
        self.count.value = self.count.value + 1
        return key

    def split(self, num: int) -> "RngStream":
        """`num` independent streams, stacked (for `vmap` or `scan`)."""
        return RngStream(jax.random.split(self(), num))

    def fork(self) -> "RngStream":
        """A new stream, independent of this one, whose root key is this stream's next key
        (as Flax NNX's `RngStream.fork`). This stream advances by one key."""
        return RngStream(self())


def _fold_in(key: jax.Array, count: jax.Array) -> jax.Array:
    if key.shape:
        # A stack of streams (split for vmap/scan, used without mapping): one each.
        return jax.vmap(jax.random.fold_in)(key, count)
    return jax.random.fold_in(key, count)


_DISTRIBUTIONS = (
    "normal",
    "uniform",
    "bernoulli",
    "categorical",
    "truncated_normal",
    "randint",
    "permutation",
    "choice",
    "gumbel",
    "laplace",
    "exponential",
)
_RESERVED = frozenset({"split", *_DISTRIBUTIONS}) | {
    name for name in dir(Module) if not name.startswith("_")
}


class Rngs(Module):
    """Named streams of PRNG keys: `rngs.params()`, `rngs.dropout()`, `rngs()`.

    Each stream gives a new key per call (its root key folded in with a counter kept in
    a Variable, so the streams live in the model and advance inside transforms). A stream
    that was not given falls back to the default one. Layers take `rngs=` as an `Rngs`,
    a PRNG key or an int seed.

    An `Rngs` is state, like a Param: each draw writes its stream's counter. Two threads
    drawing from one `Rngs` at the same time race on that write (both may get the same
    key); give each thread an `Rngs` of its own.

    Arguments:
        seed_or_key: the default stream's seed or key (None: no default stream).
        **streams: more named streams, each with its seed or key; `default=` names the
            default stream by keyword (`Rngs(default=0)` is `Rngs(0)`).

    Examples:
        >>> from pytree_nn import Rngs
        >>> rngs = Rngs(0, dropout=1)
        >>> rngs.params().dtype  # no "params" stream: the default one
        key<fry>
        >>> rngs.normal((2,)).shape  # distributions, from the default stream
        (2,)
        >>> rngs.split(4).default.key.value.shape  # four streams, for vmap
        (4,)
        >>> bool((Rngs(default=5)() == Rngs(5)()).all())
        True
    """

    def __init__(self, seed_or_key: Any = None, /, **streams: Any):
        if "default" in streams:
            if seed_or_key is not None:
                raise TypeError(
                    "Rngs got the default stream twice, as its first argument and as "
                    "default=...; give one: Rngs(0) or Rngs(default=0)."
                )
            seed_or_key = streams.pop("default")
            if seed_or_key is None:
                raise TypeError(
                    "Rngs(default=None): the default stream needs a seed or key, e.g. "
                    "Rngs(default=0)."
                )
        for name in streams:
            if name in _RESERVED or name.startswith("_"):
                raise ValueError(
                    f"Rngs: a stream cannot be called {name!r} (a method or reserved name). "
                    "Pick another name."
                )
        if seed_or_key is None and not streams:
            raise TypeError(
                "Rngs needs a seed or key: Rngs(0), Rngs(jax.random.key(0)), or named "
                "streams such as Rngs(params=0, dropout=1)."
            )
        if seed_or_key is not None:
            self.default = _stream(seed_or_key, "Rngs")
        for name, seed in streams.items():
            setattr(self, name, _stream(seed, f"Rngs({name}=...)"))

    def __getattr__(self, name: str) -> RngStream:
        # Only reached for names that are not attributes: unknown streams.
        if name.startswith("_"):
            raise AttributeError(name)
        default = vars(self).get("default")
        if default is None:
            raise AttributeError(
                f"Rngs has no stream {name!r} and no default stream to fall back to; its "
                f"streams: {self.streams()}. Give one: Rngs(0) or Rngs({name}=0)."
            )
        return default

    def __call__(self) -> jax.Array:
        """A new key from the default stream."""
        return self.default()

    def streams(self) -> list[str]:
        """The names of the streams."""
        return [name for name, value in vars(self).items() if isinstance(value, RngStream)]

    def split(self, num: int) -> "Rngs":
        """`num` independent copies of every stream, stacked: pass the result to `vmap`
        (mapped over axis 0) or `scan` to give each example or step its own keys.

        Arguments:
            num: how many.

        Returns:
            A new `Rngs` whose keys and counts have a leading axis of size `num`. This
            `Rngs` advances by one key per stream.
        """
        split = {name: getattr(self, name).split(num) for name in self.streams()}
        default = split.pop("default", None)
        return Rngs(default, **split)


def _stream(seed_or_key: Any, where: str) -> RngStream:
    if isinstance(seed_or_key, RngStream):
        return seed_or_key
    return RngStream(_as_key(seed_or_key, where))


def _distribution(name: str, on_default: bool) -> Any:
    sample = getattr(jax.random, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return sample((self.default if on_default else self)(), *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"{'Rngs' if on_default else 'RngStream'}.{name}"
    method.__doc__ = (
        f"`jax.random.{name}(key, ...)` with a new key from "
        f"{'the default stream' if on_default else 'this stream'}."
    )
    return method


for _name in _DISTRIBUTIONS:
    setattr(RngStream, _name, _distribution(_name, on_default=False))
    setattr(Rngs, _name, _distribution(_name, on_default=True))


def as_rngs(rngs: Any, where: str) -> Rngs:
    """The `Rngs` a layer was given as `rngs=`: an `Rngs`, an `RngStream` (its default
    stream, shared), a PRNG key or an int seed."""
    if isinstance(rngs, Rngs):
        return rngs
    if isinstance(rngs, RngStream):
        return Rngs(rngs)
    if rngs is None:
        raise TypeError(
            f"{where} needs `rngs=` to initialise its parameters: an Rngs, a PRNG key or "
            "an int seed, e.g. rngs=Rngs(0) or rngs=0."
        )
    return Rngs(_as_key(rngs, f"{where}(rngs=...)"))


def forked_rngs(rngs: Any, stream: str, where: str) -> Rngs:
    """The `Rngs` kept by a layer that draws keys when called (dropout): one default stream
    of its own, forked from the `stream` stream of the `rngs=` it was built with.

    A layer holding a stream of its own shares no counter with any other layer, so every
    way of running the model (in place, `pytree_graph.jit`, or pure transforms that see a
    copy of each object) draws the same keys, and two layers built from one `Rngs` draw
    different ones.
    """
    source = rngs if isinstance(rngs, RngStream) else getattr(as_rngs(rngs, where), stream)
    return Rngs(source.fork())
