"""LoRA, LoRALinear and LoRAParam against Flax NNX's: same initial weights from the same seed,
same outputs and gradients on the same weights, same training of the adapters (or of the
base alone) with the Optimizer. Runs in the bench environment (`hatch run bench:crosscheck`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
import pytree_nn as pnn
from pytree_filter import All, Not
from pytree_graph import Param

nnx = pytest.importorskip("flax.nnx")

RTOL, ATOL = 1e-5, 1e-6


def ours_values(model, *filters):
    return {p: np.asarray(v.value) for p, v in pg.state(model, *filters).flat_state().items()}


def nnx_values(model, *filters):
    return {tuple(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, *filters))}


def assert_same(ours, theirs, exact=False):
    assert ours.keys() == theirs.keys()
    for path in ours:
        if exact:
            np.testing.assert_array_equal(ours[path], theirs[path], err_msg=str(path))
        else:
            np.testing.assert_allclose(ours[path], theirs[path], RTOL, ATOL, err_msg=str(path))


def randomize(theirs, seed=0):
    """Fixed random values in every Param of an NNX model (so `lora_b` is not zero)."""
    for i, (_, variable) in enumerate(sorted(nnx.to_flat_state(nnx.state(theirs, nnx.Param)))):
        value = variable[...]
        variable[...] = jax.random.normal(jax.random.key(seed + i), value.shape, value.dtype)


def copy_into(ours, theirs):
    """Our model given the values of NNX's, path by path (the paths are the same)."""
    theirs_flat = nnx_values(theirs)
    assert ours_values(ours).keys() == theirs_flat.keys()
    pg.update(ours, pg.State.from_flat_path(theirs_flat))
    return ours


def pair(seed=0, **kwargs):
    theirs = nnx.LoRALinear(6, 4, lora_rank=3, rngs=nnx.Rngs(0), **kwargs)
    randomize(theirs, seed)
    return copy_into(pnn.LoRALinear(6, 4, lora_rank=3, rngs=0, **kwargs), theirs), theirs


def test_the_same_seed_gives_the_same_weights():
    ours = pnn.LoRALinear(6, 4, lora_rank=3, rngs=pnn.Rngs(5))
    theirs = nnx.LoRALinear(6, 4, lora_rank=3, rngs=nnx.Rngs(5))
    assert_same(ours_values(ours), nnx_values(theirs), exact=True)
    assert_same(ours_values(ours, pnn.LoRAParam), nnx_values(theirs, nnx.LoRAParam), exact=True)
    adapter = pnn.LoRA(6, 3, 4, rngs=pnn.Rngs(params=2))
    their_adapter = nnx.LoRA(6, 3, 4, rngs=nnx.Rngs(params=2))
    assert_same(ours_values(adapter), nnx_values(their_adapter), exact=True)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"use_bias": False}, {"lora_dtype": jnp.bfloat16}, {"lora_param_dtype": jnp.bfloat16}],
    ids=["default", "no-bias", "lora-dtype", "lora-param-dtype"],
)
def test_lora_linear_outputs_and_gradients_match(kwargs):
    ours, theirs = pair(**kwargs)
    x = jax.random.normal(jax.random.key(9), (5, 6))
    expected = theirs(x)
    got = ours(x)
    assert got.dtype == expected.dtype
    tolerance = (RTOL, ATOL) if expected.dtype == jnp.float32 else (2e-2, 2e-2)
    np.testing.assert_allclose(got, expected, *tolerance)

    def loss(model):
        return jnp.sum(jnp.sin(model(x).astype(jnp.float32)))

    their_grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(theirs)
    our_grads = pg.grad(loss, wrt=pnn.LoRAParam)(ours)
    ours_flat = {p: np.asarray(v, np.float32) for p, v in our_grads.flat_state().items()}
    theirs_flat = {
        tuple(p): np.asarray(v[...], np.float32) for p, v in nnx.to_flat_state(their_grads)
    }
    assert ours_flat.keys() == theirs_flat.keys() == {("lora", "lora_a"), ("lora", "lora_b")}
    for path in ours_flat:
        np.testing.assert_allclose(ours_flat[path], theirs_flat[path], *tolerance)


def test_lora_around_a_base_module_matches():
    their_base = nnx.Linear(6, 4, rngs=nnx.Rngs(1))
    theirs = nnx.LoRA(6, 2, 4, base_module=their_base, rngs=nnx.Rngs(2))
    randomize(theirs)
    ours = pnn.LoRA(6, 2, 4, base_module=pnn.Linear(6, 4, rngs=0), rngs=0)
    copy_into(ours, theirs)
    x = jax.random.normal(jax.random.key(3), (2, 3, 6))
    np.testing.assert_allclose(ours(x), theirs(x), RTOL, ATOL)

    def loss(model):
        return jnp.mean(model(x) ** 2)

    their_grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(theirs)
    our_grads = pg.grad(loss, wrt=pnn.LoRAParam)(ours)
    theirs_flat = {tuple(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(their_grads)}
    assert_same({p: np.asarray(v) for p, v in our_grads.flat_state().items()}, theirs_flat)


@pytest.mark.parametrize("part", ["adapters", "base"])
def test_the_optimizer_trains_the_same_part(part):
    ours, theirs = pair(seed=4)
    if part == "adapters":
        our_wrt, their_wrt = pnn.LoRAParam, nnx.LoRAParam
    else:
        our_wrt, their_wrt = (
            All(Param, Not(pnn.LoRAParam)),
            nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)),
        )
    x = jax.random.normal(jax.random.key(5), (16, 6))
    y = jax.random.normal(jax.random.key(6), (16, 4))

    def loss(model):
        return jnp.mean((model(x) - y) ** 2)

    our_optimizer = pnn.Optimizer(ours, optax.adam(1e-2), wrt=our_wrt)
    their_optimizer = nnx.Optimizer(theirs, optax.adam(1e-2), wrt=their_wrt)

    @pg.jit
    def our_step(model, optimizer):
        grads = pg.grad(loss, wrt=our_wrt)(model)
        optimizer.update(model, grads)

    @nnx.jit
    def their_step(model, optimizer):
        grads = nnx.grad(loss, argnums=nnx.DiffState(0, their_wrt))(model)
        optimizer.update(model, grads)

    frozen = ours_values(ours, Not(our_wrt))
    for _ in range(4):
        our_step(ours, our_optimizer)
        their_step(theirs, their_optimizer)
    assert_same(ours_values(ours), nnx_values(theirs))
    assert_same(ours_values(ours, Not(our_wrt)), frozen, exact=True)
