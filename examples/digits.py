"""Train a small CNN on scikit-learn's handwritten digits, in either training style of pytree_nn.

The demo loads the 1797 8x8 grey images bundled with scikit-learn (nothing is downloaded),
holds out a stratified fifth of them as a test set, and trains a two-layer convolutional
network on the rest with Adam. It shows the two ways pytree_nn trains a model:

- ``--style graph`` (the default): an ``Optimizer`` keeps Adam's state in Variables next to
  the model, and one step under ``pytree_graph.jit`` takes the gradients with
  ``pytree_graph.value_and_grad`` and updates the model in place.
- ``--style functional``: the model is a plain pytree; one step under
  ``pytree_transforms.filter_jit`` takes the gradients with ``filter_value_and_grad``,
  calls optax itself and returns a new model from ``apply_updates``.

A progress bar shows the training loss and the held-out accuracy after every epoch. At the
end the model is saved with ``pytree_nn.save_checkpoint``, loaded into a freshly built model
with ``pytree_nn.load_checkpoint`` (which must then give exactly the same test logits), and a
plot of the loss and accuracy per epoch is written next to the checkpoint.

Run it from the repository root::

    hatch run demo
    hatch run demo --style functional --epochs 5 --out /tmp/digits

or ``python examples/digits.py --help`` in an environment with the five packages,
scikit-learn, tqdm and matplotlib installed. The last line printed is the test accuracy.
"""

import argparse
import pathlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import pytree_graph as pg
from pytree_filter import filter, is_inexact_array
from pytree_graph import Param
from pytree_nn import (
    Conv,
    Linear,
    Module,
    Optimizer,
    Rngs,
    load_checkpoint,
    max_pool,
    save_checkpoint,
)
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad

STYLES = ("graph", "functional")
DEFAULT_EPOCHS = 15
DEFAULT_BATCH_SIZE = 64
LEARNING_RATE = 1e-2  # Adam's initial step size, decayed to zero over the run
TEST_FRACTION = 0.2
# scikit-learn and numpy take seeds in [0, 2**32); the model's Rngs take any of those too.
MAX_SEED = 2**32 - 1


class Digits(NamedTuple):
    """The digits split into a training set and a held-out test set."""

    train_images: np.ndarray  # float32, shape (N, 8, 8, 1), values in [0, 1]
    train_labels: np.ndarray  # int32, shape (N,), values 0-9
    test_images: np.ndarray
    test_labels: np.ndarray


class History(NamedTuple):
    """What was measured after each epoch."""

    losses: list[float]  # mean training loss over the epoch's minibatches
    accuracies: list[float]  # accuracy on the held-out test set


class DigitsCNN(Module):
    """Two 3x3 convolutions, a 2x2 max pool and a linear classifier: about 10k parameters.

    Takes channels-last images of shape ``(*batch, 8, 8, 1)`` and returns logits of shape
    ``(*batch, 10)``. It has no dropout or batch norm, so training and evaluation run the
    same computation and need no ``train()``/``eval()`` switch; it reaches about 98.5% on
    the held-out digits without them.
    """

    def __init__(self, rngs: Rngs):
        self.conv1 = Conv(1, 16, (3, 3), rngs=rngs)
        self.conv2 = Conv(16, 32, (3, 3), rngs=rngs)
        self.classifier = Linear(4 * 4 * 32, 10, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.conv1(images))  # "SAME" padding keeps 8x8
        x = jax.nn.relu(self.conv2(x))
        x = max_pool(x, (2, 2), strides=(2, 2))  # 4x4x32
        return self.classifier(x.reshape(*x.shape[:-3], -1))


