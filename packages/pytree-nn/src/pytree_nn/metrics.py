"""Metrics that accumulate over batches: `Average`, `Accuracy`, `Welford`, `MultiMetric`.

A metric holds its running totals in `MetricState` Variables and changes them in place:
`update(**batch)` adds a batch, `compute()` gives the value so far, `reset()` starts over.
Being Variables, the totals are written back by `pytree_graph.jit` when a metric is updated
inside a jitted step, as in Flax NNX (`nnx.metrics`), with the same names and numbers.

Examples:
    >>> import jax.numpy as jnp
    >>> from pytree_nn import metrics
    >>> loss = metrics.Average()
    >>> loss.update(values=jnp.array([1.0, 2.0, 3.0, 4.0]))
    >>> loss.update(values=jnp.array([3.0, 2.0, 1.0, 0.0]))
    >>> float(loss.compute())
    2.0
    >>> loss.reset()
    >>> bool(jnp.isnan(loss.compute()))
    True
"""

from typing import Any

import jax
import jax.numpy as jnp

import pytree_graph
from pytree_graph import Variable
from pytree_module import Module as PytreeModule

__all__ = ["Accuracy", "Average", "Metric", "MetricState", "MultiMetric", "Statistics", "Welford"]


class MetricState(Variable):
    """A Variable holding a running total of a `Metric`."""


class Metric(PytreeModule):
    """The base of metrics: subclasses define `update`, `compute` and `reset`.

    A metric holds its totals in `MetricState` Variables and changes them in place, so it
    can be passed to a `pytree_graph.jit` step and updated there (the new totals are
    written back to the caller's metric).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn.metrics import Metric, MetricState
        >>> class Maximum(Metric):
        ...     def __init__(self):
        ...         self.max = MetricState(jnp.array(-jnp.inf))
        ...     def update(self, *, values, **_):
        ...         self.max.value = jnp.maximum(self.max.value, jnp.max(values))
        ...     def compute(self):
        ...         return self.max.value
        ...     def reset(self):
        ...         self.max.value = jnp.array(-jnp.inf)
        >>> metric = Maximum()
        >>> metric.update(values=jnp.array([1.0, 5.0, 2.0]))
        >>> float(metric.compute())
        5.0
    """

    def update(self, **kwargs: Any) -> None:
        """Add a batch to the totals, in place."""
        raise NotImplementedError(f"{type(self).__name__} must define `update(**kwargs)`.")

    def compute(self) -> Any:
        """The value of the metric over the batches added since the last reset."""
        raise NotImplementedError(f"{type(self).__name__} must define `compute()`.")

    def reset(self) -> None:
        """Set the totals back to their starting values, in place."""
        raise NotImplementedError(f"{type(self).__name__} must define `reset()`.")

    def split(self, *filters: Any) -> tuple[Any, ...]:
        """`pytree_graph.split(self, *filters)`: the graph definition and State(s)."""
        return pytree_graph.split(self, *filters)


def _argument(metric: Metric, argname: str, kwargs: dict[str, Any]) -> Any:
    """The value `update` was given as `argname`, or a TypeError naming what it got."""
    if argname not in kwargs:
        given = ", ".join(f"{name}=" for name in kwargs) or "nothing"
        raise TypeError(
            f"{type(metric).__name__}.update expects the keyword argument '{argname}' (the "
            f"metric was built with argname={argname!r}), got {given}. Call "
            f"`update({argname}=...)`, or build the metric with the name you pass, e.g. "
            f"`{type(metric).__name__}('loss')` for `update(loss=...)`."
        )
    return kwargs[argname]


def _as_array(metric: Metric, argname: str, values: Any) -> jax.Array:
    try:
        return jnp.asarray(values)
    except TypeError:
        raise TypeError(
            f"{type(metric).__name__}.update: '{argname}' must be a number or an array, got "
            f"{type(values).__name__} {values!r:.80}."
        ) from None


def _mask_for(metric: Metric, argname: str, values: Any, mask: Any) -> jax.Array:
    """`mask` broadcast to the values' shape, as booleans (nonzero keeps a value)."""
    if isinstance(values, (int, float)):
        raise ValueError(
            f"{type(metric).__name__}.update: a mask needs '{argname}' as an array (one value "
            f"per mask entry), got the Python {type(values).__name__} {values!r}."
        )
    mask = jnp.asarray(mask)
    try:
        shape = jnp.broadcast_shapes(mask.shape, values.shape)
    except ValueError:
        shape = None
    if shape != values.shape:
        raise ValueError(
            f"{type(metric).__name__}.update: the mask of shape {mask.shape} does not "
            f"broadcast to the shape of '{argname}', {values.shape}."
        )
    return jnp.broadcast_to(mask.astype(bool), values.shape)


