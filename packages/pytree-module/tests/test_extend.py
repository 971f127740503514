"""`pytree_module.extend`: every name of the extension surface, as library authors use it."""

import ast
import collections
import inspect
import itertools
import re
import traceback
import types
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import wadler_lindig

from pytree_module import Module, data, extend, field, static
from pytree_module.extend import (
    Layout,
    MutationCount,
    TreedefEntry,
    blank_instance,
    construct,
    constructor_pdoc,
    current_trace_token,
    flat_form,
    is_frozen_class,
    is_pytree_class,
    mutations,
    rebuild_into,
    same_trace,
    touch,
    trace_of,
)


class Scale(Module):
    factor: jax.Array
    name: str = field(static=True)
    sizes: list = field(static=True, default_factory=list)


class Shift(Module):
    offset: jax.Array


class Frozen(Module, frozen=True):
    value: jax.Array


class FrozenChild(Frozen):
    pass


class Node(Module, pytree=False):
    def __init__(self):
        self.value = 1


# ------------------------------------------------------------------------ docstrings


def _attribute_docstrings(module: types.ModuleType) -> set[str]:
    """Names assigned at the top of `module` and followed by a string (attribute docstrings)."""
    body = ast.parse(Path(inspect.getfile(module)).read_text()).body
    documented = set()
    for statement, following in itertools.pairwise(body):
        target = None
        if isinstance(statement, ast.AnnAssign):
            target = statement.target
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
        target = target.id if isinstance(target, ast.Name) else None
        if (
            target is not None
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
            and following.value.value.strip()
        ):
            documented.add(target)
    return documented


def _own_docstring(obj: object) -> str | None:
    """The docstring a function or class was given itself (not one inherited from its type)."""
    if isinstance(obj, type):
        return vars(obj).get("__doc__")
    if isinstance(obj, types.FunctionType):
        return obj.__doc__
    return None


@pytest.mark.parametrize("name", extend.__all__)
def test_every_public_name_has_a_docstring(name):
    obj = getattr(extend, name)
    documented = (_own_docstring(obj) or "").strip() or name in _attribute_docstrings(extend)
    assert documented, f"pytree_module.extend.{name} has neither a docstring nor an attribute one"


def test_all_lists_exactly_the_public_names():
    public = {n for n, v in vars(extend).items() if not n.startswith("_")}
    imported_modules = {n for n, v in vars(extend).items() if isinstance(v, types.ModuleType)}
    helpers = {"Any", "Callable", "Sequence", "Module"}
    assert set(extend.__all__) == public - imported_modules - helpers


# ------------------------------------------------------------------------ flat forms


def test_flat_form_is_what_jax_flattens_and_the_entry_rebuilds():
    scale = Scale(jnp.ones(2), "s", [1, 2])
    children, entry = flat_form(scale)
    assert children == tuple(jax.tree_util.tree_leaves(scale))
    assert jax.tree_util.tree_structure(scale) == jax.tree_util.tree_structure(entry(children))
    rebuilt = entry((jnp.zeros(2),))
    assert type(rebuilt) is Scale
    assert rebuilt.name == "s" and rebuilt.sizes == [1, 2]
    np.testing.assert_array_equal(rebuilt.factor, jnp.zeros(2))
    # Static lists are frozen on assignment, so rebuilt modules can share them.
    assert rebuilt.sizes is scale.sizes
    assert flat_form(rebuilt)[1] is entry


def test_flat_form_has_no_entry_while_init_runs():
    seen = []

    class Probe(Module):
        def __init__(self):
            self.weight = jnp.ones(2)
            seen.append(flat_form(self)[1])

    Probe()
    assert seen == [None]


def test_treedef_entry_has_the_attributes_its_protocol_declares():
    scale = Scale(jnp.ones(2), "s")
    children, entry = flat_form(scale)
    declared = {n for n in vars(TreedefEntry).get("__annotations__", {})}
    assert declared == {"layout", "statics", "get_data"}
    for name in declared:
        assert hasattr(entry, name), name
    assert entry.statics == ("s", [])
    assert entry.get_data(vars(scale)) == children
    assert entry.__name__ == "Scale(name='s', sizes=[])"
    assert callable(entry)


