"""Side by side with Equinox: abstract attributes, definition warnings, generated __init__s.

Where pytree_module deliberately differs, a test asserts both behaviours and says why.
"""

import pytest

eqx = pytest.importorskip("equinox")

import abc  # noqa: E402
import dataclasses  # noqa: E402
import inspect  # noqa: E402
import warnings  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any, ClassVar  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_module as pm  # noqa: E402

LIBRARIES = {
    "equinox": SimpleNamespace(
        Module=eqx.Module,
        field=eqx.field,
        AbstractVar=eqx.AbstractVar,
        AbstractClassVar=eqx.AbstractClassVar,
    ),
    "ours": SimpleNamespace(
        Module=pm.Module,
        field=pm.field,
        AbstractVar=pm.AbstractVar,
        AbstractClassVar=pm.AbstractClassVar,
    ),
}


@pytest.fixture(params=sorted(LIBRARIES))
def lib(request):
    return LIBRARIES[request.param]


@pytest.fixture
def caught():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        yield record


def class_line(cls):
    return inspect.getsourcelines(cls)[1]


# ------------------------------------------------------------------------- the same


def test_abstract_var_is_provided_by_a_field_after_the_parent_fields(lib):
    class Base(lib.Module):
        a: int
        b: lib.AbstractVar[str]

    class Concrete(Base):
        c: float
        b: str

    assert [f.name for f in dataclasses.fields(Base)] == ["a"]
    assert str(inspect.signature(Concrete)) == "(a: int, c: float, b: str) -> None"
    assert Concrete(1, 2.0, "b").b == "b"


@pytest.mark.parametrize("how", ["class attribute", "ClassVar", "property"])
def test_abstract_var_is_provided_at_class_level(lib, how):
    class Base(lib.Module):
        x: lib.AbstractVar[int]

    if how == "class attribute":

        class Concrete(Base):
            x = 1
    elif how == "ClassVar":

        class Concrete(Base):
            x: ClassVar[int] = 1
    else:

        class Concrete(Base):
            @property
            def x(self):
                return 1

    assert Concrete().x == 1 and jax.tree.leaves(Concrete()) == []


def test_an_unprovided_abstract_var_is_refused_after_init(lib):
    calls = []

    class Base(lib.Module):
        x: lib.AbstractVar[int]

    class Unfinished(Base):
        def __init__(self):
            calls.append("__init__")

        def __check_init__(self):
            calls.append("__check_init__")

    with pytest.raises(TypeError, match=r"^Can't instantiate abstract class Unfinished.*'x'"):
        Unfinished()
    assert calls == ["__init__"]


def test_an_unprovided_abstract_class_var_is_refused_before_init(lib):
    calls = []

    class Base(lib.Module):
        y: lib.AbstractClassVar[int]

    class Unfinished(Base):
        def __init__(self):
            calls.append("__init__")

    with pytest.raises(TypeError, match=r"^Can't instantiate abstract class Unfinished.*'y'"):
        Unfinished()
    assert calls == []

    class Concrete(Base):
        y: ClassVar[int] = 2

    class Plain(Base):
        y = 3

    assert (Concrete.y, Concrete().y, Plain().y) == (2, 2, 3)


def test_redeclaring_and_narrowing(lib):
    class Base(lib.Module):
        x: lib.AbstractVar[int]

    class Again(Base):
        x: lib.AbstractVar[int]

    class Narrowed(Base):
        x: lib.AbstractClassVar[int]

    class Concrete(Narrowed):
        x = 1

    for abstract in (Again, Narrowed):
        with pytest.raises(TypeError, match="'x'"):
            abstract()
    assert Concrete().x == 1


def test_refused_declarations(lib):
    with pytest.raises(TypeError, match="x"):
        type("Valued", (lib.Module,), {"__annotations__": {"x": lib.AbstractVar[int]}, "x": 3})
    with pytest.raises(TypeError, match="AbstractVar"):
        type("Untyped", (lib.Module,), {"__annotations__": {"x": lib.AbstractVar}})


