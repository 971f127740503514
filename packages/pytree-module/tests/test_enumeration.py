"""Enumeration: pytree members under jit, vmap, cond and switch; messages, promote, errors."""

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import Enumeration, Module, is_data, tree_at, tree_equal, tree_pformat


class RESULTS(Enumeration):
    successful = ""
    max_steps_reached = "The maximum number of solver steps was reached."
    nonfinite = "A non-finite value appeared."


class SOLVER_RESULTS(RESULTS):
    diverged = "The solver diverged."


class OTHER(Enumeration):
    successful = ""


def test_members_are_pytrees_with_one_int32_leaf_and_a_shared_treedef():
    leaves, treedef = jax.tree.flatten(RESULTS.nonfinite)
    assert len(leaves) == 1 and leaves[0].dtype == np.int32 and int(leaves[0]) == 2
    assert treedef == jax.tree.structure(RESULTS.successful)
    assert treedef != jax.tree.structure(OTHER.successful)
    assert jax.tree.unflatten(treedef, leaves) == RESULTS.nonfinite
    ((path, _),) = jax.tree_util.tree_flatten_with_path(RESULTS.successful)[0]
    assert jax.tree_util.keystr(path) == "._value"


def test_members_are_indexed_in_declaration_order():
    assert [int(m.index) for m in RESULTS] == [0, 1, 2]
    assert list(RESULTS) == [RESULTS.successful, RESULTS.max_steps_reached, RESULTS.nonfinite]
    assert len(RESULTS) == 3 and len(SOLVER_RESULTS) == 4


def test_equality_gives_boolean_arrays():
    same = RESULTS.successful == RESULTS.successful
    differ = RESULTS.successful == RESULTS.max_steps_reached
    assert isinstance(same, jax.Array) and same.dtype == jnp.bool_
    assert bool(same) and not bool(differ)
    assert bool(RESULTS.successful != RESULTS.nonfinite)
    assert not bool(RESULTS.nonfinite != RESULTS.nonfinite)


def test_equality_with_a_traced_member_inside_jit():
    @jax.jit
    def is_nonfinite(result):
        return result == RESULTS.nonfinite, RESULTS.nonfinite != result

    eq, ne = is_nonfinite(RESULTS.nonfinite)
    assert bool(eq) and not bool(ne)
    eq, ne = is_nonfinite(RESULTS.successful)
    assert not bool(eq) and bool(ne)


def test_constant_members_compare_concretely_inside_jit():
    # So that Python `if` works on members known at trace time.
    @jax.jit
    def f(x):
        if RESULTS.successful == RESULTS.successful:
            return x + 1
        return x

    assert int(f(1)) == 2


def test_members_pass_through_jit_as_arguments_and_results():
    compiles = []

    @jax.jit
    def identity(result):
        compiles.append(None)
        return result

    out = identity(RESULTS.max_steps_reached)
    assert isinstance(out, RESULTS) and bool(out == RESULTS.max_steps_reached)
    assert bool(identity(RESULTS.nonfinite) == RESULTS.nonfinite)
    assert len(compiles) == 1


def test_where_selects_with_a_concrete_or_traced_predicate():
    picked = RESULTS.where(True, RESULTS.nonfinite, RESULTS.successful)
    assert bool(picked == RESULTS.nonfinite)
    assert RESULTS.where(jnp.array(False), RESULTS.nonfinite, RESULTS.nonfinite) is (
        RESULTS.nonfinite
    )

    @jax.jit
    def classify(steps, value):
        result = RESULTS.where(steps < 10, RESULTS.successful, RESULTS.max_steps_reached)
        return RESULTS.where(jnp.isfinite(value), result, RESULTS.nonfinite)

    assert repr(classify(3, 1.0)) == "RESULTS.successful"
    assert repr(classify(30, 1.0)) == "RESULTS.max_steps_reached"
    assert repr(classify(3, jnp.nan)) == "RESULTS.nonfinite"


def test_where_with_a_boolean_array_gives_a_batch():
    batch = RESULTS.where(jnp.array([True, False]), RESULTS.nonfinite, RESULTS.successful)
    assert repr(batch) == "RESULTS.<[nonfinite, successful]>"
    assert (batch == RESULTS.nonfinite).tolist() == [True, False]
    large = RESULTS.where(jnp.zeros((2, 10), bool), RESULTS.nonfinite, RESULTS.successful)
    assert repr(large) == "RESULTS.<batch of shape (2, 10)>"


