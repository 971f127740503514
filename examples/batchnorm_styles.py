"""Train a model with BatchNorm in both training styles, and check that they agree.

BatchNorm is stateful: in training mode each call normalizes with the batch's statistics
and folds them, in place, into running averages (BatchStat Variables) that evaluation mode
uses instead. This example trains ``Linear -> BatchNorm -> relu -> Linear`` on
scikit-learn's bundled handwritten digits (8x8 pixels as 64 features; nothing is
downloaded) twice, from the same initial weights and with the same minibatches in the same
order:

- the **graph style**: an ``Optimizer`` and a step under ``pytree_graph.jit``, which writes
  the new running statistics back into the model by itself;
- the **functional style**: a step under ``filter_jit`` whose loss function returns the
  model as auxiliary output (``filter_value_and_grad(..., has_aux=True)``), so that the
  model whose statistics moved is the one optax's updates are applied to.

It prints the evidence: the two runs give the same loss at every step and the same final
parameters and running statistics; the statistics moved away from their initial values
(mean 0, variance 1); evaluation mode (``model.eval()``) uses them, so one image at a time
gets its own prediction, where training mode would normalize it by its own statistics.
It also tries the functional style *without* returning the model from the loss function:
the losses would be the same, but the running statistics would never leave their initial
values; `filter_value_and_grad` refuses it with an error naming the lost statistics.

Run it from the repository root::

    hatch run python examples/batchnorm_styles.py
    hatch run python examples/batchnorm_styles.py --style graph --epochs 2 --seed 1

or ``python examples/batchnorm_styles.py --help`` in an environment with the five packages
and scikit-learn installed. The last line printed is the test accuracy in evaluation mode.
"""

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import pytree_graph as pg
from pytree_filter import filter, is_inexact_array
from pytree_graph import BatchStat, Param
from pytree_nn import BatchNorm, Linear, Module, Optimizer, Rngs
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad

STYLES = ("both", "graph", "functional")
FEATURES = 64  # 8x8 pixels
CLASSES = 10
HIDDEN = 64
# The default 0.99 would need hundreds of steps to forget the initial statistics;
# 0.9 tracks the current weights within a few dozen, which a short run needs.
MOMENTUM = 0.9
DEFAULT_EPOCHS = 5
BATCH_SIZE = 64
LEARNING_RATE = 1e-2
# One optax transformation for every run and both styles (the functional steps use it).
TX = optax.adam(LEARNING_RATE)
TEST_FRACTION = 0.2
# scikit-learn and numpy take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1
# The same arithmetic in the same order: the styles agree to within float rounding.
TOLERANCE = 1e-5


class Digits(NamedTuple):
    """The digits as rows of 64 pixels in [0, 1] (float32), labels 0-9 (int32)."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


class Run(NamedTuple):
    """One training run: the trained model, the loss of every step, the time it took."""

    model: "Classifier"
    losses: np.ndarray
    seconds: float


class Classifier(Module):
    """`Linear -> BatchNorm -> relu -> Linear`, from 64 pixels to 10 logits."""

    def __init__(self, rngs: Rngs):
        self.hidden = Linear(FEATURES, HIDDEN, rngs=rngs)
        self.norm = BatchNorm(HIDDEN, momentum=MOMENTUM, rngs=rngs)
        self.out = Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.norm(self.hidden(images))))


def cross_entropy(model: Classifier, images: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy against integer labels; in training mode, as a side
    effect, the model's BatchNorm folds this batch's statistics into its running ones."""
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@filter_jit
def predict(model: Classifier, images: jax.Array) -> jax.Array:
    """The logits of a model in evaluation mode (in training mode the forward pass writes
    the running statistics, and `filter_jit` refuses a write it would drop)."""
    return model(images)


