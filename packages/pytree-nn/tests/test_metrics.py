import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
import pytree_nn
from pytree_nn import Linear, Module, Optimizer, metrics
from pytree_nn.metrics import (
    Accuracy,
    Average,
    Metric,
    MetricState,
    MultiMetric,
    Statistics,
    Welford,
)

BATCHES = [
    np.array([1.0, 2.0, 3.0, 4.0], np.float32),
    np.array([3.0, 2.0, 1.0, 0.0], np.float32),
    np.array([[0.5, -1.5, 7.25], [2.0, 2.0, 9.0]], np.float32),
]


def test_names_and_layout():
    # As in NNX: the submodule, with Metric and MultiMetric also at the top level.
    assert pytree_nn.metrics is metrics
    assert pytree_nn.Metric is Metric and pytree_nn.MultiMetric is MultiMetric
    assert issubclass(MetricState, pg.Variable)
    average = Average()
    assert isinstance(average.total, MetricState) and isinstance(average.count, MetricState)
    assert average.total.value.dtype == jnp.float32 and average.count.value.dtype == jnp.int32


def test_average_matches_numpy():
    average = Average()
    assert np.isnan(average.compute())
    seen = []
    for batch in BATCHES:
        average.update(values=jnp.asarray(batch))
        seen.extend(batch.ravel())
        np.testing.assert_allclose(average.compute(), np.mean(seen), rtol=1e-6)
    assert int(average.count.value) == len(seen)
    average.update(values=5)  # a Python number counts once
    seen.append(5)
    np.testing.assert_allclose(average.compute(), np.mean(seen), rtol=1e-6)
    average.reset()
    assert np.isnan(average.compute()) and int(average.count.value) == 0


def test_average_argname_numpy_input_and_mask():
    average = Average("loss")
    average.update(loss=BATCHES[0], values=jnp.full(4, 100.0))  # other names ignored
    values = np.array([[1.0, np.nan], [3.0, 4.0]], np.float32)
    mask = np.array([[True, False], [False, True]])
    average.update(loss=jnp.asarray(values), mask=jnp.asarray(mask))
    expected = np.concatenate([BATCHES[0], values[mask]])
    np.testing.assert_allclose(average.compute(), expected.mean(), rtol=1e-6)
    assert int(average.count.value) == 6  # a NaN that is masked out does not spread

    # A mask that broadcasts counts every value it keeps.
    broadcast = Average()
    broadcast.update(values=jnp.arange(6.0).reshape(2, 3), mask=jnp.array([[True], [False]]))
    assert int(broadcast.count.value) == 3 and float(broadcast.compute()) == 1.0


def test_average_errors():
    average = Average("loss")
    with pytest.raises(TypeError, match=r"keyword argument 'loss'.*got values="):
        average.update(values=jnp.ones(3))
    with pytest.raises(ValueError, match="mask needs 'loss' as an array"):
        average.update(loss=1.0, mask=jnp.ones(1, bool))
    with pytest.raises(ValueError, match=r"mask of shape \(3,\) does not broadcast.*\(2,\)"):
        average.update(loss=jnp.ones(2), mask=jnp.ones(3, bool))
    with pytest.raises(TypeError, match="'loss' must be a number or an array"):
        average.update(loss="high")
    with pytest.raises(TypeError, match="argname must be a string"):
        Average(3)
    assert int(average.count.value) == 0  # nothing changed by the failed updates


def test_accuracy_multiclass_matches_numpy():
    rng = np.random.default_rng(0)
    accuracy = Accuracy()
    correct = []
    for _ in range(3):
        logits = rng.normal(size=(4, 5, 3)).astype(np.float32)
        labels = rng.integers(0, 3, size=(4, 5))
        accuracy.update(logits=jnp.asarray(logits), labels=jnp.asarray(labels))
        correct.extend((logits.argmax(-1) == labels).ravel())
        np.testing.assert_allclose(accuracy.compute(), np.mean(correct), rtol=1e-6)
    mask = rng.integers(0, 2, size=(4, 5)).astype(bool)
    accuracy.update(logits=jnp.asarray(logits), labels=jnp.asarray(labels), mask=mask)
    correct.extend((logits.argmax(-1) == labels)[mask])
    np.testing.assert_allclose(accuracy.compute(), np.mean(correct), rtol=1e-6)
    accuracy.reset()
    assert np.isnan(accuracy.compute())


