"""Variables and object graphs for JAX: split/merge with sharing, graph transforms.

This package will hold mutable, shareable `Variable`s, `split`/`merge`/`update` of object graphs
with sharing kept, and graph-aware transforms (`jit`, `grad`, `vmap`, `scan`, ...) that write
updates back. DESIGN.md describes the planned public API.
"""

from .__about__ import __version__ as __version__