def test_layout_describes_the_structure_and_is_shared():
    a, b = Scale(jnp.ones(2), "a"), Scale(jnp.zeros(3), "b")
    layout = flat_form(a)[1].layout
    assert isinstance(layout, Layout)
    assert layout is flat_form(b)[1].layout
    assert layout.cls is Scale
    assert layout.data_keys == ("factor",)
    assert layout.static_keys == ("name", "sizes")
    assert layout.key_entries == (jax.tree_util.GetAttrKey("factor"),)
    assert repr(layout) == "Layout(Scale, data=('factor',), static=('name', 'sizes'))"
    # Equal static values share one entry; other values make another.
    assert flat_form(a)[1] is flat_form(Scale(jnp.ones(1), "a"))[1]
    assert flat_form(a)[1] is not flat_form(b)[1]


def test_layout_rebuild_into_fills_an_existing_instance():
    _, entry = flat_form(Scale(jnp.ones(2), "s", [3]))
    target = blank_instance(Scale)
    entry.layout.rebuild_into(target, [jnp.zeros(2)], entry)
    assert target.name == "s" and target.sizes == [3]
    assert target.sizes is entry.statics[1]
    assert flat_form(target)[1] is entry
    assert isinstance(flat_form(target)[0], tuple)


def test_a_traceback_through_a_rebuild_shows_the_generated_builder():
    _, entry = flat_form(Shift(jnp.ones(2)))
    with pytest.raises(IndexError) as raised:
        entry(())  # no leaf for `offset`
    innermost = traceback.extract_tb(raised.tb)[-1]
    expected = rf"<pytree_module {re.escape(Shift.__module__)}\.Shift builder #\d+>"
    assert re.fullmatch(expected, innermost.filename), innermost.filename
    assert innermost.line == "d['offset'] = children[0]"
    shown = "".join(traceback.format_exception(raised.value))
    assert f'File "{innermost.filename}", line {innermost.lineno}, in build' in shown
    assert "d['offset'] = children[0]" in shown


# ------------------------------------------------------------------------ class facts


def test_class_facts():
    assert is_pytree_class(Scale) and not is_pytree_class(Node)
    assert is_frozen_class(Frozen) and is_frozen_class(FrozenChild)
    assert not is_frozen_class(Scale) and not is_frozen_class(Node)

    class Thawed(Frozen, frozen=False):
        pass

    class NodeChild(Node):
        pass

    assert not is_frozen_class(Thawed)
    assert not is_pytree_class(NodeChild)


# ------------------------------------------------------------------------ making and filling


def test_blank_instance_has_no_attributes_and_belongs_to_this_trace():
    blank = blank_instance(Scale)
    assert type(blank) is Scale
    assert vars(blank) == {}
    assert same_trace(trace_of(blank))

    @jax.jit
    def inside(x):
        made = blank_instance(Shift)
        assert same_trace(trace_of(made))
        assert not same_trace(trace_of(blank))
        return x

    inside(1.0)


def test_blank_instance_of_a_graph_class_is_filled_by_object_setattr():
    node = blank_instance(Node)
    object.__setattr__(node, "value", 2)
    assert node.value == 2


def test_construct_runs_another_init_with_the_usual_finishing_steps():
    class Checked(Module):
        size: int = field(static=True, converter=int)

        def __init__(self, size):
            raise AssertionError("construct runs the init it is given, not this one")

        def __check_init__(self):
            if self.size < 0:
                raise ValueError("size must be >= 0")

    def init(self, size, *, scale=1):
        self.size = size * scale
        self.weight = jnp.ones(2)

    made = construct(Checked, init, 2.0, scale=3)
    assert type(made) is Checked and made.size == 6  # the converter ran
    assert flat_form(made)[1].layout.data_keys == ("weight",)  # statuses settled
    with pytest.raises(ValueError, match="size must be >= 0"):  # __check_init__ ran
        construct(Checked, init, -1)
    with pytest.raises(TypeError, match="construct expects a subclass of Module"):
        construct(dict, init)
    with pytest.raises(TypeError, match="construct: init must be callable"):
        construct(Checked, None)