class Average(Metric):
    """The mean of all the values given to `update`, over every batch since the last reset.

    Arguments:
        argname: the keyword argument of `update` that holds the values (default
            `"values"`): `Average("loss")` is updated with `update(loss=...)`.

    Attributes:
        total: a `MetricState` holding the float32 sum of the values.
        count: a `MetricState` holding the int32 number of values.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn.metrics import Average
        >>> loss = Average("loss")
        >>> loss.update(loss=jnp.array([1.0, 2.0, 3.0, 4.0]))
        >>> loss.update(loss=10.0)  # a Python number counts as one value
        >>> float(loss.compute())
        4.0
        >>> loss.update(loss=jnp.array([4.0, 100.0]), mask=jnp.array([True, False]))
        >>> float(loss.compute()), int(loss.count.value)
        (4.0, 6)
    """

    def __init__(self, argname: str = "values"):
        if not isinstance(argname, str):
            raise TypeError(
                f"{type(self).__name__}: argname must be a string naming the keyword "
                f"argument of `update` (e.g. 'loss'), got {type(argname).__name__} {argname!r}."
            )
        self.argname = argname
        self.total = MetricState(jnp.array(0, dtype=jnp.float32))
        self.count = MetricState(jnp.array(0, dtype=jnp.int32))

    def reset(self) -> None:
        """Set the sum and the count back to zero."""
        self.total.value = jnp.zeros_like(self.total.value)
        self.count.value = jnp.zeros_like(self.count.value)

    def update(self, mask: Any = None, **kwargs: Any) -> None:
        """Add the values given as `kwargs[argname]` to the sum, and their number to the count.

        Arguments:
            mask: optional, broadcastable to the values' shape: only the values where it is
                true (nonzero) are added and counted.
            **kwargs: the values, under the name given to the constructor as `argname`
                (a Python number counts as one value, an array as its size); other keyword
                arguments are ignored, so a `MultiMetric` can pass every metric the same ones.

        Raises:
            TypeError: `kwargs` lacks `argname`, or the values are not numbers.
            ValueError: `mask` is given with a Python number, or does not broadcast to the
                values' shape.
        """
        values = _argument(self, self.argname, kwargs)
        total, count = self.total.value, self.count.value
        if isinstance(values, (int, float)) and mask is None:
            batch_total, batch_count = jnp.asarray(values, total.dtype), 1
        else:
            if not isinstance(values, (int, float)):
                values = _as_array(self, self.argname, values)
            if mask is None:
                batch_total, batch_count = jnp.sum(values, dtype=total.dtype), values.size
            else:
                keep = _mask_for(self, self.argname, values, mask)
                batch_total = jnp.sum(jnp.where(keep, values, 0), dtype=total.dtype)
                batch_count = jnp.sum(keep, dtype=count.dtype)
        self.total.value = total + batch_total
        self.count.value = count + jnp.asarray(batch_count, count.dtype)

    def compute(self) -> jax.Array:
        """The sum divided by the count (NaN before any value was added)."""
        return self.total.value / self.count.value


