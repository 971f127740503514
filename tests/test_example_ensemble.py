"""The ensemble example (examples/ensemble.py): a run, the stacked members, training, errors."""

import re
from typing import NamedTuple

import jax
import numpy as np
import pytest
from example_scripts import assert_refused, load_example, run_example

from pytree_filter import is_array

MEMBER_LINE = re.compile(r" +(\d+) +(\d+\.\d{4}) +(\d+\.\d{4})")
ENSEMBLE_LINE = re.compile(r"ensemble test mse: (\d+\.\d{4})")
MEMBERS = 4
STEPS = 300


ensemble_example = load_example("ensemble")
make_member = ensemble_example.filter_jit(ensemble_example.make_member)  # compiled once


class Run(NamedTuple):
    """One short training run of a 4-member ensemble, shared by the tests that need one."""

    data: object
    keys: jax.Array
    x: np.ndarray  # the members' resamples, (MEMBERS, TRAIN_SIZE, 1)
    y: np.ndarray
    initial: object
    trained: object
    first: np.ndarray  # each member's training loss before training
    last: np.ndarray  # and after


@pytest.fixture(scope="module")
def run():
    data = ensemble_example.make_data(seed=1)
    keys = jax.random.split(jax.random.key(1), MEMBERS)
    initial = ensemble_example.build_ensemble(keys)
    x, y = ensemble_example.bootstrap(data, MEMBERS, np.random.default_rng(1))
    trained, first, last = ensemble_example.train(initial, x, y, steps=STEPS)
    return Run(data, keys, x, y, initial, trained, first, last)


