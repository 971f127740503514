"""The weight-tied autoencoder example (examples/tied_autoencoder.py): the tie survives
split/merge, training and checkpoints; plain JAX loses it; the error falls; bad arguments."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from example_scripts import assert_refused, load_example, started_example

LAST_LINE = re.compile(r"test reconstruction mse: (\d+\.\d{4})")
HIDDEN = 8


example = load_example("tied_autoencoder")
pg = example.pg


@pytest.fixture(scope="module", autouse=True)
def script_run(tmp_path_factory):
    """The script run as a user would, started before the other tests so that it runs
    alongside them (on a second core); test_script_end_to_end checks it."""
    out = tmp_path_factory.mktemp("tied") / "new-directory"  # created by the script
    args = ("--epochs", "2", "--hidden", str(HIDDEN), "--seed", "1", "--out", str(out))
    with started_example("tied_autoencoder", *args) as process:
        yield process, out


@pytest.fixture(scope="module")
def data():
    return example.load_data(seed=0)


def _model(seed: int = 0):
    return example.TiedAutoencoder(example.FEATURES, HIDDEN, example.Rngs(seed))


def test_split_stores_the_shared_kernel_once_and_merge_reties_it():
    model = _model()
    assert example.is_tied(model)
    assert pg.find_duplicates(model) == [[("decoder", "kernel"), ("encoder", "kernel")]]
    graphdef, state = pg.split(model)
    paths = set(state.flat_state())
    assert paths == {("decoder", "bias"), ("decoder", "kernel"), ("encoder", "bias")}
    assert len(jax.tree.leaves(model)) == 4  # plain flattening sees the kernel twice

    kernel = example.FEATURES * HIDDEN
    assert example.parameter_count(model) == kernel + HIDDEN + example.FEATURES
    untied = example.untie(model)
    assert not example.is_tied(untied)
    assert example.parameter_count(untied) == 2 * kernel + HIDDEN + example.FEATURES
    x = jnp.linspace(0.0, 1.0, 2 * example.FEATURES).reshape(2, example.FEATURES)
    np.testing.assert_allclose(
        example.reconstruct(untied, x), example.reconstruct(model, x), rtol=1e-6
    )  # the same function

    rebuilt = pg.merge(graphdef, state, copy=True)
    assert example.is_tied(rebuilt)
    assert rebuilt.encoder.kernel is not model.encoder.kernel  # new Variables ...
    np.testing.assert_array_equal(rebuilt.encoder.kernel.value, model.encoder.kernel.value)
    rebuilt.encoder.kernel.value = rebuilt.encoder.kernel.value + 1.0  # ... still one of them
    np.testing.assert_array_equal(rebuilt.decoder.kernel.value, rebuilt.encoder.kernel.value)


def test_plain_jax_makes_two_copies():
    model = _model()
    assert not example.is_tied(jax.jit(lambda m: m)(model))


def test_the_functional_step_keeps_the_tie_and_matches_the_graph_step():
    model = _model()
    before = np.asarray(model.encoder.kernel.value)
    tied, difference = example.functional_step_difference(
        model, jnp.full((4, example.FEATURES), 0.5)
    )
    assert tied and difference < 1e-6
    np.testing.assert_array_equal(model.encoder.kernel.value, before)  # left unchanged


def test_shared_kernel_gets_the_summed_gradient_once(data):
    check = example.check_summed_gradient(_model(), jnp.asarray(data.train[:64]))
    assert check.gradient_error < 1e-6
    assert check.step_size > 1e-4  # the step is real ...
    assert check.step_error < 1e-3 * check.step_size  # ... and is -lr * (sum), not twice it


def test_training_keeps_the_tie_and_lowers_the_error(data, capsys):
    model = _model(seed=2)
    kernel = model.encoder.kernel
    initial_kernel = kernel.value
    before = float(example.evaluate(model, data.test))
    optimizer, test_errors = example.train(model, data, epochs=2, seed=2)
    assert model.encoder.kernel is kernel and model.decoder.kernel is kernel
    np.testing.assert_array_equal(model.decoder.kernel.value, model.encoder.kernel.value)
    assert not np.allclose(kernel.value, initial_kernel)  # the shared kernel was trained
    assert len(test_errors) == 2 and test_errors[-1] < 0.5 * before
    assert set(pg.state(optimizer.opt_state[0]["mu"]).flat_state()) == {
        ("decoder", "bias"),
        ("decoder", "kernel"),
        ("encoder", "bias"),
    }
    assert "tied: True" in capsys.readouterr().out


def test_checkpoint_keeps_the_tie(tmp_path, data):
    model = _model(seed=3)
    path = tmp_path / "tied.safetensors"
    example.save_checkpoint(path, model)
    fresh = example.load_checkpoint(path, _model(seed=4))
    assert example.is_tied(fresh)
    np.testing.assert_array_equal(
        example.reconstruct(fresh, data.test), example.reconstruct(model, data.test)
    )
    with pytest.raises(ValueError):  # an untied model has a path the file lacks
        example.load_checkpoint(path, example.untie(_model(seed=4)))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
        (["--hidden", "0"], "argument --hidden: must be between 1 and 64, got 0"),
        (["--hidden", "65"], "argument --hidden: must be between 1 and 64, got 65"),
        (["--seed", "-1"], "argument --seed: must be between 0 and 4294967295, got -1"),
        (["--epochs", "many"], "argument --epochs: invalid int value: 'many'"),
    ],
    ids=["epochs-0", "hidden-0", "hidden-65", "seed", "epochs-text"],
)
def test_bad_arguments_exit_2(args, message, capsys):
    assert_refused(example.main, args, message, capsys)


def test_out_pointing_at_a_file_is_refused(tmp_path, capsys):
    not_a_directory = tmp_path / "notes.txt"
    not_a_directory.write_text("keep me")
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--out", str(not_a_directory)])
    assert exit_info.value.code == 2
    assert "argument --out:" in capsys.readouterr().err
    assert not_a_directory.read_text() == "keep me"


def test_script_end_to_end(script_run):
    # Last in the file, so that the script ran while the other tests did.
    process, out = script_run
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stdout + stderr
    final = float(LAST_LINE.fullmatch(stdout.splitlines()[-1]).group(1))
    initial = float(re.search(r"initial test reconstruction mse: (\d+\.\d+)", stdout).group(1))
    assert final < 0.5 * initial  # two epochs already more than halve the error
    assert "merge: rebuilt model's decoder.kernel is its encoder.kernel: True" in stdout
    assert "jax.jit round trip: decoder.kernel is encoder.kernel: False" in stdout
    assert "after training: decoder.kernel is encoder.kernel: True" in stdout
    assert "tied: True, identical test reconstructions: True" in stdout
    assert (out / example.CHECKPOINT_NAME).stat().st_size > 0
    assert f"written to {out / example.CHECKPOINT_NAME}" in stdout
