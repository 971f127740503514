"""Exceptions raised by pytree_module."""


class TraceContextError(ValueError):
    """A Module was mutated from inside a JAX trace other than the one it was created in.

    Mutating an object that lives outside a `jax.jit`/`jax.grad`/`jax.vmap`/... trace from
    inside that trace would store tracers in it, which then leak out of the transform. Pass
    the object into the transformed function as an argument (so the transform owns a copy),
    or return the new values from the function and assign them outside.
    """
