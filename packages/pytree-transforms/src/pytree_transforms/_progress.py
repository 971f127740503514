"""Progress meters for long loops: `while_loop(..., progress_meter=...)` reports how far the
loop has got from inside the compiled loop.

Each step works out the progress on the device (`steps / max_steps`, or the meter's
`fraction` of the carry) and only when it increased enough since the last report (the
meter's threshold, decided with `lax.cond`) calls back to the host (`jax.debug.callback`),
so a step costs a comparison, not a host round trip. The host side keeps, per loop (per
place in the traced program), the last progress shown: under `vmap` every batch element
reports, and the meter shows the furthest any has got.
"""

import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._errors import check_callable

_next_key = itertools.count()
_lock = threading.Lock()


class _Monitor:
    """What a loop calls: `start()` gives the values it carries for reporting,
    `update(i, arrays, extra)` after each step, `finish(i, arrays)` after the loop."""

    def __init__(self, meter: "_Reporting", rebuild: Callable[[list[Any]], Any], max_steps: Any):
        self.meter = meter
        self.rebuild = rebuild
        self.max_steps = max_steps
        self.key = next(_next_key)

    def fraction(self, i: Any, arrays: list[Any]) -> Any:
        if self.meter.fraction is None:
            value = i / self.max_steps
        else:
            value = self.meter.fraction(self.rebuild(arrays))
            shape = getattr(value, "shape", ())
            if shape != ():
                raise TypeError(
                    f"while_loop: the progress meter's `fraction` must return a scalar (the "
                    f"progress, from 0 to 1), but it returned an array of shape {shape}. "
                    "Reduce it, e.g. `lambda carry: carry.t / t_final`."
                )
        return jnp.clip(jnp.asarray(value, jnp.float32), 0.0, 1.0)

    def start(self) -> Any:
        return jnp.float32(0.0), jnp.int32(0)

    def update(self, i: Any, arrays: list[Any], extra: Any) -> Any:
        last_fraction, last_step = extra
        fraction = self.fraction(i, arrays)
        report = self.meter.due(fraction, last_fraction, i, last_step)

        def call() -> None:
            show = functools.partial(self.meter.host_update, self.key)
            jax.debug.callback(show, fraction, i)

        lax.cond(report, call, lambda: None)
        return jnp.where(report, fraction, last_fraction), jnp.where(report, i, last_step)

    def finish(self, i: Any, arrays: list[Any]) -> None:
        fraction = self.fraction(i, arrays)
        jax.debug.callback(functools.partial(self.meter.host_finish, self.key), fraction)


class _Reporting:
    """The part of a meter that decides when to report and shows it."""

    fraction: Callable[[Any], Any] | None

    def due(self, fraction: Any, last_fraction: Any, step: Any, last_step: Any) -> Any:
        raise NotImplementedError

    def monitor(self, rebuild: Callable[[list[Any]], Any], max_steps: Any) -> _Monitor | None:
        return _Monitor(self, rebuild, max_steps)

    def host_update(self, key: int, fraction: Any, step: Any) -> None:
        raise NotImplementedError

    def host_finish(self, key: int, fraction: Any) -> None:
        raise NotImplementedError


def _check_fraction(fraction: Any, meter: str) -> None:
    if fraction is not None:
        check_callable(fraction, meter, "fraction", spelling=f"{meter}(fraction={{}})")


def _check_positive(value: Any, name: str, meter: str, kind: type, example: str) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
    if not ok or not value > 0 or (kind is float and not value <= 1):
        what = "a number in (0, 1]" if kind is float else "a positive int"
        raise ValueError(f"{meter}: `{name}` must be {what}, got {value!r}; e.g. {example}.")


class NoProgressMeter:
    """No progress reporting: the same as `progress_meter=None`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import NoProgressMeter, while_loop
        >>> while_loop(lambda i: i < 3, lambda i: i + 1, jnp.int32(0),
        ...            progress_meter=NoProgressMeter())
        Array(3, dtype=int32)
    """

    fraction = None

    def monitor(self, rebuild: Callable[[list[Any]], Any], max_steps: Any) -> None:
        return None

    def __repr__(self) -> str:
        return "NoProgressMeter()"


