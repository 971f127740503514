"""error_if and branched_error_if: run-time checks under every transform, and the modes of
PYTREE_TRANSFORMS_ON_ERROR."""

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from runtime_checks import (
    COMPILED_FAILURE,
    assert_check_fails,
    simulated_accelerator,
)

import pytree_transforms as pt
from pytree_transforms import RuntimeCheckError, branched_error_if, error_if
from pytree_transforms.debug import backward_nan


def _nonnegative(x):
    return error_if(x, x < 0, "x must be nonnegative")


CHECK_LINE = _nonnegative.__code__.co_firstlineno + 1


def test_a_passing_check_returns_x_unchanged_with_its_other_leaves():
    tree = {"w": jnp.arange(3.0), "tag": "t", "n": 2}
    eager = error_if(tree, tree["w"] < 0, "negative")
    assert eager["tag"] == "t" and eager["n"] == 2 and eager["w"].tolist() == [0.0, 1.0, 2.0]
    out = pt.filter_jit(lambda t: error_if(t, t["w"] < 0, "negative"))(tree)
    assert out["tag"] == "t" and out["n"] == 2 and out["w"].tolist() == [0.0, 1.0, 2.0]


def test_a_check_whose_result_is_unused_still_runs():
    unused = jax.jit(lambda x: (error_if(x, x < 0, "unused"), x)[1])
    assert unused(1.0) == 1.0
    assert_check_fails(lambda: unused(-1.0), "unused")
    with pytest.raises(RuntimeCheckError, match="known"):
        jax.jit(lambda x: error_if(x, np.array([False, True]), "known"))(1.0)


def test_a_failing_check_in_jit_raises_with_the_message_and_the_line_of_the_check():
    error = assert_check_fails(lambda: jax.jit(_nonnegative)(jnp.array([1.0, -1.0])), "nonneg")
    if error is None:
        pytest.skip("this backend went on past the failed check (its result is poisoned)")
    text = str(error)
    assert "RuntimeCheckError: x must be nonnegative" in text
    assert f'{__file__}", line {CHECK_LINE}, in _nonnegative' in text


def test_eagerly_a_failing_check_raises_our_error_at_once():
    with pytest.raises(RuntimeCheckError, match=r"^x must be nonnegative$") as info:
        _nonnegative(jnp.array(-1.0))
    assert any(
        str(entry.path) == __file__ and entry.lineno + 1 == CHECK_LINE for entry in info.traceback
    )


def test_jax_jit_raises_jaxs_error_holding_the_message():
    assert jax.jit(_nonnegative)(jnp.array(2.0)) == 2.0
    assert_check_fails(lambda: jax.jit(_nonnegative)(jnp.array(-2.0)), "x must be nonnegative")


@contextlib.contextmanager
def _on_the_cpu(async_dispatch):
    """Compute on the CPU (beside an accelerator too: JAX_PLATFORMS=cuda,cpu), whose calls
    raise a failed check themselves, with asynchronous CPU dispatch on or off."""
    before = jax.config.values["jax_cpu_enable_async_dispatch"]
    jax.config.update("jax_cpu_enable_async_dispatch", async_dispatch)
    try:
        with jax.default_device(jax.devices("cpu")[0]):
            yield
    finally:
        jax.config.update("jax_cpu_enable_async_dispatch", before)


@pytest.mark.parametrize("async_dispatch", [True, False])
def test_filter_jit_raises_the_check_error_itself_on_every_call_on_the_cpu(async_dispatch):
    # Where the call raises (on the CPU). Elsewhere the failure surfaces when the result is
    # waited for, as JAX's error (runtime_checks.py): after `filter_jit` has returned.
    with _on_the_cpu(async_dispatch):
        f = pt.filter_jit(lambda x, scale: _nonnegative(x) * scale)
        assert f(jnp.array(2.0), 3) == 6.0
        expected = (
            "^x must be nonnegative\n\nThe check is at "
            f'File "{re.escape(__file__)}", line {CHECK_LINE}, in _nonnegative.$'
        )
        for _ in range(2):  # the compiling call, then JAX's C++ dispatch path
            with pytest.raises(RuntimeCheckError, match=expected):
                f(jnp.array(-2.0), 3)
        # The general path too (the same array passed twice).
        g = pt.filter_jit(lambda x, y: _nonnegative(x) + y)
        x = jnp.array(-1.0)
        with pytest.raises(RuntimeCheckError, match=r"^x must be nonnegative"):
            g(x, x)


def test_filter_jit_reports_a_failed_check_on_any_backend():
    f = pt.filter_jit(lambda x, scale: _nonnegative(x) * scale)
    for _ in range(2):
        assert_check_fails(
            lambda: f(jnp.array(-2.0), 3), "^x must be nonnegative", errors=RuntimeCheckError
        )