class Accuracy(Average):
    """The fraction of correct predictions, over every batch since the last reset.

    Without `threshold` (multi-class), a prediction is correct where the argmax of the
    logits over their last axis equals the integer label. With `threshold` (binary), it is
    correct where `logits >= threshold` agrees with `labels > 0`.

    Arguments:
        threshold: for binary classification, the logit from which a prediction is positive
            (e.g. `0.5` for probabilities, `0.0` for logits); `None` (the default) for
            multi-class classification.
        argname: as `Average`'s; `update` takes `logits` and `labels` instead.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn.metrics import Accuracy
        >>> accuracy = Accuracy()
        >>> logits = jnp.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
        >>> accuracy.update(logits=logits, labels=jnp.array([1, 1, 1]))
        >>> round(float(accuracy.compute()), 4)
        0.6667
        >>> binary = Accuracy(threshold=0.5)
        >>> binary.update(logits=jnp.array([0.9, 0.2, 0.6]), labels=jnp.array([1, 0, 0]))
        >>> round(float(binary.compute()), 4)
        0.6667
    """

    def __init__(self, threshold: float | None = None, argname: str = "values"):
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, (int, float))
        ):
            raise TypeError(
                f"Accuracy: threshold must be a float (the logit from which a binary "
                f"prediction is positive, e.g. 0.5) or None for multi-class accuracy, got "
                f"{type(threshold).__name__} {threshold!r}."
            )
        self.threshold = None if threshold is None else float(threshold)
        super().__init__(argname)

    def update(  # type: ignore[override]
        self, *, logits: Any = None, labels: Any = None, mask: Any = None, **_: Any
    ) -> None:
        """Add a batch of predictions.

        Arguments:
            logits: the predictions: shaped `labels.shape + (num_classes,)` for multi-class
                accuracy, `labels.shape` with a `threshold`.
            labels: the true classes, integers.
            mask: optional, broadcastable to `labels`' shape: only the predictions where it
                is true count.
            **_: other keyword arguments are ignored (a `MultiMetric` passes all of them).

        Raises:
            TypeError: `logits` or `labels` is missing.
            ValueError: the shapes do not match, or the labels are not integers.
        """
        if logits is None or labels is None:
            missing = " and ".join(
                n for n, v in (("logits", logits), ("labels", labels)) if v is None
            )
            raise TypeError(
                f"Accuracy.update expects the keyword arguments logits= and labels=; "
                f"{missing} missing. Call `accuracy.update(logits=..., labels=...)`."
            )
        logits, labels = jnp.asarray(logits), jnp.asarray(labels)
        if not (jnp.issubdtype(labels.dtype, jnp.integer) or labels.dtype == jnp.bool_):
            raise ValueError(
                f"Accuracy.update: labels must be integer class indices, got dtype "
                f"{labels.dtype}. For one-hot labels pass `labels.argmax(-1)`."
            )
        if self.threshold is not None:
            if logits.shape != labels.shape:
                raise ValueError(
                    f"Accuracy.update: with a threshold (binary accuracy), logits and labels "
                    f"must have the same shape, got logits {logits.shape} and labels "
                    f"{labels.shape}."
                )
            correct = (logits >= self.threshold) == (labels > 0)
        else:
            if logits.ndim != labels.ndim + 1 or logits.shape[:-1] != labels.shape:
                raise ValueError(
                    f"Accuracy.update: for multi-class accuracy, logits must be shaped "
                    f"labels.shape + (num_classes,), got logits {logits.shape} and labels "
                    f"{labels.shape}. For binary predictions (one logit each), build "
                    "`Accuracy(threshold=...)`."
                )
            correct = logits.argmax(axis=-1) == labels
        super().update(mask=mask, **{self.argname: correct})


class Statistics(PytreeModule, frozen=True):
    """What `Welford.compute` returns: the mean, its standard error and the standard deviation.

    A pytree, so it can be returned from a jitted function.

    Attributes:
        mean: the mean of the values.
        standard_error_of_mean: `standard_deviation / sqrt(count)`.
        standard_deviation: the population standard deviation (dividing by the count).
    """

    mean: jax.Array
    standard_error_of_mean: jax.Array
    standard_deviation: jax.Array


