"""error_if, branched_error_if, store_dce/inspect_dce and backward_nan, side by side with
Equinox's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")

from runtime_checks import assert_check_fails  # noqa: E402

import pytree_transforms as pt  # noqa: E402

# Inside compiled code both report the failure through JAX's callback error; Equinox's
# filter_jit turns it into its own EquinoxRuntimeError, ours passes JAX's through.
FAILURE = (jax.errors.JaxRuntimeError, ValueError, RuntimeError)
ERROR_IFS = pytest.mark.parametrize(
    "error_if", [pt.error_if, eqx.error_if], ids=["ours", "equinox"]
)
BRANCHED = pytest.mark.parametrize(
    "branched_error_if", [pt.branched_error_if, eqx.branched_error_if], ids=["ours", "equinox"]
)


@ERROR_IFS
def test_error_if_passes_and_fails_alike_under_jit_vmap_grad_and_scan(error_if):
    def check(x):
        return error_if(x, x < 0, "x must be nonnegative")

    assert jax.jit(check)(2.0) == 2.0
    assert jax.jit(jax.vmap(check))(jnp.array([1.0, 2.0])).tolist() == [1.0, 2.0]
    assert jax.jit(jax.grad(lambda x: check(x) ** 2))(3.0) == 6.0
    scanned = jax.jit(lambda xs: jax.lax.scan(lambda c, x: (c + check(x), None), 0.0, xs)[0])
    for f, x in [
        (jax.jit(check), -1.0),
        (jax.jit(jax.vmap(check)), jnp.array([1.0, -1.0])),
        (jax.jit(jax.grad(lambda x: check(x) ** 2)), -3.0),
        (scanned, jnp.array([1.0, -1.0])),
    ]:
        assert_check_fails(lambda f=f, x=x: f(x), "x must be nonnegative", FAILURE)


@ERROR_IFS
def test_a_known_predicate_raises_at_trace_time(error_if):
    with pytest.raises(RuntimeError, match="always"):
        jax.jit(lambda x: error_if(x, True, "always"))(1.0)
    assert jax.jit(lambda x: error_if(x, False, "never"))(1.0) == 1.0


@BRANCHED
def test_branched_error_if_picks_the_message(branched_error_if):
    msgs = ["x is negative", "x is too large"]
    f = jax.jit(lambda x: branched_error_if(x, (x < 0) | (x > 10), jnp.where(x < 0, 0, 1), msgs))
    assert f(3.0) == 3.0
    assert_check_fails(lambda: f(30.0), "x is too large", FAILURE)


def test_a_wrong_message_type_is_refused_by_ours_only():
    # Equinox takes any `msg` and fails later, when it is formatted; ours refuses it.
    with pytest.raises(TypeError, match="`msg` to be a str"):
        pt.error_if(1.0, False, 3)


@pytest.mark.parametrize("debug", [pt.debug, eqx.debug], ids=["ours", "equinox"])
def test_inspect_dce_prints_the_same_tree(debug, capsys):
    @jax.jit
    def f(x):
        tree = debug.store_dce({"w": x, "n": "static", "v": [x * 3, jnp.arange(3)]}, name=debug)
        return tree["w"] * 2

    f(1.0)
    debug.inspect_dce(name=debug)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Found 1 call to `") and lines[1] == "Entry 0:"
    assert lines[2] == "{'n': 'static', 'v': [<DCE'd>, <DCE'd>], 'w': f32[]}"


@pytest.mark.parametrize("debug", [pt.debug, eqx.debug], ids=["ours", "equinox"])
def test_backward_nan_prints_the_same_values(debug, capsys):
    def f(x):
        return jnp.sum(jnp.sqrt(debug.backward_nan(x, name="x", terminate=False)))

    grad = jax.grad(f)(jnp.array([1.0, 0.0]))
    assert grad[0] == 0.5 and np.isinf(grad[1])
    assert capsys.readouterr().out == (
        "x:\n   primals=Array([1., 0.], dtype=float32)\n"
        "cotangents=Array([0.5, inf], dtype=float32)\n"
    )


@ERROR_IFS
def test_a_checks_own_on_error_overrides_the_environment(error_if, monkeypatch):
    monkeypatch.delenv("PYTREE_TRANSFORMS_ON_ERROR", raising=False)
    monkeypatch.delenv("EQX_ON_ERROR", raising=False)

    def checked(on_error):
        return jax.jit(lambda x: error_if(x, x < 0, "negative", on_error=on_error))

    bad = jnp.array([1.0, -1.0])
    assert np.isnan(checked("nan")(bad)).all()
    assert checked("off")(bad).tolist() == [1.0, -1.0]
    assert_check_fails(lambda: checked("raise")(bad), "negative", FAILURE)


@pytest.mark.parametrize(
    "mark",
    [
        pt.nondifferentiable,
        eqx.internal.nondifferentiable,
        pt.nondifferentiable_backward,
        eqx.internal.nondifferentiable_backward,
    ],
    ids=["ours", "equinox", "ours-backward", "equinox-backward"],
)
def test_nondifferentiable_raises_the_message_given(mark):
    with pytest.raises(RuntimeError, match="use the adjoint method instead"):
        jax.grad(lambda x: mark(x, msg="use the adjoint method instead") ** 2)(1.0)
