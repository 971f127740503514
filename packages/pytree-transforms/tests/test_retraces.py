"""Retraces that explain themselves: `explain_retraces`, and `assert_max_traces`' message."""

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, field
from pytree_transforms import explain_retraces, explaining_retraces, filter_jit
from pytree_transforms.debug import assert_max_traces
from pytree_transforms.extend import Signature, TraceHistory

LOGGER = "pytree_transforms.retraces"


class Linear(Module):
    weight: jax.Array
    rate: float = field(static=True)
    activation: str = field(static=True, default="relu")


class Conv(Module):
    weight: jax.Array
    rate: float = field(static=True)


class Net(Module):
    layers: list


def explained(caplog, calls):
    """The messages logged while running `calls` (each a thunk) with the switch on."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), explain_retraces():
        for call in calls:
            call()
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def one_message(caplog, first, second):
    """The message logged for the retrace `second` causes after `first`."""
    messages = explained(caplog, [first, second])
    assert len(messages) == 1, messages
    return messages[0]


def jitted(**options):
    """A `filter_jit` of a new function named `loss` (so that its traces are its own)."""

    def loss(model, x=None, **kwargs):
        return jax.tree.leaves(model)[0]

    loss.__qualname__ = "loss"
    return filter_jit(loss, **options)


def test_array_shape_names_path_and_hint(caplog):
    f = jitted()
    message = one_message(
        caplog,
        lambda: f(Net([Linear(jnp.ones((2, 2)), 0.1)])),
        lambda: f(Net([Linear(jnp.ones((3, 2)), 0.1)])),
    )
    assert message == (
        "filter_jit(loss): retraced (trace 2): args[0].layers[0].weight: shape (2, 2) -> "
        "(3, 2) (every new shape traces again: pad or bucket inputs to a few fixed shapes)"
    )


def test_dtype(caplog):
    f = jitted()
    message = one_message(caplog, lambda: f(jnp.ones(2)), lambda: f(jnp.ones(2, dtype=jnp.float16)))
    assert "args[0]: dtype float32 -> float16" in message
    assert "astype" in message


def test_weak_type(caplog):
    # A Python float traced as an array is weakly typed; an array of a given dtype is not.
    f = jitted(args=(True,))
    message = one_message(caplog, lambda: f(1.0), lambda: f(jnp.asarray(1.0, dtype=jnp.float32)))
    assert "args[0]: weak type True -> False" in message
    assert "jnp.asarray(x, dtype=...)" in message


def test_prng_keys(caplog):
    f = jitted()
    message = one_message(
        caplog,
        lambda: f(jax.random.key(0)),
        lambda: f(jax.random.split(jax.random.key(0))),
    )
    assert "args[0]: shape () -> (2,)" in message


def test_static_float_field_and_string(caplog):
    f = jitted()
    message = one_message(
        caplog,
        lambda: f(Linear(jnp.ones(2), 0.1, "relu")),
        lambda: f(Linear(jnp.ones(2), 0.2, "gelu")),
    )
    lines = message.splitlines()
    assert lines == [
        "filter_jit(loss): retraced (trace 2): args[0].rate: static value 0.1 -> 0.2 (a static "
        "attribute or argument compiles anew for each value: hold one that varies as an "
        "array instead)",
        "filter_jit(loss): retraced (trace 2): args[0].activation: static value 'relu' -> "
        "'gelu' (a static attribute or argument compiles anew for each value: hold one that "
        "varies as an array instead)",
    ]


def test_python_number_argument(caplog):
    f = filter_jit(lambda x, n: x * n)
    message = one_message(caplog, lambda: f(jnp.ones(2), 3), lambda: f(jnp.ones(2), 4))
    assert message.endswith(
        "args[1]: Python value 3 -> 4 (a Python number is static: pass `jnp.asarray(...)` "
        "to avoid retracing)"
    )
    # Equal numbers of different types are different statics.
    message = one_message(caplog, lambda: None, lambda: f(jnp.ones(2), 4.0))
    assert "args[1]: Python value 4 -> 4.0" in message


def test_number_then_array(caplog):
    f = jitted()
    message = one_message(caplog, lambda: f(2.0), lambda: f(jnp.asarray(2.0)))
    assert "args[0]: Python value 2.0 -> array f32[] (passing an array from the start" in message


def test_structure_added_removed_and_list_length(caplog):
    f = jitted()
    one = Linear(jnp.ones(2), 0.1)
    messages = explained(
        caplog,
        [
            lambda: f({"a": jnp.ones(2)}),
            lambda: f({"a": jnp.ones(2), "b": jnp.ones(3)}),
            lambda: f({"b": jnp.ones(3)}),
            lambda: f(Net([one])),
            lambda: f(Net([one, one])),
        ],
    )
    assert messages[0].endswith("args[0]['b']: added (f32[3])")
    assert messages[1].endswith("args[0]['a']: removed (was f32[2])")
    # Another structure altogether: the closest earlier trace is the dict, whose insides
    # are not listed below the changed class.
    assert "args[0]: class dict -> Net" in messages[2]
    # A list one longer: the new entry once, not each of its leaves.
    assert messages[3].splitlines() == [
        "filter_jit(loss): retraced (trace 5): args[0].layers[1]: added (Linear)"
    ]


def test_module_class(caplog):
    f = jitted()
    message = one_message(
        caplog, lambda: f(Linear(jnp.ones(2), 0.1)), lambda: f(Conv(jnp.ones(2), 0.1))
    )
    assert message.splitlines() == [
        "filter_jit(loss): retraced (trace 2): args[0]: class Linear -> Conv"
    ]


def test_keyword_argument_added(caplog):
    f = jitted()
    message = one_message(caplog, lambda: f(jnp.ones(2)), lambda: f(jnp.ones(2), x=jnp.ones(2)))
    assert message.endswith("kwargs['x']: added (f32[2])")


def test_compared_with_the_closest_earlier_trace(caplog):
    f = jitted()
    messages = explained(
        caplog,
        [lambda: f(jnp.ones(2)), lambda: f(jnp.ones(3)), lambda: f(jnp.ones(2, jnp.int32))],
    )
    # The third differs from the first in dtype only, from the second in shape and dtype.
    assert messages[1].endswith(
        "args[0]: dtype float32 -> int32 (cast to one dtype before the call, with `x.astype(...)`)"
    )
    assert "trace 3" in messages[1]


def test_many_differences_are_cut_short(caplog):
    f = jitted()
    message = one_message(
        caplog,
        lambda: f([jnp.ones(2)] * 1 + [jnp.ones(i + 1) for i in range(20)]),
        lambda: f([jnp.ones(3)] * 1 + [jnp.ones(i + 2) for i in range(20)]),
    )
    lines = message.splitlines()
    assert len(lines) == 13
    assert lines[-1].endswith("... and 9 more differences")


def test_a_tied_module_is_explained_at_its_first_path(caplog):
    class Dense(Module):
        weight: jax.Array

    f = jitted()
    tied = Dense(jnp.ones(2))
    messages = explained(
        caplog,
        [
            lambda: f({"a": tied, "b": tied}),
            lambda: f({"a": Dense(jnp.ones(2)), "b": Dense(jnp.ones(2))}),
            lambda: f({"a": tied, "b": Dense(jnp.ones(3))}),
        ],
    )
    # Untied: "b" holds an array of its own now, where it held the one at "a".
    assert messages[0].splitlines() == [
        "filter_jit(loss): retraced (trace 2): args[0]['b'].weight: now its own f32[2] "
        "(before the same object as args[0]['a'].weight)"
    ]
    # Compared with the closest earlier trace, the untied one: a new shape at "b".
    assert messages[1].splitlines() == [
        "filter_jit(loss): retraced (trace 3): args[0]['b'].weight: shape (2,) -> (3,) (every "
        "new shape traces again: pad or bucket inputs to a few fixed shapes)"
    ]


def test_nothing_logged_on_first_trace_or_cache_hit(caplog):
    f = jitted()
    assert explained(caplog, [lambda: f(jnp.ones(2)), lambda: f(jnp.zeros(2))]) == []
    # The retrace logs; going back to the first structure hits the cache, and logs nothing.
    messages = explained(caplog, [lambda: f(jnp.ones(3)), lambda: f(jnp.ones(2))])
    assert len(messages) == 1


def test_same_arguments_after_clearing_jax_caches(caplog):
    f = jitted()
    message = one_message(
        caplog, lambda: f(jnp.ones(2)), lambda: (jax.clear_caches(), f(jnp.ones(2)))
    )
    assert "no argument changed" in message
    assert "jax.clear_caches()" in message


def test_logged_as_warning_on_its_own_logger(caplog):
    f = jitted()
    with caplog.at_level(logging.WARNING, logger=LOGGER), explain_retraces():
        f(jnp.ones(2))
        f(jnp.ones(3))
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.WARNING


def test_off_by_default_and_after_the_block(caplog):
    f = jitted()
    assert not explaining_retraces()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        f(jnp.ones(2))
        f(jnp.ones(3))
        with explain_retraces() as switch:
            assert explaining_retraces() and switch.enabled
            f(jnp.ones(4))
        assert not explaining_retraces()
        f(jnp.ones(5))
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 1
    assert "trace 3" in messages[0]


def test_nesting_and_the_function_form():
    assert not explaining_retraces()
    with explain_retraces():
        with explain_retraces(False):
            assert not explaining_retraces()
            with explain_retraces(True):
                assert explaining_retraces()
            assert not explaining_retraces()
        assert explaining_retraces()
    assert not explaining_retraces()
    try:
        explain_retraces(True)  # set globally, until set again
        assert explaining_retraces()
    finally:
        explain_retraces(False)
    assert not explaining_retraces()


def test_refuses_a_non_bool():
    with pytest.raises(TypeError, match=r"explain_retraces\(enabled\) takes True or False"):
        explain_retraces(1)
    assert not explaining_retraces()  # nothing changed


def test_environment_variable_turns_it_on():
    script = (
        "import logging, jax.numpy as jnp\n"
        "logging.basicConfig(format='%(name)s %(levelname)s %(message)s')\n"
        "from pytree_transforms import explaining_retraces, filter_jit\n"
        "print('on:', explaining_retraces())\n"
        "f = filter_jit(lambda x: x)\n"
        "f(jnp.ones(2)); f(jnp.ones(3)); f(jnp.ones(3))\n"
    )
    for value, expected in (("1", True), ("0", False)):
        env = {**os.environ, "PYTREE_EXPLAIN_RETRACES": value, "JAX_PLATFORMS": "cpu"}
        run = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        assert f"on: {expected}" in run.stdout
        logged = [line for line in run.stderr.splitlines() if line.startswith(LOGGER)]
        if expected:
            assert logged == [
                "pytree_transforms.retraces WARNING filter_jit(<lambda>): retraced (trace 2): "
                "args[0]: shape (2,) -> (3,) (every new shape traces again: pad or bucket "
                "inputs to a few fixed shapes)"
            ]
        else:
            assert logged == []


def test_assert_max_traces_explains_even_when_off():
    @filter_jit
    @assert_max_traces(max_traces=1)
    def double(x):
        return 2 * x

    double(jnp.ones(2))
    with pytest.raises(RuntimeError) as error:
        double(jnp.ones(3))
    message = str(error.value)
    assert "this is trace 2" in message
    assert message.endswith(
        "What changed:\nfilter_jit(double): retraced (trace 2): args[0]: shape (2,) -> (3,) "
        "(every new shape traces again: pad or bucket inputs to a few fixed shapes)"
    )


def test_assert_max_traces_outside_a_recorded_jit_is_unchanged():
    counted = jax.jit(assert_max_traces(lambda x: x, max_traces=1))
    counted(jnp.ones(2))
    with pytest.raises(RuntimeError) as error:
        counted(jnp.ones(3))
    assert "What changed" not in str(error.value)


def test_callable_module_is_named_fun(caplog):
    class Scale(Module):
        factor: jax.Array

        def __call__(self, x):
            return self.factor * x

    messages = explained(
        caplog,
        [
            lambda: filter_jit(Scale(jnp.ones(())))(jnp.ones(2)),
            lambda: filter_jit(Scale(jnp.ones(())))(jnp.ones(2)),
            lambda: filter_jit(Scale(jnp.ones(())))(jnp.ones(3)),
        ],
    )
    assert len(messages) == 1
    assert "args[0]: shape (2,) -> (3,)" in messages[0]


def test_signature_and_history_for_other_transforms():
    history = TraceHistory("my_jit", abs)
    first = Signature()
    first.pytree("args[0]", {"w": jnp.ones(2), "n": 1})
    with history.record(first) as retrace:
        assert retrace is None
    second = Signature()
    second.pytree("args[0]", {"w": jnp.ones(2), "n": 2})
    with history.record(second) as retrace:
        assert retrace.lines() == [
            "my_jit(abs): retraced (trace 2): args[0]['n']: Python value 1 -> 2 (a Python "
            "number is static: pass `jnp.asarray(...)` to avoid retracing)"
        ]
    assert history.count == 2
