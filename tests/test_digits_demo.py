"""The digits demo (examples/digits.py): short end-to-end runs, bad arguments, its helpers."""

import pathlib
import re

import numpy as np
import pytest
import safetensors.numpy
from example_scripts import assert_refused, load_example, run_example

ACCURACY_LINE = re.compile(r"test accuracy: 0\.\d{3}")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


digits = load_example("digits")


def _check_outputs(out: pathlib.Path, stdout: str) -> None:
    """The checkpoint and the PNG exist, and the last line is the accuracy."""
    assert (out / "model.safetensors").stat().st_size > 0
    assert (out / "training.png").read_bytes().startswith(PNG_SIGNATURE)
    assert ACCURACY_LINE.fullmatch(stdout.splitlines()[-1])
    assert "identical test logits" in stdout


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory):
    """One short graph-style run of the script, shared by the tests that need one."""
    out = tmp_path_factory.mktemp("graph") / "new-directory"  # created by the script
    return out, run_example("digits", "--epochs", "1", "--seed", "3", "--out", str(out))


def test_graph_style_end_to_end(graph_run):
    out, result = graph_run
    assert result.returncode == 0, result.stdout + result.stderr
    _check_outputs(out, result.stdout)
    assert "graph style" in result.stdout


def test_functional_style_end_to_end(tmp_path):
    result = run_example(
        "digits", "--style", "functional", "--epochs", "1", "--seed", "3", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    _check_outputs(tmp_path, result.stdout)
    assert "functional style" in result.stdout


def test_same_seed_same_result(graph_run, tmp_path, capsys):
    out, result = graph_run
    assert result.returncode == 0, result.stdout + result.stderr
    # In this process, through main(): the same seed gives the same accuracy and weights.
    assert digits.main(["--epochs", "1", "--seed", "3", "--out", str(tmp_path)]) == 0
    stdout = capsys.readouterr().out
    _check_outputs(tmp_path, stdout)
    assert stdout.splitlines()[-1] == result.stdout.splitlines()[-1]
    first = safetensors.numpy.load_file(out / "model.safetensors")
    second = safetensors.numpy.load_file(tmp_path / "model.safetensors")
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
        (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
        (["--style", "bogus"], "argument --style: invalid choice: 'bogus'"),
        (["--seed", "-1"], "argument --seed: must be between 0 and 4294967295, got -1"),
        (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
        (
            ["--batch-size", "5000"],
            "argument --batch-size: must be at most the training set size 1437",
        ),
    ],
    ids=["epochs-0", "epochs-text", "style", "seed", "batch-size-0", "batch-size-big"],
)
def test_bad_arguments_exit_2_and_write_nothing(args, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert_refused(digits.main, [*args, "--out", str(out)], message, capsys)
    assert not out.exists()


def test_out_pointing_at_a_file_is_refused(tmp_path, capsys):
    # Through main() in this process, as the other refusals: the exit status, stderr and stdout
    # are those of the script (the end-to-end runs above cover its `sys.exit(main())`), without
    # paying for a new interpreter importing JAX, scikit-learn and matplotlib.
    not_a_directory = tmp_path / "results.txt"
    not_a_directory.write_text("keep me")
    message = f"argument --out: {not_a_directory} is an existing file"
    assert_refused(digits.main, ["--out", str(not_a_directory)], message, capsys)
    assert not_a_directory.read_text() == "keep me"


def test_load_data_is_a_seeded_stratified_split():
    data = digits.load_data(seed=0)
    assert data.train_images.shape == (1437, 8, 8, 1)
    assert data.test_images.shape == (360, 8, 8, 1)
    assert data.train_images.dtype == np.float32
    assert data.train_images.min() == 0.0 and data.train_images.max() == 1.0
    # Stratified: every digit makes up about a tenth of the test set.
    assert np.bincount(data.test_labels, minlength=10).min() >= 35
    # Held out: no test image appears among the training images.
    train_rows = {row.tobytes() for row in data.train_images}
    assert not any(row.tobytes() in train_rows for row in data.test_images[:50])
    again = digits.load_data(seed=0)
    np.testing.assert_array_equal(again.test_labels, data.test_labels)
    other = digits.load_data(seed=1)
    assert not np.array_equal(other.test_labels, data.test_labels)


def test_minibatches_cover_each_example_once_per_epoch():
    batches = list(digits.minibatches(10, 3, np.random.default_rng(0)))
    assert [len(batch) for batch in batches] == [3, 3, 3]  # the incomplete batch is dropped
    assert len(set(np.concatenate(batches).tolist())) == 9
    same = list(digits.minibatches(10, 3, np.random.default_rng(0)))
    np.testing.assert_array_equal(np.concatenate(same), np.concatenate(batches))
    rng = np.random.default_rng(0)
    first, second = (np.concatenate(list(digits.minibatches(10, 10, rng))) for _ in range(2))
    assert sorted(first.tolist()) == list(range(10))
    assert not np.array_equal(first, second)  # reshuffled every epoch


def test_model_maps_images_to_ten_logits():
    model = digits.DigitsCNN(digits.Rngs(0))
    assert digits.predict(model, np.zeros((5, 8, 8, 1), np.float32)).shape == (5, 10)
    assert model(np.zeros((8, 8, 1), np.float32)).shape == (10,)  # unbatched works too


def test_check_reload_rejects_a_checkpoint_of_another_model(tmp_path):
    path = tmp_path / "model.safetensors"
    images = digits.load_data(seed=0).test_images[:20]
    trained = digits.DigitsCNN(digits.Rngs(0))
    digits.save_checkpoint(path, trained)
    digits.check_reload(path, trained, seed=7, images=images)
    with pytest.raises(RuntimeError, match="different test logits"):
        digits.check_reload(path, digits.DigitsCNN(digits.Rngs(1)), seed=7, images=images)
