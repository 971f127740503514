"""Progress meters: `AbstractProgressMeter`'s `init`/`step`/`close` protocol (Equinox's and
diffrax's), which a loop of your own drives from inside compiled code, and which
`while_loop(..., progress_meter=...)` drives for you.

A meter's state is a pytree of arrays that the loop carries. It holds the key of the meter's
host-side display (made by `init`'s host callback) and what the device needs to decide, with
`lax.cond`, when a report is due: a step costs a comparison, and the host is called back only
when a line is due. The callbacks take the key and return it, and the state carries what they
return, so they run in program order (init, then the steps, then close), and nothing that a
later callback needs is dead code. Under `vmap` the decision and the values reported are
reduced over the batch first (the furthest progress), so the host gets one call per report,
not one per batch element.
"""

import abc
import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from ._error_if import _unvmap_p
from ._errors import check_callable


def _batch_max(x: Any) -> Any:
    """The largest value over `vmap`'s batch axes (an unbatched value, the same for every
    element), so that `lax.cond` stays a conditional and the host is called once."""
    return _unvmap_p.bind(x, reduce="max")


class _Displays:
    """The host side: each running meter's display (a tqdm bar, the last line printed), by
    the key its `init` got."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys = itertools.count(1)
        self.items: dict[int, Any] = {}

    def open(self, make: Callable[[], Any]) -> Any:
        def host_open() -> Any:
            with self.lock:
                key = next(self.keys)
                self.items[key] = make()
            return np.int32(key)

        # An `io_callback`: it is not a function of its inputs (each call makes a new
        # display), and its result is needed, which `jax.debug.callback` cannot give.
        return io_callback(host_open, jax.ShapeDtypeStruct((), jnp.int32))

    def update(self, show: Callable[[Any, float], None], key: Any, progress: Any) -> Any:
        def host_update(key: Any, progress: Any) -> Any:
            with self.lock:
                item = self.items.get(int(np.max(key)))
                if item is not None:
                    show(item, float(np.max(progress)))
            return np.asarray(key, np.int32)

        shape = jax.ShapeDtypeStruct(jnp.shape(key), jnp.int32)
        return jax.pure_callback(host_update, shape, key, progress, vmap_method="broadcast_all")

    def close(self, finish: Callable[[Any], None], key: Any) -> None:
        def host_close(key: Any) -> None:
            with self.lock:
                item = self.items.pop(int(np.max(key)), None)
                if item is not None:
                    finish(item)

        io_callback(host_close, None, _batch_max(key))


_displays = _Displays()


def _progress_value(progress: Any) -> Any:
    # The meter's state is not differentiated: the progress only decides what is shown.
    return _batch_max(lax.stop_gradient(jnp.asarray(progress, jnp.float32)))


class AbstractProgressMeter(abc.ABC):
    """The protocol of progress meters (Equinox's and diffrax's): `init` makes the meter's
    state, `step` reports a progress and returns the next state, `close` ends the report.

    All three are called inside the traced program (under `jax.jit`, `jax.vmap`,
    `jax.grad`, in a `lax.scan` or `lax.while_loop` body), and the state is a pytree of
    arrays, carried by the loop from one step to the next. `while_loop(...,
    progress_meter=meter)` drives any meter: `init()` before the loop, `step(state,
    fraction)` after each step and `close(state)` after the loop. To write your own meter,
    subclass this and define the three methods; a report is a host callback
    (`jax.debug.callback`, `jax.experimental.io_callback`), best made under a `lax.cond` so
    that only the steps that show something call back to the host.

    Example:
        Drive a meter from your own loop:

        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import TextProgressMeter
        >>> meter = TextProgressMeter(minimum_increase=0.3)
        >>> @jax.jit
        ... def run(x):
        ...     def body(carry, i):
        ...         x, state = carry
        ...         return (2 * x, meter.step(state, (i + 1) / 4)), None
        ...     (x, state), _ = jax.lax.scan(body, (x, meter.init()), jnp.arange(4))
        ...     meter.close(state)
        ...     return x
        >>> x = run(1.0); jax.effects_barrier()
        0.00%
        50.00%
        100.00%

        Write one, here a meter that counts the steps and prints the count at the end:

        >>> from pytree_transforms import AbstractProgressMeter, while_loop
        >>> class StepCounter(AbstractProgressMeter):
        ...     def init(self):
        ...         return jnp.int32(0)
        ...     def step(self, state, progress):
        ...         return state + 1
        ...     def close(self, state):
        ...         jax.debug.callback(lambda n: print(f"{n} steps"), state)
        >>> out = while_loop(lambda i: i < 5, lambda i: i + 1, jnp.int32(0),
        ...                  max_steps=10, progress_meter=StepCounter()); jax.effects_barrier()
        5 steps
    """

    @abc.abstractmethod
    def init(self) -> Any:
        """Start a new report (each call a fresh one).

        Returns:
            The meter's initial state, a pytree of arrays.
        """

    @abc.abstractmethod
    def step(self, state: Any, progress: Any) -> Any:
        """Report the progress after a step, as a side effect.

        Arguments:
            state: the state `init` or the previous `step` returned.
            progress: how far the work has got, a scalar from 0 (start) to 1 (done);
                may be traced.

        Returns:
            The next state, of the same structure, shapes and dtypes as `state`.
        """

    @abc.abstractmethod
    def close(self, state: Any) -> None:
        """End the report: the work is done.

        Arguments:
            state: the last state `step` (or `init`) returned.

        Returns:
            None.
        """


def _check_fraction(fraction: Any, meter: str) -> None:
    if fraction is not None:
        check_callable(fraction, meter, "fraction", spelling=f"{meter}(fraction={{}})")


def _check_positive(value: Any, name: str, meter: str, kind: type, example: str) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
    if not ok or not value > 0 or (kind is float and not value <= 1):
        what = "a number in (0, 1]" if kind is float else "a positive int"
        raise ValueError(f"{meter}: `{name}` must be {what}, got {value!r}; e.g. {example}.")


class NoProgressMeter(AbstractProgressMeter):
    """No progress reporting: `init` gives `None`, `step` returns the state, `close` does
    nothing. In a loop, the same as `progress_meter=None`.

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import NoProgressMeter, while_loop
        >>> while_loop(lambda i: i < 3, lambda i: i + 1, jnp.int32(0),
        ...            progress_meter=NoProgressMeter())
        Array(3, dtype=int32)
    """

    fraction = None

    def init(self) -> None:
        return None

    def step(self, state: Any, progress: Any) -> Any:
        return state

    def close(self, state: Any) -> None:
        return None

    def __repr__(self) -> str:
        return "NoProgressMeter()"


def _text_open() -> list[float]:
    print("0.00%", flush=True)
    return [0.0]


def _text_show(shown: list[float], progress: float) -> None:
    # Under `vmap` the device reduced the batch already; this also keeps a value from
    # being printed twice.
    if progress > shown[0]:
        shown[0] = progress
        print(f"{100 * progress:.2f}%", flush=True)


def _text_finish(shown: list[float]) -> None:
    if shown[0] != 1.0:
        print("100.00%", flush=True)


class TextProgressMeter(AbstractProgressMeter):
    """Print the progress as a percentage: `0.00%` when it starts, a line each time the
    progress increased by more than `minimum_increase` (or reached 1), and `100.00%` when
    it is closed, unless already printed.

    Under `jax.vmap` it prints one line per report, with the furthest progress of the batch.

    Arguments:
        minimum_increase: the increase of the progress (a fraction in (0, 1]) needed for a
            new line.
        fraction: for `while_loop` only: `carry -> scalar in [0, 1]`, the progress; by
            default the number of steps taken over `max_steps` (which the loop then needs).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import TextProgressMeter, while_loop
        >>> meter = TextProgressMeter(minimum_increase=0.4)
        >>> out = while_loop(lambda i: i < 4, lambda i: i + 1, jnp.int32(0), max_steps=4,
        ...                  progress_meter=meter); jax.effects_barrier()
        0.00%
        50.00%
        100.00%
    """

    def __init__(
        self, minimum_increase: float = 0.02, *, fraction: Callable[[Any], Any] | None = None
    ):
        _check_positive(
            minimum_increase,
            "minimum_increase",
            "TextProgressMeter",
            float,
            "TextProgressMeter(minimum_increase=0.05)",
        )
        _check_fraction(fraction, "TextProgressMeter")
        self.minimum_increase = float(minimum_increase)
        self.fraction = fraction

    def __repr__(self) -> str:
        return f"TextProgressMeter(minimum_increase={self.minimum_increase})"

    def init(self) -> tuple[Any, Any]:
        """`(progress last shown, display key)`: prints `0.00%`."""
        return jnp.float32(0.0), _displays.open(_text_open)

    def step(self, state: tuple[Any, Any], progress: Any) -> tuple[Any, Any]:
        last, key = _progress_value(state[0]), _batch_max(state[1])
        progress = _progress_value(progress)
        due = (progress > last) & ((progress - last > self.minimum_increase) | (progress >= 1))

        def show(progress: Any, key: Any) -> tuple[Any, Any]:
            return progress, _displays.update(_text_show, key, progress)

        return lax.cond(due, show, lambda _, key: (last, key), progress, key)

    def close(self, state: tuple[Any, Any]) -> None:
        _displays.close(_text_finish, state[1])


def _tqdm_open() -> Any:
    import tqdm

    return tqdm.tqdm(total=100.0, unit="%", bar_format="{percentage:.2f}%|{bar}| {elapsed}")


def _tqdm_show(bar: Any, progress: float) -> None:
    bar.n = round(100 * progress, 2)
    bar.refresh()


def _tqdm_finish(bar: Any) -> None:
    bar.n = 100.0
    bar.refresh()
    bar.close()


class TqdmProgressMeter(AbstractProgressMeter):
    """Show the progress as a `tqdm` bar (on stderr), made by `init`, refreshed every
    `refresh_steps` steps, and brought to 100% and closed by `close`.

    Needs the `tqdm` package (`pip install tqdm`, or `pip install pytree-transforms[tqdm]`),
    imported when the meter is made.

    Arguments:
        refresh_steps: the number of steps between two refreshes of the bar.
        fraction: for `while_loop` only: `carry -> scalar in [0, 1]`, the progress; by
            default the number of steps taken over `max_steps` (which the loop then needs).

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import TqdmProgressMeter, while_loop
        >>> meter = TqdmProgressMeter(refresh_steps=100)
        >>> while_loop(lambda i: i < 1000, lambda i: i + 1, jnp.int32(0), max_steps=1000,
        ...            progress_meter=meter)  # doctest: +SKIP
        100.00%|██████████| 00:00
        Array(1000, dtype=int32)
    """

    def __init__(self, refresh_steps: int = 20, *, fraction: Callable[[Any], Any] | None = None):
        try:
            import tqdm  # noqa: F401
        except ImportError as error:
            raise ImportError(
                "TqdmProgressMeter needs the `tqdm` package, which is not installed. "
                "Install it (`pip install tqdm`, or `pip install pytree-transforms[tqdm]`), "
                "or use TextProgressMeter()."
            ) from error
        _check_positive(
            refresh_steps,
            "refresh_steps",
            "TqdmProgressMeter",
            int,
            "TqdmProgressMeter(refresh_steps=100)",
        )
        _check_fraction(fraction, "TqdmProgressMeter")
        self.refresh_steps = int(refresh_steps)
        self.fraction = fraction

    def __repr__(self) -> str:
        return f"TqdmProgressMeter(refresh_steps={self.refresh_steps})"

    def init(self) -> tuple[Any, Any]:
        """`(steps taken, display key)`: makes the bar."""
        return jnp.int32(0), _displays.open(_tqdm_open)

    def step(self, state: tuple[Any, Any], progress: Any) -> tuple[Any, Any]:
        # Under `vmap` the batch elements that finished stop counting: the most steps taken
        # is the batch's.
        steps, key = _batch_max(state[0]) + 1, _batch_max(state[1])
        progress = _progress_value(progress)
        key = lax.cond(
            steps % self.refresh_steps == 0,
            functools.partial(_displays.update, _tqdm_show),
            lambda key, _: key,
            key,
            progress,
        )
        return steps, key

    def close(self, state: tuple[Any, Any]) -> None:
        _displays.close(_tqdm_finish, state[1])


class LoopMonitor:
    """How a loop drives a meter: `start()` gives the meter's state, which the loop carries,
    `update(i, arrays, state)` after each step (`i` steps taken, `arrays` the carry's),
    `finish(state)` after the loop."""

    def __init__(
        self, meter: AbstractProgressMeter, rebuild: Callable[[list[Any]], Any], max_steps: Any
    ):
        self.meter = meter
        self.fraction_of = getattr(meter, "fraction", None)
        self.rebuild = rebuild
        self.max_steps = max_steps

    def fraction(self, i: Any, arrays: list[Any]) -> Any:
        if self.fraction_of is None:
            value = i / self.max_steps
        else:
            value = self.fraction_of(self.rebuild(arrays))
            shape = getattr(value, "shape", ())
            if shape != ():
                raise TypeError(
                    f"while_loop: the progress meter's `fraction` must return a scalar (the "
                    f"progress, from 0 to 1), but it returned an array of shape {shape}. "
                    "Reduce it, e.g. `lambda carry: carry.t / t_final`."
                )
        return jnp.clip(jnp.asarray(value, jnp.float32), 0.0, 1.0)

    def start(self) -> Any:
        return self.meter.init()

    def update(self, i: Any, arrays: list[Any], state: Any) -> Any:
        return self.meter.step(state, self.fraction(i, arrays))

    def finish(self, state: Any) -> None:
        self.meter.close(state)


def check_progress_meter(meter: Any, max_steps: int | None, caller: str) -> Any:
    """`meter` if a loop can drive it (None for none), else a clear error."""
    if meter is None or isinstance(meter, NoProgressMeter):
        return None
    if not isinstance(meter, AbstractProgressMeter):
        raise TypeError(
            f"{caller}: `progress_meter` must be an AbstractProgressMeter (TextProgressMeter, "
            f"TqdmProgressMeter, NoProgressMeter, or a subclass of your own) or None, but "
            f"got {type(meter).__name__} {meter!r:.60}. Pass e.g. "
            "`progress_meter=TextProgressMeter()`."
        )
    fraction = getattr(meter, "fraction", None)
    if fraction is not None and not callable(fraction):
        raise TypeError(
            f"{caller}: the progress meter's `fraction` must be a function `carry -> scalar "
            f"in [0, 1]` or None, but {type(meter).__name__}.fraction is "
            f"{type(fraction).__name__} {fraction!r:.60}."
        )
    if fraction is None and max_steps is None:
        raise ValueError(
            f"{caller}: `progress_meter` reports the steps taken over `max_steps`, but "
            "`max_steps` is None. Pass `max_steps=`, or give the meter a `fraction` of the "
            "carry, e.g. `TextProgressMeter(fraction=lambda carry: carry[0] / t_final)`."
        )
    return meter
