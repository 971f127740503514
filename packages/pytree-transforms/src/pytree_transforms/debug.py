"""Tools for debugging transformed code: retrace guards, breakpoints, dead code and NaNs.

- `assert_max_traces`: raise when a function is traced more often than expected.
- `get_num_traces`: how often a function wrapped in `assert_max_traces` was traced.
- `breakpoint_if`: `jax.debug.breakpoint`, entered only where a predicate is true.
- `store_dce`, `inspect_dce`: which arrays the compiler removed as dead code.
- `backward_nan`: print primals and cotangents on the backward pass, and stop at a NaN.
"""

from ._backward_nan import backward_nan
from ._breakpoint import breakpoint_if
from ._dce import inspect_dce, store_dce
from ._traces import assert_max_traces, get_num_traces

__all__ = [
    "assert_max_traces",
    "backward_nan",
    "breakpoint_if",
    "get_num_traces",
    "inspect_dce",
    "store_dce",
]
