"""An ensemble of small MLPs, built and trained all at once with `filter_vmap`.

The data is a one-dimensional regression problem made from the seed: noisy samples of
``sin(x)`` on two intervals, [-3, -1] and [1, 3]. An ensemble of ``--members`` MLPs
(``pytree_nn.MLP``, 1-32-32-1 with ReLU) is then

- **built** by `pytree_transforms.filter_vmap` over a batch of PRNG keys: one call of the
  constructor gives a single MLP whose every parameter has a leading axis of size
  ``--members``, while its non-array attributes (the activation, the sizes) stay shared;
- **trained** in one `filter_jit` step: the loss is `filter_vmap`-ed over the members, each
  member sees its own bootstrap resample of the training set, and the functional recipe
  (`filter_value_and_grad`, optax's Adam, `apply_updates`) updates all of them together;
- **evaluated** member by member and as an ensemble (the mean of the members' predictions)
  on fresh points of the training intervals, and, to show where an ensemble is unsure, on
  points between the intervals and outside them: the members agree where there was data
  and spread apart where there was none.

Run it from the repository root::

    hatch run python examples/ensemble.py
    hatch run python examples/ensemble.py --members 16 --steps 2000 --seed 1

or ``python examples/ensemble.py [options]`` in an environment with the packages. The last
line printed is ``ensemble test mse: ...``, the ensemble's error on the training intervals.
"""

import argparse
import math
import sys
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pytree_filter import filter, is_inexact_array
from pytree_nn import MLP
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad, filter_vmap

DEFAULT_MEMBERS = 8
DEFAULT_STEPS = 1000
LEARNING_RATE = 1e-2  # Adam's step size
WIDTH = 32  # units per hidden layer
DEPTH = 2  # hidden layers
TRAIN_SIZE = 64
TEST_SIZE = 500  # points per test region
NOISE = 0.1  # standard deviation of the noise on the training targets
TRAIN_INTERVALS = ((-3.0, -1.0), (1.0, 3.0))
# Where the ensemble is evaluated. Only the first region is where the training data lies.
REGIONS = {
    "in distribution": TRAIN_INTERVALS,
    "between the intervals": ((-1.0, 1.0),),
    "outside the intervals": ((-5.0, -3.0), (3.0, 5.0)),
}
REPORTS = 4  # how many times the training losses are printed, besides the start
# numpy and jax.random.key take any seed in [0, 2**32).
MAX_SEED = 2**32 - 1


class Data(NamedTuple):
    """The training set, and noiseless test sets for every region of `REGIONS`."""

    train_x: np.ndarray  # float32, shape (TRAIN_SIZE, 1)
    train_y: np.ndarray  # float32, shape (TRAIN_SIZE, 1): sin(x) plus noise
    test: dict[str, tuple[np.ndarray, np.ndarray]]  # region -> (x, sin(x)), (TEST_SIZE, 1)


class Evaluation(NamedTuple):
    """How the ensemble does on one test region."""

    member_mse: np.ndarray  # shape (members,): each member's mean squared error
    ensemble_mse: float  # the mean squared error of the members' mean prediction
    spread: float  # the members' standard deviation around their mean, averaged over points


def sample_inputs(
    rng: np.random.Generator, size: int, intervals: Sequence[tuple[float, float]]
) -> np.ndarray:
    """`size` points uniform on the union of `intervals` (of equal lengths), shape (size, 1)."""
    lows, highs = np.array(intervals, dtype=np.float32).T
    which = rng.integers(len(intervals), size=size)
    return rng.uniform(lows[which], highs[which]).astype(np.float32)[:, None]


def make_data(seed: int) -> Data:
    """Noisy training samples of sin on `TRAIN_INTERVALS` and clean test sets, from `seed`."""
    rng = np.random.default_rng(seed)
    train_x = sample_inputs(rng, TRAIN_SIZE, TRAIN_INTERVALS)
    noise = NOISE * rng.standard_normal(train_x.shape).astype(np.float32)
    test = {}
    for region, intervals in REGIONS.items():
        x = sample_inputs(rng, TEST_SIZE, intervals)
        test[region] = (x, np.sin(x))
    return Data(train_x, np.sin(train_x) + noise, test)


