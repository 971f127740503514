"""A weight-tied autoencoder: one Param used by the encoder and, transposed, by the decoder.

The encoder is a ``Linear`` layer that maps 64 pixels to a small code; the decoder maps the
code back with the *same* weight matrix, transposed, plus a bias of its own. The sharing is
written the Python way: the decoder holds a reference to the encoder's kernel ``Param``, so
the model is an object graph, not a tree. The example shows, with printed evidence, what
keeps that sharing and what loses it:

- ``pytree_graph.split`` stores the shared kernel once (the tied model has about half the
  parameters of an untied one of the same shape), and ``pytree_graph.merge`` rebuilds a
  model whose decoder's Param *is* its encoder's Param;
- the gradient of the shared kernel is the sum of the gradients of its two uses, and an
  ``Optimizer`` step moves it once by that sum;
- graph-style training (``Optimizer``, ``pytree_graph.jit``, ``pytree_graph.value_and_grad``)
  keeps the tie, and so does a ``save_checkpoint``/``load_checkpoint`` round trip;
- so does the functional style: ``filter_jit`` passes the shared kernel once,
  ``filter_value_and_grad`` gives it the summed gradient, and ``apply_updates`` updates it
  once, so one functional-style Adam step keeps the tie and matches the graph-style step;
- plain JAX does not: ``jax.tree`` flattening sees the kernel twice and ``jax.jit`` returns
  two separate copies.

The data are scikit-learn's bundled handwritten digits (1797 images of 8x8 pixels, scaled to
[0, 1]; nothing is downloaded), split 80/20 into training and held-out test images.

Run it from the repository root::

    hatch run python examples/tied_autoencoder.py
    hatch run python examples/tied_autoencoder.py --epochs 5 --hidden 8 --out /tmp/tied

or ``python examples/tied_autoencoder.py --help`` in an environment with the five packages
and scikit-learn installed. The last line printed is the test reconstruction error.
"""

import argparse
import pathlib
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import pytree_graph as pg
from pytree_filter import filter, is_inexact_array
from pytree_graph import Param
from pytree_nn import Linear, Module, Optimizer, Rngs, load_checkpoint, save_checkpoint
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad

FEATURES = 64  # 8x8 pixels
DEFAULT_EPOCHS = 30
DEFAULT_HIDDEN = 16
BATCH_SIZE = 64
LEARNING_RATE = 1e-2
TEST_FRACTION = 0.2
CHECKPOINT_NAME = "tied_autoencoder.safetensors"
# scikit-learn and numpy take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1


class Digits(NamedTuple):
    """Flattened digit images, float32 in [0, 1], shape (N, 64)."""

    train: np.ndarray
    test: np.ndarray


class TiedDecoder(Module):
    """Maps a code back to pixels with a kernel it does not own: `code @ kernel.T + bias`.

    `kernel` is the encoder's Param of shape `(features, hidden)`, held by reference, so the
    encoder and the decoder read and train the very same Variable. Only the bias is new.
    """

    def __init__(self, kernel: Param, features: int):
        self.kernel = kernel
        self.bias = Param(jnp.zeros((features,), jnp.float32))

    def __call__(self, code: jax.Array) -> jax.Array:
        # A sigmoid keeps the reconstructed pixels in [0, 1], like the data.
        return jax.nn.sigmoid(code @ self.kernel.value.T + self.bias.value)


class TiedAutoencoder(Module):
    """`features -> hidden -> features`: a ReLU code, a sigmoid reconstruction, one kernel."""

    def __init__(self, features: int, hidden: int, rngs: Rngs):
        self.encoder = Linear(features, hidden, rngs=rngs)
        self.decoder = TiedDecoder(self.encoder.kernel, features)  # the same Param object

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.decoder(jax.nn.relu(self.encoder(x)))


def untie(model: TiedAutoencoder) -> TiedAutoencoder:
    """A copy of `model` whose decoder has its own kernel Param, starting from the same values.

    It computes exactly what `model` computes, but the two uses of the kernel are now two
    parameters: the baseline for counting parameters and for splitting the gradient.
    """
    copy = pg.clone(model)  # new Variables, the tie kept ...
    copy.decoder.kernel = Param(copy.encoder.kernel.value)  # ... and then cut
    return copy


