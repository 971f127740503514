"""Every `filter_*` wrapper compares (and hashes) equal when made around equal functions with
equal options, so `filter_jit` of one made again finds the compilations of the first."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module
from pytree_transforms import (
    filter_checkpoint,
    filter_custom_jvp,
    filter_custom_vjp,
    filter_grad,
    filter_hessian,
    filter_jacfwd,
    filter_jacrev,
    filter_jit,
    filter_pmap,
    filter_value_and_grad,
    filter_vmap,
)


def _loss(x):
    return jnp.sum(x**2)


def _other(x):
    return jnp.sum(x**3)


# (transform, equal options, other options): made twice with the first options, the
# wrappers compare equal; with the second, they do not.
WRAPPERS = {
    "filter_vmap": (filter_vmap, {}, {"in_axes": 1}),
    "filter_pmap": (filter_pmap, {}, {"axis_name": "i"}),
    "filter_grad": (filter_grad, {}, {"has_aux": True}),
    "filter_value_and_grad": (filter_value_and_grad, {}, {"has_aux": True}),
    "filter_jacfwd": (filter_jacfwd, {}, {"has_aux": True}),
    "filter_jacrev": (filter_jacrev, {}, {"has_aux": True}),
    "filter_hessian": (filter_hessian, {}, {"has_aux": True}),
    "filter_checkpoint": (filter_checkpoint, {}, {"prevent_cse": False}),
    "filter_jit": (filter_jit, {}, {"donate": "all"}),
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrappers_of_equal_functions_and_options_compare_equal(name):
    transform, options, other = WRAPPERS[name]
    a, b = transform(_loss, **options), transform(_loss, **options)
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1
    assert a != transform(_other, **options)
    assert a != transform(_loss, **other)


def test_keyword_options_are_compared_by_type_and_in_any_order():
    assert filter_vmap(_loss, in_axes=0, axis_name="i") == filter_vmap(
        _loss, axis_name="i", in_axes=0
    )
    # `1` and `True` are different options (`static_key`), though `1 == True`.
    assert filter_grad(_loss, has_aux=False) != filter_grad(_loss, arg=1)
    assert filter_checkpoint(_loss, prevent_cse=True) != filter_checkpoint(_loss, prevent_cse=1)


def test_different_transforms_never_compare_equal():
    assert filter_grad(_loss) != filter_value_and_grad(_loss)
    assert filter_jacfwd(_loss) != filter_jacrev(_loss)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: filter_vmap(f),
        lambda f: filter_grad(f),
        lambda f: filter_value_and_grad(f),
        lambda f: filter_jacfwd(f),
        lambda f: filter_jacrev(f),
        lambda f: filter_hessian(f),
        lambda f: filter_checkpoint(f),
    ],
    ids=["vmap", "grad", "value_and_grad", "jacfwd", "jacrev", "hessian", "checkpoint"],
)
def test_jit_of_a_wrapper_built_again_traces_once(transform, counting):
    fun, traces = counting(_loss)
    for _ in range(3):
        filter_jit(transform(fun))(jnp.ones(3))
    assert len(traces) == 1


def test_jit_of_a_vmapped_module_built_again_for_a_new_instance_traces_once():
    traces = []

    class Scale(Module):
        def __init__(self, w):
            self.w = w

        def __call__(self, x):
            traces.append(1)
            return self.w * x

    for w in (1.0, 2.0, 3.0):
        out = filter_jit(filter_vmap(Scale(jnp.asarray(w))))(jnp.ones(2))
        assert out.tolist() == [w, w]  # the new instance's arrays, not the first's
    assert len(traces) == 1


def test_a_wrapper_of_a_module_compares_by_the_modules_identity():
    class Scale(Module):
        def __init__(self):
            self.w = jnp.ones(2)

        def __call__(self, x):
            return jnp.sum(self.w * x)

    model = Scale()
    assert filter_vmap(model) == filter_vmap(model)
    assert filter_grad(model.__call__) == filter_grad(model.__call__)
    assert filter_vmap(model) != filter_vmap(Scale())


def test_unhashable_options_give_a_wrapper_equal_only_to_itself():
    class Spec:  # an axis function that defines `==` but no hash
        def __call__(self, leaf):
            return 0

        def __eq__(self, other):
            return type(other) is Spec

        __hash__ = None

    a = filter_vmap(_loss, default=Spec())
    assert a == a and hash(a) == hash(a)
    assert a != filter_vmap(_loss, default=Spec())
    # Still usable under filter_jit, rebuilt copies included.
    assert filter_jit(a)(jnp.ones((2, 3))).shape == (2,)
    assert jax.tree.unflatten(*reversed(jax.tree.flatten(a))) == a


def test_custom_jvp_wrappers_compare_by_function_and_rule():
    def rule(primals, tangents):
        (x,), (t,) = primals, tangents
        return _loss(x), jnp.sum(2 * x * t)

    a, b = filter_custom_jvp(_loss), filter_custom_jvp(_loss)
    assert a == b and hash(a) == hash(b)
    before = hash(a)
    a.defjvp(rule)
    assert hash(a) == before  # setting the rule does not move it in a dict
    assert a != b
    b.defjvp(rule)
    assert a == b
    assert a != filter_custom_jvp(_other)


def test_custom_vjp_wrappers_compare_by_function_and_rule():
    def fwd(x):
        return _loss(x), x

    def bwd(residuals, grad_obj, x):
        return 2 * residuals * grad_obj

    a, b = filter_custom_vjp(_loss), filter_custom_vjp(_loss)
    assert a == b and hash(a) == hash(b)
    a.defvjp(fwd, bwd)
    assert a != b
    b.defvjp(fwd, bwd)  # `defvjp` makes adapters of its own: the rules given compare
    assert a == b and hash(a) == hash(b)
    c = filter_custom_vjp(_loss)
    c.def_fwd(lambda perturbed, x: fwd(x))
    assert c != a
