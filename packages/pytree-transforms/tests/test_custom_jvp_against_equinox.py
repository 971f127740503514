"""`filter_custom_jvp(...).def_jvp` and `filter_jvp`'s errors, side by side with Equinox."""

import jax
import jax.numpy as jnp
import pytest

import pytree_transforms as pt

eqx = pytest.importorskip("equinox")


def _with_rule(filter_custom_jvp):
    @filter_custom_jvp
    def call(x, y, *, fn):
        return fn(x, y)

    @call.def_jvp
    def call_jvp(primals, tangents, *, fn):
        x, y = primals
        tx, ty = tangents
        return call(x, y, fn=fn), tx**2 + (0.0 if ty is None else ty)

    return call


def _square_plus(a, b):
    return a**2 + b


def _jvp_of(call, x, y, tx, ty):
    if ty is None:  # y is not differentiated
        return jax.jvp(lambda a: call(a, y, fn=_square_plus), (x,), (tx,))
    return jax.jvp(lambda a, b: call(a, b, fn=_square_plus), (x, y), (tx, ty))


def test_def_jvp_gives_equinox_numbers():
    ours, theirs = _with_rule(pt.filter_custom_jvp), _with_rule(eqx.filter_custom_jvp)
    for call in (ours, theirs):
        assert float(call(jnp.asarray(1.0), 2.0, fn=_square_plus)) == 3.0
    for args in ((2.0, 1.5, 3.0, 4.0), (2.0, 1, 3.0, None)):
        (o1, t1), (o2, t2) = _jvp_of(ours, *args), _jvp_of(theirs, *args)
        assert float(o1) == float(o2) and float(t1) == float(t2)


@pytest.mark.parametrize(
    "primal, tangent",
    [
        (jnp.array(1), jnp.array(1.0)),  # an integer array cannot be perturbed
        (object(), object()),  # neither can a non-array
    ],
)
def test_filter_jvp_refuses_a_tangent_for_an_unperturbable_primal_with_a_type_error(
    primal, tangent
):
    def first(x, p):
        return x

    for filter_jvp in (pt.filter_jvp, eqx.filter_jvp):
        with pytest.raises(TypeError):
            filter_jvp(first, (1.0, primal), (1.0, tangent))
