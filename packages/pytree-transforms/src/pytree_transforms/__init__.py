"""Filtered JAX transforms (filter_jit, filter_grad, ...) that accept any pytree.

This package will hold filtered transforms: `filter_jit`, `filter_grad`, `filter_value_and_grad`,
`filter_vmap`, `filter_custom_vjp` and the rest of the family, which accept any pytree and trace
only its arrays. DESIGN.md describes the planned public API.
"""

from .__about__ import __version__ as __version__
