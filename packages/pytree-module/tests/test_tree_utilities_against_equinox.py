"""Side by side with Equinox: tree_equal(typematch=), tree_check, tree_flatten_one_level and
tree_pformat's options. Where we differ on purpose, both behaviours are asserted."""

import pytest

eqx = pytest.importorskip("equinox")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytree_module as pm  # noqa: E402


class Linear(pm.Module):
    def __init__(self, n=2):
        self.weight = jnp.ones((n, n))
        self.bias = jnp.zeros(n)


class EqxLinear(eqx.Module):
    weight: jax.Array
    bias: jax.Array

    def __init__(self, n=2):
        self.weight = jnp.ones((n, n))
        self.bias = jnp.zeros(n)


class Settings(pm.Module):
    name: str = pm.field(static=True, default="s")


# tree_equal(typematch=...)

TYPEMATCH_CASES = {
    "int and float": (1, 1.0),
    "int and bool": (1, True),
    "float and numpy scalar": (1.0, np.float32(1.0)),
    "numpy and jax arrays": (np.ones(2, np.float32), jnp.ones(2)),
    "numpy scalar and 0-d array": (np.float32(1.0), np.array(1.0, np.float32)),
    "numpy arrays": (np.ones(2, np.float32), np.ones(2, np.float32)),
    "jax arrays": (jnp.ones(2), jnp.ones(2)),
    "unequal jax arrays": (jnp.ones(2), jnp.zeros(2)),
    "weak and strong jax arrays": (jnp.asarray(1.0), jnp.float32(1.0)),
    "strings": ("a", "a"),
    "nested": ({"a": [1, 2.0], "b": None}, {"a": [1, 2.0], "b": None}),
    "list and tuple": ([1], (1,)),
    "modules": (Linear(), Linear()),
}


@pytest.mark.parametrize("typematch", [False, True])
@pytest.mark.parametrize("trees", TYPEMATCH_CASES.values(), ids=TYPEMATCH_CASES.keys())
def test_tree_equal_typematch_agrees(trees, typematch):
    ours = pm.tree_equal(*trees, typematch=typematch)
    theirs = eqx.tree_equal(*trees, typematch=typematch)
    assert bool(ours) is bool(theirs), (ours, theirs)
    # Equinox answers concrete JAX arrays with a boolean array; ours is a Python bool
    # outside a trace (an existing difference).
    assert type(ours) is bool


def test_tree_equal_typematch_on_traced_arguments():
    concrete = jnp.ones(2)
    answers = {}

    def compare(x):
        answers["ours"] = pm.tree_equal(x, concrete, typematch=True)
        answers["equinox"] = eqx.tree_equal(x, concrete, typematch=True)
        answers["both traced"] = (
            pm.tree_equal(x, x + 0, typematch=True),
            eqx.tree_equal(x, x + 0, typematch=True),
        )
        answers["numpy"] = (
            pm.tree_equal(x, np.ones(2, np.float32), typematch=True),
            eqx.tree_equal(x, np.ones(2, np.float32), typematch=True),
        )
        return x.sum()

    for transform in (jax.jit, jax.grad):
        transform(compare)(jnp.ones(2))
        # Deliberate difference: Equinox compares the tracer's class with the concrete
        # array's and answers a static False under any transform, though the same call
        # outside one is True. We count every JAX array as one type, so tracing a function
        # does not change its answer: the values decide, as a traced boolean.
        assert answers["equinox"] is False
        assert answers["ours"] is not False and isinstance(answers["ours"], jax.Array)
        ours, theirs = answers["both traced"]
        assert ours is not False and theirs is not False
        assert answers["numpy"] == (False, False)
    assert bool(eqx.tree_equal(concrete, jnp.ones(2), typematch=True)) is True
    assert pm.tree_equal(concrete, jnp.ones(2), typematch=True) is True


def test_tree_equal_typematch_must_be_a_bool():
    # Deliberate difference: Equinox takes any truthy value (`typematch="no"` means True);
    # we refuse what is not a bool, naming the argument, so a typo cannot flip the meaning.
    assert eqx.tree_equal(1, 1.0, typematch="no") is False
    with pytest.raises(TypeError, match=r"tree_equal\(typematch=\.\.\.\) must be True or False"):
        pm.tree_equal(1, 1.0, typematch="no")


# tree_flatten_one_level

EMPTY_CHILDREN = {"none": None, "empty list": [], "empty dict": {}, "static module": Settings()}
ONE_LEVEL_CASES = {
    "dict": {"a": 3, "b": (1, 2)},
    "list": [[1], [2, 3]],
    "tuple of none": (None, None),
    "int": 4,
    "string": "text",
    "array": jnp.ones(2),
    "our module": Linear(),
    "equinox module": EqxLinear(),
    "partial": jax.tree_util.Partial(jnp.add, jnp.ones(2)),
    **EMPTY_CHILDREN,
}


