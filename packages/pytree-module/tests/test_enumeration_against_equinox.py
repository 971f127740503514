"""Side by side with Equinox: Enumeration. The same operations give the same indices,
booleans and messages; where we differ on purpose, both behaviours are asserted."""

import warnings

import pytest

eqx = pytest.importorskip("equinox")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytree_module as pm  # noqa: E402


class RESULTS(pm.Enumeration):
    successful = ""
    max_steps_reached = "The maximum number of solver steps was reached."
    nonfinite = "A non-finite value appeared."


class EqxRESULTS(eqx.Enumeration):
    successful = ""
    max_steps_reached = "The maximum number of solver steps was reached."
    nonfinite = "A non-finite value appeared."


class MORE(RESULTS):
    diverged = "The solver diverged."


class EqxMORE(EqxRESULTS):  # pyright: ignore
    diverged = "The solver diverged."


PAIRS = [(RESULTS, EqxRESULTS), (MORE, EqxMORE)]
NAMES = ["successful", "max_steps_reached", "nonfinite"]


def members(enumeration, names=NAMES):
    return [getattr(enumeration, name) for name in names]


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=["RESULTS", "MORE"])
def test_same_indices_leaves_lengths_and_messages(ours, theirs):
    assert len(ours) == len(theirs)
    names = [*NAMES, "diverged"][: len(ours)]
    for a, b in zip(members(ours, names), members(theirs, names), strict=True):
        ((leaf_a,), (leaf_b,)) = jax.tree.leaves(a), jax.tree.leaves(b)
        assert leaf_a.dtype == leaf_b.dtype == np.int32 and int(leaf_a) == int(leaf_b)
        assert int(a._value) == int(b._value) == int(a.index)
        assert ours[a] == theirs[b]
        assert isinstance(a, ours) and isinstance(b, theirs)


def test_same_equality_tables_outside_and_inside_jit():
    for (a, b), (c, d) in zip(
        [(x, y) for x in members(RESULTS) for y in members(RESULTS)],
        [(x, y) for x in members(EqxRESULTS) for y in members(EqxRESULTS)],
        strict=True,
    ):
        assert bool(a == b) == bool(c == d) and bool(a != b) == bool(c != d)
        assert bool(jax.jit(lambda p, q: p == q)(a, b)) == bool(jax.jit(lambda p, q: p == q)(c, d))


@pytest.mark.parametrize("pred", [True, False])
def test_same_where_under_jit(pred):
    ours = jax.jit(lambda p: RESULTS.where(p, RESULTS.nonfinite, RESULTS.successful))(pred)
    theirs = jax.jit(lambda p: EqxRESULTS.where(p, EqxRESULTS.nonfinite, EqxRESULTS.successful))(
        pred
    )
    assert int(ours._value) == int(theirs._value)
    assert RESULTS[ours] == EqxRESULTS[theirs]


def test_same_vmap_batch_and_switch():
    preds = jnp.array([True, False, True])
    ours = jax.vmap(lambda p: RESULTS.where(p, RESULTS.nonfinite, RESULTS.max_steps_reached))(preds)
    theirs = jax.vmap(
        lambda p: EqxRESULTS.where(p, EqxRESULTS.nonfinite, EqxRESULTS.max_steps_reached)
    )(preds)
    assert ours._value.tolist() == theirs._value.tolist() == [2, 1, 2]
    branches = [lambda: 0.0, lambda: 1.0, lambda: 2.0]
    switch = jax.vmap(lambda r: jax.lax.switch(r._value, branches))
    assert switch(ours).tolist() == switch(theirs).tolist()


def test_same_promote_including_traced_members():
    for name in NAMES:
        ours = jax.jit(MORE.promote)(getattr(RESULTS, name))
        theirs = jax.jit(EqxMORE.promote)(getattr(EqxRESULTS, name))
        assert int(ours._value) == int(theirs._value)
        assert bool(ours == getattr(MORE, name)) and bool(theirs == getattr(EqxMORE, name))


