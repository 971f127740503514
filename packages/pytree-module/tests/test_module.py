"""Module: both field styles, statuses, inference, mutability, checks, construction errors."""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytree_module import (
    Dict,
    List,
    Module,
    check_module,
    data,
    field,
    is_data,
    static,
    tree_equal,
)


def leaf_paths(tree):
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


# ---------------------------------------------------------------- Equinox-style fields


class Adder(Module):
    parameter: float

    def __call__(self, x):
        return x + self.parameter


def test_annotated_field_is_data_and_gets_a_gradient():
    grads = jax.grad(lambda adder, x: adder(x))(Adder(1.0), 2.0)
    assert isinstance(grads, Adder)
    assert grads.parameter == 1.0


def test_generated_init_positional_keyword_and_defaults():
    class Conf(Module):
        a: int
        b: str = field(static=True, default="x")
        c: list = field(default_factory=list)

    assert Conf(1).b == "x"
    conf = Conf(a=2, b="y")
    assert (conf.a, conf.b, conf.c) == (2, "y", [])
    assert Conf(1).c is not Conf(1).c
    assert jax.tree.leaves(conf) == [2]


def test_static_field_lives_in_the_treedef():
    class Named(Module):
        weight: jax.Array
        name: str = static(default="layer", kw_only=True)

    a, b = Named(jnp.ones(2)), Named(jnp.ones(2), name="other")
    assert jax.tree.leaves(a) == [a.weight]
    assert jax.tree.structure(a) != jax.tree.structure(b)


def test_dataclasses_field_metadata_static_is_honoured():
    class Bar(Module):
        a: int = dataclasses.field(metadata={"static": False})
        b: str = dataclasses.field(metadata={"static": True})

    assert jax.tree.leaves(Bar(a=10, b="hello")) == [10]


def test_data_and_static_field_specifiers_seed_example():
    class Foo(Module):
        i: int = data()
        x: jax.Array
        a: int
        s: str = static(default="hi", kw_only=True)

    class Bar(Module):
        ls: list = data()
        shapes: list = static()

    bar = Bar(ls=[Foo(i, jnp.array(42 * i), hash(i)) for i in range(2)], shapes=[8, 16, 32])
    # Annotated fields are data (Equinox semantics), in declaration order.
    assert leaf_paths(bar) == [
        ".ls[0].i",
        ".ls[0].x",
        ".ls[0].a",
        ".ls[1].i",
        ".ls[1].x",
        ".ls[1].a",
    ]
    assert bar.shapes == [8, 16, 32]
    assert jax.tree.structure(bar) == jax.tree.structure(
        Bar(ls=[Foo(i, jnp.array(0), 0) for i in range(2)], shapes=[8, 16, 32])
    )


def test_parent_custom_init_is_inherited():
    class Base(Module):
        x: int

        def __init__(self, value):
            self.x = value * 2

    class Child(Base):
        pass

    assert Child(3).x == 6


def test_converter_runs_once_after_init_then_check_init():
    calls = []

    class Scaled(Module):
        value: jax.Array = field(converter=jnp.asarray)

        def __check_init__(self):
            calls.append(type(self.value))
            if self.value.ndim != 0:
                raise ValueError("value must be a scalar")

    s = Scaled(3.0)
    assert isinstance(s.value, jax.Array)
    assert calls == [type(s.value)]
    with pytest.raises(ValueError, match="scalar"):
        Scaled([1.0, 2.0])


def test_check_init_runs_for_every_class_in_the_mro():
    seen = []

    class A(Module):
        x: int

        def __check_init__(self):
            seen.append("A")

    class B(A):
        def __check_init__(self):
            seen.append("B")

    B(1)
    assert sorted(seen) == ["A", "B"]


def test_paper_appendix_module_with_custom_init():
    class MyModule(Module):
        layers: list
        activation: Callable
        bias: jax.Array

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.layers = [jax.random.normal(k1, (2, 8)), jax.random.normal(k2, (8, 2))]
            self.activation = jax.nn.relu
            self.bias = jnp.ones(2)

        def __call__(self, x):
            for w in self.layers[:-1]:
                x = self.activation(x @ w)
            return x @ self.layers[-1] + self.bias

    model = MyModule(jax.random.key(0))
    assert leaf_paths(model) == [".layers[0]", ".layers[1]", ".activation", ".bias"]
    assert model(jnp.ones(2)).shape == (2,)


