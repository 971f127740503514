"""filter_custom_vjp: custom backward passes over Modules, under grad, jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module
from pytree_transforms import (
    filter_closure_convert,
    filter_custom_vjp,
    filter_grad,
    filter_jit,
    filter_vmap,
)


class Linear(Module):
    weight: jax.Array
    bias: jax.Array
    steps: jax.Array  # an integer array: never differentiated
    name: str

    def __call__(self, x):
        return self.weight @ x + self.bias


def make_linear():
    weight = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    return Linear(weight, jnp.array([0.5, -0.5]), jnp.array(7), "linear")


# A layer whose backward pass clips every parameter gradient to [-bound, bound].
@filter_custom_vjp
def clipped_apply(model, x, *, bound):
    return {"y": model(x), "layer": model.name, "argmax": jnp.argmax(x)}


def clipped_apply_fwd(model, x, *, bound):
    return clipped_apply(model, x, bound=bound), {"x": x, "note": "saved"}


def clipped_apply_bwd(residuals, grad_obj, model, x, *, bound):
    assert residuals["note"] == "saved"
    assert grad_obj["layer"] is None and grad_obj["argmax"] is None
    g = grad_obj["y"]
    grads = Linear(jnp.outer(g, residuals["x"]), g, None, None)
    clip = lambda t: jnp.clip(t, -bound, bound)  # noqa: E731
    return Linear(clip(grads.weight), clip(grads.bias), None, None)


clipped_apply.defvjp(clipped_apply_fwd, clipped_apply_bwd)


def loss(model, x, bound):
    return 10.0 * jnp.sum(clipped_apply(model, x, bound=bound)["y"])


def test_clipped_gradients_of_a_module():
    model, x = make_linear(), jnp.array([1.0, 0.1])
    out = clipped_apply(model, x, bound=0.5)
    assert out["layer"] == "linear"
    assert out["y"].tolist() == pytest.approx([1.7, 2.9])
    grads = filter_grad(loss)(model, x, 0.5)
    assert isinstance(grads, Linear)
    np.testing.assert_allclose(grads.weight, [[0.5, 0.5], [0.5, 0.5]], rtol=1e-6)
    assert grads.bias.tolist() == [0.5, 0.5]
    assert grads.steps is None and grads.name is None


def test_under_jit_and_jax_grad():
    model, x = make_linear(), jnp.array([1.0, 0.1])
    grads = filter_jit(filter_grad(loss))(model, x, 0.5)
    np.testing.assert_allclose(grads.weight, [[0.5, 0.5], [0.5, 0.5]], rtol=1e-6)
    dweight = jax.jit(jax.grad(lambda w: loss(Linear(w, model.bias, model.steps, "l"), x, 0.5)))
    np.testing.assert_allclose(dweight(model.weight), [[0.5, 0.5], [0.5, 0.5]], rtol=1e-6)


def test_under_vmap():
    model = make_linear()
    xs = jnp.array([[1.0, 0.1], [0.01, 0.02]])
    per_example = filter_vmap(filter_grad(loss), in_axes=(None, 0, None))(model, xs, 0.5)
    assert per_example.weight.shape == (2, 2, 2)
    # 10 * outer(1, x) clipped to 0.5, example by example.
    np.testing.assert_allclose(per_example.weight[1], [[0.1, 0.2], [0.1, 0.2]], rtol=1e-6)
    batched = jax.vmap(lambda x: clipped_apply(model, x, bound=0.5)["y"])(xs)
    assert batched.shape == (2, 2)
    summed = filter_grad(lambda m: jnp.sum(jax.vmap(lambda x: loss(m, x, 0.5))(xs)))(model)
    assert summed.bias.tolist() == pytest.approx([1.0, 1.0])


# The identity, with the gradient scaled on the way back (as in gradient reversal).
@filter_custom_vjp
def scale_gradient(x, scale):
    return x


scale_gradient.defvjp(
    lambda x, scale: (x, None),
    lambda residuals, grad_obj, x, scale: jax.tree.map(lambda g: scale * g, grad_obj),
)


def test_scaled_identity_with_array_arguments():
    x = {"a": jnp.array(2.0), "n": 3, "k": jnp.array(1)}
    assert scale_gradient(x, jnp.array(-0.5)) == x

    def f(a, scale):
        y = scale_gradient({"a": a, "n": 3, "k": jnp.array(1)}, scale)
        return y["a"] ** 2 * y["n"]

    assert jax.grad(f)(jnp.array(2.0), jnp.array(-0.5)) == pytest.approx(-6.0)
    # Arguments other than vjp_arg get no gradient: differentiating through one is refused
    # (its part of the derivative would be silently zero), naming it.
    with pytest.raises(ValueError, match=r"with respect to `scale`, which is not in its first"):
        jax.grad(f, argnums=(0, 1))(jnp.array(2.0), jnp.array(-0.5))
    per_scale = jax.vmap(jax.grad(f), in_axes=(None, 0))(jnp.array(2.0), jnp.array([1.0, -1.0]))
    assert per_scale.tolist() == [12.0, -12.0]
    assert jax.jit(jax.grad(f))(jnp.array(2.0), jnp.array(2.0)) == pytest.approx(24.0)


def test_python_number_inputs_to_jax_grad():
    # Eagerly, JAX hands the rules the values of Python-number inputs as typed Python
    # scalars; the rules still see arrays, and their outputs are still differentiated.
    seen = []

    @filter_custom_vjp
    def identity(x):
        return x

    def identity_fwd(x):
        seen.append(x)
        return x, None

    identity.defvjp(identity_fwd, lambda residuals, grad_obj, x: grad_obj)
    assert jax.grad(lambda x: identity((x, x))[0])(1.0) == 1.0
    assert all(isinstance(x, jax.Array) for x in seen[0])


def test_none_gradient_means_zero():
    @filter_custom_vjp
    def blocked(pair):
        return pair[0] + pair[1]

    blocked.defvjp(lambda pair: (blocked(pair), None), lambda r, g, pair: (g, None))
    grads = jax.grad(blocked)((jnp.array(1.0), jnp.array(2.0)))
    assert grads[0] == 1.0 and grads[1] == 0.0


def test_gradients_of_closed_over_values():
    @filter_custom_vjp
    def apply(fn, x):
        return fn(x)

    def apply_fwd(fn, x):
        return fn(x), None

    def apply_bwd(residuals, grad_obj, fn, x):
        _, vjp = jax.vjp(lambda fn: fn(x), fn)
        (grads,) = vjp(grad_obj)
        return grads

    apply.defvjp(apply_fwd, apply_bwd)

    def outer(y):
        fn = filter_closure_convert(lambda x: jnp.sin(x * y), jnp.array(0.0))
        return apply(fn, jnp.array(2.0))

    assert jax.grad(outer)(0.5) == pytest.approx(2 * float(jnp.cos(1.0)))


def test_as_a_method():
    class Scaler(Module):
        factor: jax.Array

        @filter_custom_vjp
        def __call__(self, x):
            return self.factor * x

    Scaler.__call__.defvjp(lambda m, x: (m(x), x), lambda x, g, m, _: Scaler(jnp.sum(g * x)))
    grads = filter_grad(lambda m: m(jnp.array(3.0)))(Scaler(jnp.array(2.0)))
    assert grads.factor == pytest.approx(3.0)


def test_errors():
    @filter_custom_vjp
    def identity(x):
        return x

    with pytest.raises(TypeError, match="no VJP rule yet"):
        identity(jnp.ones(2))
    with pytest.raises(TypeError, match="`fn_bwd` to be a function"):
        identity.defvjp(lambda x: (x, None), None)
    with pytest.raises(TypeError, match="expects a function"):
        filter_custom_vjp("identity")

    identity.defvjp(lambda x: x, lambda r, g, x: g)
    with pytest.raises(TypeError, match=r"must return a pair `\(out, residuals\)`"):
        jax.grad(lambda x: identity(x))(1.0)

    identity.defvjp(lambda x: (x, None), lambda r, g, x: g[0])
    with pytest.raises(ValueError, match="must return the cotangent of `vjp_arg`"):
        jax.grad(lambda x: jnp.sum(identity((x, x))[0]))(1.0)

    identity.defvjp(lambda x: (x, None), lambda r, g, x: {"w": g["w"][:1], "n": None})
    with pytest.raises(ValueError, match=r"at \['w'\] of `vjp_arg`, where an array of shape"):
        jax.grad(lambda w: jnp.sum(identity({"w": w, "n": 1})["w"]))(jnp.ones(2))


# The current form: `def_fwd`/`def_bwd`, whose rules take `perturbed`.
@filter_custom_vjp
def weighted(vjp_arg, scale):
    a, b, _, k = vjp_arg
    return {"y": a * scale, "z": b * 2, "k": k, "label": "weighted"}


SEEN = {}


@weighted.def_fwd
def weighted_fwd(perturbed, vjp_arg, scale):
    SEEN["perturbed"] = perturbed
    return weighted(vjp_arg, scale), {"a": vjp_arg[0], "note": "saved"}


@weighted.def_bwd
def weighted_bwd(residuals, grad_obj, perturbed, vjp_arg, scale):
    SEEN["grad_obj"] = grad_obj
    assert residuals["note"] == "saved" and perturbed == SEEN["perturbed"]
    grad_a = grad_obj["y"] * scale if perturbed[0] and grad_obj["y"] is not None else None
    grad_b = 2 * grad_obj["z"] if perturbed[1] and grad_obj["z"] is not None else None
    return grad_a, grad_b, None, None


def weighted_loss(a, b, outputs=("y",)):
    out = weighted((a, b, 3, jnp.array(1)), 5.0)
    return sum(jnp.sum(out[name]) for name in outputs)


def test_def_fwd_and_def_bwd_are_decorators_returning_the_rule():
    assert callable(weighted_fwd) and weighted_fwd.__name__ == "weighted_fwd"
    assert weighted_bwd.__name__ == "weighted_bwd"
    out = weighted((jnp.ones(2), jnp.ones(2), 3, jnp.array(1)), 5.0)
    assert out["label"] == "weighted" and out["y"].tolist() == [5.0, 5.0]


def test_perturbed_marks_the_differentiated_arrays_only():
    grad_a = jax.grad(weighted_loss)(jnp.ones(2), jnp.ones(2))
    # `b` is a floating-point array that is not differentiated; 3 and the integer array
    # are never differentiable.
    assert SEEN["perturbed"] == (True, False, False, False)
    assert grad_a.tolist() == [5.0, 5.0]
    grads = jax.grad(weighted_loss, argnums=(0, 1))(jnp.ones(2), jnp.ones(2))
    assert SEEN["perturbed"] == (True, True, False, False)
    # `z` does not reach the loss: its cotangent is None, so `b` gets zero.
    assert SEEN["grad_obj"]["z"] is None and SEEN["grad_obj"]["k"] is None
    assert grads[1].tolist() == [0.0, 0.0]
    grads = jax.grad(weighted_loss, argnums=(0, 1))(jnp.ones(2), jnp.ones(2), ("y", "z"))
    assert grads[1].tolist() == [2.0, 2.0]
    assert jax.jit(jax.grad(weighted_loss))(jnp.ones(2), jnp.ones(2)).tolist() == [5.0, 5.0]


def test_defvjp_gets_zero_arrays_where_def_bwd_gets_none():
    seen = []

    @filter_custom_vjp
    def pair(x):
        return x * 2, x * 3

    pair.defvjp(lambda x: (pair(x), None), lambda r, g, x: seen.append(g) or g[0] * 2 + g[1] * 3)
    assert jax.grad(lambda x: pair(x)[0])(1.0) == 2.0
    assert seen[0][1].shape == () and seen[0][1] == 0.0  # an array of zeros, as before


def test_mixing_the_two_forms_and_missing_halves_are_refused():
    @filter_custom_vjp
    def identity(x):
        return x

    with pytest.raises(TypeError, match=r"called before both passes are set\. Set "):
        identity(1.0)
    identity.def_fwd(lambda perturbed, x: (x, None))
    with pytest.raises(TypeError, match=r"Set `identity\.def_bwd\(identity_bwd\)` first"):
        identity(1.0)
    with pytest.raises(TypeError, match=r"identity\.defvjp: identity already has a rule set"):
        identity.defvjp(lambda x: (x, None), lambda r, g, x: g)
    with pytest.raises(TypeError, match=r"expects the backward pass as `fn_bwd`"):
        identity.def_bwd("identity_bwd")
    with pytest.raises(TypeError, match=r"`fn\.def_fwd\(f\)`, not `fn\.def_fwd\(f\(x\)\)`"):
        identity.def_fwd(None)
    identity.def_bwd(lambda r, g, perturbed, x: g)
    assert jax.grad(identity)(1.0) == 1.0

    @filter_custom_vjp
    def other(x):
        return x

    other.defvjp(lambda x: (x, None), lambda r, g, x: g)
    with pytest.raises(TypeError, match=r"other\.def_fwd: other already has a rule set with"):
        other.def_fwd(lambda perturbed, x: (x, None))
    with pytest.raises(TypeError, match=r"other\.def_bwd: .* `defvjp`"):
        other.def_bwd(lambda r, g, perturbed, x: g)
    assert jax.grad(other)(2.0) == 1.0


def test_differentiating_through_another_argument_is_refused_not_dropped():
    @filter_custom_vjp
    def product(x, y, *, scale=1.0):
        return x * y * scale

    @product.def_fwd
    def product_fwd(perturbed, x, y, *, scale=1.0):
        return x * y * scale, None

    @product.def_bwd
    def product_bwd(residuals, grad_obj, perturbed, x, y, *, scale=1.0):
        return grad_obj * y * scale

    # The second argument is the same value as the first: its part would be lost (1.0
    # instead of 2.0), so the call is refused, naming the argument and the fix.
    with pytest.raises(ValueError, match=r"`y`.*Move `y` into the first argument") as info:
        jax.grad(lambda x: product(x, x))(1.0)
    assert "stop_gradient" in str(info.value)
    with pytest.raises(ValueError, match=r"`y\['w'\]`"):
        jax.grad(lambda x: product(2.0, {"w": x})["w"])(1.0)
    with pytest.raises(ValueError, match=r"`scale`"):
        jax.grad(lambda s: product(2.0, 3.0, scale=s))(1.0)
    # Constants and stopped gradients in the other arguments are fine.
    assert jax.grad(lambda x: product(x, 3.0))(1.0) == 3.0
    assert jax.grad(lambda x: product(x, jax.lax.stop_gradient(x)))(2.0) == 2.0
    # Packed into the first argument, both parts count.
    pair = filter_custom_vjp(lambda xy: xy[0] * xy[1])
    pair.defvjp(lambda xy: (xy[0] * xy[1], None), lambda r, g, xy: (g * xy[1], g * xy[0]))
    assert jax.grad(lambda x: pair((x, x)))(1.0) == 2.0
