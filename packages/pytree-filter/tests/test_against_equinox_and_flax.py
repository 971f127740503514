"""Side by side with Equinox: `filter`/`partition` keyword spelling."""

import pytest

eqx = pytest.importorskip("equinox")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_filter as pf  # noqa: E402


def test_filter_spec_by_keyword_gives_equinox_results():
    tree = {"w": jnp.ones(2), "n": 3, "layers": [jnp.zeros(1), "relu"]}
    ours = pf.partition(tree, filter_spec=pf.is_array)
    theirs = eqx.partition(tree, filter_spec=eqx.is_array)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    assert all(a is b for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True))
    assert pf.filter(tree, filter_spec=pf.is_array)["n"] is None
    assert eqx.filter(tree, filter_spec=eqx.is_array)["n"] is None