def test_abstract_methods_are_refused(lib):
    class Layer(lib.Module):
        @abc.abstractmethod
        def forward(self, x): ...

    class Identity(Layer):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match=r"abstract class Layer.*forward"):
        Layer()
    assert Identity().forward(1) == 1


def test_post_init_with_a_hand_written_init_warns_and_does_not_run(lib, caught):
    ran = []

    class Both(lib.Module):
        x: int

        def __init__(self, x):
            self.x = x

        def __post_init__(self):
            ran.append(1)

    Both(1)
    [warning] = caught
    assert ran == [] and warning.category is UserWarning
    assert (warning.filename, warning.lineno) == (__file__, class_line(Both))
    assert "`__post_init__`" in str(warning.message)


def test_post_init_runs_from_a_generated_init(lib, caught):
    ran = []

    class Generated(lib.Module):
        x: int

        def __post_init__(self):
            ran.append(self.x)

    Generated(2)
    assert ran == [2] and caught == []


def test_transformed_callables_warn_only_when_they_wrap_parameters(lib, caught):
    class Linear(lib.Module):
        weight: Any

        def __call__(self, x):
            return self.weight * x

    class Holder(lib.Module):
        fn: Any

        def __init__(self, fn):
            self.fn = fn

    for fn in (jax.jit(lambda x: x), jax.vmap(lambda x: x), jax.nn.relu):
        Holder(fn)
    assert caught == []
    Holder(jax.vmap(Linear(jnp.ones(()))))
    [warning] = caught
    assert warning.category is UserWarning
    assert warning.lineno == inspect.getsourcelines(Holder.__init__)[1] + 1  # `self.fn = fn`
    assert "Holder" in str(warning.message) and "jax.vmap" in str(warning.message)


def test_converted_parameters_are_annotated_with_the_converter_input(lib):
    def to_array(value: float) -> jax.Array:
        return jnp.asarray(value)

    class Converted(lib.Module):
        a: jax.Array = lib.field(converter=to_array)
        b: jax.Array = lib.field(converter=jnp.asarray)
        c: int = lib.field(converter=int)
        d: int = 0

    assert str(inspect.signature(Converted)) == "(a: float, b: Any, c: Any, d: int = 0) -> None"


def test_a_generated_init_keeps_the_docstring_of_the_one_it_replaces(lib):
    class Documented(lib.Module):
        x: int

    Documented.__init__.__doc__ = "Make a Documented."

    class Same(Documented):
        pass

    class More(Documented):
        y: int = 0

    assert Same.__init__.__doc__ == More.__init__.__doc__ == "Make a Documented."


# ------------------------------------------------------------------ deliberate differences


def test_an_assignment_in_init_provides_an_abstract_var():
    # Ours has NNX-style attributes assigned in __init__, so an assignment provides an
    # AbstractVar, checked per instance right after __init__. Equinox modules refuse
    # attributes that are not fields, so there the same class cannot be built at all.
    def build(lib):
        class Base(lib.Module):
            x: lib.AbstractVar[int]

        class Assigns(Base):
            def __init__(self):
                self.x = 1

        return Assigns()

    with pytest.raises(dataclasses.FrozenInstanceError):
        build(LIBRARIES["equinox"])
    assert build(LIBRARIES["ours"]).x == 1


def test_redeclaring_an_inherited_field_abstract():
    # The field is still inherited (dataclasses keep it) and the generated __init__ sets it.
    # Equinox's class-level bookkeeping calls it abstract anyway, so no instance can be made;
    # ours checks the instance, which has it.
    def build(lib):
        class Sized(lib.Module):
            size: int

        class Resized(Sized):
            size: lib.AbstractVar[int]

        return Resized(3)

    with pytest.raises(TypeError, match="abstract attributes"):
        build(LIBRARIES["equinox"])
    assert build(LIBRARIES["ours"]).size == 3


