"""Side by side with Flax NNX, where pytree_graph follows it (runs in the bench environment:
`hatch run bench:pytest packages/pytree-graph/tests/test_against_equinox_and_flax.py`)."""

import warnings

import pytest

pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def test_indexed_assignment_writes_into_the_array_as_in_nnx():
    ours, theirs = pg.Param(jnp.zeros(3)), nnx.Param(jnp.zeros(3))
    for index, value in [(..., 1.0), (0, 5.0), (slice(1, None), jnp.array([7.0, 8.0]))]:
        ours[index] = value
        theirs[index] = value
        assert ours.value.tolist() == theirs.value.tolist()
        assert ours.value.shape == theirs.value.shape == (3,)
    assert float(ours[0]) == float(theirs[0]) == 5.0
    assert ours[...].tolist() == theirs[...].tolist()


def test_grad_of_a_param_holding_a_python_float_as_in_nnx():
    class Ours(Module):
        def __init__(self):
            self.p = pg.Param(1.5)

    class Theirs(nnx.Module):
        def __init__(self):
            self.p = nnx.Param(1.5)

    ours = pg.grad(lambda m: m.p.value * 2.0)(Ours())
    theirs = nnx.grad(lambda m: m.p.value * 2.0)(Theirs())
    assert float(ours["p"].value) == float(theirs["p"].value) == 2.0
    ours = pg.grad(lambda d: d["p"].value * 2.0)({"p": pg.Param(1.5)})
    theirs = nnx.grad(lambda d: d["p"].value * 2.0)({"p": nnx.Param(1.5)})
    assert float(ours["p"].value) == float(theirs["p"].value) == 2.0


@pytest.mark.parametrize("argnums", [0, 1])
def test_a_variable_differentiated_through_one_argument_only_is_refused_as_in_nnx(argnums):
    def f(a, b):
        return a.value * b.value

    w, v = pg.Param(jnp.array(2.0)), nnx.Param(jnp.array(2.0))
    with pytest.raises(ValueError, match="one object"):
        pg.grad(f, argnums=argnums)(w, w)
    with pytest.raises(ValueError, match="Inconsistent aliasing"):
        nnx.grad(f, argnums=argnums)(v, v)


def test_two_in_axes_for_one_shared_variable_are_refused_as_in_nnx():
    class Ours(Module):
        def __init__(self):
            self.w = pg.Param(jnp.ones((2, 2)))

    class Theirs(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones((2, 2)))

    ours, theirs = Ours(), Theirs()
    with pytest.raises(ValueError, match=r"in_axes gives it two specs:\n.*: 0\n.*: 1\n"):
        pg.vmap(lambda a, b: a.w.value, in_axes=(0, 1))(ours, ours)
    with pytest.raises(ValueError, match="Inconsistent aliasing"):
        nnx.vmap(lambda a, b: a.w.value, in_axes=(0, 1))(theirs, theirs)


def test_everything_before_another_filter_is_refused_as_in_nnx():
    class Ours(Module):
        def __init__(self):
            self.w = pg.Param(jnp.ones(2))

    class Theirs(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(2))

    with pytest.raises(ValueError, match="must come last"):
        pg.split(Ours(), ..., pg.Param)
    with pytest.raises(ValueError, match="can only be used as the last filters"):
        nnx.split(Theirs(), ..., nnx.Param)


def test_loops_carry_python_numbers_as_in_nnx():
    ours = pg.fori_loop(0, 3, lambda i, c: c + 1, 0)
    theirs = nnx.fori_loop(0, 3, lambda i, c: c + 1, 0)
    assert int(ours) == int(theirs) == 3 and ours.dtype == theirs.dtype


def test_jit_on_init_as_in_nnx():
    class Ours(Module):
        @pg.jit
        def __init__(self, x):
            self.w = pg.Param(x * 2)
            self.n = 3

    class Theirs(nnx.Module):
        @nnx.jit
        def __init__(self, x):
            self.w = nnx.Param(x * 2)
            self.n = 3

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = Ours(jnp.ones(2)), Theirs(jnp.ones(2))
    for built in (ours, theirs):
        assert isinstance(built.w.value, jax.Array)
        assert not isinstance(built.w.value, jax.core.Tracer)
        assert built.w.value.tolist() == [2.0, 2.0] and built.n == 3
