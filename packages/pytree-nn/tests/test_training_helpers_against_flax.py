"""`metrics`, `EMA`, `TrainState` and `ModelAndOptimizer` side by side with Flax NNX's.

Runs in the bench environment only (it has flax); elsewhere the module is skipped. The same
data (and the same weights, copied from the NNX model) go into both; the same numbers come
out.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
import pytree_nn as pnn
from pytree_graph import Param
from pytree_nn import metrics

nnx = pytest.importorskip("flax.nnx")

RNG = np.random.default_rng(0)
LOSSES = [RNG.normal(size=(4,)).astype(np.float32), RNG.normal(size=(2, 3)).astype(np.float32)]
LOGITS = [RNG.normal(size=(6, 4)).astype(np.float32) for _ in range(2)]
LABELS = [RNG.integers(0, 4, size=(6,)).astype(np.int32) for _ in range(2)]
MASK = np.array([1, 0, 1, 1, 0, 1], bool)


def close(ours, theirs, rtol=1e-6):
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=rtol, atol=1e-7)


def test_average():
    ours, theirs = metrics.Average("loss"), nnx.metrics.Average("loss")
    close(ours.compute(), theirs.compute())
    for batch in LOSSES:
        ours.update(loss=jnp.asarray(batch))
        theirs.update(loss=jnp.asarray(batch))
        close(ours.compute(), theirs.compute())
    ours.update(loss=2.5)
    theirs.update(loss=2.5)
    close(ours.compute(), theirs.compute())
    ours.update(loss=jnp.asarray(LOSSES[0]), mask=jnp.array([True, False, True, True]))
    theirs.update(loss=jnp.asarray(LOSSES[0]), mask=jnp.array([True, False, True, True]))
    close(ours.compute(), theirs.compute())
    assert int(ours.count.value) == int(theirs.count[...])
    ours.reset()
    theirs.reset()
    close(ours.compute(), theirs.compute())


def test_accuracy_multiclass_and_binary():
    ours, theirs = metrics.Accuracy(), nnx.metrics.Accuracy()
    for logits, labels in zip(LOGITS, LABELS, strict=True):
        ours.update(logits=jnp.asarray(logits), labels=jnp.asarray(labels))
        theirs.update(logits=jnp.asarray(logits), labels=jnp.asarray(labels))
        close(ours.compute(), theirs.compute())
    ours.update(logits=LOGITS[0], labels=LABELS[1], mask=jnp.asarray(MASK))
    theirs.update(
        logits=jnp.asarray(LOGITS[0]), labels=jnp.asarray(LABELS[1]), mask=jnp.asarray(MASK)
    )
    close(ours.compute(), theirs.compute())

    binary_logits = jnp.asarray(RNG.normal(size=(8,)).astype(np.float32))
    binary_labels = jnp.asarray(RNG.integers(0, 2, size=(8,)).astype(np.int32))
    ours, theirs = metrics.Accuracy(threshold=0.0), nnx.metrics.Accuracy(threshold=0.0)
    ours.update(logits=binary_logits, labels=binary_labels)
    theirs.update(logits=binary_logits, labels=binary_labels)
    close(ours.compute(), theirs.compute())


def test_accuracy_errors_where_nnx_raises_too():
    for accuracy in (metrics.Accuracy(), nnx.metrics.Accuracy()):
        with pytest.raises(ValueError):
            accuracy.update(logits=jnp.ones((4,)), labels=jnp.ones((4,), jnp.int32))
        with pytest.raises(ValueError):
            accuracy.update(logits=jnp.ones((4, 2)), labels=jnp.ones((4,), jnp.float32))
    for average in (metrics.Average("loss"), nnx.metrics.Average("loss")):
        with pytest.raises(TypeError, match="'loss'"):
            average.update(values=jnp.ones(2))


def test_welford():
    ours, theirs = metrics.Welford(), nnx.metrics.Welford()
    for batch in [*LOSSES, 1.5]:
        ours.update(values=batch if isinstance(batch, float) else jnp.asarray(batch))
        theirs.update(values=batch if isinstance(batch, float) else jnp.asarray(batch))
        mine, nnx_stats = ours.compute(), theirs.compute()
        close(mine.mean, nnx_stats.mean)
        close(mine.standard_deviation, nnx_stats.standard_deviation, rtol=1e-5)
        close(mine.standard_error_of_mean, nnx_stats.standard_error_of_mean, rtol=1e-5)


def test_multimetric_under_jit():
    ours = pnn.MultiMetric(accuracy=metrics.Accuracy(), loss=metrics.Average())
    theirs = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average())

    @pg.jit
    def our_step(metrics, logits, labels, values, mask):
        metrics.update(logits=logits, labels=labels, values=values, mask=mask)

    @nnx.jit
    def their_step(metrics, logits, labels, values, mask):
        metrics.update(logits=logits, labels=labels, values=values, mask=mask)

    for logits, labels in zip(LOGITS, LABELS, strict=True):
        values = jnp.asarray(RNG.normal(size=(6,)).astype(np.float32))
        mask = {"loss": jnp.asarray(MASK)}
        our_step(ours, jnp.asarray(logits), jnp.asarray(labels), values, mask)
        their_step(theirs, jnp.asarray(logits), jnp.asarray(labels), values, mask)
        mine, nnx_result = ours.compute(), theirs.compute()
        assert mine.keys() == nnx_result.keys()
        for name in mine:
            close(mine[name], nnx_result[name])


def copy_linear(theirs):
    ours = pnn.Linear(theirs.in_features, theirs.out_features, rngs=0)
    ours.kernel.value = jnp.asarray(theirs.kernel[...])
    ours.bias.value = jnp.asarray(theirs.bias[...])
    return ours


def test_ema_update_and_apply_to():
    their_model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    our_model = copy_linear(their_model)
    theirs, ours = nnx.EMA(their_model, decay=0.7), pnn.EMA(our_model, decay=0.7)
    their_view, our_view = theirs.apply_to(their_model), ours.apply_to(our_model)
    assert their_view.kernel is theirs.params["kernel"]
    assert our_view.kernel is ours.params["kernel"]
    x = jnp.asarray(RNG.normal(size=(5, 3)).astype(np.float32))
    their_tx = nnx.Optimizer(their_model, optax.sgd(0.2), wrt=nnx.Param)
    our_tx = pnn.Optimizer(our_model, optax.sgd(0.2))

    @nnx.jit
    def their_step(model, optimizer, ema):
        grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        ema.update(model)

    @pg.jit
    def our_step(model, optimizer, ema):
        grads = pg.grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        ema.update(model)

    for _ in range(3):
        their_step(their_model, their_tx, theirs)
        our_step(our_model, our_tx, ours)
        close(ours.params["kernel"].value, theirs.params["kernel"][...], rtol=1e-5)
        close(ours.params["bias"].value, theirs.params["bias"][...], rtol=1e-5)
        close(our_view(x), their_view(x), rtol=1e-5)


def test_train_state():
    their_model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    our_model = copy_linear(their_model)
    x = jnp.asarray(RNG.normal(size=(8, 3)).astype(np.float32))
    y = jnp.asarray(RNG.normal(size=(8, 1)).astype(np.float32))

    their_graphdef, their_params = nnx.split(their_model, nnx.Param)
    their_state = nnx.TrainState.create(their_graphdef, params=their_params, tx=optax.adam(0.1))
    our_graphdef, our_params = pg.split(our_model, Param)
    our_state = pnn.TrainState.create(our_graphdef, params=our_params, tx=optax.adam(0.1))

    def step(state):
        def loss_fn(params):
            prediction, _ = state.apply(params)(x)
            return jnp.mean((prediction - y) ** 2)

        return state.apply_gradients(jax.grad(loss_fn)(state.params))

    jitted = jax.jit(step)
    for _ in range(4):
        their_state, our_state = jitted(their_state), jitted(our_state)
    assert int(our_state.step) == int(their_state.step) == 4
    close(our_state.params["kernel"].value, their_state.params["kernel"][...], rtol=1e-5)
    close(our_state.params["bias"].value, their_state.params["bias"][...], rtol=1e-5)


def test_model_and_optimizer():
    their_model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    our_model = copy_linear(their_model)
    theirs = nnx.ModelAndOptimizer(their_model, optax.adam(0.05))
    ours = pnn.ModelAndOptimizer(our_model, optax.adam(0.05))
    assert theirs.model is their_model and ours.model is our_model
    x = jnp.asarray(RNG.normal(size=(5, 3)).astype(np.float32))

    @nnx.jit
    def their_step(optimizer):
        optimizer.update(nnx.grad(lambda m: jnp.mean(jnp.sin(m(x))))(optimizer.model))

    @pg.jit
    def our_step(optimizer):
        optimizer.update(pg.grad(lambda m: jnp.mean(jnp.sin(m(x))))(optimizer.model))

    for _ in range(3):
        their_step(theirs)
        our_step(ours)
    close(our_model.kernel.value, their_model.kernel[...], rtol=1e-5)
    close(our_model.bias.value, their_model.bias[...], rtol=1e-5)
    assert int(ours.step.value) == int(theirs.step[...]) == 3
