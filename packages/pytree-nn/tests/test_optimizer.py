import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_filter import PathContains, is_inexact_array
from pytree_filter import filter as filter_tree
from pytree_graph import BatchStat, Param
from pytree_module import Dict
from pytree_nn import MLP, Linear, Module, Optimizer, OptState
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad


def regression_data(n=64):
    """A small linear regression problem: y = x @ w + b."""
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (n, 3))
    w = jax.random.normal(kw, (3, 1))
    return x, x @ w + 0.5


def mse(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def reference_adam(kernel, bias, x, y, steps, learning_rate):
    """The same training written directly with jax.grad and optax on a dict of arrays."""
    params = {"bias": bias, "kernel": kernel}
    tx = optax.adam(learning_rate)
    opt_state = tx.init(params)

    def loss(p):
        return jnp.mean((x @ p["kernel"] + p["bias"] - y) ** 2)

    for _ in range(steps):
        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params


@pg.jit
def train_step(model, optimizer, x, y):
    loss, grads = pg.value_and_grad(mse)(model, x, y)
    optimizer.update(model, grads)
    return loss


def test_nnx_style_converges_under_graph_jit():
    x, y = regression_data()
    model = MLP(3, 1, width_size=16, depth=1, rngs=0)
    kernel = model.layers[0].kernel  # the Variables are updated in place
    optimizer = Optimizer(model, optax.adam(0.02))
    assert optimizer.model is model
    first = float(train_step(model, optimizer, x, y))
    for _ in range(300):
        loss = train_step(model, optimizer, x, y)
    assert float(loss) < 1e-3 * first
    assert model.layers[0].kernel is kernel
    assert int(optimizer.step.value) == 301
    assert optimizer.step.value.dtype == jnp.uint32


def test_functional_optax_style_converges():
    x, y = regression_data()
    model = MLP(3, 1, width_size=16, depth=1, rngs=0)
    tx = optax.adam(0.02)
    # A model holding Variables is a pytree: the Variables' values are its leaves.
    opt_state = tx.init(filter_tree(model, is_inexact_array))

    @filter_jit
    def step(model, opt_state, x, y):
        loss, grads = filter_value_and_grad(mse)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, filter_tree(model, is_inexact_array))
        return apply_updates(model, updates), opt_state, loss

    model, opt_state, first = step(model, opt_state, x, y)
    for _ in range(300):
        model, opt_state, loss = step(model, opt_state, x, y)
    assert float(loss) < 1e-3 * float(first)
    assert isinstance(model.layers[0].kernel, Param)


