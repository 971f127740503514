"""filter_vmap: the seed's examples, ensembles of models, axes and errors."""

import jax
import jax.numpy as jnp
import jax.random as jr
import pytest

from pytree_module import Module
from pytree_transforms import filter_jit, filter_vmap, if_array


def test_seed_examples():
    @filter_vmap
    def f(x, y):
        return x + y

    @filter_vmap(kwargs=dict(x=1))
    def g(x, y):
        return x + y

    @filter_vmap(args=(None,))
    def h(x, y):
        return x + y

    assert f(jnp.array([1, 2]), jnp.array([3, 4])).tolist() == [4, 6]
    assert f(jnp.array([1, 2]), 3).tolist() == [4, 5]  # second arg broadcast
    assert g(jnp.array([[1, 2]]), jnp.array([3, 4])).tolist() == [[4], [6]]
    assert g(x=jnp.array([[1, 2]]), y=jnp.array([3, 4])).tolist() == [[4], [6]]
    assert h(jnp.array(1), jnp.array([2, 3])).tolist() == [3, 4]


class MLP(Module):
    def __init__(self, key):
        k1, k2 = jr.split(key)
        self.w1 = jr.normal(k1, (2, 4))
        self.w2 = jr.normal(k2, (4, 2))
        self.activation = jax.nn.relu

    def __call__(self, x):
        return self.activation(x @ self.w1) @ self.w2


def test_ensemble_of_models():
    @filter_vmap
    def make_ensemble(key):
        return MLP(key)

    ensemble = make_ensemble(jr.split(jr.PRNGKey(0), 8))
    assert ensemble.w1.shape == (8, 2, 4) and ensemble.activation is jax.nn.relu

    @filter_vmap(kwargs=dict(x=None))
    def evaluate_ensemble(model, x):
        return model(x)

    assert evaluate_ensemble(ensemble, jr.normal(jr.PRNGKey(1), (2,))).shape == (8, 2)

    @filter_vmap
    def evaluate_per_ensemble(model, x):
        return model(x)

    assert evaluate_per_ensemble(ensemble, jr.normal(jr.PRNGKey(1), (8, 2))).shape == (8, 2)
    jitted = filter_jit(evaluate_per_ensemble)
    assert jitted(ensemble, jnp.ones((8, 2))).shape == (8, 2)


def test_newer_spellings_and_out_axes():
    assert filter_vmap(lambda x: x, out_axes=1)(jnp.ones((3, 2))).shape == (2, 3)
    assert filter_vmap(lambda x, y: x + y, in_axes=(0, None))(jnp.ones(3), 1.0).shape == (3,)
    out = filter_vmap(lambda: jnp.ones(2), axis_size=4)()
    assert out.shape == (4, 2)
    total = filter_vmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(jnp.arange(3.0))
    assert total.tolist() == [3.0, 3.0, 3.0]
    assert filter_vmap(lambda x: x, in_axes=if_array(1))(jnp.ones((2, 5))).shape == (5, 2)


def test_non_array_outputs_pass_through():
    assert filter_vmap(lambda x: (x, "tag"))(jnp.arange(2))[1] == "tag"


def test_outputs_given_an_axis_are_broadcast_along_it():
    out = filter_vmap(lambda: 1.5, out_axes=0, axis_size=3)()
    assert out.tolist() == [1.5, 1.5, 1.5]
    out = filter_vmap(lambda x: (x, 2.0, jnp.array(4.0)), out_axes=0)(jnp.arange(3.0))
    assert out[1].tolist() == [2.0] * 3 and out[2].tolist() == [4.0] * 3
    out = filter_vmap(lambda x: jnp.ones(2), out_axes=1)(jnp.arange(3.0))
    assert out.shape == (2, 3)
    # By default only arrays get an axis: other outputs are returned as they are.
    assert filter_vmap(lambda x: (x, 2.0))(jnp.arange(3.0))[1] == 2.0


def test_an_output_with_axis_none_must_not_depend_on_the_mapped_inputs():
    const = filter_vmap(lambda x: (x, jnp.ones(2)), out_axes=(0, None))(jnp.arange(3.0))
    assert const[1].shape == (2,)
    with pytest.raises(ValueError, match="axis spec None but output was batched"):
        filter_vmap(lambda x: x, out_axes=None)(jnp.arange(3.0))