def is_tied(model: TiedAutoencoder) -> bool:
    """Whether the decoder's kernel is the encoder's kernel (the same object, not equal values)."""
    return model.decoder.kernel is model.encoder.kernel


def parameter_count(model: Module) -> int:
    """The number of trained values, each shared Param counted once (as `split` stores it)."""
    return sum(leaf.size for leaf in jax.tree.leaves(pg.state(model, Param)))


def path_name(path: tuple) -> str:
    """A State path as the dotted attribute path a reader would type, e.g. `decoder.kernel`."""
    return ".".join(str(key) for key in path)


def reconstruction_mse(model: TiedAutoencoder, images: jax.Array) -> jax.Array:
    """Mean squared error between the images and their reconstructions."""
    return jnp.mean((model(images) - images) ** 2)


@filter_jit
def reconstruct(model: TiedAutoencoder, images: jax.Array) -> jax.Array:
    """The model's reconstructions, compiled once per model structure."""
    return model(images)


@filter_jit
def evaluate(model: TiedAutoencoder, images: jax.Array) -> jax.Array:
    """The reconstruction error, compiled once per model structure."""
    return reconstruction_mse(model, images)


@pg.jit
def train_step(model: TiedAutoencoder, optimizer: Optimizer, images: jax.Array) -> jax.Array:
    """One Adam step in place; `pytree_graph.jit` sees the shared kernel as one Variable."""
    loss, grads = pg.value_and_grad(reconstruction_mse)(model, images)
    optimizer.update(model, grads)
    return loss


class GradientCheck(NamedTuple):
    """How the shared kernel's gradient and one SGD step relate to the kernel's two uses."""

    gradient_error: float  # max |tied gradient - (encoder-use + decoder-use gradient)|
    step_error: float  # max |kernel change - (-lr * summed gradient)| after one SGD step
    step_size: float  # max |kernel change|, for scale


@pg.jit
def tied_and_untied_gradients(
    model: TiedAutoencoder, untied: TiedAutoencoder, images: jax.Array
) -> tuple[pg.State, pg.State]:
    """The Param gradients of both models on the same images (States, one entry per Param)."""
    grad_fn = pg.grad(reconstruction_mse)
    return grad_fn(model, images), grad_fn(untied, images)


def check_summed_gradient(
    model: TiedAutoencoder, images: jax.Array, learning_rate: float = 0.5
) -> GradientCheck:
    """Compare the tied kernel's gradient and one SGD step with the untied model's two kernels.

    The model itself is not changed: the step is taken on a clone (which keeps the tie).
    """
    tied_grads, untied_grads = tied_and_untied_gradients(model, untie(model), images)
    # The tied gradient State holds the kernel once, at its first path; find that path.
    (shared_path, *_), *_ = pg.find_duplicates(model)
    # Compared in numpy (float64): rounding in the comparison itself stays far below it.
    tied_kernel_grad = np.asarray(tied_grads.flat_state()[shared_path].value, np.float64)
    summed = np.asarray(untied_grads["encoder"]["kernel"].value, np.float64) + np.asarray(
        untied_grads["decoder"]["kernel"].value, np.float64
    )

    stepped = pg.clone(model)
    train_step(stepped, Optimizer(stepped, optax.sgd(learning_rate), wrt=Param), images)
    change = np.asarray(stepped.encoder.kernel.value, np.float64) - np.asarray(
        model.encoder.kernel.value, np.float64
    )
    return GradientCheck(
        gradient_error=float(np.max(np.abs(tied_kernel_grad - summed))),
        step_error=float(np.max(np.abs(change + learning_rate * summed))),
        step_size=float(np.max(np.abs(change))),
    )


@filter_jit
def functional_adam_step(model: TiedAutoencoder, images: jax.Array) -> TiedAutoencoder:
    """One functional-style Adam step from a fresh optimizer state; returns the new model.

    `filter_jit` passes the shared kernel once, `filter_value_and_grad` gives it the sum of
    its two uses' gradients, and `apply_updates` updates it once: the new model is tied too.
    """
    tx = optax.adam(LEARNING_RATE)
    params = filter(model, is_inexact_array)
    _, grads = filter_value_and_grad(reconstruction_mse)(model, images)
    updates, _ = tx.update(grads, tx.init(params), params)
    return apply_updates(model, updates)