def test_both_styles_give_the_same_parameters():
    x, y = regression_data()
    tx = optax.adam(0.05)
    model = MLP(3, 1, width_size=16, depth=1, rngs=1)
    functional = pg.clone(model)
    optimizer = Optimizer(model, tx)
    opt_state = tx.init(filter_tree(functional, is_inexact_array))

    @filter_jit
    def functional_step(model, opt_state, x, y):
        grads = jax.grad(mse)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, model)
        return apply_updates(model, updates), opt_state

    for _ in range(5):
        train_step(model, optimizer, x, y)
        functional, opt_state = functional_step(functional, opt_state, x, y)
    for ours, theirs in zip(jax.tree.leaves(model), jax.tree.leaves(functional), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_update_matches_a_hand_written_optax_loop(jitted):
    x, y = regression_data(16)
    model = Linear(3, 1, rngs=2)
    expected = reference_adam(model.kernel.value, model.bias.value, x, y, 3, 0.1)
    optimizer = Optimizer(model, optax.adam(0.1))

    def step(model, optimizer, x, y):
        grads = pg.grad(mse)(model, x, y)
        optimizer.update(model, grads)

    step = pg.jit(step) if jitted else step
    for _ in range(3):
        step(model, optimizer, x, y)
    np.testing.assert_allclose(model.kernel.value, expected["kernel"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bias.value, expected["bias"], rtol=1e-5, atol=1e-6)
    assert int(optimizer.step.value) == 3


def test_model_reached_through_the_optimizer_under_jit():
    x, y = regression_data(16)
    model = Linear(3, 1, rngs=0)
    optimizer = Optimizer(model, optax.sgd(0.1))

    @pg.jit
    def step(optimizer, x, y):
        grads = pg.grad(mse)(optimizer.model, x, y)
        optimizer.update(optimizer.model, grads)

    before = model.kernel.value
    step(optimizer, x, y)
    assert not np.allclose(model.kernel.value, before)


def test_opt_state_is_held_in_opt_state_variables_by_path():
    model = Linear(3, 2, rngs=0)
    optimizer = Optimizer(model, optax.adam(1e-3))
    mu = optimizer.opt_state[0]["mu"]["kernel"]
    assert isinstance(mu, OptState) and mu.value.shape == (3, 2)
    paths = set(pg.state(optimizer).flat_state())
    assert {("opt_state", 0, "count"), ("opt_state", 0, "nu", "bias"), ("step",)} <= paths
    assert ("model", "kernel") in paths
    # Only Modules, dicts and Variables: the graph transforms can cache its walk.
    assert all(isinstance(v, OptState) for v in pg.state(optimizer, OptState).flat_state().values())
    # `Dict`s, whose changes bump the mutation count: a cached call need not compare them.
    assert type(optimizer.opt_state) is Dict and type(optimizer.opt_state[0]["mu"]) is Dict


def test_bound_to_jit_partial_the_optimizer_sees_every_change_made_outside():
    x, y = regression_data()

    def step(model, optimizer, x, y):
        loss, grads = pg.value_and_grad(mse)(model, x, y)
        optimizer.update(model, grads)
        return loss

    models = [Linear(3, 1, rngs=0) for _ in range(2)]
    optimizers = [Optimizer(m, optax.adam(0.05)) for m in models]
    ours = pg.jit_partial(step, models[0], optimizers[0])
    reference = pg.jit(step)

    def both(change):
        for model, optimizer in zip(models, optimizers, strict=True):
            change(model, optimizer)

    def run(n):
        for _ in range(n):
            assert jnp.allclose(ours(x, y), reference(models[1], optimizers[1], x, y))

    run(3)
    # An eager update (values written outside), then a moment replaced in its Dict.
    grads = pg.grad(mse)(models[0], x, y)
    both(lambda m, o: o.update(m, grads))
    run(2)
    both(lambda m, o: o.opt_state[0]["mu"].__setitem__("kernel", OptState(jnp.ones((3, 1)))))
    run(2)
    ours_state, theirs = (pg.state(o).flat_state() for o in optimizers)
    assert ours_state.keys() == theirs.keys()
    for path, variable in ours_state.items():
        assert jnp.allclose(variable.value, theirs[path].value), path


def test_opt_state_variables_carry_their_parameters_metadata():
    class Sharded(Module):
        def __init__(self):
            self.w = Param(jnp.ones((4, 2)), sharding=(None, "model"))

        def __call__(self, x):
            return x @ self.w.value

    optimizer = Optimizer(Sharded(), optax.adam(1e-3))
    assert optimizer.opt_state[0]["mu"]["w"].sharding == (None, "model")
    assert optimizer.opt_state[0]["nu"]["w"].sharding == (None, "model")
    assert dict(optimizer.opt_state[0]["count"].metadata) == {}


def test_shared_parameters_stay_shared():
    class Tied(Module):
        def __init__(self):
            self.encoder = Param(jnp.ones((3, 3)))
            self.decoder = self.encoder

        def __call__(self, x):
            return x @ self.encoder.value @ self.decoder.value

    x, y = regression_data(8)
    y = jnp.tile(y, (1, 3))
    model = Tied()
    optimizer = Optimizer(model, optax.adam(0.01))
    assert list(pg.state(model).flat_state()) == [("decoder",)]
    losses = [float(train_step(model, optimizer, x, y)) for _ in range(30)]
    assert model.encoder is model.decoder
    assert losses[-1] < losses[0]


def test_wrt_selects_what_is_trained():
    class Frozen(Param):
        pass

    class TwoPart(Module):
        def __init__(self):
            self.trained = Param(jnp.ones(2))
            self.frozen = Frozen(jnp.ones(2))

        def __call__(self, x):
            return x * self.trained.value * self.frozen.value

    model = TwoPart()
    optimizer = Optimizer(model, optax.sgd(0.1), wrt=pg.Variable)
    assert set(pg.state(optimizer, OptState).flat_state()) == {("step",)}  # sgd: no state
    only_trained = Optimizer(model, optax.sgd(0.1), wrt=PathContains("trained"))

    @pg.jit
    def step(model, optimizer):
        grads = pg.grad(lambda m: jnp.sum(m(jnp.ones(2))), wrt=optimizer.wrt)(model)
        optimizer.update(model, grads)

    step(model, only_trained)
    np.testing.assert_allclose(model.trained.value, [0.9, 0.9])
    np.testing.assert_allclose(model.frozen.value, [1.0, 1.0])


def test_extra_arguments_reach_the_transformation():
    x, y = regression_data(16)
    model = Linear(3, 1, rngs=0)
    tx = optax.chain(optax.adam(0.1), optax.contrib.reduce_on_plateau(patience=2, factor=0.5))
    optimizer = Optimizer(model, tx)

    @pg.jit
    def step(model, optimizer, x, y):
        loss, grads = pg.value_and_grad(mse)(model, x, y)
        optimizer.update(model, grads, value=loss)
        return loss

    losses = [float(step(model, optimizer, x, y)) for _ in range(100)]
    assert losses[-1] < 1e-2 * losses[0]
    assert "scale" in optimizer.opt_state[1]


def test_line_search_with_value_grad_and_value_fn():
    x, y = regression_data(32)
    model = Linear(3, 1, rngs=0)
    graphdef, _, rest = pg.split(model, Param, ...)
    tx = optax.chain(optax.sgd(1.0), optax.scale_by_backtracking_linesearch(15))
    optimizer = Optimizer(model, tx)

    def value_fn(params):  # params: a State of the parameters' values
        return mse(pg.merge(graphdef, params, rest), x, y)

    @pg.jit
    def step(model, optimizer, x, y):
        loss, grads = pg.value_and_grad(mse)(model, x, y)
        optimizer.update(model, grads, value=loss, grad=grads, value_fn=value_fn)
        return loss

    losses = [float(step(model, optimizer, x, y)) for _ in range(30)]
    assert losses[-1] < 1e-3 * losses[0]


def test_hyperparameters_can_be_changed_in_the_state():
    model = Linear(3, 1, rngs=0)
    optimizer = Optimizer(model, optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))
    optimizer.opt_state["hyperparams"]["learning_rate"].value = jnp.asarray(0.0)
    x, y = regression_data(8)
    before = model.kernel.value
    train_step(model, optimizer, x, y)
    np.testing.assert_array_equal(model.kernel.value, before)


def test_constructor_errors():
    model = Linear(3, 1, rngs=0)
    with pytest.raises(TypeError, match="tx must be an optax GradientTransformation"):
        Optimizer(model, "adam")
    with pytest.raises(ValueError, match="nothing in the Linear matches wrt"):
        Optimizer(model, optax.sgd(0.1), wrt=BatchStat)

    class Counter(Module):
        def __init__(self):
            self.n = Param(jnp.arange(3))

    with pytest.raises(TypeError, match=r"Param at \.n .* floating-point array"):
        Optimizer(Counter(), optax.sgd(0.1))


def snapshot(*nodes):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nodes)]


