"""The trace-level guard: no mutation of outside objects from inside a JAX trace."""

import jax
import jax.numpy as jnp
import pytest

from pytree_module import Module, TraceContextError, data


class Counter(Module):
    def __init__(self):
        self.count = data(0)


@pytest.mark.parametrize(
    "transform",
    [
        jax.jit,
        jax.vmap,
        jax.grad,
        lambda f: lambda x: jax.lax.scan(lambda c, x: (f(x), None), 0.0, x[None]),
    ],
    ids=["jit", "vmap", "grad", "scan"],
)
def test_mutating_a_captured_module_inside_a_transform_raises(transform):
    counter = Counter()

    def increment(x):
        counter.count += 1
        return jnp.sum(x) * 1.0

    with pytest.raises(
        TraceContextError,
        match=r"^Cannot mutate 'Counter' from different trace level "
        r".*created outside the JAX transformation",
    ):
        transform(increment)(jnp.arange(3.0))
    assert counter.count == 0


def test_trace_context_error_is_a_value_error():
    assert issubclass(TraceContextError, ValueError)


def test_deleting_inside_a_transform_raises():
    counter = Counter()

    @jax.jit
    def f(x):
        del counter.count
        return x

    with pytest.raises(TraceContextError, match="delete"):
        f(1.0)
    assert counter.count == 0


def test_module_passed_as_argument_can_be_mutated_inside():
    @jax.jit
    def increment(counter):
        counter.count += 1
        return counter

    counter = increment(Counter())
    assert int(counter.count) == 1
    counter.count = 5  # the output lives at the top level again
    assert counter.count == 5


def test_module_created_inside_a_trace_can_be_mutated_there():
    @jax.jit
    def f(x):
        c = Counter()
        c.count = x
        return c.count + 1

    assert int(f(1)) == 2


def test_vmapped_argument_can_be_mutated():
    @jax.vmap
    def f(counter):
        counter.count = counter.count * 2
        return counter.count

    counter = Counter()
    counter.count = jnp.arange(3)
    assert f(counter).tolist() == [0, 2, 4]


@pytest.mark.parametrize("public_api_only", [False, True])
def test_trace_tokens_tell_traces_apart(public_api_only):
    from pytree_module._trace import make_current_trace_token, trace_state

    token = make_current_trace_token(None if public_api_only else trace_state)
    outside = token()
    assert token() == outside
    seen = []

    @jax.jit
    def f(x):
        seen.append(token() == outside)
        return x

    f(1.0)
    assert seen == [False]