@pytest.mark.parametrize("async_dispatch", [True, False])
def test_on_the_cpu_the_call_raises_with_async_dispatch_on_and_off(async_dispatch):
    with _on_the_cpu(async_dispatch):
        f = jax.jit(lambda x: _nonnegative(x) * 2)
        with pytest.raises(COMPILED_FAILURE, match="x must be nonnegative"):
            f(jnp.array(-1.0))


def test_vmap_with_a_batched_predicate_fails_if_any_element_fails():
    f = jax.jit(jax.vmap(_nonnegative))
    assert f(jnp.array([1.0, 2.0])).tolist() == [1.0, 2.0]
    assert_check_fails(lambda: f(jnp.array([1.0, -2.0])), "x must be nonnegative")
    with pytest.raises(RuntimeCheckError, match="x must be nonnegative"):
        jax.vmap(_nonnegative)(jnp.array([1.0, -2.0]))


def test_grad_checks_the_forward_pass_and_differentiates_as_the_identity():
    def loss(x):
        return jnp.sum(_nonnegative(x) ** 2)

    assert jax.grad(loss)(jnp.array([1.0, 3.0])).tolist() == [2.0, 6.0]
    assert jax.jit(jax.grad(loss))(jnp.array([1.0, 3.0])).tolist() == [2.0, 6.0]
    assert jax.jvp(_nonnegative, (2.0,), (1.0,)) == (2.0, 1.0)
    assert_check_fails(lambda: jax.jit(jax.grad(loss))(jnp.array([1.0, -3.0])), "nonnegative")
    with pytest.raises(RuntimeCheckError, match="x must be nonnegative"):
        jax.grad(loss)(jnp.array([1.0, -3.0]))


def _linear(x):
    # The gradient of a linear function does not need its primal value: under `jax.grad`
    # the check's output is computed on the known side of linearization, then unused.
    return jnp.sum(3.0 * _nonnegative(x))


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.jit(jax.grad(f)),
        lambda f: jax.grad(jax.jit(f)),
        lambda f: jax.jit(jax.grad(jax.jit(f))),
        lambda f: jax.jit(jax.grad(jax.checkpoint(f))),
        lambda f: jax.jit(jax.vmap(jax.grad(f))),
        lambda f: jax.vmap(jax.jit(jax.grad(f))),
        lambda f: jax.jit(lambda x: jax.vjp(f, x)[1](1.0)[0]),
        lambda f: jax.jit(lambda x: jax.linear_transpose(jax.linearize(f, x)[1], x)(1.0)[0]),
        lambda f: pt.filter_jit(pt.filter_grad(f)),
    ],
    ids=[
        "jit-grad",
        "grad-jit",
        "jit-grad-jit",
        "remat",
        "jit-vmap",
        "vmap-jit",
        "vjp",
        "linearize",
        "filter",
    ],
)
def test_a_check_on_a_value_a_gradient_does_not_need_still_runs(transform):
    compiled = transform(_linear)
    good, bad = jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.array([[1.0, 2.0], [3.0, -4.0]])
    assert np.array_equal(compiled(good), np.full((2, 2), 3.0))
    # The gradient does not use the checked value: nothing comes out poisoned, so this
    # passes only where the failure is raised (at the call or, on an accelerator, by a wait).
    assert_check_fails(
        lambda: compiled(bad), "x must be nonnegative", (*COMPILED_FAILURE, RuntimeCheckError)
    )
    with pytest.raises(RuntimeCheckError, match="x must be nonnegative"):
        jax.grad(_linear)(bad)  # as eagerly


def test_a_passing_check_is_traced_once_and_costs_about_a_python_dispatch():
    traces = []

    def step(x):
        traces.append(None)
        return jnp.sum(jnp.sin(error_if(x, x < 0, "negative")))

    checked, plain = jax.jit(step), jax.jit(lambda x: jnp.sum(jnp.sin(x)))
    x = jnp.arange(100.0)
    assert checked(x) == plain(x)
    per_call = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(100):
            checked(x).block_until_ready()
        per_call.append((time.perf_counter() - start) / 100)
    assert len(traces) == 1 and checked._cache_size() == 1
    # The effect costs JAX's Python dispatch path, about 0.1 ms a call on a CPU (the docs'
    # figure); a bound far above it, as the machine may be loaded, still catches a check
    # that compiles or calls back on every call.
    assert sorted(per_call)[2] < 5e-3, per_call