def test_vmap_over_a_batch_of_members():
    batch = jax.vmap(lambda p: RESULTS.where(p, RESULTS.nonfinite, RESULTS.successful))(
        jnp.array([True, False, True])
    )
    assert isinstance(batch, RESULTS)
    assert batch.index.tolist() == [2, 0, 2]
    assert repr(batch) == "RESULTS.<[nonfinite, successful, nonfinite]>"
    is_bad = jax.vmap(lambda r: r == RESULTS.nonfinite)(batch)
    assert is_bad.tolist() == [True, False, True]
    # A batch as input, and a shared member broadcast with in_axes=None.
    both = jax.vmap(lambda r, s: r == s, in_axes=(0, None))(batch, RESULTS.successful)
    assert both.tolist() == [False, True, False]


def test_lax_cond_on_a_comparison_and_lax_switch_on_the_index():
    @jax.jit
    def respond(result, x):
        x = jax.lax.cond(result == RESULTS.successful, lambda: x, lambda: -x)
        return jax.lax.switch(result.index, [lambda: x, lambda: x * 10, lambda: x * 100])

    assert float(respond(RESULTS.successful, 1.0)) == 1.0
    assert float(respond(RESULTS.max_steps_reached, 1.0)) == -10.0
    assert float(respond(RESULTS.nonfinite, 1.0)) == -100.0


def test_members_as_cond_operands_and_results():
    out = jax.lax.cond(
        jnp.array(True), lambda r: r, lambda r: RESULTS.nonfinite, RESULTS.max_steps_reached
    )
    assert repr(out) == "RESULTS.max_steps_reached"


def test_grad_passes_through_a_member_argument():
    def loss(x, result):
        return jnp.where(result == RESULTS.successful, x**2, 3 * x)

    assert float(jax.grad(loss)(2.0, RESULTS.successful)) == 4.0
    assert float(jax.grad(loss)(2.0, RESULTS.nonfinite)) == 3.0
    grads = jax.grad(lambda x, r: loss(x, r), allow_int=True, argnums=(0, 1))(
        2.0, RESULTS.successful
    )
    assert float(grads[0]) == 4.0 and isinstance(grads[1], RESULTS)
    assert grads[1].index.dtype == jax.dtypes.float0
    assert repr(grads[1]) == "RESULTS.<unknown>"


def test_messages():
    assert RESULTS[RESULTS.successful] == ""
    assert RESULTS[RESULTS.nonfinite] == "A non-finite value appeared."
    assert SOLVER_RESULTS[SOLVER_RESULTS.diverged] == "The solver diverged."
    assert SOLVER_RESULTS[SOLVER_RESULTS.nonfinite] == "A non-finite value appeared."
    assert RESULTS[jax.jit(lambda r: r)(RESULTS.nonfinite)] == "A non-finite value appeared."


def test_messages_need_a_concrete_scalar_member():
    with pytest.raises(TypeError, match=r"traced .*lax\.switch\(member\.index"):
        jax.jit(lambda r: RESULTS[r])(RESULTS.successful)
    batch = RESULTS.where(jnp.array([True, False]), RESULTS.nonfinite, RESULTS.successful)
    with pytest.raises(TypeError, match=r"batch of shape \(2,\)"):
        RESULTS[batch]
    with pytest.raises(TypeError, match=r"expects a member of RESULTS"):
        RESULTS[0]
    with pytest.raises(TypeError, match=r"expects a member of RESULTS.*got OTHER\.successful"):
        RESULTS[OTHER.successful]


def test_repr_names_the_member():
    assert repr(RESULTS.max_steps_reached) == "RESULTS.max_steps_reached"
    assert str(SOLVER_RESULTS.diverged) == "SOLVER_RESULTS.diverged"
    seen = []
    jax.jit(lambda r: seen.append(repr(r)))(RESULTS.successful)
    assert seen == ["RESULTS.<traced>"]
    assert repr(jax.eval_shape(lambda: RESULTS.successful)) == "RESULTS.<unknown>"
    assert tree_pformat({"result": RESULTS.nonfinite}) == "{'result': RESULTS.nonfinite}"


def test_help_lists_the_members():
    assert "- `max_steps_reached`: The maximum number" in RESULTS.__doc__
    assert "- `successful`\n" in RESULTS.__doc__

    class Documented(Enumeration):
        """Own docstring."""

        a = ""

    assert Documented.__doc__ == "Own docstring."


def test_inheritance_extends_the_parent_members():
    assert [int(m.index) for m in SOLVER_RESULTS] == [0, 1, 2, 3]
    assert repr(SOLVER_RESULTS.successful) == "SOLVER_RESULTS.successful"
    assert SOLVER_RESULTS.successful is not RESULTS.successful
    assert isinstance(SOLVER_RESULTS.successful, SOLVER_RESULTS)
    assert not isinstance(SOLVER_RESULTS.successful, RESULTS)
    assert isinstance(RESULTS.successful, Enumeration) and not isinstance(0, Enumeration)