# ------------------------------------------------------------------ NNX-style inference


class Linear(Module):
    def __init__(self, din, dout):
        self.din, self.dout = din, dout
        self.w = jnp.ones((din, dout))
        self.b = jnp.zeros((dout,))


class MLP(Module):
    def __init__(self, num_layers, dim):
        self.num_layers = num_layers
        self.layers = []
        for _ in range(num_layers):
            self.layers.append(Linear(dim, dim))


def test_inferred_statuses_and_list_of_modules_built_by_append():
    mlp = MLP(num_layers=2, dim=1)
    assert leaf_paths(mlp) == [".layers[0].b", ".layers[0].w", ".layers[1].b", ".layers[1].w"]
    assert "num_layers" not in str(leaf_paths(mlp))


def test_structure_does_not_depend_on_assignment_order():
    class Twice(Module):
        def __init__(self, flip):
            if flip:
                self.b = jnp.zeros(1)
                self.a = jnp.zeros(1)
            else:
                self.a = jnp.zeros(1)
                self.b = jnp.zeros(1)

    assert jax.tree.structure(Twice(True)) == jax.tree.structure(Twice(False))


def test_explicit_wrappers_force_status():
    class Bar(Module):
        def __init__(self, x, use_bias):
            self.x = data(x)
            self.y = data(42)
            self.ls = List([jnp.array(i) for i in range(3)])
            self.bias = data(None)
            if use_bias:
                self.bias = jnp.array(0.0)

    assert leaf_paths(Bar(1.0, True)) == [".bias", ".ls[0]", ".ls[1]", ".ls[2]", ".x", ".y"]
    assert leaf_paths(Bar(1.0, False)) == [".ls[0]", ".ls[1]", ".ls[2]", ".x", ".y"]


def test_status_is_kept_on_reassignment_unless_a_wrapper_overrides():
    class Foo(Module):
        def __init__(self):
            self.a = jnp.array(1.0)
            self.b = "Hello, world!"
            self.c = data(3.14)

    foo = Foo()
    assert leaf_paths(foo) == [".a", ".c"]
    foo.a = "text"
    foo.b = data(42)
    foo.c = static(0.5)
    assert leaf_paths(foo) == [".a", ".b"]
    assert jax.tree.leaves(foo) == ["text", 42]
    assert foo.c == 0.5


def test_attribute_added_after_init_is_inferred_at_assignment():
    lin = Linear(1, 1)
    lin.extra = jnp.ones(3)
    lin.label = "x"
    assert ".extra" in leaf_paths(lin)
    assert ".label" not in leaf_paths(lin)
    del lin.extra
    assert ".extra" not in leaf_paths(lin)


def test_empty_list_is_static_but_List_is_data():
    class Holder(Module):
        def __init__(self):
            self.plain = []
            self.explicit = List()

    h = Holder()
    h.explicit.append(jnp.ones(1))
    assert leaf_paths(h) == [".explicit[0]"]


def test_dict_and_Dict_of_modules_are_data():
    class Holder(Module):
        def __init__(self):
            self.blocks = {"a": Linear(1, 1)}
            self.more = Dict(b=Linear(1, 1))

    assert leaf_paths(Holder()) == [
        ".blocks['a'].b",
        ".blocks['a'].w",
        ".more['b'].b",
        ".more['b'].w",
    ]


def test_static_lists_and_dicts_are_hashed_by_content():
    class Shapes(Module):
        def __init__(self, shapes):
            self.shapes = shapes
            self.opts = {"k": 1}
            self.w = jnp.ones(1)

    a, b, c = Shapes([8, 16]), Shapes([8, 16]), Shapes([8, 32])
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert jax.tree.structure(a) != jax.tree.structure(c)
    rebuilt = jax.tree.map(lambda x: x, a)
    assert rebuilt.shapes == [8, 16] and rebuilt.opts == {"k": 1}
    # Frozen on assignment, so rebuilt modules can share them: no one changes them in place.
    assert rebuilt.shapes is a.shapes and isinstance(rebuilt.shapes, list)


