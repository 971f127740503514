"""`ModuleInfo`: one frozen record of facts per Module class."""

import dataclasses

import jax
import pytest

from pytree_module import Module, field
from pytree_module._module_info import ModuleInfo


class Base(Module, frozen=True):
    weight: jax.Array
    name: str = field(static=True, default="b")
    size: int = field(converter=int, default=1)

    def __check_init__(self):
        pass


class Child(Base):
    @property
    def name(self):
        return "fixed"

    def __check_init__(self):
        pass


class Graph(Module, pytree=False):
    def __init__(self):
        self.value = 1


def test_each_class_has_its_own_frozen_info():
    info = Base.__module_info__
    assert isinstance(info, ModuleInfo)
    assert Child.__module_info__ is not info
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.frozen = False


def test_info_holds_what_the_declaration_says():
    info = Base.__module_info__
    assert (info.frozen, info.pytree, info.custom_init) == (True, True, False)
    assert [f.name for f in info.fields] == ["weight", "name", "size"]
    assert info.field_index == {"weight": 0, "name": 1, "size": 2}
    assert info.field_static == {"weight": False, "name": True, "size": False}
    assert [name for name, _ in info.converters] == ["size"]
    assert info.class_provided == frozenset()
    assert info.check_inits == (vars(Base)["__check_init__"],)


def test_subclasses_inherit_options_and_see_their_own_overrides():
    info = Child.__module_info__
    assert info.frozen and info.pytree
    assert info.class_provided == frozenset({"name"})
    assert info.check_inits == (vars(Child)["__check_init__"], vars(Base)["__check_init__"])
    assert info.is_data_descriptor(Child, "name")
    assert not info.is_data_descriptor(Child, "weight")
    assert info.descriptors == {"name": True, "weight": False}


@pytest.mark.parametrize("cls", [Module, Base, Child, Graph])
def test_class_flags_are_copies_of_the_info(cls):
    info = cls.__module_info__
    assert cls.__module_frozen__ is info.frozen
    assert cls.__module_pytree__ is info.pytree