@pytest.mark.parametrize("tree", ONE_LEVEL_CASES.values(), ids=ONE_LEVEL_CASES.keys())
def test_tree_flatten_one_level_agrees(tree):
    ours, our_def = pm.tree_flatten_one_level(tree)
    theirs, their_def = eqx.tree_flatten_one_level(tree)
    assert our_def == their_def
    assert len(ours) == len(theirs)
    assert all(a is b for a, b in zip(ours, theirs, strict=True))


def test_tree_flatten_one_level_of_a_node_holding_itself():
    loop = [1]
    loop.append(loop)
    # Both refuse with a ValueError; ours says where the node holds itself.
    with pytest.raises(ValueError, match="immediately self-referential"):
        eqx.tree_flatten_one_level(loop)
    with pytest.raises(ValueError, match=r"the list passed holds itself at \[1\]"):
        pm.tree_flatten_one_level(loop)


# tree_check


def _passing_trees():
    array, empty, settings, eqx_empty = jnp.ones(2), [], Settings(), eqx.Module()
    return {
        "repeated leaves": [1, 1, "s", "s"],
        "repeated array": [array, array],
        "repeated empty list": [empty, empty],
        "repeated none": [None, None],
        "repeated static-only module": [settings, settings],
        "repeated empty equinox module": [eqx_empty, eqx_empty],
        "equal but distinct lists": [[1], [1]],
        "distinct modules": [Linear(), Linear()],
        "nested": {"a": jnp.ones(2), "b": {"c": (1, 2)}},
    }


def _failing_trees():
    ours, theirs, shared, only_none = Linear(), EqxLinear(), [1.0], [None]
    loop = []
    loop.append(loop)
    outer = [1]
    outer.append({"back": outer})
    return {
        "shared module": ([ours, Linear(), ours], r"same Linear object is at \[0\] and at \[2\]"),
        "shared equinox module": (
            [theirs, theirs],
            r"same EqxLinear object is at \[0\] and at \[1\]",
        ),
        "shared list": (
            {"a": shared, "b": shared},
            r"same list object is at \['a'\] and at \['b'\]",
        ),
        "shared list of none": ([only_none, only_none], "same list object"),
        "immediate cycle": (loop, r"list at the top level contains itself again at \[0\]"),
        "cycle": ({"a": outer}, r"list at \['a'\] contains itself again at \['a'\]\[1\]\['back'\]"),
    }


@pytest.mark.parametrize("name", _passing_trees())
def test_tree_check_passes_where_equinox_does(name):
    tree = _passing_trees()[name]
    assert eqx.tree_check(tree) is None
    assert pm.tree_check(tree) is None


@pytest.mark.parametrize("name", _failing_trees())
def test_tree_check_fails_where_equinox_does(name):
    tree, our_message = _failing_trees()[name]
    # Same exception type (ValueError). Deliberate difference: Equinox names only the
    # node's type ("PyTree node of type `list` appears in the PyTree multiple times");
    # ours also names both paths, so the repeat can be found in a large model.
    with pytest.raises(ValueError, match="PyTree node of type"):
        eqx.tree_check(tree)
    with pytest.raises(ValueError, match=our_message):
        pm.tree_check(tree)


def test_tree_check_does_not_take_temporary_children_for_repeats():
    # A node whose flatten builds new tuples: once dropped, their ids can be given to the
    # tuples built for the next node. Equinox keys its record by id alone and may report a
    # repeat here; we hold each node met, so its id cannot be reused during the check.
    class Fresh:
        def __init__(self, items):
            self.items = items

    jax.tree_util.register_pytree_node(
        Fresh, lambda f: ((tuple(f.items), tuple(f.items)), None), lambda _, c: Fresh(list(c[0]))
    )
    tree = [Fresh([1, 2]) for _ in range(50)]
    assert pm.tree_check(tree) is None
    try:
        eqx.tree_check(tree)
    except ValueError as error:
        assert "appears in the PyTree multiple times" in str(error)


# tree_pformat / tree_pprint options

STRUCT = jax.ShapeDtypeStruct((2, 3), jnp.float32)


@pytest.mark.parametrize("short_arrays", [True, False])
@pytest.mark.parametrize("struct_as_array", [True, False])
def test_struct_as_array_agrees_when_given(struct_as_array, short_arrays):
    tree = {"s": STRUCT, "a": jnp.ones((2, 3), jnp.int32), "n": 1}
    options = {"struct_as_array": struct_as_array, "short_arrays": short_arrays}
    if short_arrays:
        assert pm.tree_pformat(tree, **options) == eqx.tree_pformat(tree, **options)
    else:
        # Long arrays: the array's repr is the same; the struct is never shortened in either.
        assert "ShapeDtypeStruct(shape=(2, 3), dtype=float32)" in pm.tree_pformat(tree, **options)
        assert "ShapeDtypeStruct(shape=(2, 3), dtype=float32)" in eqx.tree_pformat(tree, **options)