def test_checks_inside_scan_while_loop_and_cond():
    def scanned(xs):
        return lax.scan(lambda c, x: (c + _nonnegative(x), None), 0.0, xs)[0]

    def looped(x):
        return lax.while_loop(
            lambda c: c[1] < 3, lambda c: (_nonnegative(c[0] - 1), c[1] + 1), (x, 0)
        )

    def branched(x):
        return lax.cond(x < 5, _nonnegative, lambda y: y, x)

    assert jax.jit(scanned)(jnp.array([1.0, 2.0])) == 3.0
    assert jax.jit(looped)(3.0)[0] == 0.0
    assert jax.jit(branched)(1.0) == 1.0
    for f, x in [(scanned, jnp.array([1.0, -2.0])), (looped, 2.0), (branched, -1.0)]:
        assert_check_fails(lambda f=f, x=x: jax.jit(f)(x), "x must be nonnegative")


def test_a_concrete_predicate_is_decided_at_trace_time():
    jaxpr = jax.make_jaxpr(lambda x: error_if(x, np.bool_(False), "never"))(1.0)
    assert not jaxpr.eqns
    with pytest.raises(RuntimeCheckError, match="always"):
        jax.jit(lambda x: error_if(x, True, "always"))(1.0)
    jaxpr = jax.make_jaxpr(lambda x: error_if(x, x < 0, "sometimes"))(1.0)
    assert "cond" in str(jaxpr)


def test_branched_error_if_picks_the_message_by_a_traced_index():
    msgs = ["x is negative", "x is too large"]

    @jax.jit
    def f(x):
        return branched_error_if(x, (x < 0) | (x > 10), jnp.where(x < 0, 0, 1), msgs)

    assert f(3.0) == 3.0
    assert_check_fails(lambda: f(30.0), "x is too large")
    assert_check_fails(lambda: f(-3.0), "x is negative")
    # Under vmap the message is that of a failing element, not of the largest index.
    g = jax.jit(jax.vmap(lambda x, i: branched_error_if(x, x < 0, i, ["neg", "other"])))
    assert_check_fails(lambda: g(jnp.array([-1.0, 2.0]), jnp.array([0, 1])), "neg")
    with pytest.raises(RuntimeCheckError, match="x is too large"):
        branched_error_if(30.0, jnp.array(True), 1, msgs)


