"""`pytree_graph.jit` and `jit_partial` explain their retraces (`explain_retraces`)."""

import logging

import jax.numpy as jnp
import pytest

import pytree_graph as pg
from pytree_module import Module
from pytree_transforms import explain_retraces
from pytree_transforms.debug import assert_max_traces

LOGGER = "pytree_transforms.retraces"
SHAPE_HINT = "(every new shape traces again: pad or bucket inputs to a few fixed shapes)"


class Dense(Module):
    def __init__(self, n, rate=0.1, name="dense"):
        self.kernel = pg.Param(jnp.ones((n, 2)))
        self.rate = rate
        self.name = name


class Conv(Module):
    def __init__(self, n):
        self.kernel = pg.Param(jnp.ones((n, 2)))


class Net(Module, pytree=False):
    def __init__(self, n=2):
        self.layers = [Dense(n)]


class TreeNet(Module):
    def __init__(self, n=2):
        self.layers = [Dense(n)]


def explained(caplog, calls):
    """The messages logged while running `calls` (each a thunk) with the switch on."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), explain_retraces():
        for call in calls:
            call()
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def lines_of(messages):
    """Each message's lines, without the `transform(function): retraced (trace n): ` part."""
    return [[line.split("): ", 2)[2] for line in m.splitlines()] for m in messages]


def new_step():
    def step(model, x=None, **kwargs):
        return x

    return step


@pytest.mark.parametrize("net", [Net, TreeNet], ids=["graph_module", "pytree_module"])
def test_jit_explains_each_kind_of_change(caplog, net):
    step = pg.jit(new_step())
    model = net()

    def set_kernel(value):
        model.layers[0].kernel.value = value

    messages = explained(
        caplog,
        [
            lambda: step(model, 1.0),
            lambda: step(model, 1.0),  # cached: nothing
            lambda: (set_kernel(jnp.ones((3, 2))), step(model, 1.0)),
            lambda: (set_kernel(jnp.ones((3, 2), jnp.float16)), step(model, 1.0)),
            lambda: (setattr(model.layers[0], "rate", 0.2), step(model, 1.0)),
            lambda: (setattr(model.layers[0], "name", "other"), step(model, 1.0)),
            lambda: step(model, 2.0),
            lambda: step(model, 2.0, y=jnp.ones(2)),
        ],
    )
    assert messages[0].startswith("pytree_graph.jit(step): retraced (trace 2): ")
    assert lines_of(messages) == [
        [f"args[0].layers[0].kernel: shape (2, 2) -> (3, 2) {SHAPE_HINT}"],
        [
            "args[0].layers[0].kernel: dtype float32 -> float16 (cast to one dtype before "
            "the call, with `x.astype(...)`)"
        ],
        [
            "args[0].layers[0].rate: static value 0.1 -> 0.2 (a static attribute or argument "
            "compiles anew for each value: hold one that varies as an array instead)"
        ],
        [
            "args[0].layers[0].name: static value 'dense' -> 'other' (a static attribute or "
            "argument compiles anew for each value: hold one that varies as an array instead)"
        ],
        [
            "args[1]: Python value 1.0 -> 2.0 (a Python number is static: pass "
            "`jnp.asarray(...)` to avoid retracing)"
        ],
        ["kwargs['y']: added (f32[2])"],
    ]


def test_jit_structure_changes(caplog):
    step = pg.jit(new_step())
    model = Net()
    messages = explained(
        caplog,
        [
            lambda: step(model),
            lambda: (model.layers.append(Dense(2)), step(model)),
            lambda: (model.layers.pop(), step(model)),
            lambda: (setattr(model, "extra", pg.BatchStat(jnp.ones(2))), step(model)),
            lambda: (setattr(model, "extra", pg.Param(jnp.ones(2))), step(model)),
            lambda: (delattr(model, "extra"), step(model)),
            lambda: (model.layers.__setitem__(0, Conv(2)), step(model)),
        ],
    )
    assert lines_of(messages) == [
        ["args[0].layers[1]: added (Dense)"],
        # Back to a structure traced before: the cache hits, nothing is said.
        ["args[0].extra: added (BatchStat f32[2])"],
        ["args[0].extra: Variable type BatchStat -> Param"],
        ["args[0].layers[0]: class Dense -> Conv"],
    ]


def test_jit_variable_metadata(caplog):
    step = pg.jit(new_step())
    model = Net()
    messages = explained(
        caplog,
        [
            lambda: step(model),
            lambda: (model.layers[0].kernel.set_metadata(tag="a"), step(model)),
        ],
    )
    assert lines_of(messages) == [["args[0].layers[0].kernel: Variable metadata tag: None -> 'a'"]]