@pytest.mark.parametrize("bad", [dict, Scale(jnp.ones(2), "s"), "Scale"])
def test_blank_instance_refuses_what_is_not_a_module_class(bad):
    with pytest.raises(TypeError, match="blank_instance expects a subclass of Module"):
        blank_instance(bad)


def test_rebuild_into_fills_a_blank_instance_and_records_the_write():
    _, entry = flat_form(Scale(jnp.ones(2), "s", [1]))
    target = blank_instance(Scale)
    before = mutations.count
    rebuild_into(target, entry, (jnp.zeros(2),))
    assert mutations.count == before + 1
    assert target.name == "s" and target.sizes == [1]
    np.testing.assert_array_equal(target.factor, jnp.zeros(2))
    assert flat_form(target)[1] is entry
    # The filled instance behaves as any other: assignment keeps its leaves in step.
    target.factor = jnp.full(2, 3.0)
    np.testing.assert_array_equal(jax.tree_util.tree_leaves(target)[0], jnp.full(2, 3.0))


def test_rebuild_into_replaces_the_attributes_of_an_existing_instance():
    target = Scale(jnp.ones(2), "old")
    target.extra = 5
    _, entry = flat_form(Scale(jnp.zeros(2), "new"))
    rebuild_into(target, entry, [jnp.zeros(2)])
    assert vars(target).keys() == {"factor", "name", "sizes"}
    assert target.name == "new"


def test_rebuild_into_refuses_an_entry_of_another_class_and_changes_nothing():
    target = Scale(jnp.ones(2), "s")
    held = flat_form(target)
    _, other = flat_form(Shift(jnp.zeros(2)))
    before = mutations.count
    with pytest.raises(TypeError, match=r"the entry builds Shift instances, but the module is a"):
        rebuild_into(target, other, (jnp.zeros(2),))
    assert mutations.count == before
    assert flat_form(target) is held and target.name == "s"


def test_rebuild_into_refuses_an_entry_of_a_parent_class():
    class Child(Shift):
        pass

    _, parent_entry = flat_form(Shift(jnp.zeros(2)))
    with pytest.raises(TypeError, match="Pass an entry taken from a Child"):
        rebuild_into(blank_instance(Child), parent_entry, (jnp.zeros(2),))


# ------------------------------------------------------------------------ traces


def test_trace_tokens():
    outside = current_trace_token()
    assert same_trace(outside)
    module = Shift(jnp.ones(2))
    assert same_trace(trace_of(module))

    @jax.jit
    def inside(m):
        assert not same_trace(outside)
        assert not same_trace(trace_of(module))
        # A module passed in is rebuilt by unflattening, in this trace.
        assert same_trace(trace_of(m))
        assert same_trace(current_trace_token())
        return m

    inside(module)


# ------------------------------------------------------------------------ mutation count


def test_touch_and_the_writes_that_call_it():
    assert isinstance(mutations, MutationCount)
    start = mutations.count
    touch()
    assert mutations.count == start + 1
    module = Shift(jnp.ones(2))  # construction changes no existing object
    assert mutations.count == start + 1
    module.offset = jnp.zeros(2)
    assert mutations.count == start + 2
    module.label = static("x")
    assert mutations.count == start + 3
    del module.label
    assert mutations.count == start + 4
    node = Node()
    node.value = data(jnp.ones(1))
    assert mutations.count == start + 5


def test_a_refused_assignment_is_not_counted():
    frozen = Frozen(jnp.ones(2))
    start = mutations.count
    with pytest.raises(AttributeError, match="frozen"):
        frozen.value = jnp.zeros(2)
    assert mutations.count == start


