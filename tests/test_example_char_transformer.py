"""The character-level transformer example (examples/char_transformer.py): a short run as a
subprocess, then its parts imported: causality, the decode cache, sampling, bad arguments."""

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from example_scripts import assert_refused, load_example, run_example

import pytree_graph as pg

# A model small enough to compile and train in seconds, still able to learn something.
TINY = [
    "--steps", "60",
    "--batch-size", "16",
    "--context", "16",
    "--layers", "1",
    "--width", "32",
    "--heads", "2",
    "--learning-rate", "1e-2",
    "--sample-length", "50",
    "--seed", "3",
]  # fmt: skip
LOSSES = re.compile(r"training loss (\d+\.\d{3}), validation loss (\d+\.\d{3}) nats/char")
LAST_LINE = re.compile(r"validation loss: (\d+\.\d{3}) nats/char")


ct = load_example("char_transformer")


@pytest.fixture(scope="module")
def corpus():
    return ct.load_corpus()


@pytest.fixture(scope="module")
def tiny_args():
    return ct.build_parser().parse_args(TINY)


@pytest.fixture(scope="module")
def model(corpus, tiny_args):
    """An untrained tiny model in evaluation mode (dropout off), as sampling uses it."""
    model = ct.build_model(len(corpus.vocabulary), tiny_args, jax.random.key(0))
    model.eval()
    return model


# Compiled once each: on a CPU, that is much quicker than running the layers op by op.
forward = pg.jit(lambda model, tokens: model(tokens))
decode_step = pg.jit(lambda model, token, position: model(token, start=position, decode=True))


@pytest.fixture(scope="module")
def tiny_run():
    """One short run of the script, as a user would start it."""
    # This run checks behaviour, not speed: XLA's cheapest optimisation level about halves
    # the compilation time of the three compiled functions.
    flags = os.environ.get("XLA_FLAGS", "")
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_backend_optimization_level=0".strip()}
    return run_example("char_transformer", *TINY, env=env)


def test_short_run_learns_and_reports(tiny_run, corpus):
    assert tiny_run.returncode == 0, tiny_run.stdout + tiny_run.stderr
    lines = tiny_run.stdout.splitlines()
    before = next(line for line in lines if line.startswith("before training:"))
    after = next(line for line in lines if line.startswith("after training:"))
    train_before, validation_before = map(float, LOSSES.search(before).groups())
    train_after, validation_after = map(float, LOSSES.search(after).groups())
    # From about the uniform guess (ln 92 = 4.5) to well below it: letter frequencies at least.
    assert train_before > 4.0
    assert train_after < train_before - 1.0
    assert validation_after < validation_before - 0.8
    # A new key per dropout call: two per block and step, kept across the compiled steps.
    assert "dropout drew 120 keys" in tiny_run.stdout
    match = LAST_LINE.fullmatch(lines[-1])
    assert match and float(match.group(1)) == validation_after
    # The sample (which may span lines) is the prompt and then 50 corpus characters.
    header = next(i for i, line in enumerate(lines) if line.startswith("sample ("))
    text = "\n".join(lines[header + 1 : -1])
    assert text.startswith(ct.DEFAULT_PROMPT)
    continuation = text[len(ct.DEFAULT_PROMPT) :]
    assert len(continuation) == 50
    assert not corpus.vocabulary.unknown(continuation)
    assert "training" in tiny_run.stderr  # the progress bar


def test_corpus_is_stdlib_text_split_90_10(corpus, capsys):
    sys.modules.pop("this", None)  # importing it afresh would print the Zen
    text = ct.corpus_text()
    assert capsys.readouterr().out == ""
    assert text.startswith("The Zen of Python, by Tim Peters\n\nBeautiful is better than ugly.")
    assert 20_000 < len(text) < 100_000
    assert text == corpus.text  # deterministic
    assert len(corpus.train) + len(corpus.validation) == len(text)
    assert len(corpus.validation) == pytest.approx(0.1 * len(text), abs=1)
    assert corpus.vocabulary.decode(corpus.validation) == text[len(corpus.train) :]


