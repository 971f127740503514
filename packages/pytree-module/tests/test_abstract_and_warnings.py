"""Abstract attributes and methods, the warnings about likely mistakes, and generated __init__s."""

import abc
import dataclasses
import inspect
import sys
import warnings
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import pytest

import pytree_module as pm
from pytree_module import AbstractClassVar, AbstractVar, Module, field, tree_at


def next_line() -> int:
    """The number of the line after the caller's."""
    return sys._getframe(1).f_lineno + 1


@pytest.fixture
def caught():
    """Every warning raised in the test, however often the same one was raised before."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        yield record


class Linear(Module):
    weight: jax.Array

    def __call__(self, x):
        return self.weight * x

    def apply(self, x):
        return self.weight * x


# -------------------------------------------------------------------------- AbstractVar


class Shape(Module):
    sides: AbstractVar[int]

    def describe(self):
        return f"{self.sides} sides"


def test_an_abstract_var_is_not_a_field_of_the_declaring_class():
    assert dataclasses.fields(Shape) == ()
    assert str(inspect.signature(Shape)) == "() -> None"
    assert Shape.__annotations__ == {"sides": AbstractVar[int]}
    assert Shape.__module_info__.abstract_vars == ("sides",)


def test_a_field_provides_it_after_the_parent_fields():
    class Named(Module):
        name: str
        sides: AbstractVar[int]

    class Polygon(Named):
        colour: str
        sides: int

    polygon = Polygon("p", "red", 5)
    assert (polygon.name, polygon.colour, polygon.sides) == ("p", "red", 5)
    assert str(inspect.signature(Polygon)) == "(name: str, colour: str, sides: int) -> None"
    assert jax.tree.leaves(polygon) == ["p", "red", 5]  # annotated fields are data
    assert Polygon.__module_info__.abstract_vars == ()


@pytest.mark.parametrize("how", ["class attribute", "ClassVar", "property", "method"])
def test_a_class_level_value_provides_it(how):
    if how == "class attribute":

        class Square(Shape):
            sides = 4
    elif how == "ClassVar":

        class Square(Shape):
            sides: ClassVar[int] = 4
    elif how == "property":

        class Square(Shape):
            @property
            def sides(self):
                return 4
    else:

        class Square(Shape):
            def sides(self):
                return 4

    assert Square.__module_info__.abstract_vars == ()
    square = Square()
    assert jax.tree.leaves(square) == [] and jax.jit(lambda s: s)(square) is not square


def test_an_assignment_in_init_provides_it_with_an_inferred_status():
    class Polygon(Shape):
        def __init__(self, sides, scale):
            self.sides = sides
            self.scale = jnp.asarray(scale)

    polygon = Polygon(6, 2.0)
    assert polygon.describe() == "6 sides"
    assert jax.tree.leaves(polygon) == [polygon.scale]  # `sides` is an int: static
    rebuilt = jax.jit(lambda p: p)(polygon)
    assert rebuilt.sides == 6
    assert tree_at(lambda p: p.scale, polygon, jnp.asarray(3.0)).sides == 6


def test_an_unprovided_abstract_var_is_refused_after_init_before_check_init():
    calls = []

    class Unfinished(Shape):
        size: int

        def __init__(self):
            calls.append("__init__")

        def __check_init__(self):
            calls.append("__check_init__")

    with pytest.raises(TypeError) as error:
        Unfinished()
    # As in Equinox: `__init__` has run, `__check_init__` has not, and the abstract
    # attribute is reported before the field `size` that `__init__` did not set either.
    assert calls == ["__init__"]
    message = str(error.value)
    assert message.startswith("Can't instantiate abstract class Unfinished")
    assert "'sides' (declared `sides: AbstractVar[int]` in Shape)" in message
    assert "`sides: int`" in message and "`self.sides = ...`" in message


def test_the_declaring_class_itself_cannot_be_instantiated():
    with pytest.raises(TypeError, match=r"abstract class Shape: .*'sides'"):
        Shape()


def test_init_setting_it_only_on_some_paths_is_checked_per_instance():
    class Maybe(Shape):
        def __init__(self, sides=None):
            if sides is not None:
                self.sides = sides

    assert Maybe(3).sides == 3
    with pytest.raises(TypeError, match="'sides'"):
        Maybe()


def test_redeclaring_keeps_it_abstract_and_narrowing_makes_it_a_class_var():
    class Again(Shape):
        sides: AbstractVar[int]

    class Square(Shape):
        sides = 4

    class AbstractAgain(Square):
        sides: AbstractVar[int]

    class Narrowed(Shape):
        sides: AbstractClassVar[int]

    assert Again.__module_info__.abstract_vars == ("sides",)
    assert AbstractAgain.__module_info__.abstract_vars == ("sides",)
    info = Narrowed.__module_info__
    assert (info.abstract_vars, info.abstract_class_vars) == ((), ("sides",))


def test_redeclaring_an_inherited_field_abstract_keeps_the_field():
    class Sized(Module):
        size: int

    class Resized(Sized):
        size: AbstractVar[int]

    # The field stays (dataclasses inherit it) and the generated __init__ sets it, which
    # provides it. Equinox refuses the instance instead (test_abstract_against_equinox.py).
    assert Resized(3).size == 3


def test_string_annotations_are_understood():
    class Deferred(Module):
        a: "int"
        x: "AbstractVar[int]"
        y: "pm.AbstractClassVar[str]"
        z: "ClassVar[int]" = 1

    assert [f.name for f in dataclasses.fields(Deferred)] == ["a"]
    info = Deferred.__module_info__
    assert (info.abstract_vars, info.abstract_class_vars) == (("x",), ("y",))
    with pytest.raises(TypeError, match=r"'y' \(declared `y: pm.AbstractClassVar\[str\]`"):
        Deferred(1)


@pytest.mark.parametrize("style", ["fields", "inferred"])
def test_frozen_modules_accept_the_abstract_attribute_in_init(style):
    class Base(Module, frozen=True):
        sides: AbstractVar[int]

    if style == "fields":

        class Frozen(Base):
            name: str

            def __init__(self):
                self.name = "n"
                self.sides = 3
    else:

        class Frozen(Base):
            def __init__(self):
                self.sides = 3

    frozen = Frozen()
    assert frozen.sides == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.sides = 4


def test_frozen_modules_still_refuse_undeclared_attributes():
    class Base(Module, frozen=True):
        sides: AbstractVar[int]
        name: str

        def __init__(self):
            self.name = "n"
            self.sides = 3
            self.other = 1

    with pytest.raises(ValueError, match="'other' on frozen Base"):
        Base()


def test_pytree_false_modules_check_it_too():
    class Graph(Module, pytree=False):
        node: AbstractVar[Any]

    class Empty(Graph):
        def __init__(self):
            pass

    with pytest.raises(TypeError, match="'node'"):
        Empty()


def test_classes_without_abstract_attributes_store_empty_tuples():
    class Plain(Module):
        x: int

    info = Plain.__module_info__
    assert info.abstract_vars == () and info.abstract_class_vars == ()
    assert Module.__module_info__.abstract_vars == ()


# --------------------------------------------------------------------- AbstractClassVar


class Activation(Module):
    name: AbstractClassVar[str]


def test_a_class_var_is_provided_by_a_value_in_a_class_body():
    class Relu(Activation):
        name: ClassVar[str] = "relu"

    class Tanh(Activation):
        name = "tanh"

    assert (Relu.name, Relu().name, Tanh().name) == ("relu", "relu", "tanh")
    assert dataclasses.fields(Relu) == () and jax.tree.leaves(Relu()) == []


def test_an_unprovided_class_var_is_refused_before_init_runs():
    calls = []

    class Unnamed(Activation):
        name: ClassVar[str]  # an annotation alone provides nothing

        def __init__(self):
            calls.append("__init__")

    with pytest.raises(TypeError) as error:
        Unnamed()
    assert calls == []
    message = str(error.value)
    assert message.startswith("Can't instantiate abstract class Unnamed")
    assert "'name' (declared `name: AbstractClassVar[str]` in Activation)" in message
    assert "`name: ClassVar[str] = ...`" in message


def test_an_instance_field_for_a_class_var_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match=r"annotates `name: str`, an instance field.*ClassVar"):

        class Wrong(Activation):
            name: str


def test_an_assignment_in_init_does_not_provide_a_class_var():
    class Late(Activation):
        def __init__(self):
            self.name = "late"

    with pytest.raises(TypeError, match="class attribute"):
        Late()


# ------------------------------------------------------------ declarations that are wrong


@pytest.mark.parametrize("spelling", ["AbstractVar", "AbstractClassVar"])
def test_an_abstract_annotation_with_a_value_is_refused(spelling):
    annotation = {"AbstractVar": AbstractVar, "AbstractClassVar": AbstractClassVar}[spelling]
    with pytest.raises(TypeError, match=rf"`x: {spelling}\[int\]` with a value \(3\).*`x: int = "):
        type("Valued", (Module,), {"__annotations__": {"x": annotation[int]}, "x": 3})


@pytest.mark.parametrize("annotation", [AbstractVar, AbstractClassVar, "AbstractVar"])
def test_an_abstract_annotation_needs_a_type(annotation):
    with pytest.raises(TypeError, match=r"needs the attribute's type.*\[int\]"):
        type("Untyped", (Module,), {"__annotations__": {"x": annotation}})


# ----------------------------------------------------------------------- abstractmethod


def test_abstract_methods_and_properties_refuse_instantiation():
    class Layer(Module):
        @abc.abstractmethod
        def __call__(self, x): ...

        @property
        @abc.abstractmethod
        def size(self): ...

        @abc.abstractmethod
        def reset(self): ...

    with pytest.raises(TypeError, match="abstract class Layer") as error:
        Layer()
    assert all(name in str(error.value) for name in ("__call__", "size", "reset"))

    class Half(Layer):
        def __call__(self, x):
            return x

    assert Half.__abstractmethods__ == frozenset({"size", "reset"})

    class Done(Half):
        size = 3

        def reset(self):
            return None

    assert Done()(1) == 1 and Done.__abstractmethods__ == frozenset()
    assert inspect.isabstract(Layer) and not inspect.isabstract(Done)


# ----------------------------------------------------------- __post_init__ and __init__


def test_post_init_with_a_hand_written_init_warns_where_the_class_is_made(caught):
    ran = []

    class Both(Module):
        x: int

        def __init__(self, x):
            self.x = x

        def __post_init__(self):
            ran.append(self.x)

    Both(1)
    assert ran == []  # as in Equinox and dataclasses: a hand-written __init__ replaces it
    [warning] = caught
    assert warning.category is UserWarning
    assert (warning.filename, warning.lineno) == (__file__, inspect.getsourcelines(Both)[1])
    message = str(warning.message)
    assert "Both" in message and "`__post_init__` will not run" in message
    assert "self.__post_init__()" in message and "__check_init__" in message


def test_post_init_runs_from_a_generated_init_without_a_warning(caught):
    ran = []

    class Generated(Module):
        x: int

        def __post_init__(self):
            ran.append(self.x)

    Generated(2)
    assert ran == [2] and caught == []


def test_an_init_that_calls_post_init_itself_gets_no_warning(caught):
    ran = []

    class Calls(Module):
        x: int

        def __init__(self, x):
            self.x = x
            self.__post_init__()

        def __post_init__(self):
            ran.append(self.x)

    Calls(3)
    assert ran == [3] and caught == []


def test_the_warning_comes_where_the_combination_is_made(caught):
    class WithPostInit(Module):
        x: int

        def __post_init__(self):
            pass

    assert caught == []

    class AddsInit(WithPostInit):
        def __init__(self):
            self.x = 1

    assert [w.lineno for w in caught] == [inspect.getsourcelines(AddsInit)[1]]

    class Unchanged(AddsInit):
        pass

    assert len(caught) == 1  # Equinox warns again for each subclass

    class CustomInit(Module):
        def __init__(self):
            pass

    class AddsPostInit(CustomInit):
        def __post_init__(self):
            pass

    assert [w.lineno for w in caught][1:] == [inspect.getsourcelines(AddsPostInit)[1]]


# ------------------------------------------------------------ JAX-transformed callables


class Holder(Module):
    fn: Any


class CustomHolder(Module):
    def __init__(self, fn):
        self.fn = fn


@pytest.mark.parametrize(
    "make",
    [
        lambda layer: jax.vmap(layer),
        lambda layer: jax.jit(layer),
        lambda layer: jax.grad(layer),
        lambda layer: jax.checkpoint(layer),
        lambda layer: jax.custom_jvp(layer),
        lambda layer: jax.jit(jax.vmap(layer)),
        lambda layer: jax.jit(layer.apply),
        lambda layer: jax.vmap(jax.tree_util.Partial(lambda w, x: w * x, layer.weight)),
    ],
    ids=["vmap", "jit", "grad", "checkpoint", "custom_jvp", "jit_of_vmap", "method", "Partial"],
)
def test_a_transformed_callable_wrapping_arrays_warns(caught, make):
    fn = make(Linear(jnp.ones(())))
    line = next_line()
    Holder(fn)
    [warning] = caught
    assert warning.category is UserWarning
    assert (warning.filename, warning.lineno) == (__file__, line)
    message = str(warning.message)
    assert "Attribute 'fn' of" in message and "Holder holds a JAX-transformed callable" in message
    assert "jax.vmap(self.fn)(x)" in message and "filter_vmap" in message


def test_python_scalars_count_as_parameters_too(caught):
    Holder(jax.vmap(Linear(1.0)))
    assert len(caught) == 1


def test_the_warning_points_at_the_assignment_in_a_hand_written_init(caught):
    fn = jax.vmap(Linear(jnp.ones(())))
    CustomHolder(fn)
    [warning] = caught
    source_line = inspect.getsourcelines(CustomHolder.__init__)[1] + 1
    assert (warning.filename, warning.lineno) == (__file__, source_line)


def test_assigning_one_after_init_warns(caught):
    holder = CustomHolder(None)
    line = next_line()
    holder.fn = jax.vmap(Linear(jnp.ones(())))
    assert [w.lineno for w in caught] == [line]


@pytest.mark.parametrize(
    "fn",
    [
        jax.jit(lambda x: x),
        jax.vmap(lambda x: x),
        jax.grad(lambda x: x),
        jax.nn.relu,
        jnp.tanh,
        lambda x: x,
        print,
    ],
    ids=["jit", "vmap", "grad", "relu", "tanh", "lambda", "builtin"],
)
def test_transformed_functions_without_parameters_do_not_warn(caught, fn):
    Holder(fn)
    CustomHolder(fn)
    assert caught == []


def test_warnings_can_be_turned_into_errors_and_nothing_is_half_changed():
    holder = CustomHolder(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning):
            holder.fn = jax.vmap(Linear(jnp.ones(())))
    assert holder.fn is None


# ------------------------------------------------------------------- generated __init__


def float_to_array(value: float) -> jax.Array:
    return jnp.asarray(value)


def test_converted_parameters_are_annotated_with_the_converter_input():
    class Converted(Module):
        a: jax.Array = field(converter=float_to_array)
        b: jax.Array = field(converter=jnp.asarray)
        c: int = field(converter=int)
        d: int = field(converter=lambda v: v)
        e: int = 0
        f: jax.Array = field(converter=float_to_array, init=False, default=1.0)

    assert str(inspect.signature(Converted)) == (
        "(a: float, b: Any, c: Any, d: Any, e: int = 0) -> None"
    )
    annotations = Converted.__init__.__annotations__
    assert annotations["a"] is float and annotations["b"] is Any and "f" not in annotations
    assert dataclasses.fields(Converted)[0].type is jax.Array  # the field keeps its own
    assert Converted(1.0, 2, "3", 4).f == 1.0


def test_a_generated_init_keeps_the_docstring_of_the_one_it_replaces():
    class Documented(Module):
        x: int

    assert Documented.__init__.__doc__ is None  # not Module.__init__'s
    Documented.__init__.__doc__ = "Make a Documented."

    class Same(Documented):
        pass

    class More(Documented):
        y: int = 0

    assert Same.__init__ is not Documented.__init__
    assert Same.__init__.__doc__ == More.__init__.__doc__ == "Make a Documented."
    assert str(inspect.signature(More)) == "(x: int, y: int = 0) -> None"


def test_a_hand_written_init_is_inherited_whole():
    class Custom(Module):
        def __init__(self, size):
            """Make one of the given size."""
            self.size = size

    class Sub(Custom):
        pass

    assert Sub.__init__ is Custom.__init__
    assert inspect.getdoc(Sub.__init__) == "Make one of the given size."
    assert str(inspect.signature(Sub)) == "(size)"
