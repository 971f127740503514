"""`Rngs`: named streams of PRNG keys, carried in a model like any other state."""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_graph import Variable

from . import initializers
from ._module import Module


class RngState(Variable):
    """The state of a random stream: the common base of `RngKey` and `RngCount`, so one
    type selects all of it, as `nnx.RngState` does.

    Examples:
        >>> import pytree_graph as pg
        >>> from pytree_nn import Rngs, RngState
        >>> sorted(pg.state(Rngs(0, dropout=1), RngState).flat_state())
        [('default', 'count'), ('default', 'key'), ('dropout', 'count'), ('dropout', 'key')]
    """


class RngKey(RngState):
    """The root key of a random stream."""


class RngCount(RngState):
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


def _check_num(num: Any, where: str) -> int | tuple[int, ...]:
    """`num` for `split`: a count >= 0, or a shape (a tuple of counts) for nested maps."""
    counts = num if isinstance(num, tuple) else (num,)
    if not counts or not all(
        isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 0 for n in counts
    ):
        raise ValueError(
            f"{where}: the number of splits must be an int >= 0 or a tuple of them (a "
            f"shape, e.g. (2, 3)), got {num!r}. For example rngs.split(4)."
        )
    return tuple(int(n) for n in counts) if isinstance(num, tuple) else int(num)


class RngStream(Module):
    """One named stream: a root key and a counter; each call gives a new key.

    Arguments:
        key: an int seed or a PRNG key.
        tag: the stream's name, shown in its repr and in errors. An `Rngs` tags each stream
            it makes with its keyword; `fork` and `split` keep the tag.

    Examples:
        >>> from pytree_nn import RngStream
        >>> stream = RngStream(0, tag="dropout")
        >>> stream().dtype, int(stream.count.value)
        (key<fry>, 1)
        >>> stream.fork().tag, int(stream.count.value)  # a new stream; this one advances
        ('dropout', 2)
    """

    def __init__(self, key: Any, *, tag: str = "default"):
        if not isinstance(tag, str):
            raise TypeError(f"RngStream(tag=...) must be a str (the stream's name), got {tag!r}.")
        key = _as_key(key, f"RngStream(tag={tag!r})")
        self.tag = tag
        # The Variables carry the name too, so that a string filter ("dropout", Flax NNX's
        # tag filter) selects this stream's state in StateAxes, DiffState, pg.state, ...
        self.key = RngKey(key, tag=tag)
        self.count = RngCount(jnp.zeros(key.shape, jnp.uint32), tag=tag)

    def __call__(self) -> jax.Array:
        """A new key: the root key folded with the count, which then goes up by one."""
        key = _fold_in(self.key.value, self.count.value)
        self.count.value = self.count.value + 1
        return key

    def split(self, num: int | tuple[int, ...]) -> "RngStream":
        """`num` independent streams, stacked (for `vmap` or `scan`); a tuple stacks them
        in that shape (for nested maps). This stream advances by one key."""
        num = _check_num(num, f"RngStream {self.tag!r}: split(num)")
        return RngStream(jax.random.split(self(), num), tag=self.tag)

    def fork(self, *, split: int | tuple[int, ...] | None = None) -> "RngStream":
        """A new stream, independent of this one, whose root key is this stream's next key
        (as Flax NNX's `RngStream.fork`). This stream advances by one key.

        Arguments:
            split: Flax NNX's older spelling of `split(num)`: given, the new stream is
                `num` stacked streams.
        """
        if split is not None:
            return self.split(split)
        return RngStream(self(), tag=self.tag)

    def broadcast(self, num: int | tuple[int, ...]) -> "RngStream":
        """A stack of `num` identical streams, for `vmap` or `scan` to give every example or
        step the same keys (as Flax NNX's `RngStream.broadcast`; `split` gives different
        ones). Its root key is this stream's next key; this stream advances by one key.

        Examples:
            >>> from pytree_nn import RngStream
            >>> stack = RngStream(0).broadcast(3)
            >>> stack.key.value.shape, bool((stack.key.value[0] == stack.key.value[2]).all())
            ((3,), True)
        """
        shape = _check_num(num, f"RngStream {self.tag!r}: broadcast(num)")
        shape = (shape,) if isinstance(shape, int) else shape
        key = self()
        return RngStream(jnp.broadcast_to(key, shape + key.shape), tag=self.tag)


def _fold_in(key: jax.Array, count: jax.Array) -> jax.Array:
    fold_in = jax.random.fold_in
    # A stack of streams (split for vmap/scan, used without mapping): one each.
    for _ in range(key.ndim):
        fold_in = jax.vmap(fold_in)
    return fold_in(key, count)


