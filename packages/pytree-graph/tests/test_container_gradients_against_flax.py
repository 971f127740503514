"""Side by side with Flax NNX: the gradient of an `nnx.Dict`/`nnx.List` argument and of
ours, in graph and tree mode (runs in the bench environment)."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_graph as pg  # noqa: E402
from pytree_module import Dict, List  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def _models():
    p1, p2 = nnx.Param(jnp.array(10.0)), nnx.Param(jnp.array(20.0))
    theirs = nnx.Dict(a=nnx.List([p1, p2]), b=p1, c=7)
    q1, q2 = pg.Param(jnp.array(10.0)), pg.Param(jnp.array(20.0))
    ours = Dict(a=List([q1, q2]), b=q1, c=7)
    return ours, theirs


def _total(m):
    return m["a"][0][...] * m["a"][1][...] + m["b"][...]


def _flat(grads, lib):
    return {path: float(v[...]) for path, v in lib.to_flat_state(grads)}


def test_graph_mode_gives_a_state_with_the_same_entries():
    ours, theirs = _models()
    our_grads, their_grads = pg.grad(_total)(ours), nnx.grad(_total)(theirs)
    assert isinstance(their_grads, nnx.State) and isinstance(our_grads, pg.State)
    assert _flat(our_grads, pg) == _flat(their_grads, nnx) == {("a", 0): 21.0, ("a", 1): 10.0}
    pg.update(ours, our_grads)
    nnx.update(theirs, their_grads)
    assert float(ours.b[...]) == float(theirs.b[...]) == 21.0


def test_tree_mode_gives_container_shaped_gradients():
    ours, theirs = _models()
    ours.b, theirs.b = pg.Param(jnp.array(1.0)), nnx.Param(jnp.array(1.0))  # untied
    # `c=7` is a leaf of our Dict (a pytree, as a plain dict), static in NNX's (a Module):
    # tree mode differentiates every leaf, so it goes.
    del ours.c, theirs.c
    our_grads = pg.grad(_total, graph=False)(ours)
    their_grads = nnx.grad(_total, graph=False)(theirs)
    assert type(our_grads) is Dict and isinstance(their_grads, nnx.Dict)
    assert jax.tree.map(float, jax.tree.leaves(our_grads)) == jax.tree.map(
        float, jax.tree.leaves(their_grads)
    )


def test_a_plain_dict_of_variables_stays_a_dict_in_both():
    our_grads = pg.grad(lambda d: d["w"][...] * 3)({"w": pg.Param(jnp.array(1.0))})
    their_grads = nnx.grad(lambda d: d["w"][...] * 3)({"w": nnx.Param(jnp.array(1.0))})
    assert type(our_grads) is type(their_grads) is dict
    assert float(our_grads["w"][...]) == float(their_grads["w"][...]) == 3.0