def test_script_end_to_end():
    result = run_example("ensemble", "--members", "3", "--steps", "200", "--seed", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  .layers[1].kernel  (3, 32, 32)" in result.stdout
    rows = [MEMBER_LINE.fullmatch(line) for line in result.stdout.splitlines()]
    rows = [row for row in rows if row]
    assert [int(row.group(1)) for row in rows] == [0, 1, 2]
    member_test = [float(row.group(3)) for row in rows]
    last = ENSEMBLE_LINE.fullmatch(result.stdout.splitlines()[-1])
    assert last, result.stdout
    # Rounded to 4 decimals, hence the slack.
    assert float(last.group(1)) <= np.mean(member_test) + 1e-4
    assert float(last.group(1)) < 0.05  # sin is learned on the training intervals


def test_parameters_are_stacked_and_non_arrays_shared(run):
    single = make_member(run.keys[0])
    stacked_leaves = jax.tree.leaves(run.initial)
    single_leaves = jax.tree.leaves(single)
    assert len(stacked_leaves) == len(single_leaves) == 6
    for stacked, one in zip(stacked_leaves, single_leaves, strict=True):
        assert stacked.shape == (MEMBERS, *one.shape)
    # The activation and the sizes are not arrays: one copy, not stacked, the same function.
    assert run.initial.activation is jax.nn.relu
    assert [layer.out_features for layer in run.initial.layers] == [32, 32, 1]
    assert jax.tree.structure(run.initial) == jax.tree.structure(single)


def test_members_differ_and_match_models_built_alone(run):
    stacked = [np.asarray(leaf) for leaf in jax.tree.leaves(run.initial)]
    for index in range(MEMBERS):
        alone = jax.tree.leaves(make_member(run.keys[index]))
        for leaf, all_members in zip(alone, stacked, strict=True):
            np.testing.assert_allclose(leaf, all_members[index], rtol=1e-6)
    # Different keys, different weights: kernels are random (biases start at zero).
    for all_members in stacked:
        if all_members.ndim == 3:
            assert not np.allclose(all_members[0], all_members[1])
    inputs = np.linspace(-3, 3, 7, dtype=np.float32)[:, None]
    predictions = np.asarray(ensemble_example.predict(run.initial, inputs))
    assert predictions.shape == (MEMBERS, 7, 1)
    assert np.abs(predictions[0] - predictions[1]).max() > 1e-3


def test_bootstrap_gives_each_member_its_own_resample():
    data = ensemble_example.make_data(seed=0)
    x, y = ensemble_example.bootstrap(data, 3, np.random.default_rng(0))
    assert x.shape == y.shape == (3, ensemble_example.TRAIN_SIZE, 1)

    def pairs(inputs, targets):
        return set(zip(inputs.ravel().tolist(), targets.ravel().tolist(), strict=True))

    train_pairs = pairs(data.train_x, data.train_y)
    for row_x, row_y in zip(x, y, strict=True):
        assert pairs(row_x, row_y) <= train_pairs
        assert len(set(row_x.ravel().tolist())) < ensemble_example.TRAIN_SIZE  # repeats
    assert not np.array_equal(x[0], x[1])


def test_training_reduces_every_members_loss(run):
    assert run.first.shape == run.last.shape == (MEMBERS,)
    assert np.all(run.last < run.first / 10), (run.first, run.last)
    assert np.all(run.last < 0.05)


def test_members_train_independently(run, capsys):
    """Other data for member 2 changes member 2 only: the summed loss does not mix them."""
    x, y = run.x.copy(), run.y.copy()
    y[2] = -y[2]  # learn -sin instead
    trained, _, _ = ensemble_example.train(run.initial, x, y, steps=STEPS)
    for after, before in zip(jax.tree.leaves(trained), jax.tree.leaves(run.trained), strict=True):
        for index in (0, 1, 3):
            np.testing.assert_array_equal(after[index], before[index])
        assert not np.allclose(after[2], before[2])
    capsys.readouterr()


def test_ensemble_is_no_worse_than_its_average_member(run):
    data, ensemble = run.data, run.trained
    for region in ensemble_example.REGIONS:
        x, y = data.test[region]
        result = ensemble_example.evaluate(ensemble, x, y)
        assert result.member_mse.shape == (MEMBERS,)
        # Mean squared error is convex, so the mean prediction is at least as good as the
        # average member; strictly better here, since the members disagree.
        assert result.ensemble_mse < result.member_mse.mean()
        predictions = np.asarray(ensemble_example.predict(ensemble, x))
        np.testing.assert_allclose(
            result.ensemble_mse, np.mean((predictions.mean(0) - y) ** 2), rtol=1e-6
        )
    in_distribution = ensemble_example.evaluate(ensemble, *data.test["in distribution"])
    assert in_distribution.ensemble_mse < 0.02


def test_spread_is_larger_away_from_the_data(run):
    data, ensemble = run.data, run.trained
    spread = {
        region: ensemble_example.evaluate(ensemble, *data.test[region]).spread
        for region in ensemble_example.REGIONS
    }
    assert spread["between the intervals"] > 2 * spread["in distribution"], spread
    assert spread["outside the intervals"] > 2 * spread["in distribution"], spread


def test_data_is_seeded_and_in_its_regions():
    data = ensemble_example.make_data(seed=0)
    assert data.train_x.shape == data.train_y.shape == (ensemble_example.TRAIN_SIZE, 1)
    assert data.train_x.dtype == np.float32
    on_intervals = (np.abs(data.train_x) >= 1) & (np.abs(data.train_x) <= 3)
    assert on_intervals.all()
    noise = data.train_y - np.sin(data.train_x)
    assert 0.05 < noise.std() < 0.2
    between = data.test["between the intervals"][0]
    assert (np.abs(between) <= 1).all()
    outside = data.test["outside the intervals"][0]
    assert ((np.abs(outside) >= 3) & (np.abs(outside) <= 5)).all()
    np.testing.assert_array_equal(ensemble_example.make_data(seed=0).train_x, data.train_x)
    assert not np.array_equal(ensemble_example.make_data(seed=1).train_x, data.train_x)
    assert all(is_array(leaf) for leaf in jax.tree.leaves(data))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--members", "1"], "argument --members: must be at least 2"),
        (["--members", "many"], "argument --members: invalid int value: 'many'"),
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--seed", "4294967296"], "argument --seed: must be between 0 and 4294967295"),
    ],
    ids=["members-1", "members-text", "steps-0", "seed"],
)
def test_bad_arguments_exit_2(args, message, capsys):
    assert_refused(ensemble_example.main, args, message, capsys)