class Welford(Metric):
    """The running mean and standard deviation of the values, by Welford's algorithm.

    Each batch is merged into the running count, mean and sum of squared deviations (`m2`)
    by Chan et al.'s parallel form of Welford's update, which stays accurate where summing
    squares would cancel.

    Arguments:
        argname: the keyword argument of `update` that holds the values (default `"values"`).

    Attributes:
        count: a `MetricState`, the int32 number of values.
        mean: a `MetricState`, their float32 mean.
        m2: a `MetricState`, the float32 sum of their squared deviations from the mean.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn.metrics import Welford
        >>> stats = Welford()
        >>> stats.update(values=jnp.array([1.0, 2.0, 3.0, 4.0]))
        >>> stats.update(values=jnp.array([3.0, 2.0, 1.0, 0.0]))
        >>> result = stats.compute()
        >>> float(result.mean), round(float(result.standard_deviation), 4)
        (2.0, 1.2247)
    """

    def __init__(self, argname: str = "values"):
        if not isinstance(argname, str):
            raise TypeError(
                f"Welford: argname must be a string naming the keyword argument of `update` "
                f"(e.g. 'loss'), got {type(argname).__name__} {argname!r}."
            )
        self.argname = argname
        self.count = MetricState(jnp.array(0, dtype=jnp.int32))
        self.mean = MetricState(jnp.array(0, dtype=jnp.float32))
        self.m2 = MetricState(jnp.array(0, dtype=jnp.float32))

    def reset(self) -> None:
        """Set the count, mean and `m2` back to zero."""
        for variable in (self.count, self.mean, self.m2):
            variable.value = jnp.zeros_like(variable.value)

    def update(self, mask: Any = None, **kwargs: Any) -> None:
        """Merge the values given as `kwargs[argname]` into the running statistics.

        Arguments:
            mask: optional, broadcastable to the values' shape: only the values where it is
                true (nonzero) count.
            **kwargs: the values under `argname` (a Python number counts as one value);
                other keyword arguments are ignored.

        Raises:
            TypeError: `kwargs` lacks `argname`, or the values are not numbers.
            ValueError: the mask does not broadcast to the values' shape.
        """
        values = _argument(self, self.argname, kwargs)
        dtype = self.mean.value.dtype
        if isinstance(values, (int, float)) and mask is None:
            batch_count, batch_mean, batch_m2 = 1, jnp.asarray(values, dtype), 0.0
        else:
            if not isinstance(values, (int, float)):
                values = _as_array(self, self.argname, values)
            if mask is None:
                batch_count = values.size
                batch_mean = values.mean()
                batch_m2 = values.var() * batch_count
            else:
                keep = _mask_for(self, self.argname, values, mask)
                batch_count = jnp.sum(keep, dtype=self.count.value.dtype)
                # An all-false mask adds nothing; dividing by 1 keeps its mean finite (zero).
                batch_mean = jnp.sum(jnp.where(keep, values, 0), dtype=dtype) / jnp.maximum(
                    batch_count, 1
                )
                batch_m2 = jnp.sum(jnp.where(keep, (values - batch_mean) ** 2, 0), dtype=dtype)
        old_count = self.count.value
        count = old_count + jnp.asarray(batch_count, old_count.dtype)
        delta = batch_mean - self.mean.value
        # With nothing counted yet and an empty batch, keep the mean at zero, not 0/0.
        safe_count = jnp.maximum(count, 1)
        self.count.value = count
        self.mean.value = (self.mean.value + delta * batch_count / safe_count).astype(dtype)
        self.m2.value = (
            self.m2.value + (batch_m2 + delta * delta * batch_count * old_count / safe_count)
        ).astype(dtype)

    def compute(self) -> Statistics:
        """The mean, the standard error of the mean and the standard deviation, as
        `Statistics` (NaN spreads before any value was added, the mean is then zero)."""
        variance = self.m2.value / self.count.value
        standard_deviation = variance**0.5
        return Statistics(
            mean=self.mean.value,
            standard_error_of_mean=standard_deviation / (self.count.value**0.5),
            standard_deviation=standard_deviation,
        )


class MultiMetric(Metric):
    """Several metrics updated together: `update(**batch)` passes every keyword to each.

    Arguments:
        **metrics: the metrics by name; each is an attribute of the `MultiMetric`, and a key
            of what `compute` returns.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn.metrics import Accuracy, Average, MultiMetric
        >>> metrics = MultiMetric(accuracy=Accuracy(), loss=Average())
        >>> logits = jnp.array([[0.1, 0.9], [0.8, 0.2]])
        >>> metrics.update(logits=logits, labels=jnp.array([1, 1]), values=jnp.array([0.5, 1.5]))
        >>> {name: float(value) for name, value in metrics.compute().items()}
        {'accuracy': 0.5, 'loss': 1.0}
    """

    def __init__(self, **metrics: Metric):
        for name, metric in metrics.items():
            if name.startswith("_") or hasattr(MultiMetric, name):
                raise ValueError(
                    f"MultiMetric: a metric cannot be named '{name}', which is "
                    + ("private" if name.startswith("_") else "a method of MultiMetric")
                    + ". Choose another name, e.g. 'val_"
                    + name.lstrip("_")
                    + "'."
                )
            if not isinstance(metric, Metric):
                raise TypeError(
                    f"MultiMetric: '{name}' must be a Metric (e.g. `Average()`), got "
                    f"{type(metric).__name__} {metric!r:.80}."
                )
        self._metric_names = tuple(metrics)
        for name, metric in metrics.items():
            setattr(self, name, metric)

    def reset(self) -> None:
        """Reset every metric."""
        for name in self._metric_names:
            getattr(self, name).reset()

    def update(self, **updates: Any) -> None:
        """Update every metric with all of `updates`.

        Arguments:
            **updates: passed to each metric's `update`; each takes the names it needs.
                `mask=` is passed to every metric, or, as a dict `{metric name: mask}`, to
                the metrics it names.
        """
        mask = updates.pop("mask", None)
        for name in self._metric_names:
            metric_mask = mask.get(name) if isinstance(mask, dict) else mask
            extra = {} if metric_mask is None else {"mask": metric_mask}
            getattr(self, name).update(**updates, **extra)

    def compute(self) -> dict[str, Any]:
        """A dict of each metric's `compute()`, by name."""
        return {name: getattr(self, name).compute() for name in self._metric_names}