# ------------------------------------------------------------------------ printing


def test_constructor_pdoc_prints_objects_as_modules_print():
    class Pair:
        def __pdoc__(self, **kwargs):
            return constructor_pdoc(self, [("a", 1), ("b", "x")], **kwargs)

    assert wadler_lindig.pformat(Pair()) == "Pair(a=1, b='x')"
    assert wadler_lindig.pformat(Pair(), width=8) == "Pair(\n  a=1,\n  b='x'\n)"


# ------------------------------------------------------------------------ static keys


class _Point(NamedTuple):
    x: float


class _Scale(float):
    pass


class _Phase(complex):
    pass


# Pairs that `==` calls equal but that a traced function can tell apart.
_LOOKALIKE_STATICS = [
    pytest.param(1, 1.0, id="int-float"),
    pytest.param(1, True, id="int-bool"),
    pytest.param(0.0, -0.0, id="signed-zero"),
    pytest.param(float("nan"), -float("nan"), id="signed-nan"),
    pytest.param(complex(0.0, 0.0), complex(0.0, -0.0), id="complex"),
    pytest.param(np.float64(0.0), np.float64(-0.0), id="numpy-float64"),
    pytest.param(np.float32(1.0), 1.0, id="numpy-float32-and-float"),
    pytest.param(np.float16(0.0), np.float16(-0.0), id="numpy-float16"),
    pytest.param(np.complex64(0.0), np.complex64(-0.0), id="numpy-complex64"),
    pytest.param(_Scale(0.0), _Scale(-0.0), id="float-subclass"),
    pytest.param(_Phase(0.0), _Phase(-0.0), id="complex-subclass"),
    pytest.param(_Point(0.0), _Point(-0.0), id="namedtuple"),
    pytest.param(_Point(np.float64(0.0)), _Point(np.float64(-0.0)), id="namedtuple-numpy"),
    pytest.param(_Point(1.0), (1.0,), id="namedtuple-and-tuple"),
    pytest.param((1, [0.0]), (1, [-0.0]), id="nested"),
    pytest.param([0.0], [-0.0], id="list"),
    pytest.param({"a": 0.0}, {"a": -0.0}, id="dict-value"),
    pytest.param({1: "a"}, {True: "a"}, id="dict-key"),
    pytest.param({"a": 1, "b": 2}, {"b": 2, "a": 1}, id="dict-order"),
    pytest.param(collections.OrderedDict(a=1), {"a": 1}, id="dict-subclass"),
    pytest.param({0.0}, {-0.0}, id="set"),
    pytest.param(frozenset({1}), {1}, id="frozenset-and-set"),
]


@pytest.mark.parametrize(("first", "second"), _LOOKALIKE_STATICS)
def test_static_key_tells_apart_values_that_compare_equal(first, second):
    assert first == second or first != first  # the premise: `==` calls them equal (or NaN)
    assert extend.static_key(first) != extend.static_key(second)
    hash(extend.static_key(first))


# Equal values of one type, made as distinct objects.
_TWIN_STATICS = [
    pytest.param(lambda: float("0.5"), id="float"),
    pytest.param(lambda: float("nan"), id="nan"),
    pytest.param(lambda: np.float32("nan"), id="numpy-nan"),
    pytest.param(lambda: complex(float("nan"), -0.0), id="complex-nan"),
    pytest.param(lambda: _Point(np.float64(-0.0)), id="namedtuple"),
    pytest.param(lambda: {"a": [1, 2.5], "b": {None}}, id="nested-containers"),
    pytest.param(lambda: "".join(["re", "lu"]), id="str"),
    pytest.param(lambda: jax.nn.relu, id="function"),
    pytest.param(lambda: jnp.float32, id="dtype-class"),
]


@pytest.mark.parametrize("make", _TWIN_STATICS)
def test_static_key_is_equal_for_equal_values_of_one_type(make):
    first, second = make(), make()
    assert extend.static_key(first) == extend.static_key(second)
    assert hash(extend.static_key(first)) == hash(extend.static_key(second))


