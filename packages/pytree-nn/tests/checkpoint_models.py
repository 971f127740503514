"""Models and checks shared by the checkpoint tests of both formats (a file, a directory)."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import BatchStat, Param, Variable
from pytree_nn import Linear, Module, Rngs


class Everything(Module):
    """A model with every kind of state a checkpoint keeps."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.w = Param(jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), sharding=(None, "m"))
        self.tied = self.w  # shared: stored once, restored for both names
        self.half = Param(jnp.asarray(rng.normal(size=(5,)), jnp.bfloat16))
        self.small = Param(jnp.asarray(rng.normal(size=(2, 3)), jnp.float8_e4m3fn))
        self.nibbles = Variable(jnp.asarray(rng.integers(-8, 8, (4,)), jnp.int4))
        self.counts = BatchStat(jnp.asarray(rng.integers(0, 9, (2, 2)), jnp.int32))
        self.flags = Variable(jnp.asarray(rng.integers(0, 2, (3,)), bool))
        self.scale = Variable(float(seed) + 0.5)
        self.steps = Variable(seed)
        self.empty = Param(jnp.zeros((0, 3)))
        self.empty_half = Param(jnp.zeros((2, 0), jnp.bfloat16))
        self.host = np.asarray(rng.normal(size=(3,)))  # a NumPy array, kept one
        self.raw = jnp.asarray(rng.normal(size=(2,)), jnp.float32)  # a bare array
        self.layers = [Linear(2, 2, rngs=seed), Linear(2, 2, rngs=seed + 1)]
        self.table = {"a/b": Param(jnp.full(2, seed, jnp.float32)), "0": Param(jnp.ones(1) * seed)}
        self.rngs = Rngs(seed)


def values(model):
    flat = pg.state(model).flat_state()
    return {
        p: (jax.random.key_data(v.value) if p[-1] == "key" else v.value)
        if isinstance(v, Variable)
        else v
        for p, v in flat.items()
    }


def assert_same_values(a, b):
    va, vb = values(a), values(b)
    assert va.keys() == vb.keys()
    for path in va:
        x, y = va[path], vb[path]
        assert type(x) is type(y), path
        assert np.asarray(x).dtype == np.asarray(y).dtype, path
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


def snapshot(model):
    return {p: np.array(v) for p, v in values(model).items()}


def assert_unchanged(before, model):
    after = snapshot(model)
    assert before.keys() == after.keys()
    for path, value in before.items():
        np.testing.assert_array_equal(value, after[path], err_msg=str(path))


class Two(Module):
    def __init__(self, shape=(2,), dtype=jnp.float32, kind=Param, extra=False, **metadata):
        self.a = kind(jnp.ones(shape, dtype), **metadata)
        self.b = Param(jnp.zeros(2))
        if extra:
            self.c = Param(jnp.zeros(1))


# The tests that hold for both forms of checkpoint run on each; directories need the orbax
# extra, which the isolation check's wheels lack.
FORMS = pytest.mark.parametrize(
    "form",
    [
        "file",
        pytest.param(
            "directory",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("orbax") is None,
                reason="checkpoint directories need the orbax extra: pytree-nn[orbax]",
            ),
        ),
    ],
)


def checkpoint_path(tmp_path, form, name):
    """Where a test saves checkpoint `name`: a `.safetensors` file, or a directory (a path
    ending in '/')."""
    if form == "file":
        return tmp_path / f"{name}.safetensors"
    return os.path.join(tmp_path, name) + "/"
