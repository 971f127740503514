"""The example of the Equinox paper's Appendix A, written with pytree_module and pytree_nn.

The paper (Kidger and Garcia, "Equinox: neural networks in JAX via callable PyTrees and
filtered transformations", 2021) ends with a short program that shows its three ideas at once:

- a model is a class whose instances are pytrees, built by composing parameterised functions
  (two linear layers) and declaring parameters directly (a bias array);
- a field may hold something that is not an array (the activation function);
- *filtered* transforms (`filter_jit`, `filter_grad`) trace and differentiate the arrays and
  let everything else through, so the whole model is passed as an ordinary argument.

Here `MyModule` is a frozen `pytree_module.Module` with annotated fields, as in Equinox; its
layers are `pytree_nn.Linear`, and the transforms come from `pytree_transforms`. The paper's
`loss` (which returns gradients) is computed on its random data, and the gradients are printed
leaf by leaf to show that they are a `MyModule` themselves, with `None` for the activation.

The script then goes one step further than the paper: it trains the model with plain gradient
descent on a target it can learn (a fixed random linear map of the inputs, plus an offset),
printing the loss as it falls.

Run it from the repository root::

    hatch run python examples/equinox_appendix.py
    hatch run python examples/equinox_appendix.py --steps 2000 --learning-rate 0.05 --seed 1

or ``python examples/equinox_appendix.py [options]`` in an environment with the packages.
The last line printed is ``final loss: ...``, the mean squared error after training.
"""

import argparse
import math
import sys
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import is_array
from pytree_module import Module
from pytree_nn import Linear
from pytree_transforms import apply_updates, filter_grad, filter_jit, filter_value_and_grad

DEFAULT_STEPS = 1000
DEFAULT_LEARNING_RATE = 0.1
NUM_POINTS = 100  # the paper's data set size
REPORTS = 5  # how many times the loss is printed during training, besides the start
# jax.random.key takes any seed in [0, 2**32) the same way on every platform.
MAX_SEED = 2**32 - 1


class MyModule(Module, frozen=True):
    """The paper's model: a 2-8-2 perceptron with ReLU, plus a bias added to its output.

    The fields are annotated, so they are data (pytree children), the activation function
    included: it is a leaf that is not an array, which the filtered transforms pass through.
    `frozen=True` makes instances immutable after `__init__`, as Equinox modules are.
    """

    layers: list
    activation: Callable
    bias: jax.Array

    def __init__(self, key: jax.Array):
        key1, key2 = jax.random.split(key)
        # `rngs=` takes a PRNG key directly: each layer draws its initial weights from it.
        self.layers = [Linear(2, 8, rngs=key1), Linear(8, 2, rngs=key2)]
        self.activation = jax.nn.relu
        self.bias = jnp.ones(2)

    def __call__(self, x: jax.Array) -> jax.Array:
        """Map one input of shape `(2,)` to an output of shape `(2,)`."""
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x) + self.bias


def mean_squared_error(model: MyModule, x: jax.Array, y: jax.Array) -> jax.Array:
    """The paper's loss: the model is written for one example, so `jax.vmap` batches it."""
    pred_y = jax.vmap(model)(x)
    return jnp.mean((y - pred_y) ** 2)


@filter_jit
@filter_grad
def loss(model: MyModule, x: jax.Array, y: jax.Array) -> jax.Array:
    """The paper's `loss`: as decorated, it returns the gradients with respect to `model`.

    `filter_grad` differentiates the floating-point arrays of its first argument and gives
    `None` for its other leaves (here the activation function); `filter_jit` traces the
    arrays and keeps the function as a static part of the compiled call.
    """
    return mean_squared_error(model, x, y)


@filter_jit
def sgd_step(
    model: MyModule, x: jax.Array, y: jax.Array, learning_rate: float
) -> tuple[MyModule, jax.Array]:
    """One step of plain gradient descent; returns the new model and the loss before it.

    `jax.tree.map` over the gradients skips their `None` leaves, so the updates have `None`
    where the activation is, and `apply_updates` leaves that leaf as it was. The learning
    rate is a Python float, so `filter_jit` holds it static (one compilation per value).
    """
    value, grads = filter_value_and_grad(mean_squared_error)(model, x, y)
    updates = jax.tree.map(lambda g: -learning_rate * g, grads)
    return apply_updates(model, updates), value