def test_mapping_an_array_without_that_axis_names_it():
    with pytest.raises(
        ValueError, match=r"args\[1\]\.a is an array of shape \(\), which has no axis 0"
    ):
        filter_vmap(lambda x, y: x)(jnp.arange(3.0), {"a": jnp.array(1.0)})
    with pytest.raises(
        ValueError, match=r"args\[0\] is an array of shape \(3,\), which has no axis 1"
    ):
        filter_vmap(lambda x: x, in_axes=1)(jnp.arange(3.0))
    with pytest.raises(ValueError, match=r"output leaf at \[1\], a str, which is not an array"):
        filter_vmap(lambda x: (x, "tag"), out_axes=0)(jnp.arange(3.0))


def test_errors():
    with pytest.raises(ValueError, match="batch size is unknown"):
        filter_vmap(lambda x: x)(3)
    with pytest.raises(ValueError, match="not an array and cannot be mapped"):
        filter_vmap(lambda x: x, in_axes=0)("text")
    with pytest.raises(TypeError, match="either `in_axes=` or"):
        filter_vmap(lambda x: x, in_axes=0, args=(0,))
    with pytest.raises(TypeError, match="expects a function"):
        filter_vmap(3)


def test_in_axes_by_parameter_name():
    @filter_vmap(in_axes=dict(x=1, scale=None))
    def f(x, y, scale=1.0, *, offset=0):
        return x * scale + y + offset

    x, y = jnp.array([[1.0, 2.0]]), jnp.array([10.0, 20.0])
    # y gets the default, if_array(0); x is mapped down axis 1, by position or keyword.
    assert f(x, y).tolist() == [[11.0], [22.0]]
    assert f(y=y, x=x, scale=jnp.array(2.0)).tolist() == [[12.0], [24.0]]
    assert f(x, y, jnp.array(2.0), offset=jnp.array([1.0, 2.0])).tolist() == [[13.0], [26.0]]
    # A parameter left to its default is no input: it is used as it is.
    scaled = filter_vmap(lambda x, s=3.0: x * s, in_axes=dict(s=None))
    assert scaled(jnp.ones(2)).tolist() == [3.0, 3.0]
    # Names combine with `default=` for every other argument.
    g = filter_vmap(lambda x, y: x + y, in_axes=dict(x=0), default=None)
    assert g(jnp.arange(3), jnp.array(10)).tolist() == [10, 11, 12]
    # Keyword-only parameters can be named.
    h = filter_vmap(lambda x, *, k: x * k, in_axes=dict(x=None, k=0))
    assert h(jnp.array(2), k=jnp.arange(3)).tolist() == [0, 2, 4]


def test_in_axes_by_name_on_a_method_and_a_module():
    class Scaler(Module):
        factor: jax.Array

        @filter_vmap(in_axes=dict(self=None, x=0))
        def scale(self, x):
            return self.factor * x

        def __call__(self, x, y):
            return self.factor * x + y

    scaler = Scaler(jnp.array([1.0, 2.0]))
    # `self` is the method's first parameter; its array is not mapped.
    assert scaler.scale(jnp.arange(3.0)).tolist() == [[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]]
    # A callable Module is named by its `__call__`'s parameters (and is itself not mapped).
    mapped = filter_vmap(scaler, in_axes=dict(y=None))
    assert mapped(jnp.arange(2.0), jnp.array(1.0)).tolist() == [[1.0, 1.0], [2.0, 3.0]]


def test_in_axes_by_name_errors():
    with pytest.raises(ValueError, match=r"names 'z', which is not a parameter of f\(x, y\)"):

        @filter_vmap(in_axes=dict(z=0))
        def f(x, y):
            return x

    def only_kwargs(**options):
        return options

    with pytest.raises(
        ValueError,
        match=r"'x', which is not a parameter of only_kwargs\(\*\*options\)\. Its named "
        r"parameters: none\. Keyword arguments caught by `\*\*kwargs` take theirs by name, "
        r"from `kwargs=dict\(\.\.\.\)`",
    ):
        filter_vmap(only_kwargs, in_axes=dict(x=0))

    def star(x, *rest):
        return x

    with pytest.raises(ValueError, match=r"names 'rest', the `\*rest` of star\(x, \*rest\)"):
        filter_vmap(star, in_axes=dict(rest=0))
    with pytest.raises(ValueError, match=r"has the key 0, which is not a parameter name"):
        filter_vmap(lambda x: x, in_axes={0: 0})
    with pytest.raises(TypeError, match=r"the signature of max cannot be read"):
        filter_vmap(max, in_axes=dict(x=0))
    with pytest.raises(TypeError, match=r"either a dict `in_axes=` or `args=`/`kwargs=`"):
        filter_vmap(lambda x: x, in_axes=dict(x=0), kwargs=dict(x=1))