@pytest.mark.parametrize("net", [Net, TreeNet], ids=["graph_module", "pytree_module"])
def test_jit_tied_variable_is_explained_by_its_first_path(caplog, net):
    step = pg.jit(new_step())
    model = net()
    model.layers.append(Dense(2))
    first, second = model.layers

    messages = explained(
        caplog,
        [
            lambda: step(model),
            lambda: (setattr(second, "kernel", first.kernel), step(model)),
            lambda: (setattr(first, "kernel", pg.Param(jnp.ones((3, 2)))), step(model)),
        ],
    )
    assert lines_of(messages) == [
        [
            "args[0].layers[1].kernel: now the same object as args[0].layers[0].kernel "
            "(before its own Param f32[2,2])"
        ],
        # Untied again, with a new kernel shape: the closest earlier trace is the first
        # (untied too), from which only the shape differs.
        [f"args[0].layers[0].kernel: shape (2, 2) -> (3, 2) {SHAPE_HINT}"],
    ]


def test_jit_static_argnums(caplog):
    step = pg.jit(new_step(), static_argnums=1)
    model = Net()
    messages = explained(caplog, [lambda: step(model, "a"), lambda: step(model, "b")])
    assert lines_of(messages) == [
        [
            "args[1]: static value 'a' -> 'b' (a static attribute or argument compiles anew "
            "for each value: hold one that varies as an array instead)"
        ]
    ]


def test_jit_method_of_a_module_names_the_function_part(caplog):
    model = Net()
    step = pg.jit(lambda x: model.layers[0].kernel.value.sum() * x)
    messages = explained(caplog, [lambda: step(jnp.ones(2)), lambda: step(jnp.ones(3))])
    assert lines_of(messages) == [[f"args[0]: shape (2,) -> (3,) {SHAPE_HINT}"]]
    assert messages[0].startswith("pytree_graph.jit(<lambda>): retraced (trace 2)")


def test_jit_no_log_on_first_trace_or_cache_hit(caplog):
    step = pg.jit(new_step())
    model = Net()
    assert explained(caplog, [lambda: step(model, jnp.ones(2))] * 3) == []


def test_jit_assert_max_traces_explains():
    step = pg.jit(assert_max_traces(new_step(), max_traces=1))
    model = Net()
    step(model, jnp.ones(2))
    with pytest.raises(RuntimeError) as error:
        step(model, jnp.ones(2, jnp.int32))
    assert str(error.value).endswith(
        "What changed:\npytree_graph.jit(step): retraced (trace 2): args[1]: dtype float32 -> "
        "int32 (cast to one dtype before the call, with `x.astype(...)`)"
    )


def test_jit_partial_explains_bound_and_step_arguments(caplog):
    model = Net()
    step = pg.jit_partial(new_step(), model)

    def set_kernel(value):
        model.layers[0].kernel.value = value

    messages = explained(
        caplog,
        [
            lambda: step(1.0),
            lambda: step(1.0),
            lambda: step(jnp.ones(2)),
            lambda: step(jnp.ones(2)),
            lambda: step(jnp.ones(3)),
            lambda: step(jnp.ones(3), y=2),
            lambda: (set_kernel(jnp.ones((3, 2))), step(jnp.ones(3), y=2)),
            lambda: (setattr(model.layers[0], "rate", 0.5), step(jnp.ones(3), y=2)),
            lambda: (model.layers.append(Dense(2)), step(jnp.ones(3), y=2)),
        ],
    )
    assert messages[0].startswith("pytree_graph.jit_partial(step): retraced (trace 2): ")
    assert lines_of(messages) == [
        [
            "args[1]: Python value 1.0 -> array f32[2] (passing an array from the start "
            "compiles once)"
        ],
        [f"args[1]: shape (2,) -> (3,) {SHAPE_HINT}"],
        ["kwargs['y']: added (2)"],
        [f"args[0].layers[0].kernel: shape (2, 2) -> (3, 2) {SHAPE_HINT}"],
        [
            "args[0].layers[0].rate: static value 0.1 -> 0.5 (a static attribute or argument "
            "compiles anew for each value: hold one that varies as an array instead)"
        ],
        ["args[0].layers[1]: added (Dense)"],
    ]


def test_jit_partial_assert_max_traces_explains():
    model = Net()
    step = pg.jit_partial(assert_max_traces(new_step(), max_traces=1), model)
    step(jnp.ones(2))
    with pytest.raises(RuntimeError, match=r"What changed:\n.*args\[1\]: shape \(2,\) -> \(4,\)"):
        step(jnp.ones(4))
