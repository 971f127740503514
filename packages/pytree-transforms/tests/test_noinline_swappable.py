"""`noinline(fn, abstract_fn)`: functions a compiled caller can be given in turn without
compiling again; each traced once, when first run; every transform through them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Module
from pytree_transforms import filter_grad, filter_jit, noinline


def pair_shape(_, x, y):
    return jnp.broadcast_arrays(x, y)[0]


@pytest.fixture
def traces():
    return {"add": 0, "mul": 0, "caller": 0}


@pytest.fixture
def add_and_mul(traces):
    def add(x, y):
        traces["add"] += 1
        return x + y

    def mul(x, y):
        traces["mul"] += 1
        return x * y

    return noinline(add, pair_shape), noinline(mul, pair_shape)


def test_a_jitted_caller_runs_either_function_without_tracing_again(traces, add_and_mul):
    add, mul = add_and_mul

    @jax.jit
    def caller(fn, x, y):
        traces["caller"] += 1
        return fn(x, y)

    assert int(caller(add, 2, 3)) == 5
    assert int(caller(mul, 2, 3)) == 6
    assert int(caller(add, 4, 5)) == 9
    assert traces == {"add": 1, "mul": 1, "caller": 1}
    # The wrappers are pytrees of one structure: a number names the function.
    assert jax.tree.structure(add) == jax.tree.structure(mul)
    assert add.__name__ == mul.__name__ == "pair_shape"  # from the shared abstract_fn


def test_eager_calls_and_transforms_match_the_functions(add_and_mul):
    add, mul = add_and_mul
    x, y = jnp.float32(1.5), jnp.float32(-2.0)
    assert float(add(x, y)) == -0.5
    for fn, plain in ((add, lambda a, b: a + b), (mul, lambda a, b: a * b)):

        def loss(a, b, fn=fn):
            return fn(jnp.sin(a), b) ** 2

        def reference(a, b, plain=plain):
            return plain(jnp.sin(a), b) ** 2

        np.testing.assert_allclose(
            jax.jit(jax.grad(loss, (0, 1)))(x, y), jax.grad(reference, (0, 1))(x, y), rtol=1e-6
        )
        np.testing.assert_allclose(
            jax.jvp(loss, (x, y), (1.0, 2.0))[1], jax.jvp(reference, (x, y), (1.0, 2.0))[1]
        )
        xs = jnp.arange(4.0)
        np.testing.assert_allclose(jax.vmap(fn, (0, None))(xs, y), plain(xs, y))
        ys = jnp.full(4, y)
        np.testing.assert_allclose(
            jax.vmap(jax.grad(loss))(xs, ys), jax.vmap(jax.grad(reference))(xs, ys)
        )


class Scale(Module):
    def __init__(self, weight):
        self.weight = weight

    def __call__(self, x):
        return self.weight * x


def test_modules_of_one_kind_share_a_number_and_their_arrays_are_inputs():
    def shape(module, x):
        return module.weight * x

    first = noinline(Scale(jnp.array([1.0, 2.0])), shape)
    second = noinline(Scale(jnp.array([3.0, 4.0])), shape)
    assert jax.tree.leaves(first)[0] == jax.tree.leaves(second)[0]  # one function
    caller = filter_jit(lambda m, x: m(x))
    assert caller(first, jnp.ones(2)).tolist() == [1.0, 2.0]
    assert caller(second, jnp.ones(2)).tolist() == [3.0, 4.0]
    # The number is an integer leaf: not differentiated.
    grad = filter_grad(lambda m: jnp.sum(m(jnp.ones(2)) ** 2))(first)
    assert jax.tree.leaves(grad)[0].tolist() == [2.0, 4.0]


def test_a_function_that_disagrees_with_its_abstract_fn_is_refused():
    wrong = noinline(lambda x: jnp.stack([x, x]), lambda _, x: x)
    with pytest.raises(ValueError, match=r"its `abstract_fn` said .*must return what it returns"):
        wrong(jnp.float32(1.0))


def test_refuses_a_batch_of_functions_and_a_bad_abstract_fn(add_and_mul):
    add, mul = add_and_mul
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), add, mul)
    with pytest.raises(ValueError, match=r"cannot be mapped over which function runs"):
        jax.vmap(lambda f, x: f(x, x))(stacked, jnp.ones(2))
    with pytest.raises(TypeError, match=r"noinline expects a function as `abstract_fn`"):
        noinline(lambda x: x, 3)
