"""Ahead-of-time compilation for `filter_jit`: `wrapper.lower(...)` and `.compile()`.

The stages know nothing of the wrapper: they get its `split` function, which turns a call's
arguments into its plan and the arguments of the plan's `jax.jit`.
"""

from collections.abc import Callable
from typing import Any

from ._jit_plan import Plan
from ._outputs import unpack_output

# `split(args, kwargs)` gives a call's plan and the arguments of its `jax.jit`: the static
# argument first, unless the plan is `fixed`.
Split = Callable[[tuple[Any, ...], dict[str, Any]], tuple[Plan, tuple[Any, ...]]]


class Lowered:
    """A `filter_jit` function lowered for one set of argument structures and static values.

    The `jax.stages.Lowered` it wraps is `.lowered`.
    """

    def __init__(self, lowered: Any, split: Split, plan: Plan, static_arg: Any):
        self.lowered = lowered
        self._split = split
        self._plan = plan
        self._static_arg = static_arg

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
        return Compiled(compiled, self._split, self._plan, self._static_arg)


class Compiled:
    """A compiled `filter_jit` function: call it with arguments of the lowered structure.

    The `jax.stages.Compiled` it wraps is `.compiled`.
    """

    def __init__(self, compiled: Any, split: Split, plan: Plan, static_arg: Any):
        self.compiled = compiled
        self._split = split
        self._plan = plan
        self._static_arg = static_arg

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plan, arguments = self._split(args, kwargs)
        if plan is not self._plan or (not plan.fixed and arguments[0] != self._static_arg):
            raise ValueError(
                "This compiled function was lowered for arguments of another structure or "
                "with other static (non-array) values. Lower it again for these arguments."
            )
        # A plan with fixed statics takes no static argument (see `Plan.fixed`).
        return unpack_output(self.compiled(*(arguments if plan.fixed else arguments[1:])))

    def as_text(self) -> str:
        """The compiled program as text."""
        return self.compiled.as_text()

    def cost_analysis(self) -> Any:
        """The compiled program's cost estimate (as `jax.stages.Compiled.cost_analysis`)."""
        return self.compiled.cost_analysis()

    def memory_analysis(self) -> Any:
        """The compiled program's memory use (as `jax.stages.Compiled.memory_analysis`)."""
        return self.compiled.memory_analysis()