def test_numpy_arrays_and_scalars_are_data():
    class Holder(Module):
        def __init__(self):
            self.a = np.ones(2)
            self.b = np.float32(1.0)
            self.c = 1.0

    assert leaf_paths(Holder()) == [".a", ".b"]


def test_is_data_rules():
    assert is_data(jnp.array(0)) and is_data(np.zeros(1)) and is_data(Linear(1, 1))
    assert is_data([1, jnp.ones(1)]) and is_data({"a": (jnp.ones(1),)})
    assert not is_data("hello") and not is_data(42) and not is_data([1, 2.0, 3j])
    assert not is_data(jnp.float32)


def test_unflatten_skips_init_and_accepts_any_leaves():
    calls = []

    class Counted(Module):
        def __init__(self):
            calls.append(1)
            self.w = jnp.ones(2)

    m = Counted()
    treedef = jax.tree.structure(m)
    rebuilt = jax.tree.unflatten(treedef, [None])
    assert rebuilt.w is None and len(calls) == 1
    shaped = jax.eval_shape(lambda m: m, m)
    assert isinstance(shaped.w, jax.ShapeDtypeStruct)


def test_modules_compare_by_identity():
    a, b = Linear(1, 1), Linear(1, 1)
    assert a != b and a == a
    assert len({a, b}) == 2
    assert tree_equal(a, b)


def test_jit_retraces_only_when_static_parts_change():
    traces = []

    @jax.jit
    def f(m, x):
        traces.append(1)
        return x @ m.w

    lin = Linear(2, 2)
    f(lin, jnp.ones(2))
    f(Linear(2, 2), jnp.ones(2))
    assert len(traces) == 1
    lin.din = 3
    f(lin, jnp.ones(2))
    assert len(traces) == 2


def test_property_setters_are_respected():
    class WithProperty(Module):
        def __init__(self):
            self._x = jnp.ones(1)

        @property
        def x(self):
            return self._x

        @x.setter
        def x(self, value):
            self._x = value * 2

    m = WithProperty()
    m.x = jnp.ones(1)
    assert float(m._x[0]) == 2.0
    assert leaf_paths(m) == ["._x"]