def bootstrap(data: Data, members: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One resample of the training set per member, drawn with replacement.

    Returns inputs and targets of shape `(members, TRAIN_SIZE, 1)`: member `i` trains on
    row `i`. Different data, on top of different initial weights, is what makes the members
    disagree away from the data.
    """
    indices = rng.integers(TRAIN_SIZE, size=(members, TRAIN_SIZE))
    return data.train_x[indices], data.train_y[indices]


def make_member(key: jax.Array) -> MLP:
    """One member: a 1-32-32-1 ReLU network whose initial weights come from `key`."""
    return MLP(1, 1, width_size=WIDTH, depth=DEPTH, rngs=key)


@filter_jit  # one compiled program instead of one per operation of the initialisers
def build_ensemble(keys: jax.Array) -> MLP:
    """One MLP per key, as one MLP whose arrays are stacked on a new leading axis.

    `filter_vmap` maps the constructor over the batch of keys: every array it creates gets
    the batch axis, and the non-array attributes (the activation function, the layer sizes),
    which must not depend on the key, are returned once, shared by all members.
    """
    return filter_vmap(make_member)(keys)


def mse(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    """The mean squared error of one model on `(x, y)`."""
    return jnp.mean((model(x) - y) ** 2)


def ensemble_loss(ensemble: MLP, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The sum of the members' losses, and the losses themselves (shape `(members,)`).

    The losses are `filter_vmap`-ed: every array of `ensemble`, `x` and `y` is mapped over
    its leading axis, so member `i` is evaluated on its own resample `x[i], y[i]`. The sum
    does not mix the members: the gradient of the sum with respect to member `i`'s
    parameters is the gradient of member `i`'s own loss.
    """
    losses = filter_vmap(mse)(ensemble, x, y)
    return jnp.sum(losses), losses


# optax works on the stacked parameters as on any pytree. Adam acts on each number
# separately, so one Adam over the stack is one Adam per member. (An optimizer that mixes
# parameters, such as clipping by global norm, would mix the members: `filter_vmap` the
# update itself then, as docs/examples/ensemble.md shows.)
OPTIMIZER = optax.adam(LEARNING_RATE)


@filter_jit
def train_step(
    ensemble: MLP, opt_state: optax.OptState, x: jax.Array, y: jax.Array
) -> tuple[MLP, optax.OptState, jax.Array]:
    """One Adam step for every member at once; returns the members' losses before it too."""
    (_, losses), grads = filter_value_and_grad(ensemble_loss, has_aux=True)(ensemble, x, y)
    params = filter(ensemble, is_inexact_array)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return apply_updates(ensemble, updates), opt_state, losses


@filter_jit
@filter_vmap(kwargs=dict(x=None))  # every member sees the same inputs
def predict(ensemble: MLP, x: jax.Array) -> jax.Array:
    """Every member's predictions for `x` of shape `(points, 1)`: `(members, points, 1)`."""
    return ensemble(x)


@filter_jit
def member_losses(ensemble: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    """Each member's loss on its own resample, without training."""
    return ensemble_loss(ensemble, x, y)[1]


def report_steps(steps: int) -> set[int]:
    """The steps after which the losses are printed: about `REPORTS` of them, the last too."""
    return {math.ceil(steps * i / REPORTS) for i in range(1, REPORTS + 1)}


def describe_losses(step: int, losses: jax.Array) -> str:
    """A line with the range of the members' training losses at `step`."""
    losses = np.asarray(losses)
    return f"step {step:>5}: member training loss {losses.min():.4f} to {losses.max():.4f}"


def train(
    ensemble: MLP, x: np.ndarray, y: np.ndarray, steps: int
) -> tuple[MLP, np.ndarray, np.ndarray]:
    """Train every member on its resample for `steps` Adam steps, printing progress.

    Returns the trained ensemble and each member's training loss before and after.
    """
    # The optax state is built on the stacked parameters, so it is stacked too.
    opt_state = OPTIMIZER.init(filter(ensemble, is_inexact_array))
    reports = report_steps(steps)
    first = np.asarray(member_losses(ensemble, x, y))
    print(describe_losses(0, first))
    for step in range(1, steps + 1):
        ensemble, opt_state, _ = train_step(ensemble, opt_state, x, y)
        if step in reports:
            print(describe_losses(step, member_losses(ensemble, x, y)))
    return ensemble, first, np.asarray(member_losses(ensemble, x, y))


def evaluate(ensemble: MLP, x: np.ndarray, y: np.ndarray) -> Evaluation:
    """Each member's error, the ensemble mean's error, and the members' spread on `(x, y)`."""
    predictions = np.asarray(predict(ensemble, x))  # (members, points, 1)
    member_mse = np.mean((predictions - y) ** 2, axis=(1, 2))
    mean_prediction = predictions.mean(axis=0)
    ensemble_mse = float(np.mean((mean_prediction - y) ** 2))
    spread = float(predictions.std(axis=0).mean())
    return Evaluation(member_mse, ensemble_mse, spread)


def stacked_shapes(ensemble: MLP) -> list[str]:
    """One line per parameter of the ensemble: its name and its (stacked) shape."""
    lines = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(ensemble):
        # Every path ends in the Variable's `.value`: dropped, to name the parameter.
        name = jax.tree_util.keystr(path).removesuffix(".value")
        lines.append(f"  {name:<18} {leaf.shape}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        description="Build and train an ensemble of MLPs at once with filter_vmap.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--members", type=int, default=DEFAULT_MEMBERS, help="MLPs in the ensemble (>= 2)"
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="Adam steps (>= 1)")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help=f"seed of the data, the resamples and the initial weights (0 to {MAX_SEED})",
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what argparse's types let through: exit with status 2 before any work."""
    if args.members < 2:
        parser.error(
            f"argument --members: must be at least 2 (an ensemble's spread needs two), "
            f"got {args.members}"
        )
    if args.steps < 1:
        parser.error(f"argument --steps: must be at least 1, got {args.steps}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"argument --seed: must be between 0 and {MAX_SEED}, got {args.seed}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, build, train and evaluate the ensemble; print its test error last."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)

    data = make_data(args.seed)
    intervals = " and ".join(f"[{low:g}, {high:g}]" for low, high in TRAIN_INTERVALS)
    print(
        f"data: {TRAIN_SIZE} noisy samples of sin(x) on {intervals}; "
        f"{TEST_SIZE} test points per region"
    )
    ensemble = build_ensemble(jax.random.split(jax.random.key(args.seed), args.members))
    print(
        f"ensemble: {args.members} MLPs 1-{WIDTH}-{WIDTH}-1 ({ensemble.activation.__name__}) "
        "as one, each parameter stacked:"
    )
    print("\n".join(stacked_shapes(ensemble)))
    print(
        f"training: {args.steps} Adam steps for all members at once, each on its own "
        f"bootstrap resample, seed {args.seed}"
    )
    x, y = bootstrap(data, args.members, np.random.default_rng(args.seed))
    ensemble, _, train_mse = train(ensemble, x, y, args.steps)

    results = {region: evaluate(ensemble, *data.test[region]) for region in REGIONS}
    in_distribution = results["in distribution"]
    print("member  train mse  test mse")
    member_errors = zip(train_mse, in_distribution.member_mse, strict=True)
    for index, (train_error, error) in enumerate(member_errors):
        print(f"{index:>6}  {train_error:>9.4f}  {error:>8.4f}")
    print(f"mean member test mse: {in_distribution.member_mse.mean():.4f}")
    for region, result in results.items():
        print(
            f"{region}: members' spread {result.spread:.3f}, ensemble mse {result.ensemble_mse:.4f}"
        )
    print(f"ensemble test mse: {in_distribution.ensemble_mse:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
