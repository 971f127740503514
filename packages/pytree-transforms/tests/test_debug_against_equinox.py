"""clear_caches, donate="warn-except-first", nondifferentiable(_backward) and the debug tools,
side by side with Equinox's."""

import jax
import jax.numpy as jnp
import pytest

eqx = pytest.importorskip("equinox")

import pytree_transforms as pt  # noqa: E402

JITS = pytest.mark.parametrize("jit", [pt.filter_jit, eqx.filter_jit], ids=["ours", "equinox"])


def _clear_ours():
    pt.clear_caches()


def _clear_equinox():
    # Equinox's clears only its own caches; ours calls `jax.clear_caches()` too.
    eqx.clear_caches()
    jax.clear_caches()


@pytest.mark.parametrize(
    ("jit", "clear"),
    [(pt.filter_jit, _clear_ours), (eqx.filter_jit, _clear_equinox)],
    ids=["ours", "equinox"],
)
def test_a_wrapper_traces_again_after_clearing_the_caches(jit, clear, counting):
    fun, traces = counting(lambda x, n: x * n)
    jitted = jit(fun)
    jitted(jnp.ones(2), 3)
    jitted(jnp.ones(2), 3)
    clear()
    jitted(jnp.ones(2), 3)
    assert len(traces) == 2
    # A wrapper made after the clearing is a new one, with compilations of its own.
    jit(fun)(jnp.ones(2), 3)
    assert len(traces) == 3


@JITS
def test_warn_except_first_donates_all_but_the_first_argument(jit):
    f = jit(lambda keep, give: keep + give, donate="warn-except-first")
    keep, give = jnp.ones(3), jnp.ones(3)
    assert f.lower(keep, give).as_text().count("tf.aliasing_output") == 1
    assert f(keep, give).tolist() == [2.0] * 3
    assert not keep.is_deleted()


@JITS
def test_warn_except_first_warns_of_an_unusable_donation(jit):
    f = jit(lambda keep, give: keep.sum() + give.sum(), donate="warn-except-first")
    with pytest.warns(UserWarning, match="donated buffers were not usable"):
        assert f(jnp.ones(3), jnp.ones(3)).item() == 6.0


@JITS
def test_a_bad_donate_value_is_a_value_error(jit):
    with pytest.raises(ValueError, match="warn-except-first"):
        jit(lambda x: x, donate="warn-first")


@pytest.mark.parametrize(
    "mark",
    [pt.nondifferentiable, eqx.internal.nondifferentiable],
    ids=["ours", "equinox"],
)
def test_nondifferentiable_refuses_both_modes_and_is_the_identity(mark):
    tree = mark({"x": jnp.arange(2.0), "label": "a"}, name="the step")
    assert tree["label"] == "a" and tree["x"].tolist() == [0.0, 1.0]

    def f(x):
        return mark(x, name="the step") * 2

    with pytest.raises(RuntimeError, match="the step"):
        jax.grad(f)(1.0)
    with pytest.raises(RuntimeError, match="the step"):
        jax.jvp(f, (1.0,), (1.0,))
    assert jax.grad(lambda x, y: x * mark(y))(1.0, 3.0) == 3.0


@pytest.mark.parametrize(
    "mark",
    [pt.nondifferentiable_backward, eqx.internal.nondifferentiable_backward],
    ids=["ours", "equinox"],
)
def test_nondifferentiable_backward_refuses_only_reverse_mode(mark):
    def f(x):
        return mark({"v": x, "tag": "t"}, name="the state")["v"] ** 2

    assert jax.jvp(f, (3.0,), (1.0,)) == (9.0, 6.0)
    assert jax.vmap(f)(jnp.arange(3.0)).tolist() == [0.0, 1.0, 4.0]
    with pytest.raises(RuntimeError, match="the state"):
        jax.grad(f)(3.0)
    with pytest.raises(RuntimeError, match="the state"):
        jax.vjp(jax.jit(f), 3.0)[1](1.0)


@pytest.mark.parametrize(
    ("jit", "debug"),
    [(pt.filter_jit, pt.debug), (eqx.filter_jit, eqx.debug)],
    ids=["ours", "equinox"],
)
def test_assert_max_traces_and_get_num_traces(jit, debug):
    @jit
    @debug.assert_max_traces(max_traces=1)
    def double(x):
        return 2 * x

    double(jnp.ones(2))
    double(jnp.zeros(2))
    assert debug.get_num_traces(double) == 1
    with pytest.raises(RuntimeError, match="traced"):
        double(jnp.ones(3))
    assert debug.get_num_traces(double) == 2

    counted = debug.assert_max_traces(lambda x: x, max_traces=None)
    for n in (1, 2, 3):
        jax.jit(counted)(jnp.ones(n))
    assert debug.get_num_traces(counted) == 3
    with pytest.raises(ValueError, match="assert_max_traces"):
        debug.get_num_traces(jit(lambda x: x))


@pytest.mark.parametrize(
    ("jit", "debug"),
    [(pt.filter_jit, pt.debug), (eqx.filter_jit, eqx.debug)],
    ids=["ours", "equinox"],
)
def test_breakpoint_if_with_a_false_predicate_runs_under_jit(jit, debug):
    @jit
    def f(x):
        debug.breakpoint_if(x.sum() > 100)
        return x + 1

    assert f(jnp.ones(2)).tolist() == [2.0, 2.0]