def test_copy_deepcopy_and_pickle_keep_structure():
    import copy
    import pickle

    lin = Linear(2, 3)
    for clone in (copy.copy(lin), copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
        assert jax.tree.structure(clone) == jax.tree.structure(lin)
        assert tree_equal(clone, lin)
        clone.din = 7  # still mutable, still guarded normally


# ------------------------------------------------------------------------ mutability


class Frozen(Module, frozen=True):
    weight: jax.Array
    name: str = static(default="f")


def test_mutable_by_default():
    lin = Linear(1, 1)
    lin.w = jnp.zeros((1, 1))
    assert float(lin.w[0, 0]) == 0.0


def test_frozen_refuses_assignment_and_deletion():
    f = Frozen(jnp.ones(2))
    with pytest.raises(dataclasses.FrozenInstanceError, match="tree_at"):
        f.weight = jnp.zeros(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del f.weight
    assert float(f.weight[0]) == 1.0


def test_frozen_is_inherited_and_check_init_cannot_mutate():
    class Child(Frozen):
        def __check_init__(self):
            self.name = "changed"

    with pytest.raises(dataclasses.FrozenInstanceError):
        Child(jnp.ones(1))


def test_frozen_with_fields_refuses_undeclared_attributes():
    class Strict(Module, frozen=True):
        a: int

        def __init__(self):
            self.a = 1
            self.b = 2

    with pytest.raises(ValueError, match="not one of its fields"):
        Strict()


def test_bad_class_options():
    with pytest.raises(TypeError, match="frozen"):

        class Bad(Module, frozen="yes"):
            pass


# ------------------------------------------------------------------------- pytree=False


def test_pytree_false_is_a_leaf_and_unchecked():
    class Graph(Module, pytree=False):
        def __init__(self):
            self.a = [jnp.array(1), jnp.array(2)]
            self.b = "hello"
            self.b = jnp.array(3)
            self.me = self  # cycles are fine for non-pytree objects

    g = Graph()
    assert jax.tree_util.all_leaves([g])
    assert jax.tree.leaves(g) == [g]
    g.b = static(jnp.array(4))  # no checks
    assert int(g.b) == 4


# ----------------------------------------------------------------------------- errors


def test_missing_and_extra_constructor_arguments_raise_type_error():
    class Conf(Module):
        a: int
        b: int = 2

    with pytest.raises(TypeError, match=r"Conf\(a, b=2\) got bad arguments: missing"):
        Conf()
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        Conf(1, c=3)
    with pytest.raises(TypeError, match="too many positional"):
        Conf(1, 2, 3)
    with pytest.raises(TypeError, match=r"Linear\(din, dout\)"):
        Linear(1)


def test_type_error_inside_init_body_is_not_rewritten():
    class Broken(Module):
        def __init__(self):
            self.x = 1 + "a"

    with pytest.raises(TypeError, match="unsupported operand"):
        Broken()


def test_custom_init_missing_annotated_field():
    class Forgetful(Module):
        weight: jax.Array
        bias: jax.Array

        def __init__(self):
            self.weight = jnp.ones(1)

    with pytest.raises(ValueError, match=r"did not set the annotated field\(s\) 'bias'"):
        Forgetful()


def test_arrays_assigned_with_static_wrapper():
    class Foo(Module):
        def __init__(self, name):
            self.name = static(name)

    with pytest.raises(
        ValueError,
        match=r"^Found Arrays in value of type .* annotated with static\(\.\.\.\) .*'name' of Foo",
    ):
        Foo(name=jnp.array(123))


def test_arrays_assigned_to_known_static_attribute_leave_nothing_changed():
    class Foo(Module):
        def __init__(self, name):
            self.name = static(name)
            self.w = jnp.ones(1)

    foo = Foo("mattjj")
    structure = jax.tree.structure(foo)
    with pytest.raises(
        ValueError,
        match=r"^Found Arrays on value of type .* assigned to static attribute 'name' of Foo"
        r".*data\(\.\.\.\)",
    ):
        foo.name = jnp.array(123)
    assert foo.name == "mattjj"
    assert jax.tree.structure(foo) == structure
    foo.name = data(jnp.array(123))
    assert ".name" in leaf_paths(foo)


def test_arrays_in_static_field_at_init():
    class Foo(Module):
        shape: tuple = static()

    with pytest.raises(
        ValueError,
        match=r"^Found unexpected Arrays on value of type .* in static attribute 'shape' of Foo",
    ):
        Foo(jnp.ones(2))


def test_unhashable_static_values_are_refused():
    class Opaque:
        __hash__ = None

    class Foo(Module):
        def __init__(self, value):
            self.value = static(value)

    with pytest.raises(ValueError, match="must be hashable"):
        Foo(Opaque())
    foo = Foo("ok")
    with pytest.raises(ValueError, match="must be hashable"):
        foo.value = Opaque()
    assert foo.value == "ok"
    with pytest.raises(ValueError, match="must be hashable"):
        foo.fresh = Opaque()
    assert not hasattr(foo, "fresh")


def test_wrappers_nested_in_containers_are_refused():
    class Foo(Module):
        def __init__(self):
            self.a = [data(1), static(2)]

    with pytest.raises(ValueError, match=r"inside a container.*`self.a = data\(\[\.\.\.\]\)`"):
        Foo()
    lin = Linear(1, 1)
    with pytest.raises(ValueError, match="inside a container"):
        lin.extra = {"k": data(1)}
    assert not hasattr(lin, "extra")


def test_wrapper_misuse():
    with pytest.raises(TypeError, match="takes no options"):
        data(1, default=2)
    with pytest.raises(ValueError, match="already wrapped"):
        data(static(1))


def test_assigning_a_bound_method_of_self_is_refused():
    class Foo(Module):
        def __init__(self):
            self.fn = self.method

        def method(self):
            return 1

    with pytest.raises(ValueError, match="bound method of this Foo"):
        Foo()
    lin = Linear(1, 1)
    with pytest.raises(ValueError, match="bound method"):
        lin.cb = lin.__repr__


def test_flattening_during_init_is_a_clear_error():
    class Early(Module):
        def __init__(self):
            self.w = jnp.ones(1)
            jax.tree.leaves(self)

    with pytest.raises(ValueError, match="still running its __init__"):
        Early()


@pytest.mark.parametrize("where", ["__init__", "nested __init__", "missing field", "converter"])
def test_a_construction_that_raises_leaves_no_module_initialising(where):
    from pytree_module._module import _INITIALISING

    class Inner(Module):
        def __init__(self):
            self.w = jnp.ones(1)
            if where == "nested __init__":
                raise RuntimeError("inner")

    class Failing(Module):
        needed: int
        converted: int = field(converter=int, default=0)

        def __init__(self):
            self.w = jnp.ones(1)
            self.inner = Inner()
            if where == "__init__":
                raise RuntimeError("outer")
            if where != "missing field":
                self.needed = 1
            if where == "converter":
                self.converted = "not a number"

    before = dict(_INITIALISING)
    with pytest.raises((RuntimeError, ValueError)):
        Failing()
    assert before == _INITIALISING


def test_init_runs_no_user_hash_or_eq_of_the_module():
    # Hashing these before `n` is set would fail: "still initialising" is keyed by id.
    class ValueHashed(Module):
        def __init__(self, n):
            self.w = jnp.ones(1)
            self.n = n

        def __hash__(self):
            return hash(self.n)

        def __eq__(self, other):
            return self.n == other.n

    assert ValueHashed(2) == ValueHashed(2)
    assert hash(ValueHashed(3)) == hash(3)


def test_arrays_put_into_a_forced_static_value_during_init():
    class Foo(Module):
        def __init__(self):
            self.ls = static([])
            self.ls.append(jnp.ones(1))

    with pytest.raises(ValueError, match="'ls' of Foo is static but its value holds arrays"):
        Foo()


# ------------------------------------------------------- containers filled after __init__


class Affine(Module):
    def __init__(self, scale):
        self.scale = jnp.asarray(scale)

    def __call__(self, x):
        return self.scale * x


class Stack(Module):
    def __init__(self, fill=False):
        self.layers = []
        self.by_name = {}
        if fill:
            self.layers.append(Affine(2.0))

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("fill_in_init", [False, True])
def test_empty_list_filled_after_init_is_data_and_trains(fill_in_init):
    stack = Stack(fill=fill_in_init)
    if not fill_in_init:
        stack.layers.append(Affine(2.0))
    stack.by_name["extra"] = Affine(3.0)
    check_module(stack)
    assert leaf_paths(stack) == [".by_name['extra'].scale", ".layers[0].scale"]
    copied = jax.jit(lambda m: m)(stack)
    assert len(copied.layers) == 1 and float(copied.by_name["extra"].scale) == 3.0
    grads = jax.grad(lambda m, x: m(x))(stack, 5.0)
    assert float(grads.layers[0].scale) == 5.0


def test_empty_containers_assigned_after_init_or_nested_are_data():
    stack = Stack()
    stack.blocks = ()
    stack.nested = [[], {}]
    stack.blocks = (Affine(1.0),)
    stack.nested[0].append(Affine(4.0))
    assert len(jax.tree.leaves(jax.jit(lambda m: m)(stack))) == 2


def test_containers_of_plain_values_stay_static():
    class Config(Module):
        def __init__(self):
            self.sizes = []
            self.sizes.append(8)
            self.options = {"layers": [], "act": "relu"}

    config = Config()
    assert jax.tree.leaves(config) == []
    assert jax.jit(lambda m: m)(config).options == {"layers": [], "act": "relu"}


# ------------------------------------------------------------------ class construction


def test_signature_of_a_module_class_is_its_init():
    class Generated(Module):
        x: int
        y: float = 1.0
        z: str = field(static=True, default="z", kw_only=True)

    class Custom(Module):
        def __init__(self, din, dout, *, bias=True):
            self.din = din

    assert str(inspect.signature(Generated)) == "(x: int, y: float = 1.0, *, z: str = 'z') -> None"
    assert str(inspect.signature(Custom)) == "(din, dout, *, bias=True)"
    assert str(inspect.signature(Stack)) == "(fill=False)"


class Tagged:
    """A plain mixin whose __init__ passes its arguments on."""

    def __init__(self, *args, **kwargs):
        self.tag = "tagged"
        super().__init__(*args, **kwargs)


def test_a_plain_mixin_init_earlier_in_the_mro_runs():
    class Point(Tagged, Module):
        x: int
        y: int = 0

    point = Point(3, y=4)
    assert point.tag == "tagged" and (point.x, point.y) == (3, 4)
    assert Point(5).y == 0
    assert str(inspect.signature(Point)) == "(*args, **kwargs)"
    with pytest.raises(TypeError, match=r"fields of Point.*too many positional arguments"):
        Point(1, 2, 3)
    with pytest.raises(ValueError, match=r"did not set the annotated field\(s\) 'x'"):
        Point()


def test_a_mixin_after_module_in_the_mro_keeps_the_generated_init():
    class Point(Module, Tagged):
        x: int

    point = Point(3)
    assert point.x == 3 and not hasattr(point, "tag")


def test_init_false_field_overridden_by_a_subclass_property():
    class Base(Module):
        y: int
        x: int = field(init=False)

    class WithProperty(Base):
        @property
        def x(self):
            return 5 * self.y

    module = WithProperty(1)
    assert module.x == 5 and jax.tree.leaves(module) == [1]
    assert str(inspect.signature(WithProperty)) == "(y: int) -> None"
    assert jax.jit(lambda m: m)(module).x == 5


def test_static_field_overridden_by_a_subclass_class_attribute_stays_static():
    class Base(Module):
        size: int = field(static=True)
        weight: jax.Array = None

        def __init__(self):
            self.weight = jnp.ones(2)

    class Sized(Base):
        size = 9

    sized = Sized()
    assert sized.size == 9 and jax.tree.leaves(sized) == [sized.weight]
    assert jax.jit(lambda m: m)(sized).size == 9
    sized.size = 4  # still static: kept in the treedef, and arrays are refused
    assert jax.tree.leaves(sized) == [sized.weight] and jax.jit(lambda m: m)(sized).size == 4
    with pytest.raises(ValueError, match="static attribute 'size'"):
        sized.size = jnp.ones(1)


def test_slots_on_a_module_subclass_are_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"__slots__ = \('cache',\).*Remove __slots__"):

        class Cached(Module):
            __slots__ = ("cache",)
            x: int

    class Empty(Module):
        __slots__ = ()
        x: int

    assert jax.tree.leaves(Empty(1)) == [1]


T = TypeVar("T")


@pytest.mark.parametrize("frozen", [False, True])
def test_generic_modules_accept_orig_class_outside_their_structure(frozen):
    class Box(Module, Generic[T], frozen=frozen):
        value: T

    box = Box[int](1)
    assert box.__orig_class__ == Box[int]
    assert jax.tree.structure(box) == jax.tree.structure(Box(1))
    assert "__orig_class__" not in repr(box)
    check_module(box)
    assert jax.jit(lambda m: m)(box).value == 1


def test_a_container_that_holds_itself_is_refused_on_assignment():
    class Holder(Module):
        def __init__(self, value):
            self.value = value

    looped_list = [1.0]
    looped_list.append(looped_list)
    looped_dict = {"a": 1.0}
    looped_dict["self"] = (looped_dict,)
    for looped in (looped_list, looped_dict):
        with pytest.raises(ValueError, match="Attribute 'value' of Holder holds a list, tuple"):
            Holder(looped)
        holder = Holder(2.0)
        with pytest.raises(ValueError, match="contains itself"):
            holder.value = looped
        assert holder.value == 2.0
