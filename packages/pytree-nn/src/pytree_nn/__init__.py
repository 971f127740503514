"""Neural-network layers, Rngs, Optimizer and checkpoints built on the pytree packages.

This package will hold neural-network layers (`Linear`, `Conv`, `MLP`, norms, attention, recurrent
cells, ...), `Rngs`, an optax-backed `Optimizer`, and safetensors checkpoints. DESIGN.md describes
the planned public API.
"""

from .__about__ import __version__ as __version__
