"""`List` and `Dict`: behave as list and dict, every in-place change bumps the mutation
count (which graph caches rely on to skip comparing their items), and changes from another
JAX trace are refused (as a Module's are)."""

import copy
import pickle

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Dict, List, TraceContextError
from pytree_module.extend import mutations

# Each in-place change of a List: the call, and the list it must leave.
LIST_CHANGES = [
    ("setitem", lambda xs: xs.__setitem__(0, 9), [9, 2, 3]),
    ("setitem slice", lambda xs: xs.__setitem__(slice(0, 2), [7]), [7, 3]),
    ("delitem", lambda xs: xs.__delitem__(1), [1, 3]),
    ("iadd", lambda xs: xs.__iadd__([4]), [1, 2, 3, 4]),
    ("imul", lambda xs: xs.__imul__(2), [1, 2, 3, 1, 2, 3]),
    ("append", lambda xs: xs.append(4), [1, 2, 3, 4]),
    ("extend", lambda xs: xs.extend([4, 5]), [1, 2, 3, 4, 5]),
    ("insert", lambda xs: xs.insert(0, 0), [0, 1, 2, 3]),
    ("pop", lambda xs: xs.pop(), [1, 2]),
    ("remove", lambda xs: xs.remove(2), [1, 3]),
    ("clear", lambda xs: xs.clear(), []),
    ("sort", lambda xs: xs.sort(reverse=True), [3, 2, 1]),
    ("reverse", lambda xs: xs.reverse(), [3, 2, 1]),
]

DICT_CHANGES = [
    ("setitem", lambda d: d.__setitem__("c", 3), {"a": 1, "b": 2, "c": 3}),
    ("delitem", lambda d: d.__delitem__("a"), {"b": 2}),
    ("ior", lambda d: d.__ior__({"c": 3}), {"a": 1, "b": 2, "c": 3}),
    ("pop", lambda d: d.pop("a"), {"b": 2}),
    ("popitem", lambda d: d.popitem(), {"a": 1}),
    ("clear", lambda d: d.clear(), {}),
    ("update", lambda d: d.update(b=5), {"a": 1, "b": 5}),
    ("setdefault", lambda d: d.setdefault("c", 3), {"a": 1, "b": 2, "c": 3}),
]


@pytest.mark.parametrize(
    ("change", "expected"), [c[1:] for c in LIST_CHANGES], ids=[c[0] for c in LIST_CHANGES]
)
def test_every_in_place_change_of_a_List_bumps_the_mutation_count(change, expected):
    xs = List([1, 2, 3])
    before = mutations.count
    change(xs)
    assert mutations.count > before
    assert xs == expected and type(xs) is List


@pytest.mark.parametrize(
    ("change", "expected"), [c[1:] for c in DICT_CHANGES], ids=[c[0] for c in DICT_CHANGES]
)
def test_every_in_place_change_of_a_Dict_bumps_the_mutation_count(change, expected):
    d = Dict(a=1, b=2)
    before = mutations.count
    change(d)
    assert mutations.count > before
    assert d == expected and type(d) is Dict


def test_reads_do_not_bump_the_count():
    xs, d = List([1, 2]), Dict(a=1)
    before = mutations.count
    _ = (xs[0], len(xs), list(xs), xs.index(2), xs.count(1), d["a"], d.get("b"), list(d.items()))
    assert mutations.count == before


def test_the_changing_methods_return_what_the_builtins_return():
    xs = List([1, 2, 3])
    assert xs.pop() == 3
    same = xs
    xs += [5]
    assert xs is same and xs == [1, 2, 5]
    xs *= 2
    assert xs is same and type(xs) is List
    d = Dict(a=1)
    assert d.setdefault("a", 7) == 1 and d.pop("a") == 1 and d.pop("x", None) is None
    d["b"] = 2
    assert d.popitem() == ("b", 2)
    same_d = d
    d |= {"c": 3}
    assert d is same_d and type(d) is Dict


def test_failed_changes_raise_as_the_builtins_do():
    with pytest.raises(IndexError):
        List().pop()
    with pytest.raises(ValueError):
        List([1]).remove(2)
    with pytest.raises(KeyError):
        Dict().pop("missing")
    with pytest.raises(KeyError):
        del Dict()["missing"]


def test_copies_and_pickles_keep_the_type_and_items():
    xs = List([jnp.ones(2), 1.0])
    d = Dict(a=List([1, 2]), b=3)
    for made in (copy.copy(xs), copy.deepcopy(xs), pickle.loads(pickle.dumps(xs))):
        assert type(made) is List and len(made) == 2 and made[1] == 1.0
    for made in (copy.copy(d), copy.deepcopy(d), pickle.loads(pickle.dumps(d))):
        assert type(made) is Dict and type(made["a"]) is List and made == {"a": [1, 2], "b": 3}


# ------------------------------------------------------------------ the trace-level guard


def test_a_container_made_outside_a_jax_transform_cannot_change_inside_it():
    d, xs = Dict(a=1), List([1])
    seen = []

    @jax.jit
    def f(x):
        for change in (
            lambda: setattr(d, "a", x),
            lambda: d.update(b=x),
            lambda: xs.append(x),
            lambda: xs.__setitem__(0, x),
        ):
            with pytest.raises(TraceContextError, match=r"Cannot mutate '(Dict|List)' from"):
                change()
            seen.append(True)
        return x

    f(1.0)
    assert seen == [True] * 4
    assert d == {"a": 1} and xs == [1]  # nothing half-changed, no tracer leaked


def test_the_error_names_the_change_and_the_fix():
    xs = List()

    @jax.jit
    def f(x):
        with pytest.raises(TraceContextError) as error:
            xs.append(x)
        assert "`append`" in str(error.value) and "argument" in str(error.value)
        return x

    f(1.0)


def test_containers_made_or_passed_inside_a_transform_change_freely():
    @jax.jit
    def f(d):
        d["b"] = d["a"] * 2  # `d` was rebuilt inside (a pytree argument)
        made = List()
        made.append(d["b"])
        return d, made

    d, made = f(Dict(a=jnp.ones(2)))
    assert set(d) == {"a", "b"} and type(made) is List
    d["c"] = 3  # the containers that come out are the caller's trace's
    made.append(4)


def test_copies_pickles_and_cycles_are_made_in_the_current_trace():
    xs = List([1])
    xs.append(xs)  # a List holding itself
    copied = copy.deepcopy(xs)
    assert copied[1] is copied and copied[0] == 1
    d = pickle.loads(pickle.dumps(Dict(a=1)))
    d.b = 2  # changeable: the unpickled Dict has a trace of its own

    @jax.jit
    def f(x):
        inner = copy.copy(Dict(a=x))
        inner["b"] = x
        return inner["b"]

    assert f(2.0) == 2.0
