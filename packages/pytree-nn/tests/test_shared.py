"""`Shared`: Equinox's explicit tying, over the native sharing of Variables; a tied model
trains the same in the functional style (filter_jit, filter_grad, apply_updates) and the
graph style (pytree_graph.jit, Optimizer), and keeps its tie in both."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_filter import filter, is_inexact_array
from pytree_graph import Param
from pytree_nn import Embedding, Linear, Module, Optimizer, Shared
from pytree_nn._shared import SharedNode
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad

STEPS = 5


class LanguageModel(Module):
    """Equinox's example: the output layer reuses the embedding matrix."""

    def __init__(self, computed: bool):
        embedding, linear = Embedding(7, 4, rngs=0), Linear(4, 4, rngs=1)
        if computed:
            get = lambda pair: pair[0].embedding.value[:4]  # noqa: E731
        else:
            # A Linear(4, 4) kernel tied to another Linear's kernel, the same Param.
            embedding, linear = (Linear(4, 4, rngs=0), Linear(4, 4, rngs=1))
            get = lambda pair: pair[0].kernel  # noqa: E731
        self.shared = Shared((embedding, linear), lambda pair: pair[1].kernel, get)
        self.computed = computed

    def __call__(self, x):
        first, second = self.shared()
        h = first(x) if self.computed else jnp.tanh(first(jax.nn.one_hot(x, 4)))
        return second(h)


def loss(model, x):
    return jnp.mean(model(x) ** 2)


def tokens(i):
    return jax.random.randint(jax.random.key(i), (6,), 0, 4)


def train_graph(computed):
    model = LanguageModel(computed)
    optimizer = Optimizer(model, optax.adam(1e-2), wrt=Param)

    @pg.jit
    def step(model, optimizer, x):
        value, grads = pg.value_and_grad(loss)(model, x)
        optimizer.update(model, grads)
        return value

    return model, [float(step(model, optimizer, tokens(i))) for i in range(STEPS)]


def train_functional(computed):
    model = LanguageModel(computed)
    tx = optax.adam(1e-2)
    opt_state = tx.init(filter(model, is_inexact_array))

    @filter_jit
    def step(model, opt_state, x):
        value, grads = filter_value_and_grad(loss)(model, x)
        updates, opt_state = tx.update(grads, opt_state, filter(model, is_inexact_array))
        return apply_updates(model, updates), opt_state, value

    losses = []
    for i in range(STEPS):
        model, opt_state, value = step(model, opt_state, tokens(i))
        losses.append(float(value))
    return model, losses


@pytest.mark.parametrize("computed", [False, True], ids=["tied-param", "computed"])
def test_a_shared_model_trains_the_same_in_both_styles_and_keeps_its_tie(computed):
    graph, graph_losses = train_graph(computed)
    functional, functional_losses = train_functional(computed)
    np.testing.assert_allclose(graph_losses, functional_losses, rtol=1e-5)
    assert graph_losses[-1] < graph_losses[0]
    for model in (graph, functional):
        first, second = model.shared()
        if computed:
            np.testing.assert_array_equal(second.kernel.value, first.embedding.value[:4])
            assert isinstance(second.kernel, Param)
        else:
            assert second.kernel is first.kernel  # the tied objects, as Equinox returns
        for ours, theirs in zip(
            jax.tree.leaves(graph.shared.pytree),
            jax.tree.leaves(model.shared.pytree),
            strict=True,
        ):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_tie_is_one_param_in_the_graph_view():
    model = LanguageModel(computed=False)
    params = pg.state(model, Param).flat_state()
    assert len(params) == 3  # the tied kernel once, and the two biases
    assert pg.find_duplicates(model) != []
    computed = LanguageModel(computed=True)
    # The node computed at each call is not held: a placeholder stands there.
    assert isinstance(computed.shared.pytree[1].kernel, SharedNode)
    assert len(pg.state(computed, Param).flat_state()) == 2  # embedding and bias


def test_shared_refuses_nodes_of_other_shapes_and_non_functions():
    pair = (Linear(4, 3, rngs=0), Linear(4, 4, rngs=1))
    with pytest.raises(ValueError, match="structure, shapes and dtypes"):
        Shared(pair, lambda p: p[1].kernel, lambda p: p[0].kernel)
    with pytest.raises(TypeError, match="must be functions of the pytree"):
        Shared(pair, "kernel", lambda p: p[0].kernel)


def test_several_nodes_tied_at_once():
    pair = (Linear(4, 4, rngs=0), Linear(4, 4, rngs=1))
    shared = Shared(pair, lambda p: (p[1].kernel, p[1].bias), lambda p: (p[0].kernel, p[0].bias))
    first, second = shared()
    assert second.kernel is first.kernel and second.bias is first.bias
