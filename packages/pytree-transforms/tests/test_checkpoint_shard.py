"""filter_checkpoint and filter_shard."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytree_transforms import filter_checkpoint, filter_jit, filter_shard


def test_checkpoint_matches_plain_gradients():
    def block(params, x):
        return {"y": jnp.tanh(params["w"] @ x), "tag": params["tag"]}

    params = {"w": jnp.eye(3) * 0.5, "tag": "layer"}
    remat = filter_checkpoint(block)

    def loss(w, f):
        return jnp.sum(f({"w": w, "tag": "layer"}, jnp.ones(3))["y"])

    assert jnp.allclose(jax.grad(loss)(params["w"], remat), jax.grad(loss)(params["w"], block))
    assert remat(params, jnp.ones(3))["tag"] == "layer"
    policy = jax.checkpoint_policies.nothing_saveable
    assert filter_checkpoint(policy=policy)(block)(params, jnp.ones(3))["tag"] == "layer"


def test_shard_outside_and_inside_jit():
    devices = np.array(jax.devices()[:2] if len(jax.devices()) >= 2 else jax.devices()[:1])
    mesh = Mesh(devices, ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    tree = {"w": jnp.ones((len(devices) * 2, 3)), "name": "w"}
    placed = filter_shard(tree, sharding)
    assert placed["name"] == "w" and placed["w"].sharding == sharding

    @filter_jit
    def f(tree):
        return filter_shard({"w": tree["w"] * 2, "name": tree["name"]}, sharding)

    out = f(placed)
    assert out["w"].sharding.is_equivalent_to(sharding, 2) and out["name"] == "w"
    with pytest.raises(ValueError, match=r"needs a jax\.sharding\.Sharding"):
        filter_jit(lambda t: filter_shard(t, jax.devices()[0]))(placed)