def accuracy(model: Classifier, images: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of `images` whose highest logit is the right label."""
    return float(np.mean(np.asarray(predict(model, images)).argmax(-1) == labels))


# ---------------------------------------------------------------------------------------
# The graph style: everything the step changes is written back by pytree_graph.jit.


@pg.jit
def graph_step(
    model: Classifier, optimizer: Optimizer, images: jax.Array, labels: jax.Array
) -> jax.Array:
    """One step in place: new Params from the Optimizer, new BatchStats from the forward pass."""
    loss, grads = pg.value_and_grad(cross_entropy)(model, images, labels)  # Params only
    optimizer.update(model, grads)
    return loss


def train_graph(model: Classifier, data: Digits, batches: list) -> Run:
    """Train `model` in place, one graph-style step per index array in `batches`."""
    optimizer = Optimizer(model, TX, wrt=Param)
    start = time.perf_counter()
    losses = [
        graph_step(model, optimizer, data.train_images[b], data.train_labels[b]) for b in batches
    ]
    losses = np.array([float(loss) for loss in losses])  # waits for the last step
    return Run(model, losses, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------
# The functional style: the step returns a new model, built from the one whose
# statistics moved.


def loss_and_model(
    model: Classifier, images: jax.Array, labels: jax.Array
) -> tuple[jax.Array, Classifier]:
    """The loss, and the model as auxiliary output: inside `filter_value_and_grad` this is
    the differentiated copy, whose BatchStats now hold the new running statistics."""
    return cross_entropy(model, images, labels), model


@filter_jit
def functional_step(
    model: Classifier, opt_state: optax.OptState, images: jax.Array, labels: jax.Array
) -> tuple[Classifier, optax.OptState, jax.Array]:
    """One step: a new model (new Params and new running statistics) and optax state."""
    (loss, model), grads = filter_value_and_grad(loss_and_model, has_aux=True)(
        model, images, labels
    )
    updates, opt_state = TX.update(grads, opt_state, filter(model, is_inexact_array))
    return apply_updates(model, updates), opt_state, loss


@filter_jit
def mistaken_functional_step(
    model: Classifier, opt_state: optax.OptState, images: jax.Array, labels: jax.Array
) -> tuple[Classifier, optax.OptState, jax.Array]:
    """The same step without returning the model from the loss: refused.

    The forward pass updates the running statistics of the copy inside
    `filter_value_and_grad`, and the updates would be applied to the model that came in,
    which still holds the old ones: the statistics would be lost without a word. So
    `filter_value_and_grad` raises a ValueError naming them and the fix (`has_aux=True`).
    """
    loss, grads = filter_value_and_grad(cross_entropy)(model, images, labels)
    updates, opt_state = TX.update(grads, opt_state, filter(model, is_inexact_array))
    return apply_updates(model, updates), opt_state, loss


def train_functional(
    model: Classifier, data: Digits, batches: list, step: Callable = functional_step
) -> Run:
    """Train in the functional style with `step`; the returned Run holds the new model."""
    opt_state = TX.init(filter(model, is_inexact_array))
    start = time.perf_counter()
    losses = []
    for b in batches:
        model, opt_state, loss = step(model, opt_state, data.train_images[b], data.train_labels[b])
        losses.append(loss)
    losses = np.array([float(loss) for loss in losses])
    return Run(model, losses, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------
# Comparing runs.


def max_difference(a: Classifier, b: Classifier, variable_type: type) -> float:
    """The largest absolute difference between the two models' Variables of a type,
    compared path by path (`.hidden.kernel` with `.hidden.kernel`, and so on)."""
    left = pg.state(a, variable_type).flat_state()
    right = pg.state(b, variable_type).flat_state()
    if left.keys() != right.keys():
        raise ValueError(f"The models differ in structure: {left.keys()} vs {right.keys()}.")
    # In numpy: the few eager operations are not worth compiling.
    return max(
        float(np.max(np.abs(np.asarray(left[p].value) - np.asarray(right[p].value)))) for p in left
    )


def statistics_at_initial_values(model: Classifier) -> bool:
    """Whether the running mean is still all zeros and the running variance all ones."""
    mean, var = np.asarray(model.norm.mean.value), np.asarray(model.norm.var.value)
    return bool(np.all(mean == 0.0) and np.all(var == 1.0))


def single_image_spread(model: Classifier, images: np.ndarray) -> tuple[float, float]:
    """Feed `images` one at a time; return how far apart their logits are (max over logits
    of max - min across images), in training mode and in evaluation mode.

    In training mode a batch of one is normalized by its own mean and (zero) variance, so
    BatchNorm outputs its bias whatever the image: every image gets the same logits. A
    clone is probed, so the model's running statistics and mode are left as they are. It is
    called directly, not through `predict`: in training mode each call writes the probe's
    running statistics, which `filter_jit` would refuse to drop.
    """
    probe = pg.clone(model)
    spreads = []
    for mode in (probe.train, probe.eval):
        mode()
        logits = np.stack([np.asarray(probe(image[None])) for image in images])
        spreads.append(float(np.max(logits.max(0) - logits.min(0))))
    return spreads[0], spreads[1]


# ---------------------------------------------------------------------------------------
# Data and command line.


def load_data(seed: int) -> Digits:
    """The digits scaled to [0, 1], split 80/20, stratified by label, reproducibly by `seed`."""
    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)  # pixels are 0-16
    labels = digits.target.astype(np.int32)
    train_images, test_images, train_labels, test_labels = train_test_split(
        images, labels, test_size=TEST_FRACTION, stratify=labels, random_state=seed
    )
    return Digits(train_images, train_labels, test_images, test_labels)


def batch_order(size: int, batch_size: int, epochs: int, seed: int) -> list[np.ndarray]:
    """Every step's minibatch indices, fixed up front so that every run sees the same ones.

    Each epoch is a new permutation; its incomplete last batch is dropped, so every step
    has the same shapes and is compiled once.
    """
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(epochs):
        order = rng.permutation(size)
        batches += [
            order[start : start + batch_size]
            for start in range(0, size - batch_size + 1, batch_size)
        ]
    return batches


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Train Linear -> BatchNorm -> relu -> Linear on scikit-learn's digits in "
        "the graph and the functional style of pytree_nn, and compare the two.",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=DEFAULT_EPOCHS,
        help="passes over the training set, at least 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the split, the initial weights and the minibatch order, "
        f"0 to {MAX_SEED} (default: %(default)s)",
    )
    parser.add_argument(
        "--style",
        choices=STYLES,
        default="both",
        help="train in one style, or in both and compare them (default: %(default)s)",
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what argparse's types let through: exit with status 2 before any work."""
    if args.epochs < 1:
        parser.error(f"argument --epochs: must be at least 1, got {args.epochs}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"argument --seed: must be between 0 and {MAX_SEED}, got {args.seed}")


def describe(run: Run, name: str) -> None:
    """One line per run: its first and last loss and how long it took."""
    print(
        f"{name}: loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f} over {len(run.losses)} "
        f"steps, {run.seconds:.1f} s (compilation included)"
    )


def report_agreement(graph: Run, functional: Run) -> None:
    """Print how far apart the two styles' runs are; raise if beyond float rounding.

    Raises:
        RuntimeError: if losses, Params or running statistics differ by more than TOLERANCE.
    """
    loss_gap = float(np.max(np.abs(graph.losses - functional.losses)))
    param_gap = max_difference(graph.model, functional.model, Param)
    stat_gap = max_difference(graph.model, functional.model, BatchStat)
    print(
        f"agreement: losses differ by at most {loss_gap:.1e} over {len(graph.losses)} steps, "
        f"final Params by {param_gap:.1e}, running statistics by {stat_gap:.1e}"
    )
    if max(loss_gap, param_gap, stat_gap) > TOLERANCE:
        raise RuntimeError(f"The two styles disagree by more than {TOLERANCE}.")


def report_mistake(initial: Classifier, data: Digits, batches: list) -> str:
    """Try one step of the mistaken functional style: print and return the error's first
    sentence, which names the lost statistics (the model is not changed)."""
    try:
        train_functional(pg.clone(initial), data, batches[:1], mistaken_functional_step)
    except ValueError as error:
        refusal = str(error).split(", and the write would be lost")[0]
    else:
        raise RuntimeError("The mistaken functional step was not refused.")
    print(f"mistake (functional style, the loss does not return the model): refused: {refusal}")
    return refusal


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, train in the chosen style(s), compare; print the test accuracy last."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)

    data = load_data(args.seed)
    batches = batch_order(len(data.train_labels), BATCH_SIZE, args.epochs, args.seed)
    # Every run trains a clone of this model: the same initial weights, by construction.
    initial = Classifier(Rngs(args.seed))
    params = sum(x.size for x in jax.tree.leaves(pg.state(initial, Param)))
    print(
        f"data: {len(data.train_labels)} training and {len(data.test_labels)} test images "
        f"({FEATURES} pixels, {CLASSES} classes)"
    )
    print(
        f"model: Linear({FEATURES} -> {HIDDEN}) -> BatchNorm(momentum {MOMENTUM}) -> relu -> "
        f"Linear({HIDDEN} -> {CLASSES}): {params:,} Params and 2 x {HIDDEN} BatchStats"
    )
    print(
        f"training: Adam {LEARNING_RATE}, {len(batches)} steps ({args.epochs} "
        f"{'epoch' if args.epochs == 1 else 'epochs'} of minibatches of {BATCH_SIZE}), "
        f"every run from the same initial weights (seed {args.seed}) and in the same order"
    )

    runs = {}
    if args.style in ("both", "graph"):
        runs["graph"] = train_graph(pg.clone(initial), data, batches)
        describe(runs["graph"], "graph style (Optimizer, pytree_graph.jit)")
    if args.style in ("both", "functional"):
        runs["functional"] = train_functional(pg.clone(initial), data, batches)
        describe(runs["functional"], "functional style (filter_jit, has_aux=True)")
    if args.style == "both":
        report_agreement(runs["graph"], runs["functional"])

    name, first = next(iter(runs.items()))  # the graph run when there are both
    mean, var = np.asarray(first.model.norm.mean.value), np.asarray(first.model.norm.var.value)
    print(
        f"running statistics moved ({name} style): mean from 0 to "
        f"[{mean.min():.2f}, {mean.max():.2f}], var from 1 to [{var.min():.2f}, {var.max():.2f}]"
        f"; still initial: {statistics_at_initial_values(first.model)}"
    )
    if "functional" in runs:
        report_mistake(initial, data, batches)

    train_spread, eval_spread = single_image_spread(first.model, data.test_images[:8])
    print(
        f"8 test images one at a time: logits spread {train_spread:.2g} in training mode "
        f"(each image normalized by its own statistics), {eval_spread:.2g} in eval mode"
    )
    accuracies = {}
    for name, run in runs.items():
        run.model.eval()  # every BatchNorm in the model now uses the running statistics
        accuracies[name] = accuracy(run.model, data.test_images, data.test_labels)
        print(f"{name} style, eval mode: test accuracy {accuracies[name]:.3f}")
    print(f"test accuracy: {next(iter(accuracies.values())):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
