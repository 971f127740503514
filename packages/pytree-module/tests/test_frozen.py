"""Static lists, dicts and sets are frozen when assigned: in-place changes raise, with the fix."""

import copy
import pickle

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, field, static, tree_at, tree_pformat


class Scaled(Module):
    def __init__(self):
        self.scales = [1.0, 2.0]
        self.options = {"mode": "fast", "sizes": [8, 16]}
        self.tags = {"a"}
        self.w = jnp.ones(2)
        self.scales.append(3.0)  # still building: `__init__` may change its own lists


class Declared(Module):
    w: jax.Array
    sizes: list = field(static=True)


SCALED_FIX = r"Scaled\.scales is static .* cannot be changed in place .*`module\.scales = "


def test_static_containers_are_frozen_after_init_and_compare_as_before():
    m = Scaled()
    assert m.scales == [1.0, 2.0, 3.0] and isinstance(m.scales, list)
    assert m.options == {"mode": "fast", "sizes": [8, 16]} and isinstance(m.options, dict)
    assert m.tags == {"a"} and type(m.tags) is frozenset
    assert hash(m.scales) == hash(Scaled().scales)
    assert repr(m.scales) == "[1.0, 2.0, 3.0]"
    assert "scales=[1.0, 2.0, 3.0]" in tree_pformat(m)
    longer = m.scales + [4.0]  # noqa: RUF005 (list concatenation is what is tested)
    assert longer == [1.0, 2.0, 3.0, 4.0] and type(longer) is list
    assert type(m.scales[:2]) is list and list(m.scales) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.scales.__setitem__(0, 5.0),
        lambda m: m.scales.append(4.0),
        lambda m: m.scales.extend([4.0]),
        lambda m: m.scales.insert(0, 4.0),
        lambda m: m.scales.pop(),
        lambda m: m.scales.remove(1.0),
        lambda m: m.scales.clear(),
        lambda m: m.scales.sort(),
        lambda m: m.scales.reverse(),
        lambda m: m.scales.__delitem__(0),
        lambda m: m.scales.__iadd__([1.0]),
        lambda m: m.scales.__imul__(2),
    ],
)
def test_every_in_place_change_of_a_static_list_raises_with_the_fix(change):
    m = Scaled()
    with pytest.raises(TypeError, match=SCALED_FIX):
        change(m)
    assert m.scales == [1.0, 2.0, 3.0]


def test_in_place_changes_of_dicts_and_nested_containers_raise():
    m = Scaled()
    with pytest.raises(TypeError, match=r"Scaled.options is static .*`__setitem__`"):
        m.options["mode"] = "slow"
    for change in (
        lambda d: d.update(mode="slow"),
        lambda d: d.pop("mode"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("x", 1),
        lambda d: d.clear(),
        lambda d: d.__delitem__("mode"),
        lambda d: d.__ior__({"x": 1}),
    ):
        with pytest.raises(TypeError, match=r"Scaled\.options is static"):
            change(m.options)
    with pytest.raises(TypeError, match=r"Scaled.options\['sizes'\] is static.*module.options = "):
        m.options["sizes"].append(32)
    with pytest.raises(TypeError, match=r"`\+=`|__iadd__"):
        m.scales += [4.0]
    with pytest.raises(AttributeError):
        m.tags.add("b")
    assert m.options == {"mode": "fast", "sizes": [8, 16]}


def test_reassignment_works_and_jax_sees_it():
    m = Scaled()
    traces = []

    @jax.jit
    def f(m, x):
        traces.append(tuple(m.scales))
        return x * m.scales[0]

    assert float(f(m, 1.0)) == 1.0
    m.scales = [5.0, *m.scales[1:]]
    assert float(f(m, 1.0)) == 5.0 and len(traces) == 2
    with pytest.raises(TypeError, match=r"Scaled\.scales is static"):
        m.scales[0] = 1.0  # the new list is frozen too
    m.scales = static([7.0])
    assert float(f(m, 1.0)) == 7.0


def test_declared_static_fields_and_tree_at_copies_are_frozen():
    d = Declared(jnp.ones(1), [1, 2])
    with pytest.raises(TypeError, match=r"Declared.sizes is static"):
        d.sizes.append(3)
    rebuilt = jax.tree.map(lambda x: x + 1, d)
    with pytest.raises(TypeError, match=r"Declared.sizes is static"):
        rebuilt.sizes.append(3)
    new = tree_at(lambda m: m.w, d, jnp.zeros(1))
    assert new.sizes == [1, 2] and jax.tree.structure(new) == jax.tree.structure(d)


@pytest.mark.parametrize(
    "duplicate", [copy.copy, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))]
)
def test_copies_and_pickles_stay_frozen_and_equal(duplicate):
    m = Scaled()
    other = duplicate(m)
    assert other.scales == m.scales and other.options == m.options and other.tags == m.tags
    assert jax.tree.structure(other) == jax.tree.structure(m)
    with pytest.raises(TypeError, match=SCALED_FIX):
        other.scales.append(1.0)
    with pytest.raises(TypeError, match=r"Scaled.options\['sizes'\] is static"):
        other.options["sizes"].append(1)


def test_an_older_pickle_with_plain_lists_is_frozen_on_load():
    m = Scaled()
    values, data_keys = m.__getstate__()
    values = {**values, "scales": [1.0], "options": {"k": [1]}}
    old = Scaled.__new__(Scaled)
    old.__setstate__((values, data_keys))
    with pytest.raises(TypeError, match=r"Scaled\.scales is static"):
        old.scales.append(2.0)
    with pytest.raises(TypeError, match=r"Scaled.options\['k'\] is static"):
        old.options["k"].append(2)