def test_promote_converts_parent_members_also_traced_and_batched():
    promoted = SOLVER_RESULTS.promote(RESULTS.nonfinite)
    assert isinstance(promoted, SOLVER_RESULTS) and bool(promoted == SOLVER_RESULTS.nonfinite)
    assert SOLVER_RESULTS.promote(SOLVER_RESULTS.diverged) is SOLVER_RESULTS.diverged
    traced = jax.jit(SOLVER_RESULTS.promote)(RESULTS.max_steps_reached)
    assert repr(traced) == "SOLVER_RESULTS.max_steps_reached"
    batch = RESULTS.where(jnp.array([True, False]), RESULTS.nonfinite, RESULTS.successful)
    assert repr(jax.vmap(SOLVER_RESULTS.promote)(batch)) == (
        "SOLVER_RESULTS.<[nonfinite, successful]>"
    )


def test_promote_from_a_grandparent_and_from_several_parents():
    class MORE(SOLVER_RESULTS):
        extra = "x"

    class SIDE(Enumeration):
        side = "s"
        successful = ""

    class BOTH(SIDE, RESULTS):
        both = "b"

    assert repr(MORE.promote(RESULTS.nonfinite)) == "MORE.nonfinite"
    assert BOTH._names == ("side", "successful", "max_steps_reached", "nonfinite", "both")
    assert repr(BOTH.promote(RESULTS.successful)) == "BOTH.successful"
    assert repr(BOTH.promote(SIDE.successful)) == "BOTH.successful"
    assert repr(BOTH.promote(RESULTS.nonfinite)) == "BOTH.nonfinite"


def test_promote_rejects_unrelated_enumerations_and_non_members():
    with pytest.raises(TypeError, match=r"extends \(here: none\).*SOLVER_RESULTS\.diverged"):
        RESULTS.promote(SOLVER_RESULTS.diverged)
    with pytest.raises(TypeError, match=r"here: RESULTS\).*OTHER\.successful belongs to OTHER"):
        SOLVER_RESULTS.promote(OTHER.successful)
    with pytest.raises(TypeError, match="expects an enumeration member, got 1"):
        SOLVER_RESULTS.promote(1)


def test_enumerations_cannot_be_instantiated():
    with pytest.raises(TypeError, match=r"RESULTS cannot be instantiated.*RESULTS\.successful"):
        RESULTS()
    with pytest.raises(TypeError, match="subclass it"):
        Enumeration()


def test_unknown_member_lists_the_members():
    with pytest.raises(AttributeError, match=r"no member `sucessful`.*successful, max_steps"):
        RESULTS.sucessful  # noqa: B018


def test_comparing_across_enumerations_or_with_other_values_raises():
    with pytest.raises(TypeError, match=r"different enumerations \(RESULTS and OTHER\)\.$"):
        RESULTS.successful == OTHER.successful  # noqa: B015
    with pytest.raises(TypeError, match=r"SOLVER_RESULTS\.promote"):
        RESULTS.successful != SOLVER_RESULTS.successful  # noqa: B015
    with pytest.raises(TypeError, match=r"RESULTS\.promote"):
        SOLVER_RESULTS.successful == RESULTS.successful  # noqa: B015
    with pytest.raises(TypeError, match=r"compare only with members of RESULTS"):
        RESULTS.successful == 0  # noqa: B015
    with pytest.raises(TypeError, match="different enumerations"):
        jax.jit(lambda a, b: a == b)(RESULTS.successful, OTHER.successful)


def test_where_rejects_wrong_members_and_non_boolean_predicates():
    with pytest.raises(TypeError, match=r"where\(pred, b=\.\.\.\) expects a member of RESULTS"):
        RESULTS.where(True, RESULTS.successful, OTHER.successful)
    with pytest.raises(TypeError, match=r"where\(pred, a=\.\.\.\)"):
        RESULTS.where(True, SOLVER_RESULTS.successful, RESULTS.successful)
    with pytest.raises(TypeError, match="boolean `pred`, got dtype int32"):
        RESULTS.where(jnp.array(1), RESULTS.successful, RESULTS.nonfinite)


def test_member_values_must_be_strings():
    with pytest.raises(TypeError, match=r"member `code` must be a string .*got 1"):

        class Bad(Enumeration):
            code = 1

    with pytest.raises(TypeError, match=r"member `helper` must be a string"):

        class WithMethod(Enumeration):
            def helper(self):
                return None


