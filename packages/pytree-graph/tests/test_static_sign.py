"""Statics that are subclasses of float or tuple (NumPy scalars, NamedTuples, float
subclasses) are keyed by type and bits, like plain floats: a graph whose static differs
only in the sign of a zero never reuses the other graph's compilation."""

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param
from pytree_module import Module


class Pair(NamedTuple):
    first: float
    second: int


class Scale(float):
    pass


class Graph(Module, pytree=False):
    def __init__(self, static):
        self.w = Param(jnp.ones(()))
        self.static = static


class Tree(Module):
    def __init__(self, scale):
        self.w = Param(jnp.ones(()), scale=scale)


class Holder(Module, pytree=False):
    def __init__(self, scale):
        self.w = Param(jnp.ones(()), scale=scale)


def _number(value):
    return value[0] if isinstance(value, tuple) else value


def identical(a, b):
    """Same type and same text: `repr` tells `0.0` from `-0.0` at any depth."""
    return type(a) is type(b) and repr(a) == repr(b)


# Pairs that `==` calls equal but that a traced function tells apart by the sign of the zero.
SIGNED_ZEROS = [
    pytest.param(np.float64(0.0), np.float64(-0.0), id="numpy-float64"),
    pytest.param(np.float32(0.0), np.float32(-0.0), id="numpy-float32"),
    pytest.param(Pair(np.float64(0.0), 1), Pair(np.float64(-0.0), 1), id="namedtuple-numpy"),
    pytest.param(Pair(0.0, 1), Pair(-0.0, 1), id="namedtuple-float"),
    pytest.param(Scale(0.0), Scale(-0.0), id="float-subclass"),
]


@pytest.mark.parametrize("holder", [Tree, Holder], ids=["pytree-module", "graph-module"])
@pytest.mark.parametrize(("positive", "negative"), SIGNED_ZEROS)
def test_jit_of_a_module_whose_variable_metadata_holds_a_signed_zero(holder, positive, negative):
    assert positive == negative  # the premise: Python calls them equal

    @pg.jit
    def signs(m):
        scale = _number(m.w.scale)
        return m.w.value * jnp.copysign(1.0, scale), 1 / jnp.asarray(scale, jnp.float32)

    plus, minus = holder(positive), holder(negative)
    assert [float(x) for x in signs(plus)] == [1.0, math.inf]
    assert [float(x) for x in signs(minus)] == [-1.0, -math.inf]
    assert pg.graphdef(plus) != pg.graphdef(minus)
    assert identical(minus.w.scale, negative)  # the metadata is the value given, not a twin's


@pytest.mark.parametrize(
    ("positive", "negative"),
    [
        pytest.param(Scale(0.0), Scale(-0.0), id="float-subclass"),
        pytest.param(Pair(Scale(0.0), 1), Pair(Scale(-0.0), 1), id="namedtuple-of-subclass"),
    ],
)
def test_jit_of_a_graph_holding_a_static_signed_zero(positive, negative):
    @pg.jit
    def sign(m):
        return m.w.value * jnp.copysign(1.0, _number(m.static))

    plus, minus = Graph(positive), Graph(negative)
    assert float(sign(plus)) == 1.0
    assert float(sign(minus)) == -1.0
    assert pg.graphdef(plus) != pg.graphdef(minus)
    assert pg.graphdef([positive]) != pg.graphdef([negative])
    assert identical(pg.merge(*pg.split(minus)).static, negative)


def test_numpy_scalars_of_equal_bits_share_one_kind_and_one_graphdef():
    one, other = Holder(np.float64(0.5)), Holder(np.float64(0.5))
    assert pg.graphdef(one) == pg.graphdef(other)
    nan, other_nan = Holder(np.float32("nan")), Holder(np.float32("nan"))
    assert pg.graphdef(nan) == pg.graphdef(other_nan)  # a NaN equals itself


def test_metadata_of_another_numpy_width_keeps_its_type():
    wide, narrow = Param(1.0, scale=np.float64(2.0)), Param(1.0, scale=np.float32(2.0))
    assert type(wide.scale) is np.float64
    assert type(narrow.scale) is np.float32
    assert pg.graphdef([wide]) != pg.graphdef([narrow])
