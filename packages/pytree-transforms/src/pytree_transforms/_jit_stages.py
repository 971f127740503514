"""Ahead-of-time compilation for `filter_jit` and `filter_pmap`: `wrapper.lower(...)` and
`.compile()`.

The stages know nothing of the wrapper: they get its `split` function, which turns a call's
arguments into what the compiled program was made for (its key) and the program's
arguments, and an `unpack` function, which turns the program's output into the function's.
"""

from collections.abc import Callable
from typing import Any

from ._outputs import unpack_output

# `split(args, kwargs)` gives a call's key, equal for calls the program was compiled for
# (the structure and static values), and the arguments of the compiled program (the
# traced leaves, without the static argument).
Split = Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, tuple[Any, ...]]]


class Lowered:
    """A `filter_jit` or `filter_pmap` function lowered for one set of argument structures
    and static values.

    The `jax.stages.Lowered` it wraps is `.lowered`.
    """

    def __init__(
        self,
        lowered: Any,
        split: Split,
        key: Any,
        unpack: Callable[[Any], Any] = unpack_output,
    ):
        self.lowered = lowered
        self._split = split
        self._key = key
        self._unpack = unpack

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The lowered program as text (as `jax.stages.Lowered.as_text`)."""
        return self.lowered.as_text(*args, **kwargs)

    def compiler_ir(self, *args: Any, **kwargs: Any) -> Any:
        """The lowered program as a compiler IR object (as `jax.stages.Lowered.compiler_ir`)."""
        return self.lowered.compiler_ir(*args, **kwargs)

    def cost_analysis(self) -> Any:
        """The estimated cost of the lowered program (as `jax.stages.Lowered.cost_analysis`)."""
        return self.lowered.cost_analysis()

    def compile(self, compiler_options: dict[str, Any] | None = None) -> "Compiled":
        """Compile ahead of time.

        Arguments:
            compiler_options: XLA options for this compilation, as for
                `jax.stages.Lowered.compile`.

        Returns:
            A `Compiled`: call it with arguments of the lowered structure and static values.
        """
        compiled = self.lowered.compile(compiler_options=compiler_options)
        return Compiled(compiled, self._split, self._key, self._unpack)


class Compiled:
    """A compiled `filter_jit` or `filter_pmap` function: call it with arguments of the
    lowered structure.

    The `jax.stages.Compiled` it wraps is `.compiled`.
    """

    def __init__(self, compiled: Any, split: Split, key: Any, unpack: Callable[[Any], Any]):
        self.compiled = compiled
        self._split = split
        self._key = key
        self._unpack = unpack

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, arguments = self._split(args, kwargs)
        if key != self._key:
            raise ValueError(
                "This compiled function was lowered for arguments of another structure or "
                "with other static (non-array) values. Lower it again for these arguments."
            )
        return self._unpack(self.compiled(*arguments))

    def as_text(self) -> str:
        """The compiled program as text."""
        return self.compiled.as_text()

    def cost_analysis(self) -> Any:
        """The compiled program's cost estimate (as `jax.stages.Compiled.cost_analysis`)."""
        return self.compiled.cost_analysis()

    def memory_analysis(self) -> Any:
        """The compiled program's memory use (as `jax.stages.Compiled.memory_analysis`)."""
        return self.compiled.memory_analysis()
