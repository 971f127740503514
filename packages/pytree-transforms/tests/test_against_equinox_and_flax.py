"""filter_jit side by side with Equinox's, where Equinox has the behaviour."""

import jax
import jax.numpy as jnp
import pytest

eqx = pytest.importorskip("equinox")

from pytree_transforms import filter_jit  # noqa: E402


@pytest.mark.parametrize("jit", [filter_jit, eqx.filter_jit], ids=["ours", "equinox"])
def test_a_wrapper_built_in_a_loop_traces_once(jit, counting):
    fun, traces = counting(lambda x, n: x * n)
    for _ in range(3):
        jit(fun)(jnp.ones(2), 3)
    assert len(traces) == 1


@pytest.mark.parametrize("jit", [filter_jit, eqx.filter_jit], ids=["ours", "equinox"])
def test_compile_takes_compiler_options(jit):
    lowered = jit(lambda x, n: x * n).lower(jnp.ones(2), 3)
    compiled = lowered.compile(compiler_options={"xla_backend_optimization_level": 0})
    assert compiled(jnp.ones(2), 3).tolist() == [3.0, 3.0]
    assert "multiply" in lowered.as_text()


def test_jax_errors_name_the_function_as_equinox_does():
    def branch(x, name):
        if x > 0:
            return x
        return -x

    for jit in (filter_jit, eqx.filter_jit):
        with pytest.raises(jax.errors.TracerBoolConversionError, match="function branch at"):
            jit(branch)(jnp.ones(()), "s")