def test_accuracy_binary_threshold():
    logits = np.array([0.1, 0.5, 0.49, 0.9, -2.0], np.float32)
    labels = np.array([0, 1, 1, 0, 0])
    expected = np.mean((logits >= 0.5) == (labels > 0))
    accuracy = Accuracy(threshold=0.5)
    accuracy.update(logits=jnp.asarray(logits), labels=jnp.asarray(labels))
    np.testing.assert_allclose(accuracy.compute(), expected)
    assert float(accuracy.compute()) == pytest.approx(0.6)
    zero = Accuracy(threshold=0)  # an int threshold is a float threshold
    zero.update(logits=jnp.asarray(logits), labels=jnp.asarray(labels))
    assert float(zero.compute()) == pytest.approx(np.mean((logits >= 0) == (labels > 0)))


def test_accuracy_errors():
    accuracy = Accuracy()
    with pytest.raises(ValueError, match=r"labels.shape \+ \(num_classes,\).*\(4, 3\).*\(5,\)"):
        accuracy.update(logits=jnp.ones((4, 3)), labels=jnp.ones(5, int))
    with pytest.raises(
        ValueError, match=r"got logits \(4,\) and labels \(4,\).*Accuracy\(threshold=...\)"
    ):
        accuracy.update(logits=jnp.ones(4), labels=jnp.ones(4, int))
    with pytest.raises(ValueError, match=r"integer class indices.*float32.*argmax"):
        accuracy.update(logits=jnp.ones((4, 3)), labels=jnp.ones((4, 3)))
    with pytest.raises(TypeError, match="labels missing"):
        accuracy.update(logits=jnp.ones((4, 3)))
    binary = Accuracy(threshold=0.5)
    with pytest.raises(ValueError, match=r"same shape.*\(4, 2\).*\(4,\)"):
        binary.update(logits=jnp.ones((4, 2)), labels=jnp.ones(4, int))
    with pytest.raises(TypeError, match="threshold must be a float"):
        Accuracy(threshold="0.5")
    with pytest.raises(TypeError, match="threshold must be a float"):
        Accuracy(threshold=True)
    assert int(accuracy.count.value) == 0 and int(binary.count.value) == 0


def numpy_statistics(values):
    values = np.asarray(values, np.float64)
    std = values.std()
    return values.mean(), std / np.sqrt(values.size), std


def test_welford_matches_numpy():
    welford = Welford()
    empty = welford.compute()
    assert isinstance(empty, Statistics)
    assert float(empty.mean) == 0.0 and np.isnan(empty.standard_deviation)
    seen = []
    for batch in [*BATCHES, 2.5]:
        welford.update(values=batch if isinstance(batch, float) else jnp.asarray(batch))
        seen.extend(np.ravel(batch))
        result = welford.compute()
        mean, sem, std = numpy_statistics(seen)
        np.testing.assert_allclose(result.mean, mean, rtol=1e-6)
        np.testing.assert_allclose(result.standard_error_of_mean, sem, rtol=1e-5)
        np.testing.assert_allclose(result.standard_deviation, std, rtol=1e-5)
    welford.reset()
    assert int(welford.count.value) == 0 and float(welford.m2.value) == 0.0


def test_welford_is_accurate_far_from_zero():
    # Summing squares in float32 would lose everything here; Welford's update does not.
    welford = Welford()
    batches = [1e4 + np.array([0.0, 1.0, 2.0], np.float32), 1e4 + np.array([3.0, 4.0], np.float32)]
    for batch in batches:
        welford.update(values=jnp.asarray(batch))
    np.testing.assert_allclose(welford.compute().standard_deviation, np.sqrt(2.0), rtol=1e-4)


