"""Errors side by side with Flax NNX: where both libraries refuse the same thing, the
exception class is the same and this library's message opens with NNX's words (then adds
the path and the fix). Runs in the bench environment."""

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pytree_graph as pg  # noqa: E402
import pytree_module as pm  # noqa: E402
import pytree_nn as pn  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def _same_opening(ours, theirs, opening):
    assert type(ours) is type(theirs) or isinstance(ours, type(theirs)), (ours, theirs)
    assert opening in str(theirs), str(theirs)
    assert str(ours).startswith(opening) or f": {opening}" in str(ours), str(ours)


def _blocks():
    class NnxBlock(nnx.Module):
        def __init__(self):
            self.dropout = nnx.Dropout(0.5, rngs=nnx.Rngs(0))

    class OurBlock(pn.Module):
        def __init__(self):
            self.dropout = pn.Dropout(0.5, rngs=pn.Rngs(0))

    return NnxBlock(), OurBlock()


def test_unknown_attributes_of_view_and_set_attributes():
    theirs, ours = _blocks()
    _same_opening(
        _error(lambda: pg.view(ours, deterministic=True, unknown=True)),
        _error(lambda: nnx.view(theirs, deterministic=True, unknown=True)),
        "Unused keys found in nnx.view: ['unknown']",
    )
    _same_opening(
        _error(lambda: ours.set_attributes(deterministic=True, unknown=True)),
        _error(lambda: theirs.set_attributes(deterministic=True, unknown=True)),
        "Could not find at least one instance of the following attributes: ",
    )


def test_split_filters_that_do_not_fit():
    theirs = nnx.Dict(a=nnx.Param(jnp.ones(1)), b=nnx.BatchStat(jnp.ones(1)))
    ours = pm.Dict(a=pg.Param(jnp.ones(1)), b=pg.BatchStat(jnp.ones(1)))
    _same_opening(
        _error(lambda: pg.split(ours, ..., pg.Param)),
        _error(lambda: nnx.split(theirs, ..., nnx.Param)),
        "`...` or `True` can only be used as the last filters, got ",
    )
    _same_opening(
        _error(lambda: pg.split(ours, pg.Param)),
        _error(lambda: nnx.split(theirs, nnx.Param)),
        "Non-exhaustive filters, got a non-empty remainder",
    )


def test_rngs_without_the_stream_or_a_default():
    _same_opening(
        _error(lambda: pn.Rngs(some_name=0).dropout()),
        _error(lambda: nnx.Rngs(some_name=0).dropout()),
        "No RngStream named 'dropout' found in Rngs",
    )


@pytest.mark.parametrize("held", ["int", "Param"])
def test_sow_under_a_name_held_by_something_else(held):
    def make(lib, graph):
        class Foo(lib.Module):
            def __init__(self):
                self.y = 10 if held == "int" else graph.Param(10)

            def __call__(self, x):
                self.sow(graph.Intermediate, "y", x + 1)

        return Foo()

    opening = (
        "Expected 'y' to be a Variable, got int"
        if held == "int"
        else "Expected 'y' to be of type 'Intermediate', got 'Param'"
    )
    _same_opening(_error(lambda: make(pn, pg)(2)), _error(lambda: make(nnx, nnx)(2)), opening)


def _opening(error):
    # NNX follows its words with a link to its docs: " (https://...)".
    return str(error).split(" (")[0]


def test_mutations_from_another_trace_level():
    def make(base):
        class Foo(base):
            def __init__(self):
                self.a = 1

        return Foo()

    found = {}
    theirs, ours = nnx.Param(jnp.ones(1)), pg.Param(jnp.ones(1))
    modules = {"nnx": make(nnx.Module), "ours": make(pm.Module)}

    @jax.jit
    def f():
        for name, module in modules.items():
            found[name] = _error(lambda module=module: setattr(module, "a", 2))
        found["nnx_variable"] = _error(lambda: theirs.set_value(jnp.zeros(1)))
        found["our_variable"] = _error(lambda: ours.set_value(jnp.zeros(1)))

    f()
    # NNX's class is flax.errors.TraceContextError; the message opening is compared.
    assert _opening(found["nnx"]) == "Cannot mutate 'Foo' from different trace level"
    assert str(found["ours"]).startswith(_opening(found["nnx"]))
    assert _opening(found["nnx_variable"]) == "Cannot mutate Param from a different trace level"
    assert str(found["our_variable"]).startswith(_opening(found["nnx_variable"]))


def test_a_variable_holding_a_function_is_called_like_it():
    assert pg.Param(lambda x: x * 2)(3) == nnx.Param(lambda x: x * 2)(3) == 6
