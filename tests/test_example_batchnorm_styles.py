"""The BatchNorm example (examples/batchnorm_styles.py): both training styles agree step by
step, the running statistics move and evaluation mode uses them, the functional style that
does not return the model is refused (it would lose them), and bad arguments are refused."""

import re

import numpy as np
import pytest
from example_scripts import assert_refused, load_example, started_example

ACCURACY_LINE = re.compile(r"test accuracy: (0\.\d{3}|1\.000)")


example = load_example("batchnorm_styles")


@pytest.fixture(scope="module", autouse=True)
def script_run():
    """The script run as a user would (one style: the cheapest run), started before the
    other tests so that it runs alongside them; test_script_end_to_end checks it."""
    with started_example(
        "batchnorm_styles", "--style", "graph", "--epochs", "1", "--seed", "2"
    ) as process:
        yield process


@pytest.fixture(scope="module")
def data():
    return example.load_data(seed=0)


@pytest.fixture(scope="module")
def runs(data):
    """One epoch (22 steps) in each style, from seed 0."""
    batches = example.batch_order(len(data.train_labels), example.BATCH_SIZE, 1, seed=0)
    initial = example.Classifier(example.Rngs(0))
    clone = example.pg.clone  # as main() does: every run starts from the same weights
    return {
        "graph": example.train_graph(clone(initial), data, batches),
        "functional": example.train_functional(clone(initial), data, batches),
    }


def test_main_with_both_styles_compares_them(capsys, runs):
    # After the `runs` fixture, everything this needs is compiled: the call is quick.
    assert example.main(["--epochs", "1", "--seed", "1"]) == 0
    stdout = capsys.readouterr().out
    assert re.search(r"agreement: losses differ by at most \S+ over 22 steps", stdout)
    assert "still initial: False" in stdout  # the trained models' statistics
    assert "mistake (functional style, the loss does not return the model): refused" in stdout
    assert "spread 0 in training mode" in stdout
    assert ACCURACY_LINE.fullmatch(stdout.splitlines()[-1])


def test_both_styles_agree_step_by_step(runs):
    graph, functional = runs["graph"], runs["functional"]
    assert graph.losses.shape == functional.losses.shape == (22,)
    np.testing.assert_allclose(graph.losses, functional.losses, rtol=1e-5)
    assert example.max_difference(graph.model, functional.model, example.Param) < 1e-5
    assert example.max_difference(graph.model, functional.model, example.BatchStat) < 1e-5
    assert graph.losses[-1] < 0.3 * graph.losses[0]  # and they did learn


def test_running_statistics_moved(runs):
    for name in ("graph", "functional"):
        norm = runs[name].model.norm
        assert not example.statistics_at_initial_values(runs[name].model), name
        assert np.max(np.abs(norm.mean.value)) > 0.1, name
        assert np.max(np.abs(np.asarray(norm.var.value) - 1.0)) > 0.1, name


def test_the_mistake_is_refused_and_names_the_lost_statistics(data):
    # The warning in the docs: without returning the model, the statistics would be lost,
    # silently (the losses and parameters are those of the correct step); it is an error.
    batches = example.batch_order(len(data.train_labels), example.BATCH_SIZE, 1, seed=0)
    initial = example.Classifier(example.Rngs(0))
    refusal = example.report_mistake(initial, data, batches)
    assert "`model.norm.mean.value`" in refusal and "`model.norm.var.value`" in refusal
    assert example.statistics_at_initial_values(initial)


def test_eval_mode_uses_the_running_statistics(runs, data):
    model = runs["graph"].model
    train_spread, eval_spread = example.single_image_spread(model, data.test_images[:4])
    assert train_spread < 1e-4  # one image normalized by itself: the same logits for all
    assert eval_spread > 1.0
    assert not model.norm.use_running_average  # the probe was a clone: still training mode
    model.eval()
    image = data.test_images[:1]
    # The same forward pass written out in numpy, normalizing with the running statistics.
    value = lambda variable: np.asarray(variable.value)  # noqa: E731
    norm = model.norm
    hidden = image @ value(model.hidden.kernel) + value(model.hidden.bias)
    normalized = (hidden - value(norm.mean)) / np.sqrt(value(norm.var) + norm.epsilon)
    activations = np.maximum(normalized * value(norm.scale) + value(norm.bias), 0.0)
    expected = activations @ value(model.out.kernel) + value(model.out.bias)
    np.testing.assert_allclose(example.predict(model, image), expected, rtol=1e-4, atol=1e-4)


def test_accuracy_after_one_epoch(runs, data):
    model = runs["functional"].model
    model.eval()
    assert example.accuracy(model, data.test_images, data.test_labels) > 0.85


def test_batch_order_is_seeded_and_covers_each_epoch():
    batches = example.batch_order(10, 3, epochs=2, seed=0)
    assert [len(b) for b in batches] == [3] * 6  # 3 full batches per epoch
    assert len(set(np.concatenate(batches[:3]).tolist())) == 9
    again = example.batch_order(10, 3, epochs=2, seed=0)
    np.testing.assert_array_equal(np.concatenate(again), np.concatenate(batches))
    assert not np.array_equal(batches[0], example.batch_order(10, 3, 2, seed=1)[0])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
        (["--seed", "-1"], "argument --seed: must be between 0 and 4294967295, got -1"),
        (["--style", "tree"], "argument --style: invalid choice: 'tree'"),
    ],
    ids=["epochs-0", "seed", "style"],
)
def test_bad_arguments_exit_2(args, message, capsys):
    assert_refused(example.main, args, message, capsys)


def test_script_end_to_end(script_run):
    # Last in the file, so that the script ran while the other tests did.
    stdout, stderr = script_run.communicate(timeout=300)
    assert script_run.returncode == 0, stdout + stderr
    assert "graph style" in stdout and "functional style" not in stdout
    assert "agreement" not in stdout and "mistake" not in stdout  # they need both styles
    assert "still initial: False" in stdout
    assert "spread 0 in training mode" in stdout
    accuracy = float(ACCURACY_LINE.fullmatch(stdout.splitlines()[-1]).group(1))
    assert accuracy > 0.85
