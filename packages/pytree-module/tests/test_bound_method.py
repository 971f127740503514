"""Bound methods are pytrees whose child is the instance."""

import inspect

import jax
import jax.numpy as jnp

from pytree_module import Module


class Affine(Module):
    def __init__(self):
        self.w = jnp.array(2.0)

    def apply(self, x, scale=1.0):
        """Apply the affine map."""
        return self.w * x * scale


def test_bound_method_is_a_pytree_with_the_instance_as_child():
    m = Affine()
    bound = m.apply
    assert jax.tree.leaves(bound) == [m.w]
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(bound)]
    assert paths == [".__self__.w"]
    rebuilt = jax.tree.map(lambda x: x + 1, bound)
    assert float(rebuilt(1.0)) == 3.0
    assert float(m.w) == 2.0


def test_bound_method_hash_and_equality_by_function_and_identity():
    a, b = Affine(), Affine()
    assert a.apply == a.apply and hash(a.apply) == hash(a.apply)
    assert a.apply != b.apply


def test_grad_through_a_bound_method():
    m = Affine()
    grads = jax.grad(lambda f: f(3.0))(m.apply)
    assert float(grads.__self__.w) == 3.0


def test_jax_jit_of_a_bound_method_closes_over_the_arrays():
    m = Affine()
    f = jax.jit(m.apply)
    assert float(f(1.0)) == 2.0
    m.w = jnp.array(10.0)
    # Already traced: the old value was baked in as a constant (documented behaviour).
    assert float(f(1.0)) == 2.0


def test_metadata_and_signature():
    m = Affine()
    assert m.apply.__name__ == "apply"
    assert m.apply.__doc__ is None or "affine" in Affine.apply.__doc__
    assert list(inspect.signature(m.apply).parameters) == ["x", "scale"]
    assert "Affine.apply" in repr(m.apply)
    assert Affine.apply(m, 1.0) == m.apply(1.0)


def test_callable_attribute_defaults_are_not_wrapped_as_methods():
    class WithActivation(Module):
        activation: object = jax.nn.relu

    assert WithActivation().activation is jax.nn.relu