def test_welford_mask():
    welford = Welford("x")
    values = np.array([[1.0, 50.0], [3.0, 4.0]], np.float32)
    mask = np.array([[True, False], [True, True]])
    welford.update(x=jnp.asarray(values), mask=jnp.asarray(mask))
    welford.update(x=jnp.asarray(values), mask=jnp.zeros_like(mask))  # adds nothing
    welford.update(x=jnp.asarray([7.0]))
    mean, sem, std = numpy_statistics([*values[mask], 7.0])
    result = welford.compute()
    np.testing.assert_allclose(result.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(result.standard_deviation, std, rtol=1e-5)
    np.testing.assert_allclose(result.standard_error_of_mean, sem, rtol=1e-5)
    with pytest.raises(TypeError, match="keyword argument 'x'"):
        welford.update(values=jnp.ones(2))


def test_multimetric():
    multi = MultiMetric(accuracy=Accuracy(), loss=Average(), spread=Welford("loss_values"))
    assert set(multi.compute()) == {"accuracy", "loss", "spread"}
    logits = jnp.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    labels = jnp.array([1, 1, 1])
    losses = jnp.array([0.5, 1.5, 4.0])
    multi.update(logits=logits, labels=labels, values=losses, loss_values=losses)
    result = multi.compute()
    assert float(result["accuracy"]) == pytest.approx(2 / 3)
    assert float(result["loss"]) == pytest.approx(2.0)
    assert float(result["spread"].mean) == pytest.approx(2.0)
    assert multi.accuracy.compute() == result["accuracy"]
    # A dict mask reaches only the metrics it names.
    multi.update(
        logits=logits,
        labels=labels,
        values=losses,
        loss_values=losses,
        mask={"loss": jnp.array([True, False, False])},
    )
    assert int(multi.loss.count.value) == 4 and int(multi.accuracy.count.value) == 6
    multi.reset()
    assert all(np.isnan(v) for v in (multi.compute()["accuracy"], multi.compute()["loss"]))


def test_multimetric_errors():
    with pytest.raises(ValueError, match="cannot be named 'update'"):
        MultiMetric(update=Average())
    with pytest.raises(ValueError, match="cannot be named '_total'"):
        MultiMetric(_total=Average())
    with pytest.raises(TypeError, match="'loss' must be a Metric"):
        MultiMetric(loss=jnp.zeros(()))
    multi = MultiMetric(loss=Average())
    with pytest.raises(TypeError, match="keyword argument 'values'"):
        multi.update(loss=jnp.ones(2))


def test_base_metric_says_what_to_define():
    class Incomplete(Metric):
        def __init__(self):
            self.x = MetricState(jnp.zeros(()))

    with pytest.raises(NotImplementedError, match="Incomplete must define `update"):
        Incomplete().update(values=1)
    _, state = Incomplete().split()
    assert list(state.flat_state()) == [("x",)]


class Classifier(Module):
    def __init__(self, rngs):
        self.shared = Linear(4, 4, rngs=rngs)
        self.head = Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        # The same layer used twice: a tied model.
        return self.head(jax.nn.relu(self.shared(jax.nn.relu(self.shared(x)))))


def test_metrics_under_graph_jit_are_written_back():
    model = Classifier(pytree_nn.Rngs(0))
    optimizer = Optimizer(model, optax.sgd(0.1))
    multi = MultiMetric(accuracy=Accuracy(), loss=Average())
    x = jax.random.normal(jax.random.key(1), (8, 4))
    labels = jnp.arange(8) % 3

    def loss_fn(model):
        logits = model(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), logits

    @pg.jit
    def step(model, optimizer, metrics):
        (loss, logits), grads = pg.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        metrics.update(values=loss, logits=logits, labels=labels)

    losses, correct = [], []
    for _ in range(3):
        loss, logits = loss_fn(model)
        losses.append(float(loss))
        correct.extend(np.asarray(logits.argmax(-1) == labels))
        step(model, optimizer, multi)
    result = multi.compute()
    np.testing.assert_allclose(result["loss"], np.mean(losses), rtol=1e-5)
    np.testing.assert_allclose(result["accuracy"], np.mean(correct), rtol=1e-6)
    assert int(multi.loss.count.value) == 3 and int(multi.accuracy.count.value) == 24

    @pg.jit
    def reset(metrics):
        metrics.reset()

    reset(multi)
    assert int(multi.accuracy.count.value) == 0

    welford = Welford()

    @pg.jit
    def observe(welford, values):
        welford.update(values=values)
        return welford.compute()

    for batch in BATCHES:
        out = observe(welford, jnp.asarray(batch))
    assert isinstance(out, Statistics)
    mean, _, std = numpy_statistics(np.concatenate([b.ravel() for b in BATCHES]))
    np.testing.assert_allclose(out.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(welford.compute().standard_deviation, std, rtol=1e-5)
