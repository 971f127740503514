"""Side by side with Equinox: class construction, fields and tree utilities behave alike."""

import pytest

eqx = pytest.importorskip("equinox")

import dataclasses  # noqa: E402
import inspect  # noqa: E402
from typing import Generic, TypeVar  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_module as pm  # noqa: E402

BASES = {"equinox": (eqx.Module, eqx.field), "ours": (pm.Module, pm.field)}
T = TypeVar("T")


@pytest.fixture(params=sorted(BASES))
def library(request):
    return BASES[request.param]


def test_signature_shows_the_init(library):
    Module, field = library

    class Generated(Module):
        x: int
        y: float = 1.0
        z: str = field(static=True, default="z", kw_only=True)

    class Custom(Module):
        x: int

        def __init__(self, a, *, b=2):
            self.x = a

    assert str(inspect.signature(Generated)) == "(x: int, y: float = 1.0, *, z: str = 'z') -> None"
    assert str(inspect.signature(Custom)) == "(a, *, b=2)"


def test_a_plain_mixin_init_earlier_in_the_mro_is_the_init(library):
    Module, _ = library
    calls = []

    class Mixin:
        def __init__(self, x):
            calls.append(x)
            self.x = 2 * x

    class Doubled(Mixin, Module):
        x: int

    assert Doubled(3).x == 6 and calls == [3]
    assert str(inspect.signature(Doubled)) == "(x)"


def test_init_false_field_overridden_by_a_property(library):
    Module, field = library

    class Base(Module):
        y: int
        x: int = field(init=False)

    class WithProperty(Base):
        @property
        def x(self):
            return 5

    module = WithProperty(1)
    assert module.x == 5 and jax.tree.leaves(module) == [1]


def test_static_field_overridden_by_a_class_attribute(library):
    Module, field = library

    class Base(Module):
        size: int = field(static=True)
        weight: jax.Array = field(default=None)

        def __init__(self):
            self.weight = jnp.ones(2)

    class Sized(Base):
        size = 9

    sized = Sized()
    assert sized.size == 9 and len(jax.tree.leaves(sized)) == 1
    assert jax.jit(lambda m: m)(sized).size == 9


def test_generic_modules_record_orig_class(library):
    Module, _ = library

    class Box(Module, Generic[T]):
        value: T

    box = Box[int](1)
    assert box.__orig_class__ == Box[int] and jax.tree.leaves(box) == [1]
    # Equinox also keeps it in the treedef, so `Box[int](1)` and `Box(1)` differ there;
    # ours leaves it out of the structure (see test_module.py).


def test_user_metadata_keys_are_kept(library):
    Module, field = library

    class Documented(Module):
        a: int = field(metadata={"doc": "a"})
        b: int = field(static=True, metadata={"doc": "b"})

    doc = [f.metadata["doc"] for f in dataclasses.fields(Documented)]
    assert doc == ["a", "b"]
    with pytest.raises(ValueError, match="static"):
        field(static=True, metadata={"static": False})


@pytest.mark.parametrize("tree_at", [eqx.tree_at, pm.tree_at], ids=["equinox", "ours"])
def test_tree_at_replaces_a_list_node_whole(tree_at):
    tree = {"layers": [1, 2], "pair": (3, 4)}
    assert tree_at(lambda t: t["layers"], tree, [5, 6, 7])["layers"] == [5, 6, 7]
    both = tree_at(lambda t: (t["layers"], t["pair"]), tree, ([0], ()))
    assert both == {"layers": [0], "pair": ()}


def test_tree_equal_needs_a_tree():
    with pytest.raises(IndexError):
        eqx.tree_equal()
    with pytest.raises(TypeError, match=r"\*trees"):
        pm.tree_equal()
    assert eqx.tree_equal(1) is True and pm.tree_equal(1) is True
