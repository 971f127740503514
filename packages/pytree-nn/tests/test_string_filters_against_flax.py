"""String filters on random streams, side by side with Flax NNX (runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import pytree_graph as pg  # noqa: E402
from pytree_nn import Rngs  # noqa: E402


@pytest.mark.parametrize("spec", ["dropout", "default", "params", None, ("dropout", "default")])
def test_state_of_rngs_by_tag(spec):
    ours = pg.state(Rngs(0, dropout=1), spec).flat_state()
    theirs = nnx.to_flat_state(nnx.state(nnx.Rngs(0, dropout=1), spec))
    assert sorted(ours) == sorted(path for path, _ in theirs)
    for path, variable in theirs:
        assert type(ours[path]).__name__ == type(variable).__name__
        assert ours[path].tag == variable.tag


def test_split_rngs_only_a_string():
    ours, theirs = Rngs(0, dropout=1), nnx.Rngs(0, dropout=1)
    from pytree_nn import split_rngs

    split_rngs(ours, splits=4, only="dropout")
    nnx.split_rngs(theirs, splits=4, only="dropout")
    assert ours.dropout.key.value.shape == theirs.dropout.key.shape == (4,)
    assert ours.default.key.value.shape == theirs.default.key.shape == ()