def assert_unchanged(before, *nodes):
    for old, new in zip(before, snapshot(*nodes), strict=True):
        np.testing.assert_array_equal(old, new)


def test_update_errors_change_nothing():
    x, y = regression_data(8)
    model = Linear(3, 1, rngs=0)
    optimizer = Optimizer(model, optax.adam(0.1))
    grads = pg.grad(mse)(model, x, y)
    before = snapshot(model, optimizer)

    with pytest.raises(ValueError, match="not the model this Optimizer was built with"):
        optimizer.update(Linear(3, 1, rngs=0), grads)
    missing = pg.State.from_flat_path({("kernel",): grads["kernel"]})
    with pytest.raises(ValueError, match=r"No gradient for: \.bias"):
        optimizer.update(model, missing)
    extra = pg.State.merge(grads, pg.State({"scale": Param(jnp.ones(1))}))
    with pytest.raises(ValueError, match=r"Gradients for what is not optimized: \.scale"):
        optimizer.update(model, extra)
    wrong = pg.State({"kernel": grads["kernel"], "bias": Param(jnp.ones(3))})
    with pytest.raises(ValueError, match=r"gradient at \.bias has shape \(3,\).*\(1,\)"):
        optimizer.update(model, wrong)
    with pytest.raises(TypeError, match="expects the gradients as a State"):
        optimizer.update(model, [grads])
    assert_unchanged(before, model, optimizer)


