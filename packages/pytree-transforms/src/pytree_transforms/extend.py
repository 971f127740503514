"""The extension surface of pytree_transforms, for libraries that write transforms of their own.

`pytree_transforms`' top level is for users; this module is for library authors (pytree_graph
is one). Everything here is declared and tested: a patch release never changes it, a minor
release may add to it, and only a major release may change or remove a name (see the
"Versions" page of the docs).

- `BindsAsMethod`: the base class of transform wrappers, so that a transformed function
  stored as a class attribute binds like a method (`model.step(x)` passes `model`).
- `Signature` and `TraceHistory`: how a jit explains its retraces (see `explain_retraces`).
  A transform keeps one `TraceHistory` per function it wraps and, inside the function it
  hands to `jax.jit` (so at trace time only), describes the call as a `Signature` by
  argument path and runs the user's function inside `history.record(signature)`.
"""

from ._method import BindsAsMethod
from ._retraces import Signature, TraceHistory

__all__ = ["BindsAsMethod", "Signature", "TraceHistory"]
