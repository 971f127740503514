"""filter_custom_vjp's `def_fwd`/`def_bwd`, dict `in_axes` for filter_vmap and filter_pmap,
and filter_pmap's `donate=` and `.lower`, side by side with Equinox's."""

import warnings

import jax
import jax.numpy as jnp
import pytest

eqx = pytest.importorskip("equinox")

import pytree_transforms as pt  # noqa: E402

LIBS = pytest.mark.parametrize("lib", [pt, eqx], ids=["ours", "equinox"])
N = jax.local_device_count()


def _weighted(lib, seen):
    """A custom VJP whose rules record what they are given."""

    @lib.filter_custom_vjp
    def weighted(vjp_arg, scale):
        a, b, _, k = vjp_arg
        return {"y": a * scale, "z": b * 2, "k": k, "label": "weighted"}

    def weighted_fwd(perturbed, vjp_arg, scale):
        seen["perturbed"] = perturbed
        return weighted(vjp_arg, scale), ("saved", vjp_arg[0])

    def weighted_bwd(residuals, grad_obj, perturbed, vjp_arg, scale):
        seen["grad_obj"] = grad_obj
        seen["residuals"] = residuals[0]
        grad_a = grad_obj["y"] * scale if perturbed[0] else None
        grad_b = 2 * grad_obj["z"] if perturbed[1] and grad_obj["z"] is not None else None
        return grad_a, grad_b, None, None

    # Equinox's `def_fwd`/`def_bwd` return None: called, not used as decorators.
    weighted.def_fwd(weighted_fwd)
    weighted.def_bwd(weighted_bwd)
    return weighted


@LIBS
def test_custom_vjp_perturbed_and_symbolic_zeros(lib):
    seen = {}
    weighted = _weighted(lib, seen)

    def loss(a, b):
        return jnp.sum(weighted((a, b, 3, jnp.array(1)), 5.0)["y"])

    assert jax.grad(loss)(jnp.ones(2), jnp.ones(2)).tolist() == [5.0, 5.0]
    assert seen["perturbed"] == (True, False, False, False)
    assert seen["residuals"] == "saved"
    grad_obj = seen["grad_obj"]
    assert grad_obj["z"] is None and grad_obj["k"] is None and grad_obj["label"] is None
    grads = jax.grad(loss, argnums=(0, 1))(jnp.ones(2), jnp.ones(2))
    assert seen["perturbed"] == (True, True, False, False)
    assert grads[1].tolist() == [0.0, 0.0]


# Equinox raises a RuntimeError when the tangent reaches the other argument; ours is a
# ValueError at the forward pass that names the argument. Neither drops its part.
_REFUSED = {pt: ValueError, eqx: RuntimeError}


@LIBS
def test_custom_vjp_refuses_a_differentiated_second_argument(lib):
    @lib.filter_custom_vjp
    def product(x, y):
        return x * y

    def product_fwd(perturbed, x, y):
        return x * y, None

    def product_bwd(residuals, grad_obj, perturbed, x, y):
        return grad_obj * y

    product.def_fwd(product_fwd)
    product.def_bwd(product_bwd)
    with pytest.raises(_REFUSED[lib]):
        jax.grad(lambda x: product(x, x))(1.0)
    # A constant second argument is fine in both.
    assert jax.grad(lambda x: product(x, jnp.array(3.0)))(1.0) == 3.0


@LIBS
def test_custom_vjp_defvjp_gets_zero_arrays(lib):
    seen = []

    @lib.filter_custom_vjp
    def pair(x):
        return x * 2, x * 3

    def pair_bwd(residuals, grad_obj, x):
        seen.append(grad_obj)
        return grad_obj[0] * 2 + grad_obj[1] * 3

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Equinox's defvjp warns that it is deprecated
        pair.defvjp(lambda x: (pair(x), None), pair_bwd)
    assert jax.grad(lambda x: pair(x)[0])(jnp.array(1.0)) == 2.0
    assert seen[0][1] is not None and float(seen[0][1]) == 0.0


@LIBS
def test_custom_vjp_called_before_its_rule(lib):
    @lib.filter_custom_vjp
    def identity(x):
        return x

    identity.def_fwd(lambda perturbed, x: (x, None))
    with pytest.raises((TypeError, RuntimeError), match="identity"):
        identity(1.0)


@LIBS
def test_vmap_in_axes_by_name(lib):
    @lib.filter_vmap(in_axes=dict(x=1, scale=None))
    def f(x, y, scale):
        return x * scale + y

    x, y = jnp.array([[1.0, 2.0]]), jnp.array([10.0, 20.0])
    assert f(x, y, jnp.array(2.0)).tolist() == [[12.0], [24.0]]
    # Non-arrays get the default `if_array(0)`: not mapped.
    assert f(x, y, 2.0).tolist() == [[12.0], [24.0]]
    with pytest.raises(ValueError, match="z"):
        lib.filter_vmap(lambda x, y: x, in_axes=dict(z=0))(x, y)


@LIBS
def test_pmap_in_axes_by_name_donation_and_lowering(lib):
    f = lib.filter_pmap(lambda x, y: x * y, in_axes=dict(y=None))
    assert f(jnp.ones((N, 2)), jnp.array([2.0, 3.0])).tolist() == [[2.0, 3.0]] * N

    step = lib.filter_pmap(lambda x, n: (x + n, "stepped"), donate="all")
    state = lib.filter_pmap(lambda x: x)(jnp.ones((N, 2)))
    new_state, label = step(state, 1)
    assert label == "stepped" and new_state.tolist() == [[2.0, 2.0]] * N
    assert state.is_deleted()
    compiled = step.lower(new_state, 1).compile()
    out, label = compiled(new_state, 1)
    assert label == "stepped" and out.tolist() == [[3.0, 3.0]] * N
    assert new_state.is_deleted()