def cross_entropy(model: DigitsCNN, images: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of the model's logits against integer labels."""
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@filter_jit
def predict(model: DigitsCNN, images: jax.Array) -> jax.Array:
    """The model's logits, compiled once per model structure (either style's model fits)."""
    return model(images)


def accuracy(model: DigitsCNN, images: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of `images` whose highest logit is the right label."""
    return float(np.mean(np.asarray(predict(model, images)).argmax(-1) == labels))


@pg.jit
def graph_train_step(
    model: DigitsCNN, optimizer: Optimizer, images: jax.Array, labels: jax.Array
) -> jax.Array:
    """One Adam step in place: `pytree_graph.jit` writes the new Variables back."""
    loss, grads = pg.value_and_grad(cross_entropy)(model, images, labels)  # grads: a State
    optimizer.update(model, grads)
    return loss


class GraphTrainer:
    """The graph style: the model is updated in place, Adam's state lives in an Optimizer."""

    def __init__(self, model: DigitsCNN, tx: optax.GradientTransformation):
        self.model = model
        self.optimizer = Optimizer(model, tx, wrt=Param)

    def step(self, images: np.ndarray, labels: np.ndarray) -> jax.Array:
        """Train on one minibatch; return its loss (not waited for)."""
        return graph_train_step(self.model, self.optimizer, images, labels)


class FunctionalTrainer:
    """The functional style: every step returns a new model and a new optax state."""

    def __init__(self, model: DigitsCNN, tx: optax.GradientTransformation):
        self.model = model
        # optax sees the floating-point arrays (the Params' values) and None elsewhere.
        self.opt_state = tx.init(filter(model, is_inexact_array))

        @filter_jit
        def train_step(model, opt_state, images, labels):
            loss, grads = filter_value_and_grad(cross_entropy)(model, images, labels)
            params = filter(model, is_inexact_array)
            updates, opt_state = tx.update(grads, opt_state, params)
            return apply_updates(model, updates), opt_state, loss

        self._train_step = train_step

    def step(self, images: np.ndarray, labels: np.ndarray) -> jax.Array:
        """Train on one minibatch; return its loss (not waited for)."""
        self.model, self.opt_state, loss = self._train_step(
            self.model, self.opt_state, images, labels
        )
        return loss


TRAINERS: dict[str, type[GraphTrainer] | type[FunctionalTrainer]] = {
    "graph": GraphTrainer,
    "functional": FunctionalTrainer,
}


def load_data(seed: int) -> Digits:
    """The digits scaled to [0, 1], split 80/20, stratified by label, reproducibly by `seed`."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]  # pixels are 0-16
    labels = digits.target.astype(np.int32)
    train_images, test_images, train_labels, test_labels = train_test_split(
        images, labels, test_size=TEST_FRACTION, stratify=labels, random_state=seed
    )
    return Digits(train_images, train_labels, test_images, test_labels)


def minibatches(size: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Index arrays of `batch_size` shuffled examples out of `size`, for one epoch.

    The last incomplete batch is dropped: every step then has the same shapes and is
    compiled once, and reshuffling each epoch still lets every example take part.
    """
    order = rng.permutation(size)
    for start in range(0, size - batch_size + 1, batch_size):
        yield order[start : start + batch_size]


def train(
    trainer: GraphTrainer | FunctionalTrainer,
    data: Digits,
    epochs: int,
    batch_size: int,
    rng: np.random.Generator,
    description: str,
) -> History:
    """Run `epochs` epochs of minibatch steps, measuring loss and test accuracy after each."""
    history = History([], [])
    progress = tqdm(range(epochs), desc=description, unit="epoch", file=sys.stderr)
    for _ in progress:
        # Steps are dispatched without waiting; the losses are read once, after the epoch.
        losses = [
            trainer.step(data.train_images[batch], data.train_labels[batch])
            for batch in minibatches(len(data.train_labels), batch_size, rng)
        ]
        history.losses.append(float(jnp.mean(jnp.stack(losses))))
        # The test accuracy is only reported, never used to choose a model or to stop,
        # so the final figure stays an honest estimate on unseen data.
        history.accuracies.append(accuracy(trainer.model, data.test_images, data.test_labels))
        progress.set_postfix(
            loss=f"{history.losses[-1]:.4f}", test_acc=f"{history.accuracies[-1]:.3f}"
        )
    return history


def check_reload(path: pathlib.Path, model: DigitsCNN, seed: int, images: np.ndarray) -> None:
    """Load the checkpoint into a model built from `seed` and compare test logits exactly.

    Raises:
        RuntimeError: if the reloaded model's logits differ from `model`'s in any bit.
    """
    fresh = load_checkpoint(path, DigitsCNN(Rngs(seed)))
    expected = np.asarray(predict(model, images))
    reloaded = np.asarray(predict(fresh, images))
    if not np.array_equal(expected, reloaded):
        difference = float(np.max(np.abs(expected - reloaded)))
        raise RuntimeError(
            f"The model reloaded from {path} gives different test logits than the trained "
            f"model (largest difference {difference:.3g}); the checkpoint did not restore it."
        )


def plot_history(history: History, path: pathlib.Path, title: str) -> None:
    """Write a PNG with the training loss and the test accuracy per epoch, side by side."""
    # The Agg canvas renders without a display and without touching pyplot's global state.
    figure = Figure(figsize=(9, 3.5), layout="constrained")
    FigureCanvasAgg(figure)
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    epochs = range(1, len(history.losses) + 1)
    loss_axes.plot(epochs, history.losses, marker="o")
    loss_axes.set_yscale("log")  # the loss falls by orders of magnitude
    loss_axes.set_xlabel("epoch")
    loss_axes.set_ylabel("training loss (cross-entropy)")
    accuracy_axes.plot(epochs, history.accuracies, marker="o", color="tab:green")
    accuracy_axes.set_xlabel("epoch")
    accuracy_axes.set_ylabel("test accuracy")
    for axes in (loss_axes, accuracy_axes):
        axes.grid(alpha=0.3)
    figure.suptitle(title)
    figure.savefig(path, dpi=100)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Train a small CNN on scikit-learn's digits with pytree_nn.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--epochs", type=int, default=DEFAULT_EPOCHS, help="passes over the training set (>= 1)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help=f"seed of the split, the initial weights and the shuffling (0 to {MAX_SEED})",
    )
    parser.add_argument("--style", choices=STYLES, default="graph", help="training style")
    parser.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="examples per training step"
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("demo-output"),
        help="directory for model.safetensors and training.png (created if missing)",
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what argparse's types let through: exit with status 2, having written nothing."""
    if args.epochs < 1:
        parser.error(f"argument --epochs: must be at least 1, got {args.epochs}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"argument --seed: must be between 0 and {MAX_SEED}, got {args.seed}")
    if args.batch_size < 1:
        parser.error(f"argument --batch-size: must be at least 1, got {args.batch_size}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out: {args.out} is an existing file; give a directory")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, train, save, reload and plot; print the test accuracy last. Returns 0."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    data = load_data(args.seed)
    train_size = len(data.train_labels)
    if args.batch_size > train_size:
        parser.error(
            f"argument --batch-size: must be at most the training set size {train_size}, "
            f"got {args.batch_size}"
        )
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --out: cannot create directory {args.out}: {error.strerror}")

    model = DigitsCNN(Rngs(args.seed))
    steps_per_epoch = train_size // args.batch_size
    # Decaying the step size to zero lets the last epochs settle instead of bouncing around
    # the minimum, so the final accuracy depends little on the seed.
    schedule = optax.cosine_decay_schedule(LEARNING_RATE, args.epochs * steps_per_epoch)
    trainer = TRAINERS[args.style](model, optax.adam(schedule))
    parameters = sum(leaf.size for leaf in jax.tree.leaves(filter(model, is_inexact_array)))
    print(
        f"data: {train_size} training and {len(data.test_labels)} held-out test images "
        f"(8x8 pixels, 10 classes)"
    )
    print(
        f"model: DigitsCNN with {parameters:,} parameters; {args.style} style, Adam, "
        f"{args.epochs} {'epoch' if args.epochs == 1 else 'epochs'} of {steps_per_epoch} "
        f"minibatches of {args.batch_size}, seed {args.seed}"
    )

    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    history = train(trainer, data, args.epochs, args.batch_size, rng, f"{args.style} style")
    print(f"trained in {time.perf_counter() - start:.1f} s (compilation included)")

    checkpoint = args.out / "model.safetensors"
    save_checkpoint(checkpoint, trainer.model)
    print(f"checkpoint: {checkpoint}")
    other_seed = (args.seed + 1) % (MAX_SEED + 1)  # weights unlike the trained ones
    check_reload(checkpoint, trainer.model, other_seed, data.test_images)
    print(
        f"reload check: a fresh model (seed {other_seed}) loaded from the checkpoint "
        "gives identical test logits"
    )
    plot = args.out / "training.png"
    title = f"DigitsCNN on scikit-learn digits ({args.style} style, seed {args.seed})"
    plot_history(history, plot, title)
    print(f"plot: {plot}")
    print(f"test accuracy: {history.accuracies[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
