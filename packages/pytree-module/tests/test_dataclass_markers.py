"""`dataclass`, `Data[...]` and `Static[...]`: Flax NNX's ways to give fields their status."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Data, Module, Static, data, dataclass, field, static


def test_without_the_decorator_fields_are_data():
    class Equinoxy(Module):
        n: int
        w: jax.Array

    assert jax.tree.leaves(Equinoxy(3, jnp.ones(1)))[0] == 3


def test_dataclass_fields_take_their_values_status():
    @dataclass
    class Foo(Module):
        node: jax.Array = data()
        meta: int
        meta2: int = 3
        node2: int = data(default=6)

    m = Foo(node=jnp.array(1), meta=1)
    assert [int(x) for x in jax.tree.leaves(m)] == [1, 6]
    m = jax.tree.map(lambda x: x + 1, m)
    assert (int(m.node), m.meta, m.meta2, m.node2) == (2, 1, 3, 7)


def test_dataclass_is_inherited_and_takes_options_form():
    @dataclass()
    class Base(Module):
        n: int

    class Child(Base):
        k: float

    assert jax.tree.leaves(Child(1, 2.0)) == []
    assert Child.__module_info__.infer_fields


def test_data_and_static_annotations():
    @dataclasses.dataclass
    class Foo(Module):
        a: Data[int]
        b: Static[int]
        c: jax.Array

    foo = Foo(a=1, b=2, c=jnp.array(3))
    assert len(jax.tree.leaves(foo)) == 2
    foo.a = 3
    assert len(jax.tree.leaves(foo)) == 2
    foo.a = static(3)  # a status forced on assignment wins over the annotation
    assert len(jax.tree.leaves(foo)) == 1
    foo.b = 4
    assert len(jax.tree.leaves(foo)) == 1
    foo.b = data(4)
    assert len(jax.tree.leaves(foo)) == 2


def test_markers_in_a_hand_written_init_and_under_dataclass():
    class Items(Module):
        items: Data[dict]
        name: Static[str]

        def __init__(self, **items):
            self.items = dict(items)
            self.name = "items"

    assert jax.tree.leaves(Items(a=1, b=2)) == [1, 2]  # Python ints, data by the marker

    @dataclass
    class Marked(Module):
        count: Data[int] = 0
        size: Static[jax.Array | None] = None

    assert jax.tree.leaves(Marked()) == [0]


def test_string_annotations_are_read(tmp_path):
    source = (
        "from __future__ import annotations\n"
        "import pytree_module as pm\n"
        "class Foo(pm.Module):\n"
        "    a: pm.Data[int]\n"
        "    b: pm.Static[int]\n"
        "    c: int\n"
    )
    namespace: dict = {}
    exec(compile(source, str(tmp_path / "m.py"), "exec"), namespace)
    assert jax.tree.leaves(namespace["Foo"](1, 2, 3)) == [1, 3]


def test_static_marked_field_refuses_arrays():
    @dataclass
    class Bar(Module):
        a: jax.Array = static()

    with pytest.raises(
        ValueError, match=r"^Found unexpected Arrays .* in static attribute 'a' of Bar"
    ):
        Bar(a=jnp.array(3))

    class Baz(Module):
        a: Static[jax.Array]

    with pytest.raises(
        ValueError, match=r"^Found unexpected Arrays .* in static attribute 'a' of Baz"
    ):
        Baz(jnp.array(3))


def test_field_static_false_is_data_under_dataclass():
    @dataclass
    class Foo(Module):
        n: int = field(static=False, default=1)
        m: int = field(default=2)

    assert jax.tree.leaves(Foo()) == [1]


def test_bad_uses_are_refused():
    with pytest.raises(TypeError, match="dataclass decorates Module classes"):

        @dataclass
        class NotAModule:
            x: int

    with pytest.raises(TypeError, match=r"dataclass\(eq=False\).*only eq=True"):
        dataclass(eq=False)
    with pytest.raises(TypeError, match="unexpected option frozen"):
        dataclass(frozen=True)