class TextProgressMeter(_Reporting):
    """Print the loop's progress as a percentage, a line each time it increased by
    `minimum_increase`, and once more at the end.

    Arguments:
        minimum_increase: the least increase of the progress (a fraction in (0, 1]) between
            two lines printed.
        fraction: `carry -> scalar in [0, 1]`, the progress; by default the number of steps
            taken over `max_steps` (which the loop then needs).

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import TextProgressMeter, while_loop
        >>> out = while_loop(lambda i: i < 4, lambda i: i + 1, jnp.int32(0), max_steps=4,
        ...                  progress_meter=TextProgressMeter(minimum_increase=0.5))
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
        self._shown: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"TextProgressMeter(minimum_increase={self.minimum_increase})"

    def due(self, fraction: Any, last_fraction: Any, step: Any, last_step: Any) -> Any:
        return fraction >= jnp.minimum(last_fraction + self.minimum_increase, 1.0)

    def _show(self, key: int, fraction: float) -> None:
        with _lock:
            shown = self._shown.get(key, 0.0)
            if fraction <= shown:
                return
            self._shown[key] = fraction
        print(f"{100 * fraction:.2f}%", flush=True)

    def host_update(self, key: int, fraction: Any, step: Any) -> None:
        self._show(key, float(np.asarray(fraction)))

    def host_finish(self, key: int, fraction: Any) -> None:
        # The end of the loop: its progress so far, if not shown yet; then a fresh start
        # for the next run.
        self._show(key, float(np.asarray(fraction)))
        with _lock:
            self._shown.pop(key, None)


class TqdmProgressMeter(_Reporting):
    """Show the loop's progress as a `tqdm` bar, refreshed every `refresh_steps` steps.

    Needs the `tqdm` package (`pip install tqdm`, or `pip install pytree-transforms[tqdm]`),
    imported when the meter is made.

    Arguments:
        refresh_steps: the number of steps between two refreshes of the bar.
        fraction: `carry -> scalar in [0, 1]`, the progress; by default the number of steps
            taken over `max_steps` (which the loop then needs).

    Example:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import TqdmProgressMeter, while_loop
        >>> meter = TqdmProgressMeter(refresh_steps=100)
        >>> while_loop(lambda i: i < 1000, lambda i: i + 1, jnp.int32(0), max_steps=1000,
        ...            progress_meter=meter)  # doctest: +SKIP
        100.00%|██████████| 100.0/100 [00:00<00:00, ...]
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
        self._bars: dict[int, Any] = {}

    def __repr__(self) -> str:
        return f"TqdmProgressMeter(refresh_steps={self.refresh_steps})"

    def due(self, fraction: Any, last_fraction: Any, step: Any, last_step: Any) -> Any:
        return (step - last_step >= self.refresh_steps) & (fraction > last_fraction)

    def _bar(self, key: int) -> Any:
        import tqdm

        with _lock:
            if key not in self._bars:
                self._bars[key] = tqdm.tqdm(
                    total=100.0, unit="%", bar_format="{percentage:.2f}%|{bar}| {elapsed}"
                )
            return self._bars[key]

    def host_update(self, key: int, fraction: Any, step: Any) -> None:
        bar = self._bar(key)
        value = 100.0 * float(np.asarray(fraction))
        if value > bar.n:
            bar.update(value - bar.n)

    def host_finish(self, key: int, fraction: Any) -> None:
        self.host_update(key, fraction, None)
        with _lock:
            bar = self._bars.pop(key, None)
        if bar is not None:
            bar.close()


def check_progress_meter(meter: Any, max_steps: int | None, caller: str) -> Any:
    """`meter` if it is a progress meter the loop can use, else a clear error."""
    if meter is None or isinstance(meter, NoProgressMeter):
        return None
    if not isinstance(meter, _Reporting):
        raise TypeError(
            f"{caller}: `progress_meter` must be a TextProgressMeter, TqdmProgressMeter, "
            f"NoProgressMeter or None, but got {type(meter).__name__} {meter!r:.60}. Pass "
            "e.g. `progress_meter=TextProgressMeter()`."
        )
    if meter.fraction is None and max_steps is None:
        raise ValueError(
            f"{caller}: `progress_meter` reports the steps taken over `max_steps`, but "
            "`max_steps` is None. Pass `max_steps=`, or give the meter a `fraction` of the "
            "carry, e.g. `TextProgressMeter(fraction=lambda carry: carry[0] / t_final)`."
        )
    return meter