def test_static_key_compares_other_values_with_their_own_eq():
    class Tag:
        def __init__(self, name):
            self.name = name

        def __eq__(self, other):
            return type(other) is Tag and other.name == self.name

        def __hash__(self):
            return hash(self.name)

    assert extend.static_key(Tag("a")) == extend.static_key(Tag("a"))
    assert extend.static_key(Tag("a")) != extend.static_key(Tag("b"))
    assert extend.static_key(Tag("a")) == (Tag, Tag("a"))


def test_static_key_is_the_key_of_treedef_entries():
    # Two modules share an entry (a treedef, a compilation) exactly when their statics'
    # keys are equal.
    made = [
        Scale(jnp.ones(1), "a", sizes)
        for sizes in ([0.0], [-0.0], [0.0], [False], [0], [_Point(0.0)], [_Point(-0.0)], (0.0,))
    ]
    for a, b in itertools.combinations(made, 2):
        same_entry = flat_form(a)[1] is flat_form(b)[1]
        same_key = extend.static_key(a.sizes) == extend.static_key(b.sizes)
        assert same_entry == same_key


class _Cell:
    """A registered pytree node holding one value, for `register_tree_at_rule`."""

    def __init__(self, value, unit):
        self.value, self.unit = value, unit


jax.tree_util.register_pytree_node(
    _Cell, lambda c: ((c.value,), c.unit), lambda unit, children: _Cell(children[0], unit)
)


def test_a_tree_at_rule_decides_what_replaces_a_node_of_its_type():
    from pytree_module import tree_at
    from pytree_module.extend import register_tree_at_rule

    def rule(old, new):
        if isinstance(new, _Cell):
            return new
        if isinstance(new, str):
            raise TypeError("a _Cell takes numbers")
        return _Cell(new, old.unit)

    register_tree_at_rule(_Cell, rule)
    shared = _Cell(1.0, "m")
    tree = {"a": shared, "b": shared, "c": _Cell(2.0, "s")}
    # Another object standing for the node: it takes its place everywhere.
    out = tree_at(lambda t: t["a"], tree, 5.0)
    assert out["a"] is out["b"] and (out["a"].value, out["a"].unit) == (5.0, "m")
    out = tree_at(lambda t: t["c"], tree, replace_fn=lambda c: c.value * 10)
    assert (out["c"].value, out["c"].unit) == (20.0, "s") and out["a"] is out["b"]
    # `new` itself: the place `where` picked, only.
    other = _Cell(3.0, "kg")
    out = tree_at(lambda t: t["b"], tree, other)
    assert out["b"] is other and out["a"].value == 1.0 and out["a"] is not shared
    with pytest.raises(TypeError, match="takes numbers"):
        tree_at(lambda t: t["a"], tree, "x")
    assert tree["a"].value == 1.0
    with pytest.raises(TypeError, match="expects a class"):
        register_tree_at_rule("_Cell", rule)
    with pytest.raises(TypeError, match="must be a function"):
        register_tree_at_rule(_Cell, None)


# ------------------------------------------------------------------------ bound methods


def test_bound_method_rebinds_a_python_bound_special_method_as_a_pytree():
    class Scale(Module):
        def __init__(self):
            self.w = jnp.ones(2)

        def __call__(self, x):
            return self.w * x

    scale = Scale()
    python_bound = scale.__call__  # Python binds special methods itself: a leaf for JAX
    assert jax.tree.leaves(python_bound) == [python_bound]
    bound = extend.BoundMethod(python_bound.__func__, python_bound.__self__)
    (leaf,) = jax.tree.leaves(bound)
    assert leaf is scale.w
    assert bound == extend.BoundMethod(type(scale).__call__, scale)
    rebuilt = jax.tree.map(lambda x: 3 * x, bound)
    assert rebuilt.__self__ is not scale and jnp.array_equal(rebuilt(1.0), jnp.full(2, 3.0))
