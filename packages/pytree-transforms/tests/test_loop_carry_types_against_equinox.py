"""Carry types of `while_loop` and `scan` side by side with Equinox's
`equinox.internal.while_loop` / `scan` and `jax.lax`: Python numbers carried as (weakly
typed) arrays, the same dtypes and weak types where Equinox agrees with `jax.lax`, and
`jax.lax`'s promotion of weakly typed leaves where Equinox refuses it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pytree_transforms import scan, while_loop

eqxi = pytest.importorskip("equinox.internal")


def kinds_of(x):
    return (str(jnp.result_type(x)), jax.typeof(x).weak_type)


# Steps whose carry types Equinox's loops give as jax.lax does.
AGREED = {
    "float times two": (0.5, lambda c: c * 2),
    "int plus one": (0, lambda c: c + 1),
    "bool": (True, lambda c: ~c),
    "complex": (1j, lambda c: c * 2),
    "numpy float64": (np.float64(1), lambda c: c * 2),
    "numpy array": (np.ones(2, np.float32), lambda c: c * 2),
    "strong float32": (jnp.float32(1), lambda c: c + 1.0),
}
# Steps that give a weakly typed leaf another dtype: jax.lax promotes it, Equinox refuses.
PROMOTED = {
    "float plus bfloat16": (0.5, lambda c: c + jnp.bfloat16(1)),
    "int plus a half": (0, lambda c: c + 0.5),
}


def ours_while(kind):
    def run(init, body):
        return while_loop(
            lambda s: s[0] < 3, lambda s: (s[0] + 1, body(s[1])), (0, init), kind=kind, max_steps=5
        )

    return run


def equinox_while(kind):
    def run(init, body):
        return eqxi.while_loop(
            lambda s: s[0] < 3, lambda s: (s[0] + 1, body(s[1])), (0, init), kind=kind, max_steps=5
        )

    return run


def lax_while(init, body):
    return lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, body(s[1])), (0, init))


def _check_same(got, want):
    assert jax.tree.map(kinds_of, got) == jax.tree.map(kinds_of, want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", list(AGREED))
@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_while_loop_carry_types_as_equinox(kind, case, jit):
    init, body = AGREED[case]
    ours, theirs = ours_while(kind), equinox_while(kind)
    if jit:
        ours, theirs = jax.jit(ours, static_argnums=1), jax.jit(theirs, static_argnums=1)
    _check_same(ours(init, body), theirs(init, body))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", list(AGREED))
def test_scan_carry_types_as_equinox(case, jit):
    init, body = AGREED[case]

    def ours(init, body):
        return scan(lambda c, x: (body(c), c), init, length=3)

    def theirs(init, body):
        return eqxi.scan(lambda c, x: (body(c), c), init, None, length=3, kind="lax")

    if jit:
        ours, theirs = jax.jit(ours, static_argnums=1), jax.jit(theirs, static_argnums=1)
    _check_same(ours(init, body), theirs(init, body))


@pytest.mark.parametrize("case", list(PROMOTED))
@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_weak_leaves_promote_as_jax_lax_where_equinox_refuses(kind, case):
    init, body = PROMOTED[case]
    with pytest.raises(ValueError, match="same input and output structure"):
        equinox_while(kind)(init, body)
    _check_same(ours_while(kind)(init, body), lax_while(init, body))


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_python_counter_values_and_gradients_as_equinox(kind):
    def loss(loop, x):
        def body(c):
            k, y = c
            return k + 1, y * x + k

        return loop(lambda c: c[0] < 4, body, (0, 1.0), kind=kind, max_steps=6)

    x = jnp.float32(0.7)
    ours, theirs = loss(while_loop, x), loss(eqxi.while_loop, x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    # Types as jax.lax gives them (Equinox's "bounded" keeps the initial weak type of `y`).
    want = lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] * x + c[0]), (0, 1.0))
    assert jax.tree.map(kinds_of, ours) == jax.tree.map(kinds_of, want)
    if kind != "lax":
        got = jax.grad(lambda x: loss(while_loop, x)[1])(x)
        want = jax.grad(lambda x: loss(eqxi.while_loop, x)[1])(x)
        np.testing.assert_allclose(got, want, rtol=1e-6)