def test_a_changed_model_is_refused():
    x, y = regression_data(8)
    model = Linear(3, 1, rngs=0)
    optimizer = Optimizer(model, optax.adam(0.1))
    model.scale = Param(jnp.ones(1))
    grads = pg.grad(mse)(model, x, y)
    with pytest.raises(ValueError, match=r"not those the Optimizer was built with\. New: \.scale"):
        optimizer.update(model, grads)


def test_update_accepts_plain_nested_dicts_of_gradients():
    x, y = regression_data(8)
    model = Linear(3, 1, rngs=0)
    optimizer = Optimizer(model, optax.sgd(1.0))
    grads = pg.grad(mse)(model, x, y)
    expected = model.kernel.value - grads["kernel"].value
    optimizer.update(model, grads.to_pure_dict())
    np.testing.assert_allclose(model.kernel.value, expected)


def test_a_weight_replaced_with_tree_at_is_still_trained():
    from pytree_module import tree_at

    class Tied(Module):
        def __init__(self):
            self.enc = Linear(2, 2, rngs=0)
            self.dec_kernel = self.enc.kernel

        def __call__(self, x):
            return (x @ self.enc.kernel) @ self.dec_kernel.value.T

    model = tree_at(lambda m: m.dec_kernel, Tied(), jnp.eye(2))
    assert model.dec_kernel is model.enc.kernel
    optimizer = Optimizer(model, optax.sgd(0.1), wrt=Param)
    grads = pg.grad(lambda m: jnp.sum(m(jnp.ones((1, 2)))))(model)
    optimizer.update(model, grads)
    assert not np.allclose(model.enc.kernel.value, np.eye(2))
    assert model.dec_kernel is model.enc.kernel


def test_an_optimizer_step_is_seen_by_the_next_jitted_forward_call():
    # A graph `jit` called again with the same model reuses the values it read while no
    # value was written: the optimizer's writes must count as writes.
    class Scale(Module):
        def __init__(self):
            self.w = Param(jnp.array(2.0))

    model = Scale()
    optimizer = Optimizer(model, optax.sgd(1.0))
    forward = pg.jit(lambda m, x: m.w.value * x)

    @pg.jit
    def step(model, optimizer):
        optimizer.update(model, pg.grad(lambda m: m.w.value * 3.0)(model))

    assert float(forward(model, jnp.array(1.0))) == 2.0
    step(model, optimizer)
    assert float(forward(model, jnp.array(1.0))) == -1.0
    optimizer.update(model, pg.grad(lambda m: m.w.value * 3.0)(model))  # eager, too
    assert float(forward(model, jnp.array(1.0))) == -4.0