def functional_step_difference(model: TiedAutoencoder, images: jax.Array) -> tuple[bool, float]:
    """Take one Adam step in each style from `model` (left unchanged); return whether the
    functional one kept the tie, and the largest difference between the two new kernels."""
    functional = functional_adam_step(model, images)
    graph = pg.clone(model)  # the tie kept
    train_step(graph, Optimizer(graph, optax.adam(LEARNING_RATE), wrt=Param), images)
    difference = np.max(
        np.abs(np.asarray(functional.encoder.kernel.value) - graph.encoder.kernel.value)
    )
    return is_tied(functional), float(difference)


def load_data(seed: int) -> Digits:
    """The digits as rows of 64 pixels scaled to [0, 1], split 80/20 reproducibly by `seed`."""
    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)  # pixels are 0-16
    train, test = train_test_split(
        pixels, test_size=TEST_FRACTION, stratify=digits.target, random_state=seed
    )
    return Digits(train, test)


def minibatches(size: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Shuffled index arrays of `batch_size` for one epoch; the incomplete last one is dropped,
    so every step has the same shape and is compiled once."""
    order = rng.permutation(size)
    for start in range(0, size - batch_size + 1, batch_size):
        yield order[start : start + batch_size]


def train(
    model: TiedAutoencoder, data: Digits, epochs: int, seed: int
) -> tuple[Optimizer, list[float]]:
    """Train with Adam in the graph style; return the optimizer and the test error per epoch."""
    optimizer = Optimizer(model, optax.adam(LEARNING_RATE), wrt=Param)
    rng = np.random.default_rng(seed)
    test_errors = []
    report_every = max(1, epochs // 5)
    for epoch in range(1, epochs + 1):
        losses = [
            train_step(model, optimizer, data.train[batch])
            for batch in minibatches(len(data.train), BATCH_SIZE, rng)
        ]
        test_errors.append(float(evaluate(model, data.test)))
        if epoch % report_every == 0 or epoch == epochs:
            train_error = float(np.mean([float(loss) for loss in losses]))
            print(
                f"  epoch {epoch:3d}/{epochs}: training mse {train_error:.4f}, "
                f"test mse {test_errors[-1]:.4f}, tied: {is_tied(model)}"
            )
    return optimizer, test_errors


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Train a weight-tied autoencoder on scikit-learn's digits and show that "
        "pytree_graph keeps the tie through split/merge, training and checkpoints.",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=DEFAULT_EPOCHS,
        help="passes over the training set, at least 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--hidden",
        type=int,
        default=DEFAULT_HIDDEN,
        help=f"size of the code, from 1 to {FEATURES} (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the split, the initial weights and the shuffling, "
        f"0 to {MAX_SEED} (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help=f"directory to keep {CHECKPOINT_NAME} in, created if missing "
        "(default: a temporary directory, removed at the end)",
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what argparse's types let through: exit with status 2 before any work."""
    if args.epochs < 1:
        parser.error(f"argument --epochs: must be at least 1, got {args.epochs}")
    if not 1 <= args.hidden <= FEATURES:
        # A code wider than the 64 pixels would have nothing to compress.
        parser.error(f"argument --hidden: must be between 1 and {FEATURES}, got {args.hidden}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"argument --seed: must be between 0 and {MAX_SEED}, got {args.seed}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out: {args.out} is an existing file; give a directory")


def show_sharing(model: TiedAutoencoder, data: Digits) -> None:
    """Print what split/merge, gradients and plain JAX do with the shared kernel."""
    duplicates = pg.find_duplicates(model)
    print(
        "find_duplicates: "
        + "; ".join(" and ".join(path_name(p) for p in paths) for paths in duplicates)
        + " are one Param"
    )
    kernel_size = model.encoder.kernel.value.size
    print(
        f"parameters: {parameter_count(model):,} tied vs {parameter_count(untie(model)):,} "
        f"untied (the {kernel_size:,}-value kernel counted once)"
    )
    graphdef, state = pg.split(model)
    paths = sorted(path_name(path) for path in state.flat_state())
    print(
        f"split: the state holds {len(paths)} Variables ({', '.join(paths)}); "
        f"jax.tree.leaves(model) sees {len(jax.tree.leaves(model))} arrays"
    )
    rebuilt = pg.merge(graphdef, state)
    print(f"merge: rebuilt model's decoder.kernel is its encoder.kernel: {is_tied(rebuilt)}")
    copied = jax.jit(lambda m: m)(model)
    print(f"jax.jit round trip: decoder.kernel is encoder.kernel: {is_tied(copied)} (two copies)")

    batch = jnp.asarray(data.train[:BATCH_SIZE])
    check = check_summed_gradient(model, batch)
    print(
        "gradient: the shared kernel's gradient minus the sum of its two uses' gradients: "
        f"max {check.gradient_error:.1e}"
    )
    print(
        f"one SGD step moved the kernel by up to {check.step_size:.2e}, = -lr * summed gradient "
        f"to within {check.step_error:.1e} (updated once, by the sum)"
    )
    tied, difference = functional_step_difference(model, batch)
    print(
        f"functional style: after one filter_value_and_grad/apply_updates step, tied: {tied}; "
        f"its kernel differs from the graph-style step's by up to {difference:.1e}"
    )


def check_checkpoint(
    model: TiedAutoencoder, directory: pathlib.Path, hidden: int, seed: int, images: np.ndarray
) -> pathlib.Path:
    """Save the model in `directory`, load it into one built from another seed, print what
    survived, and return the checkpoint's path.

    Raises:
        RuntimeError: if the reloaded model is untied or reconstructs `images` differently.
    """
    path = directory / CHECKPOINT_NAME
    save_checkpoint(path, model)
    other_seed = (seed + 1) % (MAX_SEED + 1)  # different weights until loaded
    fresh = load_checkpoint(path, TiedAutoencoder(FEATURES, hidden, Rngs(other_seed)))
    same = bool(np.array_equal(reconstruct(fresh, images), reconstruct(model, images)))
    # The file holds one entry per Variable of the State, so the kernel once.
    entries = sorted("/".join(map(str, p)) for p in pg.state(model).flat_state())
    print(f"checkpoint: {len(entries)} entries ({', '.join(entries)})")
    print(
        f"reload into a model built from seed {other_seed}: tied: {is_tied(fresh)}, "
        f"identical test reconstructions: {same}"
    )
    if not (is_tied(fresh) and same):
        raise RuntimeError(f"The checkpoint {path} did not restore the tied model.")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, show the sharing, train, checkpoint; print the test error last."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.out is not None:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            parser.error(f"argument --out: cannot create directory {args.out}: {error.strerror}")

    data = load_data(args.seed)
    print(
        f"data: {len(data.train)} training and {len(data.test)} test images, "
        f"{FEATURES} pixels each, scaled to [0, 1]"
    )
    model = TiedAutoencoder(FEATURES, args.hidden, Rngs(args.seed))
    print(
        f"model: {FEATURES} -> {args.hidden} -> {FEATURES} autoencoder, ReLU code, sigmoid "
        f"output, decoder = encoder kernel transposed; seed {args.seed}"
    )
    show_sharing(model, data)

    initial = float(evaluate(model, data.test))
    steps = len(data.train) // BATCH_SIZE
    print(f"initial test reconstruction mse: {initial:.4f}")
    print(
        f"training (graph style, Adam {LEARNING_RATE}): {args.epochs} "
        f"{'epoch' if args.epochs == 1 else 'epochs'} of {steps} minibatches of {BATCH_SIZE}"
    )
    start = time.perf_counter()
    optimizer, test_errors = train(model, data, args.epochs, args.seed)
    print(f"trained in {time.perf_counter() - start:.1f} s (compilation included)")
    moments = sorted(path_name(p) for p in pg.state(optimizer.opt_state[0]["mu"]).flat_state())
    print(
        f"after training: decoder.kernel is encoder.kernel: {is_tied(model)}; "
        f"Adam keeps {len(moments)} first moments ({', '.join(moments)})"
    )
    if args.out is None:
        with tempfile.TemporaryDirectory() as directory:
            check_checkpoint(model, pathlib.Path(directory), args.hidden, args.seed, data.test)
        print("(written to a temporary directory, now removed; pass --out DIR to keep it)")
    else:
        path = check_checkpoint(model, args.out, args.hidden, args.seed, data.test)
        print(f"written to {path}")
    print(f"test reconstruction mse: {test_errors[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
