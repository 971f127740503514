"""`clear_caches`: forget every compilation this package and JAX keep."""

import jax

from ._jit import forget_wrappers
from ._noinline import forget_traces
from ._sharing import clear_interned
from ._wrapper_cache import clear_shared


def clear_caches() -> None:
    """Clear this package's caches and JAX's: every function is traced again on its next call.

    This package keeps the wrappers `filter_jit` made (so that wrapping a function again
    reuses its compilations), the compilations `filter_pmap` shares between wrappers, the
    layouts of inputs that share objects and the traces of `noinline` functions; JAX keeps
    its traces and executables. All of them are cleared, so memory held by compiled programs
    can be freed. Wrappers already made keep working: their next call traces and compiles
    again. (`if_array`'s functions are kept: they are a few small functions, and keeping
    them keeps `if_array(0)` one value.)

    Returns:
        None.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_transforms import clear_caches, filter_jit
        >>> traces = []
        >>> @filter_jit
        ... def double(x):
        ...     traces.append(1)
        ...     return 2 * x
        >>> _ = double(jnp.ones(2)); _ = double(jnp.ones(2))
        >>> len(traces)
        1
        >>> clear_caches()
        >>> _ = double(jnp.ones(2))
        >>> len(traces)
        2
    """
    forget_wrappers()
    forget_traces()
    clear_shared()
    clear_interned()
    jax.clear_caches()
