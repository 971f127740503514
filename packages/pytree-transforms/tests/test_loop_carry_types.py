"""Loop carries follow `jax.lax`: Python numbers are carried as weakly typed arrays, a weakly
typed leaf takes the dtype its step gives it, and the outputs keep the step's weak types;
for every loop and every `kind`, eagerly and under `jit`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pytree_module import Module, tree_at
from pytree_transforms import apply_updates, fori_loop, scan, while_loop

BF16 = jnp.bfloat16(1)


def weak(x):
    return jax.typeof(x).weak_type


def kinds_of(x):
    """A carry leaf's dtype and weak type, as one comparable value."""
    return (str(jnp.result_type(x)), weak(x))


# (initial value, step): what lax gives for each is the reference.
CASES = {
    "float times two": (0.5, lambda c: c * 2),
    "float plus float32": (0.5, lambda c: c + jnp.float32(1)),
    "float plus bfloat16": (0.5, lambda c: c + BF16),
    "float to float16": (0.5, lambda c: c.astype(jnp.float16)),
    "int plus one": (0, lambda c: c + 1),
    "int plus a half": (0, lambda c: c + 0.5),
    "int plus float32": (0, lambda c: c + jnp.float32(0.5)),
    "bool": (True, lambda c: ~c),
    "complex": (1j, lambda c: c * 2),
    "numpy float64": (np.float64(1), lambda c: c * 2),
    "numpy array": (np.ones(2, np.float32), lambda c: c * 2),
    "weak array": (jnp.asarray(1.5) * 1, lambda c: c * 2),
    "strong float32": (jnp.float32(1), lambda c: c + 1.0),
    "strong to weak": (jnp.float32(1), lambda c: 2.0),
}
REFUSED = {
    "float to int": (0.5, lambda c: jnp.int32(1), r"from float32\[\] to int32\[\]"),
    "int to bool": (0, lambda c: c > 0, r"from int32\[\] to bool\[\]"),
    "float to a vector": (0.5, lambda c: jnp.zeros(2), r"from float32\[\] to float32\[2\]"),
    "strong int to float": (jnp.int32(0), lambda c: c + 0.5, r"from int32\[\] to float32\[\]"),
}


def lax_while(init, body):
    return lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, body(s[1])), (0, init))


def lax_scan(init, body):
    return lax.scan(lambda c, x: (body(c), c), init, length=3)


WHILES = {
    kind: lambda init, body, kind=kind: while_loop(
        lambda s: s[0] < 3,
        lambda s: (s[0] + 1, body(s[1])),
        (0, init),
        kind=kind,
        max_steps=5,
    )
    for kind in ("lax", "checkpointed", "bounded")
}
SCANS = {
    kind: lambda init, body, kind=kind: scan(lambda c, x: (body(c), c), init, length=3, kind=kind)
    for kind in ("lax", "checkpointed")
}
FORIS = {
    kind: lambda init, body, kind=kind: fori_loop(0, 3, lambda i, c: body(c), init, kind=kind)
    for kind in ("lax", "checkpointed", "bounded")
}
LOOPS = [
    *[(f"while_loop {k}", run, lax_while) for k, run in WHILES.items()],
    *[(f"scan {k}", run, lax_scan) for k, run in SCANS.items()],
    *[
        (f"fori_loop {k}", run, lambda i, b: lax.fori_loop(0, 3, lambda _, c: b(c), i))
        for k, run in FORIS.items()
    ],
]


def _same_as_lax(run, reference, init, body, jit):
    if jit:
        run, reference = jax.jit(run, static_argnums=1), jax.jit(reference, static_argnums=1)
    got, want = run(init, body), reference(init, body)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert jax.tree.map(kinds_of, got) == jax.tree.map(kinds_of, want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("loop", "run", "reference"), LOOPS, ids=[name for name, *_ in LOOPS])
def test_carry_types_as_lax(loop, run, reference, case, jit):
    init, body = CASES[case]
    _same_as_lax(run, reference, init, body, jit)


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize(("loop", "run", "reference"), LOOPS, ids=[name for name, *_ in LOOPS])
def test_carry_type_changes_refused_as_lax(loop, run, reference, case):
    init, body, message = REFUSED[case]
    with pytest.raises(TypeError):
        reference(init, body)
    with pytest.raises(ValueError, match=r"changed the array at .*" + message):
        run(init, body)


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_python_counter_in_a_while_loop(kind):
    x = jnp.arange(3.0)
    count, y = while_loop(
        lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] + 1), (0, x), kind=kind, max_steps=20
    )
    assert isinstance(count, jax.Array) and count.dtype == jnp.int32 and weak(count)
    assert int(count) == 10
    np.testing.assert_array_equal(y, x + 10)


