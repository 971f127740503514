"""Side by side with Flax NNX: pure dicts, `iter_modules`, `iter_children`, `recursive_map`
(runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Module  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


class OursLinear(Module):
    def __init__(self, n):
        self.b = pg.Param(jnp.zeros(n))
        self.w = pg.Param(jnp.ones(n))


class Ours(Module):
    def __init__(self):
        self.a = OursLinear(2)
        self.b = self.a
        self.layers = [OursLinear(3), OursLinear(4)]
        self.mean = pg.BatchStat(jnp.zeros(1))


class TheirsLinear(nnx.Module):
    def __init__(self, n):
        self.b = nnx.Param(jnp.zeros(n))
        self.w = nnx.Param(jnp.ones(n))


class Theirs(nnx.Module):
    def __init__(self):
        self.a = TheirsLinear(2)
        self.b = self.a
        self.layers = nnx.List([TheirsLinear(3), TheirsLinear(4)])
        self.mean = nnx.BatchStat(jnp.zeros(1))


def _shapes(pure):
    return jax.tree.map(lambda x: x.shape, pure)


def test_to_pure_dict_has_the_same_keys_and_values_as_in_nnx():
    ours = pg.to_pure_dict(pg.state(Ours()))
    theirs = nnx.to_pure_dict(nnx.state(Theirs()))
    assert type(ours) is type(theirs) is dict
    assert _shapes(ours) == _shapes(theirs)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def test_a_pure_dict_saved_from_nnx_restores_our_model():
    saved = jax.tree.map(lambda x: x + 5, nnx.to_pure_dict(nnx.state(Theirs())))
    saved["layers"] = {str(i): v for i, v in saved["layers"].items()}  # as string-keyed formats
    model = Ours()
    pg.replace_by_pure_dict(pg.state(model), saved)
    theirs = Theirs()
    theirs_state = nnx.state(theirs)
    nnx.replace_by_pure_dict(theirs_state, saved)
    nnx.update(theirs, theirs_state)
    jax.tree.map(
        np.testing.assert_array_equal,
        pg.to_pure_dict(pg.state(model)),
        nnx.to_pure_dict(nnx.state(theirs)),
    )
    np.testing.assert_array_equal(model.b.w.value, np.full(2, 6.0))


def test_an_unknown_key_is_refused_as_in_nnx():
    extra = {"a": {"w": jnp.ones(2), "v": jnp.ones(2)}}
    with pytest.raises(ValueError, match="not available in state"):
        nnx.replace_by_pure_dict(nnx.state(Theirs()), extra)
    with pytest.raises(ValueError, match=r"Not in the State: .*a.*v"):
        pg.replace_by_pure_dict(pg.state(Ours()), extra)


def test_iter_modules_gives_the_same_paths_as_nnx():
    def names(pairs):
        return [
            (path, type(m).__name__.removeprefix("Ours").removeprefix("Theirs"))
            for path, m in pairs
        ]

    ours = names(pg.iter_modules(Ours()))
    # nnx.List is a Module of its own in NNX; a plain list is not one here.
    theirs = [entry for entry in names(nnx.iter_modules(Theirs())) if entry[1] != "List"]
    assert ours == theirs
    assert ours[-1] == ((), "")


def test_iter_children_gives_the_same_keys_as_nnx():
    ours = [key for key, _ in pg.iter_children(Ours())]
    theirs = list(nnx.iter_children(Theirs()))
    # Both yield a shared child under each name. NNX also yields Variables (graph nodes
    # there) and its List; here only Modules are children.
    assert ours == ["a", "b"]
    assert [key for key, _ in theirs] == ["a", "b", "layers", "mean"]
    assert [k for k, c in theirs if isinstance(c, TheirsLinear)] == ours


def test_recursive_map_maps_variables_and_keeps_sharing_as_in_nnx():
    def double(path, value):
        if isinstance(value, pg.Variable | nnx.Variable):
            return value.replace(value.value * 2)
        return value

    ours_model, theirs_model = Ours(), Theirs()
    ours = pg.recursive_map(double, ours_model)
    theirs = nnx.recursive_map(double, theirs_model)
    assert ours.a is ours.b and theirs.a is theirs.b
    assert ours is not ours_model and theirs is not theirs_model
    jax.tree.map(
        np.testing.assert_array_equal,
        pg.to_pure_dict(pg.state(ours)),
        nnx.to_pure_dict(nnx.state(theirs)),
    )
    np.testing.assert_array_equal(ours_model.a.w.value, np.ones(2))


def test_recursive_map_visits_modules_and_variables_in_nnx_order():
    def visits(recursive_map, model, kinds):
        seen = []

        def record(path, value):
            if isinstance(value, kinds):
                seen.append(path)
            return value

        recursive_map(record, model)
        return seen

    ours = visits(pg.recursive_map, Ours(), (Module, pg.Variable))
    theirs = visits(nnx.recursive_map, Theirs(), (nnx.Module, nnx.Variable))
    assert ours == [path for path in theirs if path != ("layers",)]
    assert ours[-1] == ()


def test_a_cycle_is_refused_by_recursive_map_as_in_nnx():
    class OursNode(Module, pytree=False):
        pass

    class TheirsNode(nnx.Module):
        pass

    ours, theirs = OursNode(), TheirsNode()
    ours.me, theirs.me = ours, theirs
    with pytest.raises(ValueError, match="cycle"):
        pg.recursive_map(lambda path, value: value, ours)
    with pytest.raises(ValueError, match="cycle"):
        nnx.recursive_map(lambda path, value: value, theirs)
