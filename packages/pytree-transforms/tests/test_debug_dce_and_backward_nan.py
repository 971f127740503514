"""store_dce/inspect_dce and backward_nan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from runtime_checks import assert_check_fails

from pytree_transforms import RuntimeCheckError
from pytree_transforms.debug import backward_nan, inspect_dce, store_dce


def test_inspect_dce_prints_which_arrays_survived(capsys):
    @jax.jit
    def f(x):
        square, _ = store_dce((x**2, x + 1), name="pair")
        tree = store_dce({"w": x, "n": "static", "v": [x * 3, jnp.arange(3)]}, name="tree")
        return square + tree["w"]

    assert f(2.0) == 6.0
    inspect_dce("pair")
    inspect_dce("tree")
    inspect_dce("nothing stored")
    assert capsys.readouterr().out.splitlines() == [
        "Found 1 call to `pytree_transforms.debug.store_dce`.",
        "Entry 0:",
        "(f32[], <DCE'd>)",
        "Found 1 call to `pytree_transforms.debug.store_dce`.",
        "Entry 0:",
        "{'n': 'static', 'v': [<DCE'd>, <DCE'd>], 'w': f32[]}",
        "Found 0 calls to `pytree_transforms.debug.store_dce`.",
    ]


def test_each_traced_call_is_an_entry(capsys):
    f = jax.jit(lambda x: store_dce(x, name="retraced") * 2)
    f(jnp.ones(2))
    f(jnp.ones(3))
    inspect_dce("retraced")
    assert capsys.readouterr().out.splitlines() == [
        "Found 2 calls to `pytree_transforms.debug.store_dce`.",
        "Entry 0:",
        "f32[2]",
        "Entry 1:",
        "f32[3]",
    ]


def test_store_dce_outside_jit_and_inspect_dce_inside_are_refused():
    with pytest.raises(RuntimeError, match="inside a jitted function"):
        store_dce(jnp.ones(2))
    with pytest.raises(RuntimeError, match="outside jitted code"):
        jax.jit(lambda x: inspect_dce() or x)(1.0)


def test_backward_nan_is_the_identity_and_prints_on_the_backward_pass(capsys):
    def f(x):
        return jnp.sum(jnp.sqrt(backward_nan({"x": x, "tag": "t"}, name="x")["x"]))

    assert f(jnp.array([1.0, 4.0])) == 3.0
    assert capsys.readouterr().out == ""
    grad = jax.grad(f)(jnp.array([1.0, 4.0]))
    assert grad.tolist() == [0.5, 0.25]
    out = capsys.readouterr().out
    assert out.startswith("x:\n   primals={'tag': 't', 'x': Array([1., 4.], dtype=float32)}")
    assert "cotangents={'tag': None, 'x': Array([0.5 , 0.25], dtype=float32)}" in out


def test_backward_nan_raises_on_a_nan_cotangent_unless_asked_not_to(capsys):
    def loss(x, terminate):
        return jnp.sum(0 * jnp.log(backward_nan(x, terminate=terminate)))

    x = jnp.array([0.0, 2.0])
    grad = jax.jit(jax.grad(lambda x: loss(x, False)))(x)
    assert np.isnan(grad[0]) and grad[1] == 0.0
    assert "cotangents=Array([nan,  0.], dtype=float32)" in capsys.readouterr().out
    checked = jax.jit(jax.grad(lambda x: loss(x, True)))
    assert_check_fails(lambda: checked(x), "cotangent has a NaN")
    assert jax.grad(lambda x: loss(x, True))(jnp.array([1.0, 2.0])).tolist() == [0.0, 0.0]


def test_backward_nan_checks_a_cotangent_given_as_a_python_float(capsys):
    _, vjp = jax.vjp(lambda x: backward_nan(x, name="x"), 1.0)
    with pytest.raises(RuntimeCheckError, match="the cotangent of x has a NaN"):
        vjp(float("nan"))
    (passing,) = vjp(2.0)
    assert passing == 2.0
    assert_check_fails(lambda: jax.jit(vjp)(float("nan")), "cotangent of x has a NaN")
    _, unchecked = jax.vjp(lambda x: backward_nan(x, terminate=False), 1.0)
    assert np.isnan(unchecked(float("nan"))[0])