def test_an_index_out_of_range_is_reported_with_the_failure():
    f = jax.jit(lambda x, i: branched_error_if(x, x < 0, i, ["only one"]))
    assert_check_fails(lambda: f(-1.0, 4), "only 1 messages")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: error_if(1.0, jnp.array(1.0), "m"), TypeError, "`pred` to be a boolean"),
        (lambda: error_if(1.0, jnp.array([0, 1]), "m"), TypeError, "x != 0"),
        (lambda: error_if(1.0, False, 3), TypeError, "`msg` to be a str"),
        (lambda: branched_error_if(1.0, False, 0, []), ValueError, "empty `msgs`"),
        (lambda: branched_error_if(1.0, False, 0, "ab"), TypeError, "sequence of strings"),
        (lambda: branched_error_if(1.0, False, 0, ["a", 2]), TypeError, "message 1"),
        (lambda: branched_error_if(1.0, False, 0.5, ["a"]), TypeError, "`index` to be an integer"),
        (lambda: branched_error_if(1.0, False, True, ["a"]), TypeError, "`index` to be an integer"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_check_with_no_array_to_tie_to_is_refused():
    with pytest.raises(ValueError, match="needs an array in `x`"):
        jax.jit(lambda p: error_if("text", p, "m"))(jnp.array(True))


def test_an_unknown_mode_is_refused(monkeypatch):
    monkeypatch.setenv("PYTREE_TRANSFORMS_ON_ERROR", "warn")
    with pytest.raises(ValueError, match="PYTREE_TRANSFORMS_ON_ERROR is 'warn'"):
        error_if(1.0, False, "m")


def test_mode_nan_poisons_only_the_failing_values(monkeypatch):
    monkeypatch.setenv("PYTREE_TRANSFORMS_ON_ERROR", "nan")
    out = jax.jit(jax.vmap(lambda x: error_if(x, x < 0, "neg")))(jnp.array([1.0, -1.0]))
    assert np.isnan(out[1]) and out[0] == 1.0
    tree = {"f": jnp.array([1.0, -1.0]), "i": jnp.array([1, 2]), "b": jnp.array(False)}
    out = jax.jit(lambda t: error_if(t, t["f"] < 0, "neg"))(tree)
    assert np.isnan(out["f"]).all()
    assert out["i"].tolist() == [np.iinfo(np.int32).max] * 2 and out["b"]
    assert jax.jit(lambda x: error_if(x, x < 0, "neg"))(2.0) == 2.0
    with pytest.warns(UserWarning, match="NaNs now") as record:
        assert np.isnan(error_if(jnp.array(-1.0), jnp.array(True), "neg"))
    assert record[0].filename == __file__


def test_mode_off_removes_the_check(monkeypatch):
    monkeypatch.setenv("PYTREE_TRANSFORMS_ON_ERROR", "off")
    assert jax.jit(lambda x: error_if(x, x < 0, "neg"))(-1.0) == -1.0
    assert "cond" not in str(jax.make_jaxpr(lambda x: error_if(x, x < 0, "neg"))(-1.0))


def test_the_mode_is_read_when_the_check_is_traced(monkeypatch):
    f = jax.jit(lambda x: error_if(x, x < 0, "neg"))
    assert f(1.0) == 1.0
    monkeypatch.setenv("PYTREE_TRANSFORMS_ON_ERROR", "off")
    # Compiled while the mode was `raise`: the compiled check stays.
    assert_check_fails(lambda: f(-1.0), "neg")
    pt.clear_caches()
    assert f(-1.0) == -1.0


def test_mode_breakpoint_opens_the_debugger_then_goes_on_with_nans():
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from pytree_transforms import error_if

        def check(x):
            return error_if(x, x < 0, "x must be nonnegative")

        print("result", jax.jit(check)(jnp.array(-1.0)))
        """
    )
    env = dict(os.environ, PYTREE_TRANSFORMS_ON_ERROR="breakpoint")
    done = subprocess.run(
        [sys.executable, "-c", script],
        input="x\nc\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "RuntimeCheckError: x must be nonnegative" in done.stderr
    # The debugger shows the user's frame, whose `x` is printed on request.
    assert "(jdb)" in done.stdout and "Array(-1., dtype=float32)" in done.stdout
    assert "result nan" in done.stdout


def test_a_backend_going_on_past_a_failed_check_gets_poisoned_values(monkeypatch):
    # GPUs run programs asynchronously: the callback's failure does not stop the call.
    # On a backend that goes on past it, what comes out of the check must be poisoned,
    # never `x`'s own values (nor the zeros a skipped callback may leave), which look valid.
    with simulated_accelerator(monkeypatch, raises_at_wait=False):

        @jax.jit
        def checked(x, n):
            x, n = error_if((x, n), x < 0, "x must be nonnegative")
            return x, n

        x, n = checked(jnp.array([1.0, -2.0]), jnp.array(3))
        assert np.isnan(x).all() and int(n) == np.iinfo(np.int32).max
        x, n = checked(jnp.array([1.0, 2.0]), jnp.array(3))  # passing checks are untouched
        assert x.tolist() == [1.0, 2.0] and int(n) == 3


def _failing_checks():
    """Calls that fail a check, made afresh (traced under the simulation), with the message
    each fails with."""
    nonnegative = jax.jit(lambda x: error_if(x, x < 0, "x must be nonnegative") * 2)
    branched = jax.jit(lambda x: branched_error_if(x, x > 1, 1, ["small", "x is too large"]))
    grad_of_linear = jax.jit(jax.grad(lambda x: jnp.sum(3.0 * error_if(x, x < 0, "linear"))))
    nan_cotangent = jax.jit(jax.grad(lambda x: jnp.sum(0 * jnp.log(backward_nan(x)))))
    filtered = pt.filter_jit(lambda x: jax.vmap(lambda y: error_if(y, y < 0, "vmapped"))(x))
    return [
        (lambda: nonnegative(jnp.array([1.0, -1.0])), "x must be nonnegative", True),
        (lambda: branched(jnp.array(3.0)), "x is too large", True),
        (lambda: grad_of_linear(jnp.array([-1.0])), "linear", False),
        (lambda: nan_cotangent(jnp.array([0.0, 2.0])), "cotangent has a NaN", True),
        (lambda: filtered(jnp.array([1.0, -1.0])), "vmapped", True),
    ]


@pytest.mark.parametrize("raises_at_wait", [True, False], ids=["raises-at-wait", "goes-on"])
def test_failed_checks_are_asserted_as_an_accelerator_reports_them(monkeypatch, raises_at_wait):
    with simulated_accelerator(monkeypatch, raises_at_wait=raises_at_wait):
        for call, message, poisons in _failing_checks():
            if raises_at_wait or poisons:
                error = assert_check_fails(call, message)
                assert (error is None) == (not raises_at_wait)
            else:
                # Lost: not raised, and the gradient does not use the poisoned value.
                with pytest.raises(AssertionError, match="the check did not fail"):
                    assert_check_fails(call, message)