def test_a_bare_classvar_annotation_does_not_provide_an_abstract_class_var():
    # `y: ClassVar[int]` without a value gives the class no `y`: Equinox accepts it and the
    # first `cls.y` raises AttributeError later; ours reports it at instantiation.
    def define(lib):
        class Base(lib.Module):
            y: lib.AbstractClassVar[int]

        class Bare(Base):
            y: ClassVar[int]

        return Bare

    bare = define(LIBRARIES["equinox"])
    bare()
    assert not hasattr(bare, "y")
    with pytest.raises(TypeError, match="abstract class attribute"):
        define(LIBRARIES["ours"])()


def test_an_instance_field_for_an_abstract_class_var():
    # Equinox's documentation says an AbstractClassVar is provided by a ClassVar, but its
    # check accepts an instance field, which gives the class no attribute. Ours refuses the
    # declaration when the class is made, with the fix.
    def define(lib):
        class Base(lib.Module):
            y: lib.AbstractClassVar[int]

        class Field(Base):
            y: int

        return Field

    assert define(LIBRARIES["equinox"])(1).y == 1
    with pytest.raises(TypeError, match=r"instance field.*ClassVar\[int\] = \.\.\."):
        define(LIBRARIES["ours"])


def test_string_annotations():
    # `from __future__ import annotations` makes every annotation a string. Equinox refuses
    # abstract ones; ours recognises them by name, as dataclasses recognises "ClassVar[...]".
    annotations = {"a": "int", "x": "AbstractVar[int]"}
    with pytest.raises(NotImplementedError):
        type("Deferred", (eqx.Module,), {"__annotations__": dict(annotations)})
    deferred = type("Deferred", (pm.Module,), {"__annotations__": dict(annotations)})
    assert [f.name for f in dataclasses.fields(deferred)] == ["a"]
    assert deferred.__module_info__.abstract_vars == ("x",)


def test_the_post_init_warning_is_given_once_where_the_combination_is_made(caught):
    # Equinox warns again for every subclass of a class it warned about, and for an __init__
    # that calls `self.__post_init__()` itself. Ours warns where the mistake is written.
    def define(lib):
        class Both(lib.Module):
            x: int

            def __init__(self):
                self.x = 1

            def __post_init__(self):
                pass

        class Sub(Both):
            pass

        class Calls(lib.Module):
            def __init__(self):
                self.__post_init__()

            def __post_init__(self):
                pass

    define(LIBRARIES["equinox"])
    assert len(caught) == 3
    caught.clear()
    define(LIBRARIES["ours"])
    assert len(caught) == 1


def test_the_transform_warning_is_given_once_for_a_generated_init(caught):
    # Equinox checks the arguments of a generated __init__ and then each assignment in it,
    # so it warns twice, once pointing into the generated code. Ours warns once, at the call.
    def build(lib):
        class Linear(lib.Module):
            weight: Any

            def __call__(self, x):
                return self.weight * x

        class Holder(lib.Module):
            fn: Any

        Holder(jax.vmap(Linear(jnp.ones(()))))

    build(LIBRARIES["equinox"])
    assert len(caught) == 2
    caught.clear()
    build(LIBRARIES["ours"])
    [warning] = caught
    assert warning.filename == __file__


def test_a_generated_init_below_the_root_has_no_docstring():
    # Equinox's first generated __init__ inherits `object.__init__`'s "Initialize self..."
    # docstring. Ours leaves it empty: the root `Module.__init__` docstring describes
    # `super().__init__(...)` forwarding, not the generated __init__.
    class OursGenerated(pm.Module):
        x: int

    class EqxGenerated(eqx.Module):
        x: int

    assert EqxGenerated.__init__.__doc__ == object.__init__.__doc__
    assert OursGenerated.__init__.__doc__ is None
