"""tabulate's FLOP columns side by side with nnx.tabulate(compute_flops=, compute_vjp_flops=):
the same estimates for the same model and inputs."""

import re

import jax
import jax.numpy as jnp
import pytest

import pytree_nn as pn

nnx = pytest.importorskip("flax.nnx")


class Ours(pn.Module):
    def __init__(self):
        self.first = pn.Linear(3, 8, rngs=0)
        self.second = pn.Linear(8, 2, rngs=1)

    def __call__(self, x):
        return self.second(jax.nn.gelu(self.first(x)))


class Theirs(nnx.Module):
    def __init__(self, rngs):
        self.first = nnx.Linear(3, 8, rngs=rngs)
        self.second = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.second(jax.nn.gelu(self.first(x)))


def nnx_rows(text):
    """`{path: (flops, vjp_flops)}` from nnx.tabulate's rich table (root at '')."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) >= 6 and cells[4].isdigit():
            rows[cells[0]] = (int(cells[4]), int(cells[5]))
    return rows


def our_rows(text):
    rows = {}
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) >= 5 and cells[3].replace(",", "").isdigit():
            rows[cells[0]] = (int(cells[3].replace(",", "")), int(cells[4].replace(",", "")))
    return rows


@pytest.mark.parametrize("batch", [1, 16])
def test_flops_and_vjp_flops_match_nnx(batch):
    x = jnp.ones((batch, 3))
    theirs = nnx.tabulate(
        Theirs(nnx.Rngs(0)),
        x,
        compute_flops=True,
        compute_vjp_flops=True,
        console_kwargs=dict(width=300, force_terminal=False),
    )
    ours = pn.tabulate(Ours(), x, compute_flops=True, compute_vjp_flops=True)
    theirs, ours = nnx_rows(theirs), our_rows(ours)
    assert ours == {
        "(root)": theirs[""],
        ".first": theirs["first"],
        ".second": theirs["second"],
    }
