"""Per-call options of the run-time checks: `error_if(on_error=...)`, Enumeration members'
`error_if`, and `nondifferentiable(msg=...)`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from runtime_checks import assert_check_fails

from pytree_module import Enumeration
from pytree_transforms import (
    RuntimeCheckError,
    branched_error_if,
    error_if,
    filter_jit,
    nondifferentiable,
    nondifferentiable_backward,
)


def _checked(on_error):
    return jax.jit(lambda x: error_if(x, x < 0, "x must be nonnegative", on_error=on_error))


@pytest.mark.parametrize("environment", [None, "raise", "nan", "off"])
def test_a_checks_own_mode_overrides_the_environment(monkeypatch, environment):
    if environment is None:
        monkeypatch.delenv("PYTREE_TRANSFORMS_ON_ERROR", raising=False)
    else:
        monkeypatch.setenv("PYTREE_TRANSFORMS_ON_ERROR", environment)
    bad = jnp.array([1.0, -1.0])
    assert np.isnan(_checked("nan")(bad)).all()
    assert _checked("off")(bad).tolist() == [1.0, -1.0]
    assert_check_fails(lambda: _checked("raise")(bad), "x must be nonnegative")
    with pytest.raises(RuntimeCheckError, match="x must be nonnegative"):
        error_if(bad, bad < 0, "x must be nonnegative", on_error="raise")  # eagerly


def test_default_follows_the_environment(monkeypatch):
    monkeypatch.setenv("PYTREE_TRANSFORMS_ON_ERROR", "nan")
    assert np.isnan(_checked("default")(jnp.array([-1.0]))).all()
    monkeypatch.setenv("PYTREE_TRANSFORMS_ON_ERROR", "off")
    jax.clear_caches()
    assert _checked("default")(jnp.array([-1.0])).tolist() == [-1.0]


def test_branched_error_if_takes_the_mode_too():
    @filter_jit
    def f(x):
        return branched_error_if(x, x > 1, jnp.int32(1), ["small", "large"], on_error="nan")

    assert np.isnan(f(jnp.array(3.0)))
    assert f(jnp.array(0.5)) == 0.5


@pytest.mark.parametrize("on_error", ["warn", "Raise", None, 1])
def test_an_unknown_mode_is_refused_naming_the_argument(on_error):
    x = jnp.ones(1)
    with pytest.raises(ValueError, match=r"error_if\(on_error=\.\.\.\) must be one of"):
        error_if(x, x < 0, "m", on_error=on_error)
    with pytest.raises(ValueError, match=r"branched_error_if\(on_error=\.\.\.\)"):
        branched_error_if(x, x < 0, 0, ["m"], on_error=on_error)


class RESULTS(Enumeration):
    successful = ""
    diverged = "The iteration diverged."
    stalled = "The iteration stalled."


def _solve(x):
    result = RESULTS.where(x > 10, RESULTS.diverged, RESULTS.successful)
    result = RESULTS.where(x < -10, RESULTS.stalled, result)
    return result.error_if(x, result != RESULTS.successful)


def test_a_members_error_if_raises_its_message_picked_at_run_time():
    solve = jax.jit(_solve)
    assert solve(jnp.array(1.0)) == 1.0
    assert_check_fails(lambda: solve(jnp.array(100.0)), r"The iteration diverged\.")
    assert_check_fails(lambda: solve(jnp.array(-100.0)), r"The iteration stalled\.")
    stalled = filter_jit(_solve)
    assert_check_fails(lambda: stalled(jnp.array(-100.0)), r"stalled\.", RuntimeCheckError)


def test_a_concrete_members_error_if_is_decided_at_once():
    x = jnp.ones(2)
    assert RESULTS.diverged.error_if(x, False) is x
    with pytest.raises(RuntimeCheckError, match=r"The iteration diverged\."):
        RESULTS.diverged.error_if(x, True)
    with pytest.warns(UserWarning, match="replaced by NaNs now .*The iteration stalled"):
        poisoned = jax.jit(lambda x: RESULTS.stalled.error_if(x, True, on_error="nan"))(x)
    assert np.isnan(poisoned).all()


def test_a_members_error_if_under_vmap():
    solve = jax.jit(jax.vmap(_solve))
    assert solve(jnp.array([1.0, 2.0])).tolist() == [1.0, 2.0]
    assert_check_fails(lambda: solve(jnp.array([1.0, 20.0])), r"The iteration diverged\.")


def test_is_traced():
    assert not RESULTS.diverged.is_traced()
    seen = []

    @jax.jit
    def f(result):
        seen.append(result.is_traced())
        return result

    f(RESULTS.stalled)
    assert seen == [True]


@pytest.mark.parametrize("function", [nondifferentiable, nondifferentiable_backward])
def test_nondifferentiable_takes_the_whole_message(function):
    def loss(x):
        return function(x, name="ignored", msg="use the adjoint method instead") ** 2

    with pytest.raises(RuntimeError, match=r"^use the adjoint method instead"):
        jax.grad(loss)(1.0)
    # Without `msg`, the message is made from `name`, as before.
    with pytest.raises(RuntimeError, match=r"^the step size cannot be differentiated"):
        jax.grad(lambda x: function(x, name="the step size") ** 2)(1.0)


@pytest.mark.parametrize("function", [nondifferentiable, nondifferentiable_backward])
def test_a_message_that_is_not_a_string_is_refused(function):
    with pytest.raises(TypeError, match=r"\(msg=\.\.\.\) must be a str"):
        function(jnp.ones(1), msg=3)