@pytest.mark.parametrize("kind", ["lax", "checkpointed"])
def test_bfloat16_xs_give_bfloat16_ys(kind):
    xs = jnp.arange(4, dtype=jnp.bfloat16)

    def run(xs):
        return scan(lambda c, x: (c + x, c + x), 0.0, xs, kind=kind)

    for fun in (run, jax.jit(run)):
        total, ys = fun(xs)
        assert total.dtype == ys.dtype == jnp.bfloat16
        assert not weak(total) and not weak(ys)
        assert float(total) == 6.0


@pytest.mark.parametrize("kind", ["lax", "checkpointed"])
def test_int_carry_with_float_xs_under_strict_promotion(kind):
    xs = jnp.arange(4.0)
    with jax.numpy_dtype_promotion("strict"):
        want = lax.scan(lambda c, x: (c + x, c), 0, xs)
        got = scan(lambda c, x: (c + x, c), 0, xs, kind=kind)
        assert jax.tree.map(kinds_of, got) == jax.tree.map(kinds_of, want)
        # A strongly typed int carry is refused by both, as the addition itself is.
        with pytest.raises(ValueError, match="no available implicit dtype promotion"):
            lax.scan(lambda c, x: (c + x, c), jnp.int32(0), xs)
        with pytest.raises(ValueError, match="no available implicit dtype promotion"):
            scan(lambda c, x: (c + x, c), jnp.int32(0), xs, kind=kind)


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_weak_types_under_grad(kind):
    def loss(x):
        def body(c):
            k, y = c
            return k + 1, y * x + 1.0

        k, y = while_loop(lambda c: c[0] < 3, body, (0, 1.0), kind=kind, max_steps=4)
        assert weak(k)
        return y

    def reference(x):
        def step(c, _):
            return (c[0] + 1, c[1] * x + 1.0), None

        return lax.scan(step, (0, 1.0), length=3)[0][1]

    x = jnp.float32(0.5)
    if kind == "lax":
        got, want = jax.jvp(loss, (x,), (1.0,)), jax.jvp(reference, (x,), (1.0,))
    else:
        got, want = jax.value_and_grad(loss)(x), jax.value_and_grad(reference)(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("kind", ["lax", "checkpointed"])
def test_scan_gradient_of_a_promoted_carry(kind):
    xs = jnp.linspace(0.0, 1.0, 5, dtype=jnp.bfloat16)

    def loss(xs):
        total, ys = scan(lambda c, x: (c * 0.5 + x, c), 0.0, xs, kind=kind)
        return total.astype(jnp.float32) + ys.astype(jnp.float32).sum()

    def reference(xs):
        total, ys = lax.scan(lambda c, x: (c * 0.5 + x, c), 0.0, xs)
        return total.astype(jnp.float32) + ys.astype(jnp.float32).sum()

    got, want = jax.grad(loss)(xs), jax.grad(reference)(xs)
    assert got.dtype == want.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_static_leaves_stay_and_must_not_change(kind):
    init = {"n": 0, "name": "step", "f": abs, "flag": None}
    out = while_loop(
        lambda c: c["n"] < 2, lambda c: {**c, "n": c["n"] + 1}, init, kind=kind, max_steps=3
    )
    assert out["name"] == "step" and out["f"] is abs and out["flag"] is None
    assert int(out["n"]) == 2
    with pytest.raises(ValueError, match=r"changed the non-array leaf at \['name'\]"):
        while_loop(
            lambda c: c["n"] < 2,
            lambda c: {**c, "n": c["n"] + 1, "name": "other"},
            init,
            kind=kind,
            max_steps=3,
        )


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_fori_loop_with_traced_bounds(kind):
    def run(n, x):
        return fori_loop(0, n, lambda i, c: (c[0] + i, c[1] * x), (0, 1.0), kind=kind, max_steps=8)

    def reference(n, x):
        return lax.fori_loop(0, n, lambda i, c: (c[0] + i, c[1] * x), (0, 1.0))

    n, x = jnp.int32(4), jnp.float32(2.0)
    got, want = jax.jit(run)(n, x), jax.jit(reference)(n, x)
    assert jax.tree.map(kinds_of, got) == jax.tree.map(kinds_of, want)
    assert (int(got[0]), float(got[1])) == (6, 16.0)
    if kind != "lax":
        grad = jax.grad(lambda x: run(n, x)[1])(x)
        assert float(grad) == 4 * 2.0**3


def test_fori_loop_index_and_options():
    seen = []

    def body(i, c):
        seen.append(kinds_of(i))
        return c + i

    assert int(fori_loop(2, 5, body, 0)) == 9
    assert seen == [("int32", True)]  # a weakly typed int, as in jax.lax.fori_loop
    assert int(fori_loop(jnp.int8(0), jnp.int8(3), lambda i, c: c + 1, 0, max_steps=2)) == 2
    assert int(fori_loop(5, 2, body, 7)) == 7  # no steps
    out = fori_loop(0, 4, lambda i, c: c * 2, 1.0, unroll=2)
    assert float(out) == 16.0
    grad = jax.grad(lambda x: fori_loop(0, 3, lambda i, c: c * x, x))(2.0)
    assert float(grad) == 4 * 2.0**3


def test_fori_loop_errors():
    with pytest.raises(TypeError, match=r"`upper` must be an integer scalar"):
        fori_loop(0, 2.5, lambda i, c: c, 0)
    with pytest.raises(TypeError, match=r"`lower` must be an integer scalar"):
        fori_loop(True, 2, lambda i, c: c, 0)
    with pytest.raises(TypeError, match=r"same dtype, got int8 and int16"):
        fori_loop(jnp.int8(0), jnp.int16(2), lambda i, c: c, 0)
    with pytest.raises(TypeError, match=r"expects a function as `body_fun`"):
        fori_loop(0, 2, 3, 0)
    with pytest.raises(ValueError, match="unknown kind='fast'"):
        fori_loop(0, 2, lambda i, c: c, 0, kind="fast")
    with pytest.raises(ValueError, match="`unroll` applies"):
        fori_loop(0, 2, lambda i, c: c, 0, kind="checkpointed", unroll=2)
    with pytest.raises(ValueError, match=r"`unroll` applies.*Python ints"):
        jax.jit(lambda n: fori_loop(0, n, lambda i, c: c, 0, unroll=2))(3)
    with pytest.raises(ValueError, match=r"bounded.*needs `max_steps`"):
        jax.jit(lambda n: fori_loop(0, n, lambda i, c: c, 0, kind="bounded"))(3)
    with pytest.raises(ValueError, match="needs `checkpoints`"):
        jax.jit(lambda n: fori_loop(0, n, lambda i, c: c, 0.0, kind="checkpointed"))(3)
    with pytest.raises(ValueError, match=r"fori_loop: `body_fun` changed the array at \[0\]"):
        fori_loop(0, 2, lambda i, c: (c[0] + 0.5, c[1]), (jnp.int32(0), "tag"))


class _Cell(Module):
    def __init__(self, value):
        self.value = value


class _Tied(Module):
    def __init__(self, cell):
        self.encoder = cell
        self.decoder = cell


def _tied():
    return _Tied(_Cell(jnp.arange(3.0)))


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_carry_keeps_sharing(kind):
    def body(c):
        k, model = c
        return k + 1, apply_updates(model, jax.tree.map(jnp.ones_like, model))

    _, out = while_loop(lambda c: c[0] < 2, body, (0, _tied()), kind=kind, max_steps=3)
    assert out.encoder is out.decoder
    np.testing.assert_array_equal(out.encoder.value, jnp.arange(3.0) + 2)  # once a step
    total, _ = scan(
        lambda m, x: (m, x), _tied(), jnp.arange(2.0), kind=kind.replace("bounded", "lax")
    )
    assert total.encoder is total.decoder
    out = fori_loop(
        0,
        2,
        lambda i, m: tree_at(lambda t: t.encoder.value, m, m.encoder.value * 2),
        _tied(),
        kind=kind,
    )
    assert out.encoder is out.decoder
    np.testing.assert_array_equal(out.decoder.value, jnp.arange(3.0) * 4)


@pytest.mark.parametrize("kind", ["lax", "checkpointed", "bounded"])
def test_carry_that_loses_its_sharing_is_refused(kind):
    with pytest.raises(ValueError, match=r"shared objects .* are still shared.*apply_updates"):
        while_loop(
            lambda c: c[0] < 2,
            lambda c: (c[0] + 1, jax.tree.map(lambda x: x * 2, c[1])),
            (0, _tied()),
            kind=kind,
            max_steps=3,
        )


def test_gradient_through_a_shared_weight_in_the_carry():
    def loss(w, kind):
        def body(c):
            k, model, acc = c
            return k + 1, model, acc + (model.encoder.value * model.decoder.value).sum()

        return while_loop(
            lambda c: c[0] < 3, body, (0, _Tied(_Cell(w)), 0.0), kind=kind, max_steps=3
        )[2]

    w = jnp.arange(3.0)
    for kind in ("checkpointed", "bounded"):
        np.testing.assert_allclose(jax.grad(loss)(w, kind), 6 * w)