def test_vocabulary_round_trip_and_unknown_characters():
    vocabulary = ct.Vocabulary("hello world")
    assert len(vocabulary) == 8 and vocabulary.chars[0] == " "
    ids = vocabulary.encode("world hello")
    assert ids.dtype == np.int32 and vocabulary.decode(ids) == "world hello"
    assert vocabulary.unknown("hexagon") == ["x", "a", "g", "n"]
    with pytest.raises(ValueError, match="'xagn'"):
        vocabulary.encode("hexagon")


def test_windows():
    ids = np.arange(100, dtype=np.int32)
    tiled = ct.tiled_windows(ids, 8)
    assert tiled.shape == (12, 9)
    # Consecutive windows overlap by one id, so every target is counted once.
    np.testing.assert_array_equal(tiled[:, 1:].ravel(), ids[1:97])
    windows = ct.random_windows(ids, 8, 5, np.random.default_rng(0))
    assert windows.shape == (5, 9)
    np.testing.assert_array_equal(np.diff(windows, axis=1), 1)  # consecutive text


def test_later_characters_do_not_change_earlier_logits(model, corpus):
    tokens = jnp.asarray(corpus.train[:16])
    changed = tokens.at[9].set((tokens[9] + 1) % len(corpus.vocabulary))
    logits, logits_changed = forward(model, tokens), forward(model, changed)
    assert logits.shape == (16, len(corpus.vocabulary))
    np.testing.assert_allclose(logits_changed[:9], logits[:9], atol=1e-6)
    # Position 9 and after do see the change (so the comparison above can fail).
    assert np.all(np.abs(logits_changed[9:] - logits[9:]).max(-1) > 1e-3)


def test_decode_cache_gives_the_full_forward_logits(model, corpus):
    tokens = jnp.asarray(corpus.train[100:116])
    model.init_cache()
    stepped = [decode_step(model, tokens[t : t + 1], jnp.int32(t)) for t in range(16)]
    assert int(model.blocks[0].attention.cache_index.value) == 16
    np.testing.assert_allclose(jnp.concatenate(stepped), forward(model, tokens), atol=1e-5)


def test_sampling_is_seeded_and_stays_in_the_vocabulary(model, corpus):
    prompt = corpus.vocabulary.encode("Beautiful is ")
    # 40 characters with a context of 16: five windows, each starting a fresh cache.
    first = ct.sample(model, prompt, 40, 1.0, jax.random.key(0))
    again = ct.sample(model, prompt, 40, 1.0, jax.random.key(0))
    other = ct.sample(model, prompt, 40, 1.0, jax.random.key(1))
    assert first.shape == (40,)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert first.min() >= 0 and first.max() < len(corpus.vocabulary)
    assert len(ct.sample(model, prompt, 0, 1.0, jax.random.key(0))) == 0


def test_greedy_sampling_follows_the_full_forward_argmax(model, corpus):
    prompt = corpus.vocabulary.encode("Errors should")  # 13 + 4 fit in one window (17)
    greedy = ct.sample(model, prompt, 4, 0.0, jax.random.key(0))
    # Recompute without the cache. The model is causal, so whatever follows the text in the
    # buffer does not matter, and one buffer shape serves every step.
    buffer = np.zeros(16, np.int32)
    buffer[: len(prompt)] = prompt
    for length in range(len(prompt), len(prompt) + 4):
        next_id = int(jnp.argmax(forward(model, buffer)[length - 1]))
        if length < 16:
            buffer[length] = next_id
    np.testing.assert_array_equal(greedy[:3], buffer[len(prompt) :])
    assert greedy[3] == next_id


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--context", "0"], "argument --context: must be at least 1, got 0"),
        (["--context", "100000"], "argument --context: must be at most "),
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--width", "30", "--heads", "4"], "argument --width: must be a multiple of --heads"),
        (["--temperature", "-1"], "argument --temperature: must be 0 or more, got -1.0"),
        (["--prompt", "Café"], "argument --prompt: 'é' never occurs in the corpus"),
    ],
    ids=["context-0", "context-long", "steps-0", "width-heads", "temperature", "prompt"],
)
def test_bad_arguments_exit_2_before_any_work(args, message, capsys):
    assert_refused(ct.main, args, message, capsys)