@jax.jit  # compiled as one program rather than one small program per operation
def make_data(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The paper's inputs and targets, both standard normal of shape (100, 2), and a target
    that can be learned from the inputs: `x @ matrix + offset`, from the same `key`.
    """
    x_key, y_key, map_key, offset_key = jax.random.split(key, 4)
    x = jax.random.normal(x_key, (NUM_POINTS, 2))
    y = jax.random.normal(y_key, (NUM_POINTS, 2))  # unrelated to x: nothing to learn
    matrix = jax.random.normal(map_key, (2, 2))
    offset = jax.random.normal(offset_key, (2,))
    return x, y, x @ matrix + offset


def describe_leaves(tree: object) -> list[str]:
    """One line per leaf of `tree`, `None` leaves included: its path and what it holds."""
    lines = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: x is None):
        if is_array(leaf):
            shape = ",".join(map(str, leaf.shape))
            norm = np.linalg.norm(np.asarray(leaf))  # NumPy: nothing to compile per shape
            what = f"{leaf.dtype.name}[{shape}], norm {norm:.4f}"
        else:
            what = getattr(leaf, "__name__", repr(leaf))
        lines.append(f"  {jax.tree_util.keystr(path):<24} {what}")
    return lines


def report_steps(steps: int) -> set[int]:
    """The steps after which the loss is printed: about `REPORTS` of them, the last included."""
    return {math.ceil(steps * i / REPORTS) for i in range(1, REPORTS + 1)}


evaluate = filter_jit(mean_squared_error)


def train(
    model: MyModule, x: jax.Array, y: jax.Array, steps: int, learning_rate: float
) -> tuple[MyModule, list[tuple[int, float]]]:
    """Run `steps` steps of gradient descent on all of `(x, y)`.

    Returns the trained model and `(step, loss)` pairs: the loss before training and after
    each reported step, printed as they come.
    """
    reports = report_steps(steps)
    history = [(0, float(evaluate(model, x, y)))]
    print(f"step {0:>6}: loss {history[-1][1]:.6f}")
    for step in range(1, steps + 1):
        model, _ = sgd_step(model, x, y, learning_rate)
        if step in reports:
            history.append((step, float(evaluate(model, x, y))))
            print(f"step {step:>6}: loss {history[-1][1]:.6f}")
    return model, history


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="The Equinox paper's Appendix A example, then a short training run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help="gradient descent steps (>= 1)"
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=DEFAULT_LEARNING_RATE,
        help="step size of gradient descent (> 0)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help=f"seed of the data, the target map and the initial weights (0 to {MAX_SEED})",
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what argparse's types let through: exit with status 2 before any work."""
    if args.steps < 1:
        parser.error(f"argument --steps: must be at least 1, got {args.steps}")
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        parser.error(
            f"argument --learning-rate: must be a positive number, got {args.learning_rate}"
        )
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"argument --seed: must be between 0 and {MAX_SEED}, got {args.seed}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run the paper's example, then train; print the final loss last.

    Returns 0, or 1 if training diverged (the loss is not finite).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)

    data_key, model_key = jax.random.split(jax.random.key(args.seed))
    x, y, learnable_y = make_data(data_key)
    model = MyModule(model_key)

    # The paper's program: gradients of the loss on random data, through filtered transforms.
    grads = loss(model, x, y)
    print(f"the gradients are a {type(grads).__name__}, shaped like the model:")
    print("\n".join(describe_leaves(grads)))
    print(f"the model's activation: {model.activation.__name__}; its gradient: {grads.activation}")

    # Beyond the paper: learn y = x @ matrix + offset.
    print(
        f"training on y = x @ matrix + offset ({NUM_POINTS} points): {args.steps} steps of "
        f"gradient descent, learning rate {args.learning_rate}, seed {args.seed}"
    )
    model, history = train(model, x, learnable_y, args.steps, args.learning_rate)
    final = history[-1][1]
    if not math.isfinite(final):
        print(
            f"training diverged (loss {final}); try a smaller --learning-rate",
            file=sys.stderr,
        )
        return 1
    print(f"the trained model's activation is still {model.activation.__name__}")
    print(f"final loss: {final:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
