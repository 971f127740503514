"""filter_custom_jvp: the seed's example, argument splitting, outputs and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module
from pytree_transforms import (
    filter_closure_convert,
    filter_custom_jvp,
    filter_grad,
    filter_jit,
    filter_jvp,
)


@filter_custom_jvp
def call(fn, x):
    return fn(x)


@call.defjvp
def call_jvp(primals, tangents):
    fn, x = primals
    _, tx = tangents
    primal_out = call(fn, x)
    tangent_out = tx**2
    return primal_out, tangent_out


def test_seed_example_under_jvp():
    x, tx = jnp.array(3.0), jnp.array(2.0)
    out, tangent = jax.jvp(lambda x: call(jnp.sin, x), (x,), (tx,))
    assert out == pytest.approx(float(jnp.sin(3.0)))
    assert tangent == pytest.approx(4.0)


def test_seed_example_inside_jit():
    @jax.jit
    def jvp(x, tx):
        return jax.jvp(lambda x: call(jnp.sin, x), (x,), (tx,))

    out, tangent = jvp(jnp.array(3.0), jnp.array(2.0))
    assert out == pytest.approx(float(jnp.sin(3.0)))
    assert tangent == pytest.approx(4.0)
    assert filter_jit(call)(jnp.sin, jnp.array(0.5)) == pytest.approx(float(jnp.sin(0.5)))


def test_seed_example_under_grad():
    # Reverse mode transposes the rule, so it must be linear in the tangents: `tx**2` is
    # not, and JAX says so. The same function with a linear rule is differentiated.
    with pytest.raises(NotImplementedError, match="integer_pow"):
        jax.grad(lambda x: call(jnp.sin, x))(3.0)

    @filter_custom_jvp
    def linear_call(fn, x):
        return fn(x)

    @linear_call.defjvp
    def linear_call_jvp(primals, tangents):
        fn, x = primals
        _, tx = tangents
        return linear_call(fn, x), 2 * tx

    assert jax.grad(lambda x: linear_call(jnp.sin, x))(3.0) == pytest.approx(2.0)
    grad = jax.jit(jax.grad(lambda x: linear_call(jnp.sin, x)))
    assert grad(3.0) == pytest.approx(2.0)


def test_tangents_are_none_for_nondifferentiable_leaves():
    seen = {}

    @filter_custom_jvp
    def f(params, n, name):
        return params["w"] * n + params["b"]

    @f.defjvp
    def f_jvp(primals, tangents):
        seen["tangents"] = tangents
        params, n, name = primals
        t_params = tangents[0]
        return f(params, n, name), t_params["w"] * n

    params = {"w": jnp.array(2.0), "b": jnp.array(1.0), "steps": jnp.array(4), "act": "relu"}
    grads = jax.grad(lambda w: f({**params, "w": w}, 3, "f"))(jnp.array(2.0))
    assert grads == pytest.approx(3.0)
    t_params, t_n, t_name = seen["tangents"]
    assert t_n is None and t_name is None
    assert t_params["steps"] is None and t_params["act"] is None
    assert t_params["w"] is not None
    assert t_params["b"] is None  # a floating-point array that is not differentiated


def test_keyword_arguments_are_passed_to_the_rule_and_not_differentiated():
    @filter_custom_jvp
    def scale(x, *, factor, label):
        return x * factor

    @scale.defjvp
    def scale_jvp(primals, tangents, *, factor, label):
        assert label == "scale"
        (x,), (tx,) = primals, tangents
        return scale(x, factor=factor, label=label), tx * factor

    def loss(x, factor):
        return scale(x, factor=factor, label="scale")

    dx, dfactor = jax.grad(loss, argnums=(0, 1))(jnp.array(2.0), jnp.array(5.0))
    assert dx == pytest.approx(5.0)
    assert dfactor == 0.0  # the rule gives no derivative for keyword arguments


def test_modules_vmap_and_integer_outputs():
    class Affine(Module):
        weight: jax.Array
        bias: jax.Array
        name: str

        def __call__(self, x):
            return self.weight * x + self.bias

    @filter_custom_jvp
    def apply(model, x):
        return model(x), jnp.argmax(x)

    @apply.defjvp
    def apply_jvp(primals, tangents):
        model, x = primals
        t_model, tx = tangents
        assert t_model.name is None
        terms = [(t_model.weight, x), (model.weight, tx), (t_model.bias, 1.0)]
        tangent = sum(a * b for a, b in terms if a is not None and b is not None)
        return apply(model, x), (tangent, None)

    model = Affine(jnp.array(2.0), jnp.array(1.0), "affine")
    xs = jnp.arange(3.0)
    out, index = jax.vmap(apply, in_axes=(None, 0))(model, xs)
    assert out.tolist() == [1.0, 3.0, 5.0]
    assert index.tolist() == [0, 0, 0]
    grads = filter_grad(lambda m: jnp.sum(jax.vmap(lambda x: apply(m, x)[0])(xs)))(model)
    assert grads.weight == pytest.approx(3.0)
    assert grads.bias == pytest.approx(3.0)
    _, (tangent, t_index) = jax.jvp(lambda x: apply(model, x), (xs,), (jnp.ones(3),))
    assert tangent.tolist() == [2.0, 2.0, 2.0]
    assert t_index.dtype == jax.dtypes.float0


def test_rule_gets_none_for_floating_point_inputs_not_differentiated():
    seen = []

    @filter_custom_jvp
    def mul(x, y):
        return x * y

    @mul.defjvp
    def mul_jvp(primals, tangents):
        seen.append(tangents)
        (x, y), (tx, ty) = primals, tangents
        terms = [t * other for t, other in ((tx, y), (ty, x)) if t is not None]
        return mul(x, y), sum(terms)

    x, y = jnp.array(2.0), jnp.array(3.0)
    assert jax.jvp(lambda x: mul(x, y), (x,), (jnp.array(1.0),))[1] == 3.0
    assert jax.grad(lambda y: mul(x, y))(y) == 2.0
    assert seen[0][1] is None and seen[0][0] is not None
    assert seen[1][0] is None and seen[1][1] is not None
    both = jax.jvp(mul, (x, y), (jnp.array(1.0), jnp.array(1.0)))[1]
    assert both == 5.0 and None not in seen[2]


def test_python_float_primals_stay_python_floats():
    seen = []

    @filter_custom_jvp
    def mul(x, y):
        return x * y

    @mul.defjvp
    def mul_jvp(primals, tangents):
        seen.append(primals)
        (x, y), (tx, _) = primals, tangents
        return mul(x, y), tx * y

    out, tangent = jax.jvp(lambda x: mul(x, 3.0), (2.0,), (1.0,))
    assert (out, tangent) == (6.0, 3.0)
    assert type(out) is float and type(tangent) is float
    assert all(type(p) is float for p in seen[0])
    out, tangent = filter_jvp(mul, (2.0, 3.0), (1.0, None))
    assert type(out) is float and type(tangent) is float


def test_none_tangent_means_zero():
    @filter_custom_jvp
    def stop(x):
        return x

    stop.defjvp(lambda primals, tangents: (primals[0], None))
    assert jax.grad(lambda x: stop(x) + x)(1.0) == pytest.approx(1.0)


def test_closed_over_tracers_through_closure_convert():
    # A function closing over a traced value hides that value from the split; converting
    # the closure turns it into an array leaf, which is then differentiated like any other.
    @filter_custom_jvp
    def apply(fn, x):
        return fn(x)

    @apply.defjvp
    def apply_jvp(primals, tangents):
        fn, x = primals
        t_fn, tx = tangents
        (t_y,) = t_fn.consts
        assert tx is None  # `x` is a constant below: only `y` is differentiated
        return apply(fn, x), t_y * x

    def outer(y):
        fn = filter_closure_convert(lambda x: x * y, jnp.array(0.0))
        return apply(fn, jnp.array(2.0))

    assert jax.grad(outer)(3.0) == pytest.approx(2.0)


def test_numpy_inputs_and_python_number_outputs():
    @filter_custom_jvp
    def total(x, offset):
        return jnp.sum(x) + offset

    total.defjvp(lambda p, t: (total(*p), jnp.sum(t[0])))
    assert float(total(np.ones(3, np.float32), 1)) == 4.0

    @filter_custom_jvp
    def constant(x):
        return 2.0

    constant.defjvp(lambda p, t: (2.0, None))
    assert constant(jnp.ones(2)) == 2.0
    assert jax.jvp(constant, (1.0,), (1.0,)) == (2.0, 0.0)


def test_errors():
    @filter_custom_jvp
    def no_rule(x):
        return x

    with pytest.raises(TypeError, match="no JVP rule yet"):
        no_rule(jnp.ones(2))

    @filter_custom_jvp
    def named(x):
        return x, "name"

    named.defjvp(lambda p, t: ((p[0], "name"), (t[0], None)))
    with pytest.raises(TypeError, match=r"returned a str at \[1\]"):
        named(jnp.ones(2))
    with pytest.raises(TypeError, match=r"returned a str at \[1\]"):
        jax.jvp(named, (jnp.ones(2),), (jnp.ones(2),))

    @filter_custom_jvp
    def pair(x):
        return x, x

    pair.defjvp(lambda p, t: (pair(*p), t[0]))
    with pytest.raises(ValueError, match="structure of its primal_out"):
        jax.jvp(pair, (1.0,), (1.0,))

    pair.defjvp(lambda p, t: p[0])
    with pytest.raises(TypeError, match="must return a pair"):
        jax.jvp(pair, (1.0,), (1.0,))

    with pytest.raises(TypeError, match="expects a function"):
        filter_custom_jvp(3)
    with pytest.raises(TypeError, match="expects the JVP rule"):
        pair.defjvp("rule")


def test_def_jvp_is_the_other_spelling_of_defjvp():
    @filter_custom_jvp
    def square_plus(x, y, *, fn):
        return fn(x) + y

    seen = []

    @square_plus.def_jvp
    def square_plus_jvp(primals, tangents, *, fn):
        seen.append(fn)
        x, y = primals
        tx, ty = tangents
        assert ty is None  # y is an int: never differentiated
        return square_plus(x, y, fn=fn), 2 * x * tx

    assert square_plus_jvp.__name__ == "square_plus_jvp"  # returned: usable as a decorator
    out, tangent = jax.jvp(lambda x: square_plus(x, 1, fn=jnp.square), (3.0,), (1.0,))
    assert float(out) == 10.0 and float(tangent) == 6.0
    assert seen == [jnp.square]
    assert float(filter_grad(lambda x: square_plus(x, 1, fn=jnp.square))(jnp.asarray(3.0))) == 6.0

    # The last rule set wins, whichever spelling set it.
    square_plus.defjvp(lambda p, t, *, fn: (square_plus(*p, fn=fn), 0 * t[0]))
    assert float(jax.jvp(lambda x: square_plus(x, 1, fn=jnp.square), (3.0,), (1.0,))[1]) == 0.0

    with pytest.raises(TypeError, match=r"def_jvp expects the JVP rule .*fn\.def_jvp\(f\)"):
        square_plus.def_jvp(jnp.square(2.0))  # a result, not a rule
