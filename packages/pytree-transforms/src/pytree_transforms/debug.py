"""Tools for debugging transformed code: retrace guards and conditional breakpoints.

- `assert_max_traces`: raise when a function is traced more often than expected.
- `get_num_traces`: how often a function wrapped in `assert_max_traces` was traced.
- `breakpoint_if`: `jax.debug.breakpoint`, entered only where a predicate is true.
"""

from ._breakpoint import breakpoint_if
from ._traces import assert_max_traces, get_num_traces

__all__ = ["assert_max_traces", "breakpoint_if", "get_num_traces"]
