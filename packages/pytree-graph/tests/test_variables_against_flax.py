"""Variables side by side with Flax NNX: subscripting, get_value/set_value overrides and
get_metadata/set_metadata (runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_graph as pg  # noqa: E402

# NNX warns that `.value` is deprecated; both spellings are compared here.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class OurClipped(pg.Param):
    def set_value(self, value):
        super().set_value(jnp.clip(value, -1.0, 1.0))


class NnxClipped(nnx.Param):
    def set_value(self, value, **kwargs):
        super().set_value(jnp.clip(value, -1.0, 1.0), **kwargs)


class OurScaled(pg.Param):
    def get_value(self):
        return super().get_value() * 10


class NnxScaled(nnx.Param):
    def get_value(self, **kwargs):
        return super().get_value(**kwargs) * 10


def _user_metadata(variable):
    # NNX adds its own entries (`hijax`, `ref`, `eager_sharding`).
    return {k: v for k, v in variable.get_metadata().items() if k not in variable.required_metadata}


def test_subscripting_as_in_nnx():
    for cls in (pg.Param, nnx.Param, pg.Variable, nnx.Variable):
        alias = cls[jax.Array]
        assert alias.__origin__ is cls and alias.__args__ == (jax.Array,)
        assert isinstance(alias(jnp.ones(2)), cls)
        with pytest.raises(TypeError):
            isinstance(cls(1.0), alias)


def test_set_value_override_as_in_nnx():
    ours, theirs = OurClipped(jnp.array([5.0, 0.5])), NnxClipped(jnp.array([5.0, 0.5]))
    # Neither constructor goes through set_value.
    assert jax.tree.leaves(ours)[0].tolist() == jax.tree.leaves(theirs)[0].tolist() == [5.0, 0.5]
    writes = [
        lambda v: setattr(v, "value", jnp.array([3.0, -3.0])),
        lambda v: v.set_value(jnp.array([0.25, 9.0])),
        lambda v: v.__setitem__(0, -7.0),
        lambda v: v.__setitem__(..., jnp.array([2.0, 0.5])),
    ]
    for write in writes:
        write(ours)
        write(theirs)
        assert jax.tree.leaves(ours)[0].tolist() == jax.tree.leaves(theirs)[0].tolist()
    assert jax.tree.leaves(ours)[0].tolist() == [1.0, 0.5]


def test_get_value_override_as_in_nnx():
    ours, theirs = OurScaled(jnp.array([1.0, 2.0])), NnxScaled(jnp.array([1.0, 2.0]))
    reads = [
        lambda v: v.value,
        lambda v: v.get_value(),
        lambda v: v[...],
        lambda v: v[1],
        lambda v: v + 1,
        lambda v: v * v,
        lambda v: jax.tree.leaves(v)[0],  # the stored value
    ]
    for read in reads:
        assert read(ours).tolist() == read(theirs).tolist()
    assert ours.value.tolist() == [10.0, 20.0]


def test_get_metadata_as_in_nnx():
    ours, theirs = pg.Param(1.0, tag="a"), nnx.Param(1.0, tag="a")
    assert _user_metadata(theirs) == ours.get_metadata() == {"tag": "a"}
    for args in [("tag",), ("missing", None), ("missing", 3)]:
        assert ours.get_metadata(*args) == theirs.get_metadata(*args)
    for variable in (ours, theirs):
        with pytest.raises(KeyError):
            variable.get_metadata("missing")
        with pytest.raises(TypeError):
            variable.get_metadata(default=None)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {"tag": "b", "other": 2}), (("tag", "c"), {}), (({"only": 1},), {})],
)
def test_set_metadata_as_in_nnx(args, kwargs):
    ours, theirs = pg.Param(1.0, tag="a"), nnx.Param(1.0, tag="a")
    ours.set_metadata(*args, **kwargs)
    theirs.set_metadata(*args, **kwargs)
    assert ours.get_metadata() == _user_metadata(theirs)


def test_set_metadata_argument_errors_as_in_nnx():
    for variable in (pg.Param(1.0), nnx.Param(1.0)):
        with pytest.raises(TypeError):
            variable.set_metadata("tag", x=1)
        with pytest.raises(TypeError):
            variable.set_metadata()


def test_replace_as_in_nnx():
    ours, theirs = pg.Param(1.0, tag="a"), nnx.Param(1.0, tag="a")
    new_ours, new_theirs = ours.replace(2.0, tag="b"), theirs.replace(2.0, tag="b")
    assert type(new_ours) is pg.Param and type(new_theirs) is nnx.Param
    assert new_ours.get_value() == new_theirs.get_value() == 2.0
    assert new_ours.get_metadata() == _user_metadata(new_theirs) == {"tag": "b"}
    assert ours.tag == theirs.tag == "a"
