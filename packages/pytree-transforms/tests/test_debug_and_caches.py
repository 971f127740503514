"""clear_caches, donate="warn-except-first", nondifferentiable(_backward) and the debug tools."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import pytree_transforms
from pytree_module import Module
from pytree_transforms import (
    clear_caches,
    filter_grad,
    filter_jit,
    nondifferentiable,
    nondifferentiable_backward,
)
from pytree_transforms.debug import assert_max_traces, get_num_traces


def run_in_a_fresh_interpreter(script: str) -> str:
    """What `script` prints, run by a new Python process.

    Tracing `jax.debug.breakpoint` (as `breakpoint_if` does) collects every frame of the
    calling stack with its locals. In a long-lived test process that has run thousands of
    tests, this has been seen to leave the interpreter's C recursion budget spent
    (Python 3.12 under pytest-xdist): every later test of that process then fails with
    `RecursionError` at a shallow depth. A process of its own keeps the rest of the suite
    out of it.
    """
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_new_names_are_exported():
    assert pytree_transforms.debug.assert_max_traces is assert_max_traces
    for name in ("clear_caches", "nondifferentiable", "nondifferentiable_backward", "debug"):
        assert hasattr(pytree_transforms, name)


# clear_caches


def test_a_wrapper_traces_again_after_clear_caches(counting):
    fun, traces = counting(lambda x, n: x * n)
    jitted = filter_jit(fun)
    jitted(jnp.ones(2), 3)
    jitted(jnp.ones(2), 3)
    assert len(traces) == 1
    clear_caches()
    assert jitted(jnp.ones(2), 3).tolist() == [3.0, 3.0]
    assert len(traces) == 2


def test_a_wrapper_built_again_after_clear_caches_is_a_new_one():
    fun = lambda x: x + 1  # noqa: E731
    first = filter_jit(fun, args=(True,))
    assert filter_jit(fun, args=(True,)) is first
    clear_caches()
    assert filter_jit(fun, args=(True,)) is not first


def test_clear_caches_clears_jax_caches_too(counting):
    fun, traces = counting(lambda x: x + 1)
    jitted = jax.jit(fun)
    jitted(jnp.ones(2))
    clear_caches()
    jitted(jnp.ones(2))
    assert len(traces) == 2


def test_calls_with_shared_objects_work_after_clear_caches():
    @filter_jit
    def f(a, b):
        return a + b

    x = jnp.ones(2)
    f(x, x)
    clear_caches()
    assert f(x, x).tolist() == [2.0, 2.0]


# donate="warn-except-first"


def test_warn_except_first_keeps_the_first_argument_and_donates_the_rest():
    f = filter_jit(lambda keep, give: keep + give, donate="warn-except-first")
    keep, give = jnp.ones(3), jnp.ones(3)
    text = f.lower(keep, give).as_text()
    assert text.count("tf.aliasing_output") == 1  # `give` only
    assert f(keep, give).tolist() == [2.0] * 3
    assert not keep.is_deleted()


def test_warn_except_first_warns_of_an_unusable_donation_instead_of_failing():
    f = filter_jit(lambda keep, give: keep.sum() + give.sum(), donate="warn-except-first")
    with pytest.warns(UserWarning, match="donated buffers were not usable"):
        assert f(jnp.ones(3), jnp.ones(3)).item() == 6.0


def test_a_bad_donate_value_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="'warn-except-first'") as info:
        filter_jit(lambda x: x, donate="warn-first")
    for allowed in ("'none'", "'all'", "'all-except-first'", "'warn'"):
        assert allowed in str(info.value)


# nondifferentiable


def test_nondifferentiable_is_the_identity_on_any_pytree():
    tree = {"x": jnp.arange(3.0), "label": "a", "n": 2}
    out = nondifferentiable(tree)
    assert out["label"] == "a" and out["n"] == 2
    assert out["x"].tolist() == [0.0, 1.0, 2.0]
    assert filter_jit(nondifferentiable)(tree)["x"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "differentiate",
    [
        lambda f: jax.grad(f)(2.0),
        lambda f: jax.jvp(f, (2.0,), (1.0,)),
        lambda f: filter_grad(f)(jnp.array(2.0)),
    ],
    ids=["grad", "jvp", "filter_grad"],
)
def test_nondifferentiable_refuses_forward_and_reverse_mode(differentiate):
    def f(x):
        return nondifferentiable(x, name="the step count") * 3

    with pytest.raises(RuntimeError, match="the step count cannot be differentiated") as info:
        differentiate(f)
    assert "stop_gradient" in str(info.value)


def test_nondifferentiable_has_a_default_name():
    with pytest.raises(RuntimeError, match="A value marked `nondifferentiable`"):
        jax.grad(nondifferentiable)(1.0)


def test_nondifferentiable_allows_derivatives_that_do_not_reach_it():
    def f(x, y):
        return x * nondifferentiable(y)

    assert jax.grad(f)(1.0, 3.0) == 3.0
    assert jax.grad(lambda x: x * nondifferentiable(jax.lax.stop_gradient(x)))(2.0) == 2.0


# nondifferentiable_backward


def test_nondifferentiable_backward_lets_forward_mode_through():
    def f(x):
        return nondifferentiable_backward(x) ** 2

    primal, tangent = jax.jvp(f, (3.0,), (1.0,))
    assert (primal, tangent) == (9.0, 6.0)
    assert jax.jacfwd(jax.jit(f))(3.0) == 6.0
    assert jax.vmap(f)(jnp.arange(3.0)).tolist() == [0.0, 1.0, 4.0]


def test_nondifferentiable_backward_under_jvp_gives_back_python_scalars_as_python_scalars():
    # As `jax.jvp(lambda x: x, ...)`: not JAX's internal scalar types (`TypedFloat`).
    for value in (1.0, 1.0 + 2.0j):
        out = jax.jvp(nondifferentiable_backward, (value,), (value,))
        assert [type(o) for o in out] == [type(value)] * 2 and out == (value, value), out
    primal, tangent = jax.jvp(nondifferentiable_backward, (jnp.ones(2),), (jnp.ones(2),))
    assert isinstance(primal, jax.Array) and isinstance(tangent, jax.Array)


@pytest.mark.parametrize(
    "differentiate",
    [
        lambda f: jax.grad(f)(2.0),
        lambda f: jax.vjp(f, 2.0)[1](1.0),
        lambda f: jax.jacrev(jax.jit(f))(2.0),
    ],
    ids=["grad", "vjp", "jacrev-of-jit"],
)
def test_nondifferentiable_backward_refuses_reverse_mode(differentiate):
    def f(x):
        return nondifferentiable_backward({"v": x, "tag": "t"}, name="the solver state")["v"]

    with pytest.raises(RuntimeError, match="the solver state cannot be differentiated in reverse"):
        differentiate(f)


def test_nondifferentiable_backward_allows_a_cotangent_that_does_not_reach_it():
    def f(x):
        marked = nondifferentiable_backward(x, name="unused")
        return x * 2 + 0 * jax.lax.stop_gradient(marked)

    assert jax.grad(f)(1.0) == 2.0


# assert_max_traces and get_num_traces


def test_assert_max_traces_raises_on_a_retrace_and_counts_traces():
    @filter_jit
    @assert_max_traces(max_traces=1)
    def double(x):
        return 2 * x

    double(jnp.ones(2))
    double(jnp.zeros(2))
    assert get_num_traces(double) == 1
    with pytest.raises(RuntimeError, match=r"at most 1 time.*this is trace 2"):
        double(jnp.ones(3))
    assert get_num_traces(double) == 2


def test_assert_max_traces_with_none_only_counts():
    counted = assert_max_traces(lambda x: x + 1, max_traces=None)
    jitted = jax.jit(counted)
    for n in (1, 2, 3):
        jitted(jnp.ones(n))
    assert get_num_traces(counted) == get_num_traces(jitted) == 3


def test_each_wrapper_counts_its_own_traces():
    def f(x):
        return x

    first = filter_jit(assert_max_traces(f, max_traces=1))
    second = filter_jit(assert_max_traces(f, max_traces=1))
    first(jnp.ones(1))
    second(jnp.ones(1))
    assert get_num_traces(first) == get_num_traces(second) == 1


def test_assert_max_traces_wraps_a_module_whose_arrays_stay_traced():
    class Scale(Module):
        factor: jax.Array

        def __call__(self, x):
            return self.factor * x

    step = filter_jit(assert_max_traces(Scale(jnp.array(2.0)), max_traces=1))
    assert step(jnp.ones(2)).tolist() == [2.0, 2.0]
    other = filter_jit(assert_max_traces(Scale(jnp.array(5.0)), max_traces=1))
    assert other(jnp.ones(2)).tolist() == [5.0, 5.0]


def test_assert_max_traces_binds_as_a_method():
    class Model:
        scale = 3

        @assert_max_traces(max_traces=None)
        def apply(self, x):
            return self.scale * x

    assert Model().apply(2) == 6


def test_get_num_traces_of_an_unwrapped_function_says_how_to_wrap_it():
    with pytest.raises(ValueError, match="not wrapped in `assert_max_traces`"):
        get_num_traces(filter_jit(lambda x: x))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_assert_max_traces_refuses_a_bad_count(bad):
    with pytest.raises(ValueError, match="an int >= 0"):
        assert_max_traces(lambda x: x, max_traces=bad)


# breakpoint_if


def test_breakpoint_if_with_a_false_predicate_runs_under_jit():
    # In a fresh interpreter (see `run_in_a_fresh_interpreter`).
    script = """
import jax.numpy as jnp
from pytree_transforms import filter_jit
from pytree_transforms.debug import breakpoint_if

@filter_jit
def f(x):
    breakpoint_if(x.sum() > 100)
    breakpoint_if(x > 100)  # an array predicate: any element
    return x + 1

print(f(jnp.ones(2)).tolist())
"""
    assert run_in_a_fresh_interpreter(script) == "[2.0, 2.0]"


@pytest.mark.parametrize("mark", [nondifferentiable, nondifferentiable_backward])
def test_a_name_that_is_not_a_str_is_refused(mark):
    with pytest.raises(TypeError, match=r"\(name=\.\.\.\) must be a str .* got int 5"):
        mark(1.0, name=5)