# The samplers of `jax.random` that Flax NNX's `Rngs` and `RngStream` have as methods:
# `rngs.beta(a, b, shape)` is `jax.random.beta(rngs(), a, b, shape)`.
_DISTRIBUTIONS = (
    "ball",
    "bernoulli",
    "beta",
    "binomial",
    "bits",
    "categorical",
    "cauchy",
    "chisquare",
    "choice",
    "dirichlet",
    "double_sided_maxwell",
    "exponential",
    "f",
    "gamma",
    "generalized_normal",
    "geometric",
    "gumbel",
    "laplace",
    "loggamma",
    "logistic",
    "lognormal",
    "maxwell",
    "multinomial",
    "multivariate_normal",
    "normal",
    "orthogonal",
    "pareto",
    "permutation",
    "poisson",
    "rademacher",
    "randint",
    "rayleigh",
    "t",
    "triangular",
    "truncated_normal",
    "uniform",
    "wald",
    "weibull_min",
)


class Rngs(Module):
    """Named streams of PRNG keys: `rngs.params()`, `rngs.dropout()`, `rngs()`.

    Each stream gives a new key per call (its root key folded in with a counter kept in
    a Variable, so the streams live in the model and advance inside transforms). A stream
    that was not given falls back to the default one. Layers take `rngs=` as an `Rngs`,
    a PRNG key or an int seed. `rngs["name"]` is `rngs.name`.

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
        >>> rngs["dropout"] is rngs.dropout
        True
        >>> rngs.normal((2,)).shape  # distributions, from the default stream
        (2,)
        >>> rngs.lecun_normal()((2, 3)).shape  # initializers: init(shape), a key per call
        (2, 3)
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
            self.default = _stream(seed_or_key, "default", "Rngs")
        for name, seed in streams.items():
            setattr(self, name, _stream(seed, name, f"Rngs({name}=...)"))

    def __getattr__(self, name: str) -> RngStream:
        # Only reached for names that are not attributes: unknown streams.
        if name.startswith("_"):
            raise AttributeError(name)
        return self._stream_or_default(name, AttributeError)

    def __getitem__(self, name: str) -> RngStream:
        """The stream called `name` (or the default one, if there is none), as `rngs.name`."""
        if not isinstance(name, str):
            raise TypeError(
                f"Rngs[...] takes a stream name (a str), got {name!r}; its streams: "
                f"{self.streams()}, e.g. rngs[{self.streams()[0]!r}]."
            )
        stream = vars(self).get(name)
        if isinstance(stream, RngStream):
            return stream
        return self._stream_or_default(name, KeyError)

    def _stream_or_default(self, name: str, error: type[Exception]) -> RngStream:
        default = vars(self).get("default")
        if default is None:
            raise error(
                f"No RngStream named {name!r} found in Rngs, and no default stream to fall "
                f"back to; its streams: {self.streams()}. Give one: Rngs(0) or Rngs({name}=0)."
            )
        return default

    def __call__(self) -> jax.Array:
        """A new key from the default stream."""
        return self.default()

    def streams(self) -> list[str]:
        """The names of the streams."""
        return [name for name, _ in self._items()]

    def split(self, num: int | tuple[int, ...] | Mapping[Any, Any]) -> "Rngs":
        """Independent copies of every stream, stacked: pass the result to `vmap` (mapped
        over axis 0) or `scan` to give each example or step its own keys.

        Arguments:
            num: how many: an int, or a tuple for a stack of that shape (nested maps). Or
                a dict from stream names to how many, per stream; `...` stands for the
                streams not named (wherever it is in the dict), and `None` for "not
                split". A stream that is not split is forked: the new `Rngs` has an
                independent stream, of the same shape.

        Returns:
            A new `Rngs` whose split streams' keys and counts have leading axes of shape
            `num`. This `Rngs` advances by one key per stream.

        Examples:
            >>> from pytree_nn import Rngs
            >>> rngs = Rngs(params=0, dropout=1, noise=2)
            >>> split = rngs.split({"params": 4, ...: (2, 3), "dropout": None})
            >>> [split[name].key.value.shape for name in ("params", "dropout", "noise")]
            [(4,), (), (2, 3)]
        """
        return self._stack(num, "split")

    def broadcast(self, num: int | tuple[int, ...] | Mapping[Any, Any] | None) -> "Rngs":
        """Every stream repeated `num` times, stacked: each example of a `vmap` (or step of
        a `scan`) then draws the same keys, as Flax NNX's `Rngs.broadcast`. `split` gives
        each its own.

        Arguments:
            num: how many: an int, a tuple for a stack of that shape, or `None` (no
                stream broadcast). Or a dict from stream names to those, per stream, with
                `...` for the streams not named. A stream not broadcast is forked, as in
                `split`.

        Returns:
            A new `Rngs`; this one advances by one key per stream.

        Examples:
            >>> from pytree_nn import Rngs
            >>> rngs = Rngs(params=1, dropout=2, noise=3).broadcast(
            ...     {"params": 5, "dropout": None, ...: (2, 5)}
            ... )
            >>> [rngs[name].key.value.shape for name in ("params", "dropout", "noise")]
            [(5,), (), (2, 5)]
            >>> keys = Rngs(0).broadcast(4).default.key.value
            >>> bool((keys[0] == keys[3]).all())
            True
        """
        return self._stack(num, "broadcast")

    def _stack(self, num: Any, how: str) -> "Rngs":
        # Checked before any stream advances, so a bad `num` leaves this Rngs as it was.
        nums = self._stack_nums(num, how)
        new = {
            name: stream.fork() if nums[name] is None else getattr(stream, how)(nums[name])
            for name, stream in self._items()
        }
        return Rngs(new.pop("default", None), **new)

    def _stack_nums(self, num: Any, how: str) -> dict[str, Any]:
        """How to split (or broadcast) each stream (None: not at all), `num` checked."""
        names = self.streams()
        if not isinstance(num, Mapping):
            if num is None and how == "broadcast":
                return dict.fromkeys(names)
            num = _check_num(num, f"Rngs.{how}(num)")
            return dict.fromkeys(names, num)
        unknown = [name for name in num if name is not Ellipsis and name not in names]
        if unknown:
            raise ValueError(
                f"Rngs.{how}({{...}}): no stream called {', '.join(map(repr, unknown))}; the "
                f"streams are {names}. Name those, or use `...` for all the streams not named, "
                f"e.g. rngs.{how}({{'params': 4, ...: None}})."
            )
        nums = {name: num.get(name, num.get(Ellipsis)) for name in names}
        return {
            name: None if n is None else _check_num(n, f"Rngs.{how}({{{name!r}: ...}})")
            for name, n in nums.items()
        }

    def fork(self, *, split: int | tuple[int, ...] | Mapping[Any, Any] | None = None) -> "Rngs":
        """A new `Rngs` with the same streams, each forked: independent of this one's, its
        root key this stream's next key (as Flax NNX's `Rngs.fork`). Give it to a part of a
        model that should draw keys of its own. This `Rngs` advances by one key per stream.

        Arguments:
            split: Flax NNX's older spelling of `split(num)` (same values: an int, a
                shape, or a dict by stream name with `...` for the others): the streams
                it names are split, the others forked.

        Returns:
            The new `Rngs`.

        Examples:
            >>> from pytree_nn import Rngs
            >>> rngs = Rngs(0, dropout=1)
            >>> forked = rngs.fork()
            >>> forked.streams(), int(rngs.dropout.count.value)
            (['default', 'dropout'], 1)
            >>> bool((forked.dropout() == rngs.dropout()).all())
            False
            >>> rngs.fork(split={"dropout": 4, ...: None}).dropout.key.value.shape
            (4,)
        """
        if split is not None:
            return self._stack(split, "split")
        new = {name: stream.fork() for name, stream in self._items()}
        return Rngs(new.pop("default", None), **new)

    def _items(self) -> list[tuple[str, RngStream]]:
        """The streams, by name, in the order they were given."""
        return [(name, value) for name, value in vars(self).items() if isinstance(value, RngStream)]


def _stream(seed_or_key: Any, name: str, where: str) -> RngStream:
    if isinstance(seed_or_key, RngStream):
        return seed_or_key
    return RngStream(_as_key(seed_or_key, where), tag=name)


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


# As Flax NNX: the initializers whose names do not clash with a distribution's.
_INITIALIZERS = (
    "delta_orthogonal",
    "glorot_normal",
    "glorot_uniform",
    "he_normal",
    "he_uniform",
    "kaiming_normal",
    "kaiming_uniform",
    "lecun_normal",
    "lecun_uniform",
    "variance_scaling",
    "xavier_normal",
    "xavier_uniform",
)


def _initializer(name: str, on_default: bool) -> Any:
    make = getattr(initializers, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        init = make(*args, **kwargs)
        stream = self.default if on_default else self

        # The key is drawn at each call, not when the initializer is made: one
        # initializer gives a new array each time, as Flax NNX's.
        def keyless(*init_args: Any, **init_kwargs: Any) -> Any:
            return init(stream(), *init_args, **init_kwargs)

        keyless.__name__ = keyless.__qualname__ = name
        return keyless

    method.__name__ = name
    method.__qualname__ = f"{'Rngs' if on_default else 'RngStream'}.{name}"
    method.__doc__ = (
        f"`initializers.{name}(*args, **kwargs)` as a function `init(shape, dtype=...)` "
        f"that draws a new key from {'the default stream' if on_default else 'this stream'} "
        f"at each call (Flax NNX's `rngs.{name}()`)."
    )
    return method


for _name in _DISTRIBUTIONS:
    setattr(RngStream, _name, _distribution(_name, on_default=False))
    setattr(Rngs, _name, _distribution(_name, on_default=True))
for _name in _INITIALIZERS:
    setattr(RngStream, _name, _initializer(_name, on_default=False))
    setattr(Rngs, _name, _initializer(_name, on_default=True))

# A stream named like a method would hide it.
_RESERVED = frozenset(name for name in dir(Rngs) if not name.startswith("_"))


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
