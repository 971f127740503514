"""The Equinox appendix example (examples/equinox_appendix.py): a run, its gradients, training."""

import dataclasses
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from example_scripts import assert_refused, load_example, run_example

from pytree_filter import combine, filter, is_array, partition

LOSS_LINE = re.compile(r"step +(\d+): loss (\S+)")
FINAL_LINE = re.compile(r"final loss: (\d+\.\d{6})")


appendix = load_example("equinox_appendix")


@pytest.fixture(scope="module")
def setup():
    """The paper's model and data for seed 0, built as main() builds them."""
    data_key, model_key = jax.random.split(jax.random.key(0))
    x, y, learnable_y = appendix.make_data(data_key)
    return appendix.MyModule(model_key), x, y, learnable_y


def test_script_end_to_end():
    result = run_example("equinox_appendix", "--steps", "200", "--seed", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "the gradients are a MyModule, shaped like the model:"
    assert re.fullmatch(r" +\.activation +None", lines[5])
    kernel_line = r" +\.layers\[0\]\.kernel\.value +float32\[2,8\], norm \d+\.\d{4}"
    assert re.fullmatch(kernel_line, lines[2])
    losses = [(int(step), float(loss)) for step, loss in LOSS_LINE.findall(result.stdout)]
    assert [step for step, _ in losses] == [0, 40, 80, 120, 160, 200]
    assert FINAL_LINE.fullmatch(lines[-1])
    final = float(FINAL_LINE.fullmatch(lines[-1]).group(1))
    assert final == pytest.approx(losses[-1][1], abs=1e-6)
    assert final < losses[0][1] / 50  # 200 steps already take off most of the loss
    assert "the trained model's activation is still relu" in result.stdout


def test_grads_are_model_shaped_with_none_for_the_activation(setup):
    model, x, y, _ = setup
    grads = appendix.loss(model, x, y)
    assert isinstance(grads, appendix.MyModule)
    # Same tree as the model once None counts as a leaf: the activation's place holds None.
    assert jax.tree.structure(grads, is_leaf=lambda leaf: leaf is None) == jax.tree.structure(model)
    assert grads.activation is None
    assert model.activation is jax.nn.relu  # the model itself is untouched
    for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(filter(model, is_array)), strict=True):
        assert g.shape == p.shape and g.dtype == p.dtype
        assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0


def test_grads_have_the_right_values(setup):
    model, x, y, _ = setup
    grads = appendix.loss(model, x, y)
    residual = np.asarray(y - appendix.filter_jit(jax.vmap(model))(x))
    # d/d bias of mean((y - pred) ** 2) over 100 x 2 values is -mean over the examples.
    np.testing.assert_allclose(grads.bias, -residual.mean(axis=0), rtol=1e-5, atol=1e-6)
    # The last layer's bias is added to the output just as the module's bias is.
    np.testing.assert_allclose(grads.layers[-1].bias.value, grads.bias, rtol=1e-6)
    # The whole tree agrees with plain jax.grad, given only the arrays to differentiate.
    arrays, rest = partition(model, is_array)
    expected = jax.jit(jax.grad(lambda a: appendix.mean_squared_error(combine(a, rest), x, y)))(
        arrays
    )
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_training_reduces_the_loss_and_keeps_the_activation(setup, capsys):
    model, x, _, learnable_y = setup
    trained, history = appendix.train(model, x, learnable_y, 300, 0.1)
    assert [step for step, _ in history] == [0, 60, 120, 180, 240, 300]
    first, last = history[0][1], history[-1][1]
    assert last < first / 100
    assert all(b < a for (_, a), (_, b) in itertools.pairwise(history))
    assert isinstance(trained, appendix.MyModule)
    assert trained.activation is jax.nn.relu
    # Functional: the model that was passed in still has its initial weights.
    assert float(appendix.evaluate(model, x, learnable_y)) == pytest.approx(first)
    assert "step    300: loss" in capsys.readouterr().out


def test_module_is_frozen(setup):
    model = setup[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.bias = jnp.zeros(2)


def test_main_is_deterministic(capsys):
    assert appendix.main(["--steps", "20", "--seed", "5"]) == 0
    first = capsys.readouterr().out
    assert appendix.main(["--steps", "20", "--seed", "5"]) == 0
    assert capsys.readouterr().out == first
    assert appendix.main(["--steps", "20", "--seed", "6"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] != first.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--steps", "two"], "argument --steps: invalid int value: 'two'"),
        (["--learning-rate", "0"], "argument --learning-rate: must be a positive number, got 0.0"),
        (["--learning-rate", "nan"], "argument --learning-rate: must be a positive number"),
        (["--seed", "-1"], "argument --seed: must be between 0 and 4294967295, got -1"),
    ],
    ids=["steps-0", "steps-text", "lr-0", "lr-nan", "seed"],
)
def test_bad_arguments_exit_2(args, message, capsys):
    assert_refused(appendix.main, args, message, capsys)


def test_divergence_is_reported(capsys):
    assert appendix.main(["--steps", "50", "--learning-rate", "100"]) == 1
    captured = capsys.readouterr()
    assert "try a smaller --learning-rate" in captured.err
    assert "final loss" not in captured.out
