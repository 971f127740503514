"""Ahead-of-time compilation for `filter_jit`: `wrapper.lower(...)` and `.compile()`."""

from typing import TYPE_CHECKING, Any

from ._outputs import unpack_output

if TYPE_CHECKING:
    from ._jit_wrapper import JitWrapper, _Plan


class Lowered:
    """A `filter_jit` function lowered for one set of argument structures."""

    def __init__(self, wrapper: "JitWrapper", lowered: Any, plan: "_Plan", static: tuple):
        self._wrapper = wrapper
        self._lowered = lowered
        self._plan = plan
        self._static = static

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The lowered program as text (as `jax.stages.Lowered.as_text`)."""
        return self._lowered.as_text(*args, **kwargs)

    def compile(self) -> "Compiled":
        """Compile ahead of time."""
        return Compiled(self._wrapper, self._lowered.compile(), self._plan, self._static)


class Compiled:
    """A compiled `filter_jit` function: call it with arguments of the lowered structure."""

    def __init__(self, wrapper: "JitWrapper", compiled: Any, plan: "_Plan", static: tuple):
        self._wrapper = wrapper
        self._compiled = compiled
        self._plan = plan
        self._static = static

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _, _, plan, static, dynamic = self._wrapper._split(args, kwargs)
        if plan is not self._plan or static != self._static:
            raise ValueError(
                "This compiled function was lowered for arguments of another structure or "
                "with other static (non-array) values. Lower it again for these arguments."
            )
        return unpack_output(self._compiled(*dynamic))

    def as_text(self) -> str:
        """The compiled program as text."""
        return self._compiled.as_text()