def test_member_names_cannot_hide_the_api():
    for name in ("where", "promote", "mro", "_names"):
        with pytest.raises(ValueError, match=f"named `{name}`"):
            type(Enumeration)("Clash", (Enumeration,), {name: ""})


def test_duplicate_names_with_different_messages_raise():
    with pytest.raises(ValueError, match=r"`nonfinite` twice .*from RESULTS and 'NaN!' from"):

        class Redefined(RESULTS):
            nonfinite = "NaN!"

    class Diverging(Enumeration):
        successful = "different"

    with pytest.raises(ValueError, match="`successful` twice"):

        class Merged(RESULTS, Diverging):
            pass


def test_duplicate_names_with_the_same_message_share_one_member():
    class Restated(RESULTS):
        nonfinite = "A non-finite value appeared."

    assert Restated._names == RESULTS._names
    assert repr(Restated.promote(RESULTS.nonfinite)) == "Restated.nonfinite"


def test_enumerations_extend_only_enumerations():
    with pytest.raises(TypeError, match="cannot subclass int, which is not an Enumeration"):

        class Mixed(RESULTS, int):
            pass


def test_members_are_immutable_unhashable_and_pickle():
    with pytest.raises(AttributeError, match="immutable: cannot set `_value`"):
        RESULTS.successful._value = np.array(1)
    with pytest.raises(TypeError, match="unhashable"):
        hash(RESULTS.successful)
    assert repr(pickle.loads(pickle.dumps(RESULTS.nonfinite))) == "RESULTS.nonfinite"
    assert repr(copy.deepcopy(SOLVER_RESULTS.diverged)) == "SOLVER_RESULTS.diverged"


def test_members_are_data_in_modules():
    class Solution(Module):
        def __init__(self, value, result):
            self.value = value
            self.result = result

    assert is_data(RESULTS.successful)
    solution = Solution(jnp.ones(2), RESULTS.max_steps_reached)
    assert len(jax.tree.leaves(solution)) == 2
    out = jax.jit(lambda s: s)(solution)
    assert repr(out.result) == "RESULTS.max_steps_reached"


def test_members_as_annotated_fields_and_in_tree_utilities():
    class Solution(Module):
        value: jax.Array
        result: RESULTS

    solution = Solution(jnp.ones(2), RESULTS.nonfinite)
    assert repr(solution) == "Solution(value=f32[2], result=RESULTS.nonfinite)"
    assert tree_equal(RESULTS.nonfinite, RESULTS.nonfinite)
    assert not tree_equal(RESULTS.nonfinite, RESULTS.successful)
    replaced = tree_at(lambda s: s.result, solution, RESULTS.successful)
    assert repr(replaced.result) == "RESULTS.successful"
    # A transform that leaves the leaf out (here `None`) still prints.
    assert repr(jax.tree.map(lambda _: None, RESULTS.successful)) == "RESULTS.<unknown>"


def test_is_traced_inside_a_transform_only():
    assert not RESULTS.nonfinite.is_traced()
    traced = []
    jax.jit(lambda r: traced.append(r.is_traced()) or r)(RESULTS.nonfinite)
    jax.vmap(lambda r: traced.append(r.is_traced()) or r)(
        RESULTS.where(jnp.array([True, False]), RESULTS.nonfinite, RESULTS.successful)
    )
    assert traced == [True, True]


def test_error_if_calls_the_registered_check_with_the_members_index_and_messages(monkeypatch):
    from pytree_module import _enumeration
    from pytree_module.extend import register_error_if

    calls = []

    def check(token, pred, index, msgs, *, on_error):
        calls.append((pred, int(index), msgs, on_error))
        return token

    monkeypatch.setattr(_enumeration, "_ERROR_IF", [])
    register_error_if(check)
    x = jnp.ones(2)
    assert SOLVER_RESULTS.diverged.error_if(x, True, on_error="nan") is x
    assert calls == [(True, 3, list(SOLVER_RESULTS._messages), "nan")]


def test_error_if_without_a_registered_check_says_what_to_import(monkeypatch):
    from pytree_module import _enumeration

    monkeypatch.setattr(_enumeration, "_ERROR_IF", [])
    with pytest.raises(RuntimeError, match="import pytree_transforms"):
        RESULTS.nonfinite.error_if(jnp.ones(1), True)


def test_register_error_if_refuses_what_cannot_be_called():
    from pytree_module.extend import register_error_if

    with pytest.raises(TypeError, match="register_error_if expects a function"):
        register_error_if("branched_error_if")