def test_comparable_reprs():
    # Equinox shows `module.Class<message>`; we show `Class.name`, which stays readable for
    # members without a message (`successful` above) and matches how the member is written.
    assert repr(EqxRESULTS.nonfinite).endswith("EqxRESULTS<A non-finite value appeared.>")
    assert repr(RESULTS.nonfinite) == "RESULTS.nonfinite"
    assert repr(EqxRESULTS.successful).endswith("EqxRESULTS<>")
    assert repr(RESULTS.successful) == "RESULTS.successful"
    traced = []
    jax.jit(lambda a, b: traced.append((repr(a), repr(b))))(
        RESULTS.successful, EqxRESULTS.successful
    )
    assert traced[0][0] == "RESULTS.<traced>" and traced[0][1].endswith("EqxRESULTS<traced>")


def test_both_refuse_comparisons_across_enumerations():
    with pytest.raises(ValueError, match="same type"):
        EqxRESULTS.successful == EqxMORE.successful  # noqa: B015
    with pytest.raises(TypeError, match="different enumerations"):
        RESULTS.successful == MORE.successful  # noqa: B015
    with pytest.raises(ValueError, match="same type"):
        EqxRESULTS.successful == 0  # noqa: B015
    with pytest.raises(TypeError, match="compare only with members"):
        RESULTS.successful == 0  # noqa: B015


def test_both_refuse_promoting_from_a_child():
    with pytest.raises(ValueError, match="inherited"):
        EqxRESULTS.promote(EqxMORE.diverged)
    with pytest.raises(TypeError, match="extends"):
        RESULTS.promote(MORE.diverged)


def test_differences_on_purpose():
    # Instantiating: Equinox builds an empty object; we refuse.
    assert type(EqxRESULTS()) is EqxRESULTS
    with pytest.raises(TypeError, match="cannot be instantiated"):
        RESULTS()
    # Unknown member: both AttributeError; ours lists the members.
    with pytest.raises(AttributeError):
        EqxRESULTS.missing  # noqa: B018
    with pytest.raises(AttributeError, match="successful, max_steps_reached, nonfinite"):
        RESULTS.missing  # noqa: B018
    # A redefined member with another message: Equinox warns and takes the new message; we
    # raise, since `promote` would silently change what the parent's member means.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        class EqxRedefined(EqxRESULTS):  # pyright: ignore
            nonfinite = "NaN"

    assert caught and EqxRedefined[EqxRedefined.nonfinite] == "NaN"
    with pytest.raises(ValueError, match="twice with different messages"):

        class Redefined(RESULTS):
            nonfinite = "NaN"

    # Promoting a member of the enumeration itself: Equinox raises; we return it.
    with pytest.raises(ValueError, match="inherited"):
        EqxMORE.promote(EqxMORE.diverged)
    assert MORE.promote(MORE.diverged) is MORE.diverged
    # A boolean array predicate: Equinox wants a scalar; we give a batch, as jnp.where.
    with pytest.raises(ValueError, match="scalar boolean"):
        EqxRESULTS.where(jnp.array([True, False]), EqxRESULTS.successful, EqxRESULTS.nonfinite)
    batch = RESULTS.where(jnp.array([True, False]), RESULTS.successful, RESULTS.nonfinite)
    assert batch.index.tolist() == [0, 2]
    # The message of a traced member: Equinox returns the string "traced"; we raise.
    seen = []
    jax.jit(lambda r: seen.append(EqxRESULTS[r]))(EqxRESULTS.nonfinite)
    assert seen == ["traced"]
    with pytest.raises(TypeError, match="traced"):
        jax.jit(lambda r: RESULTS[r])(RESULTS.nonfinite)


@pytest.mark.parametrize(("ours", "theirs"), PAIRS[:1], ids=["RESULTS"])
def test_members_error_if_and_is_traced_alike(ours, theirs):
    pytest.importorskip("pytree_transforms")  # registers the check members call
    seen = []

    def solve(enumeration, x):
        result = enumeration.where(x > 10, enumeration.nonfinite, enumeration.successful)
        seen.append((enumeration.successful.is_traced(), result.is_traced()))
        return result.error_if(x, result != enumeration.successful)

    for enumeration in (ours, theirs):
        f = jax.jit(lambda x, e=enumeration: solve(e, x))
        assert f(jnp.array(1.0)) == 1.0
        with pytest.raises(
            (jax.errors.JaxRuntimeError, ValueError, RuntimeError),
            match=r"A non-finite value appeared\.",
        ):
            f(jnp.array(100.0))
    assert seen == [(False, True), (False, True)]