def test_struct_as_array_default_differs():
    # Deliberate difference: our default is `struct_as_array=True`, as tree_pformat (and so
    # the repr of every Module) already showed a struct before the option existed: a model
    # built by `eval_shape` prints as `w=f32[1000,1000]`, not as a constructor call.
    assert eqx.tree_pformat(STRUCT) == "ShapeDtypeStruct(shape=(2, 3), dtype=float32)"
    assert pm.tree_pformat(STRUCT) == "f32[2,3]"


def test_weak_types_are_not_marked():
    # Deliberate difference (as for arrays already): Equinox prefixes weakly typed arrays
    # and structs with `weak_`; we print the dtype alone, which is what a user compares.
    weak = jax.ShapeDtypeStruct((2,), jnp.float32, weak_type=True)
    assert eqx.tree_pformat(weak, struct_as_array=True) == "weak_f32[2]"
    assert pm.tree_pformat(weak, struct_as_array=True) == "f32[2]"


TRUNCATIONS = {
    "modules": lambda x: isinstance(x, (Linear, EqxLinear)),
    "lists": lambda x: isinstance(x, list),
    "ints": lambda x: type(x) is int,
    "arrays": lambda x: isinstance(x, jax.Array),
    "functions": lambda x: x is jax.nn.relu,
    "nothing": lambda x: False,
}


@pytest.mark.parametrize("truncate", TRUNCATIONS.values(), ids=TRUNCATIONS.keys())
def test_truncate_leaf_agrees(truncate):
    tree = {"layers": [Linear(), EqxLinear()], "n": 3, "x": jnp.ones(2)}
    # Untruncated, `jax.nn.relu` prints as `<function relu>` in ours (as plain functions
    # do) and as the repr of its wrapper in Equinox (an existing difference).
    if truncate(jax.nn.relu):
        tree["f"] = jax.nn.relu
    assert pm.tree_pformat(tree, truncate_leaf=truncate) == eqx.tree_pformat(
        tree, truncate_leaf=truncate
    )


def test_truncate_leaf_must_be_callable():
    # Deliberate difference: Equinox fails only when it calls `truncate_leaf`, with Python's
    # "'bool' object is not callable"; we refuse at once and name the argument.
    with pytest.raises(TypeError, match="'bool' object is not callable"):
        eqx.tree_pformat([1], truncate_leaf=True)
    with pytest.raises(TypeError, match=r"tree_pformat\(truncate_leaf=\.\.\.\)"):
        pm.tree_pformat([1], truncate_leaf=True)


def test_struct_as_array_must_be_a_bool():
    # Deliberate difference: Equinox takes any truthy value; we name the argument.
    assert eqx.tree_pformat(STRUCT, struct_as_array="yes") == "f32[2,3]"
    with pytest.raises(TypeError, match=r"tree_pformat\(struct_as_array=\.\.\.\)"):
        pm.tree_pformat(STRUCT, struct_as_array="yes")


def test_tree_pprint_agrees(capsys):
    tree = {"s": STRUCT, "layer": Linear()}
    options = {"struct_as_array": True, "truncate_leaf": lambda x: isinstance(x, Linear)}
    pm.tree_pprint(tree, **options)
    ours = capsys.readouterr().out
    eqx.tree_pprint(tree, **options)
    assert ours == capsys.readouterr().out == "{'s': f32[2,3], 'layer': Linear(...)}\n"


# tree_at on empty tuples: `()` is one object in Python, but the position `where` picked is
# known, so both libraries replace just that one.

EMPTY_TUPLE_CASES = {
    "first of two": (lambda t: t[0], [(), ()], "hello"),
    "second of two": (lambda t: t[1], [(), ((),)], "hello"),
    "nested": (lambda t: t[0][0], [((),), ()], "hello"),
    "the whole tree": (lambda t: t, (), "hello"),
    "two at once": (lambda t: (t[0], t[1]), [(), ()], ("a", "b")),
    "a tuple of empties": (lambda t: t[0], [((), ()), ()], "hello"),
}


@pytest.mark.parametrize("case", EMPTY_TUPLE_CASES.values(), ids=EMPTY_TUPLE_CASES.keys())
def test_tree_at_on_empty_tuples_agrees(case):
    where, tree, replace = case
    assert pm.tree_at(where, tree, replace) == eqx.tree_at(where, tree, replace)


def test_tree_at_on_repeated_none_is_refused_by_both():
    with pytest.raises(ValueError, match="is_leaf"):
        pm.tree_at(lambda t: t[0], [None, None], 1)
    with pytest.raises(ValueError, match="is_leaf"):
        eqx.tree_at(lambda t: t[0], [None, None], 1)
