"""Predicates, filter/partition/combine and composable filter objects for JAX pytrees.

This package will hold predicates (`is_array`, `is_inexact_array`, ...), `filter`, `partition` and
`combine`, and small composable filter objects (`OfType`, `PathContains`, `Any`, `All`, `Not`,
...). DESIGN.md describes the planned public API.
"""

from .__about__ import __version__ as __version__
