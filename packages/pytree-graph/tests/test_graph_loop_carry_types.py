"""The graph loops' carries follow `jax.lax`: Python numbers carried as weakly typed arrays,
weakly typed values taking the dtype the step gives them, outputs with the step's weak types;
a step that changes a carried array's shape or dtype otherwise is refused naming where."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pytree_graph as pg
from pytree_graph import Variable
from pytree_module import Module

BF16 = jnp.bfloat16(1)


def kinds_of(x):
    return (str(jnp.result_type(x)), jax.typeof(x).weak_type)


CASES = {
    "float times two": (0.5, lambda c: c * 2),
    "float plus float32": (0.5, lambda c: c + jnp.float32(1)),
    "float plus bfloat16": (0.5, lambda c: c + BF16),
    "int plus a half": (0, lambda c: c + 0.5),
    "int plus one": (0, lambda c: c + 1),
    "bool": (True, lambda c: ~c),
    "numpy array": (np.ones(2, np.float32), lambda c: c * 2),
    "strong to weak": (jnp.float32(1), lambda c: 2.0),
}
REFUSED = {
    "float to int": (0.5, lambda c: jnp.int32(1), r"from float32\[\] to int32\[\]"),
    "float to a vector": (0.5, lambda c: jnp.zeros(2), r"from float32\[\] to float32\[2\]"),
    "strong int to float": (jnp.int32(0), lambda c: c + 0.5, r"from int32\[\] to float32\[\]"),
}
LOOPS = {
    "while_loop": (
        lambda i, b: pg.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, b(s[1])), (0, i)),
        lambda i, b: lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, b(s[1])), (0, i)),
        r"while_loop: body_fun changed the array at \[1\] ",
    ),
    "fori_loop": (
        lambda i, b: pg.fori_loop(0, 3, lambda _, c: b(c), i),
        lambda i, b: lax.fori_loop(0, 3, lambda _, c: b(c), i),
        r"fori_loop: body_fun changed the array at the top level of the carry ",
    ),
    "scan": (
        lambda i, b: pg.scan(lambda c, x: (b(c), c), i, length=3),
        lambda i, b: lax.scan(lambda c, x: (b(c), c), i, length=3),
        r"scan: f changed the array at the top level of the carry ",
    ),
    "scan with in_axes": (
        lambda i, b: pg.scan(
            lambda c, x: (b(c), c), in_axes=(pg.Carry, None), out_axes=(pg.Carry, 0), length=3
        )(i, None),
        lambda i, b: lax.scan(lambda c, x: (b(c), c), i, length=3),
        r"scan: the function changed the array at argument 0 ",
    ),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_carry_types_as_lax(loop, case, jit):
    run, reference, _ = LOOPS[loop]
    init, body = CASES[case]
    if jit:
        run, reference = jax.jit(run, static_argnums=1), jax.jit(reference, static_argnums=1)
    got, want = run(init, body), reference(init, body)
    assert jax.tree.map(kinds_of, got) == jax.tree.map(kinds_of, want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_carry_type_changes_refused_naming_the_place(loop, case):
    run, reference, where = LOOPS[loop]
    init, body, message = REFUSED[case]
    with pytest.raises(TypeError):
        reference(init, body)
    with pytest.raises(ValueError, match=where + message):
        run(init, body)


def test_variable_in_a_carry_is_named_by_its_path():
    class Counter(Module):
        def __init__(self):
            self.count = Variable(jnp.int32(0))

    def body(c):
        c.count.value = c.count.value + 0.5
        return c

    with pytest.raises(ValueError, match=r"changed the array at \.count from int32\[\] to float32"):
        pg.while_loop(lambda c: c.count.value < 3, body, Counter())


def test_bfloat16_xs_give_bfloat16_ys():
    xs = jnp.arange(4, dtype=jnp.bfloat16)
    for fun in (pg.scan, jax.jit(pg.scan, static_argnums=0)):
        total, ys = fun(lambda c, x: (c + x, c + x), 0.0, xs)
        assert total.dtype == ys.dtype == jnp.bfloat16 and float(total) == 6.0
