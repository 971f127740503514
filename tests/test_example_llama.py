"""The LLaMA-style example (examples/llama.py): a short run as a subprocess (in the
background, while the rest runs), then its parts imported: the layer's numerics against a
hand-written jax.numpy version, causality, the key/value cache, the tied head, LoRA, the
EMA and the command line."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from example_scripts import assert_refused, load_example, started_example

import pytree_graph as pg
from pytree_filter import All, Not
from pytree_graph import Param
from pytree_nn import EMA, LoRA, LoRAParam, Optimizer, Rngs

llama = load_example("llama")

# A model small enough to compile and train in seconds, still able to learn something.
TINY = [
    "--steps", "40",
    "--lora-steps", "30",
    "--batch-size", "16",
    "--context", "16",
    "--layers", "1",
    "--width", "16",
    "--heads", "2",
    "--kv-heads", "1",
    "--hidden", "32",
    "--learning-rate", "2e-2",
    "--lora-learning-rate", "3e-2",
    "--sample-length", "30",
    "--seed", "1",
]  # fmt: skip
NUMBER = r"(\d+\.\d{3})"

# Grouped-query attention: 4 query heads in 2 groups, each sharing a key/value head.
CONFIG = llama.Config(vocab_size=24, width=32, layers=2, heads=4, kv_heads=2, hidden=48, context=12)

# Compiled once each: on a CPU, much quicker than running the layers op by op.
forward = pg.jit(lambda model, tokens: model(tokens))
decode = pg.jit(lambda model, tokens, cache, start: model.decode(tokens, cache, start))
loss_and_grads = pg.jit(pg.value_and_grad(llama.next_token_loss))
# One optax transformation for every test, so that `train_step` compiles once per model
# structure (the optimizer's transformation is part of what the compiled step depends on).
TX = optax.adam(1e-2)


@pytest.fixture(scope="module", autouse=True)
def tiny_run():
    """One short run of the script, started first and read by the last test."""
    # This run checks behaviour, not speed: XLA's cheapest optimisation level about halves
    # the compilation time.
    flags = os.environ.get("XLA_FLAGS", "")
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_backend_optimization_level=0".strip()}
    with started_example("llama", *TINY, env=env) as process:
        yield process


@pytest.fixture(scope="module")
def model():
    return llama.Llama(CONFIG, rngs=0)


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, CONFIG.context), 0, CONFIG.vocab_size)


# --- a hand-written version, on the model's own arrays ---------------------------------


def rms_norm(x, scale, epsilon):
    return x * jax.lax.rsqrt(jnp.mean(x**2, -1, keepdims=True) + epsilon) * scale


def rotate(x, theta):
    """Rotary embeddings, "rotate half" pairing, positions 0 .. length - 1 (x: b, t, h, d)."""
    length, size = x.shape[1], x.shape[-1]
    frequencies = 1.0 / theta ** (jnp.arange(0, size, 2, dtype=jnp.float32) / size)
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * frequencies
    cos, sin = jnp.cos(angles)[None, :, None], jnp.sin(angles)[None, :, None]
    first, second = x[..., : size // 2], x[..., size // 2 :]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], -1)


def reference(model, tokens, embedding, head):
    """The logits, layer by layer in jax.numpy, with `embedding` as the input table and
    `head` as the output matrix (both the model's tied table, or replacements)."""
    config, layers = model.config, model.layers
    batch, length = tokens.shape
    heads, kv_heads, size = config.heads, config.kv_heads, config.head_size
    group = heads // kv_heads
    causal = jnp.tril(jnp.ones((length, length), bool))
    x = embedding[tokens]
    for i in range(config.layers):
        attention, mlp = layers.attention, layers.mlp

        def kernel(linear, i=i):
            return linear.kernel.value[i]

        h = rms_norm(x, layers.attention_norm.scale.value[i], config.norm_epsilon)
        q = rotate(
            (h @ kernel(attention.query)).reshape(batch, length, heads, size), config.rope_theta
        )
        k = rotate(
            (h @ kernel(attention.key)).reshape(batch, length, kv_heads, size), config.rope_theta
        )
        v = (h @ kernel(attention.value)).reshape(batch, length, kv_heads, size)
        # Query head j reads key/value head j // group.
        k, v = k[:, :, np.arange(heads) // group], v[:, :, np.arange(heads) // group]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(size)
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, heads * size)
        x = x + attended @ kernel(attention.output)
        h = rms_norm(x, layers.mlp_norm.scale.value[i], config.norm_epsilon)
        x = x + (jax.nn.silu(h @ kernel(mlp.gate)) * (h @ kernel(mlp.up))) @ kernel(mlp.down)
    return rms_norm(x, model.norm.scale.value, config.norm_epsilon) @ head.T


reference_logits = pg.jit(reference)


# --- the model -------------------------------------------------------------------------


def test_structure_is_stacked_and_tied(model):
    layers = model.layers
    assert layers.attention.query.kernel.value.shape == (2, 32, 32)
    assert layers.attention.key.kernel.value.shape == (2, 32, 16)  # 2 kv heads of 8
    assert layers.attention.value.kernel.value.shape == (2, 32, 16)
    assert layers.mlp.gate.kernel.value.shape == (2, 32, 48)
    assert layers.mlp.down.kernel.value.shape == (2, 48, 32)
    assert layers.attention_norm.scale.value.shape == (2, 32)
    assert layers.attention.query.bias is None
    # The layers drew different keys.
    assert not np.allclose(layers.mlp.up.kernel.value[0], layers.mlp.up.kernel.value[1])
    # One table of (vocab, width) and no other matrix of that shape: the head is the table.
    shapes = [leaf.shape for leaf in jax.tree.leaves(pg.state(model, Param))]
    assert shapes.count((24, 32)) == 1 and shapes.count((32, 24)) == 0


def test_forward_matches_hand_written_grouped_query_layers(model, tokens):
    logits = forward(model, tokens)
    assert logits.shape == (2, CONFIG.context, CONFIG.vocab_size)
    assert logits.dtype == jnp.float32
    expected = reference_logits(model, tokens, *[model.embed.embedding.value] * 2)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    # Pairing query head j with key/value head j % kv_heads instead gives other numbers,
    # so the check above sees the grouping.
    shuffled = pg.clone(model)
    key = shuffled.layers.attention.key.kernel
    key.value = key.value.reshape(2, 32, 2, 8)[:, :, ::-1].reshape(2, 32, 16)
    assert not np.allclose(forward(shuffled, tokens), logits, atol=1e-3)


def test_later_tokens_do_not_change_earlier_logits(model, tokens):
    changed = tokens.at[:, 7].set((tokens[:, 7] + 1) % CONFIG.vocab_size)
    logits, logits_changed = forward(model, tokens), forward(model, changed)
    np.testing.assert_allclose(logits_changed[:, :7], logits[:, :7], atol=1e-6)
    assert np.all(np.abs(logits_changed[:, 7:] - logits[:, 7:]).max(-1) > 1e-4)


def test_cache_decoding_gives_the_full_forward_logits(model, tokens):
    full = forward(model, tokens)
    # One token at a time, then a prompt of 5 in one call followed by single tokens.
    cache = model.init_cache(2, CONFIG.context)
    stepped = []
    for t in range(CONFIG.context):
        logits, cache = decode(model, tokens[:, t : t + 1], cache, jnp.int32(t))
        stepped.append(logits)
    np.testing.assert_allclose(jnp.concatenate(stepped, 1), full, rtol=1e-5, atol=1e-5)
    prefill, cache = decode(model, tokens[:, :5], model.init_cache(2, CONFIG.context), jnp.int32(0))
    np.testing.assert_allclose(prefill, full[:, :5], rtol=1e-5, atol=1e-5)
    assert cache.keys.shape == (2, 2, CONFIG.context, 2, 8)  # (layers, batch, length, kv, head)
    np.testing.assert_array_equal(cache.keys[:, :, 5:], 0)  # nothing written past the prompt


def test_greedy_generation_follows_the_full_forward_argmax(model, tokens):
    prompt = np.asarray(tokens[0, :4])
    buffer = np.zeros(CONFIG.context + 1, np.int32)
    buffer[:4] = prompt
    filled, logits = llama.generate_window(model, buffer, np.int32(4))
    filled = np.asarray(filled)
    np.testing.assert_array_equal(filled[:4], prompt)
    # The compiled loop's logits at every position are the full pass's on what it wrote.
    full = forward(model, np.stack([filled[:-1]] * 2))[0]  # the tests' batch of 2
    np.testing.assert_allclose(logits, full, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(filled[5:], np.argmax(full[4:], -1))
    # Longer than a window: the cache restarts from the last context // 2 ids.
    text = llama.generate(model, prompt, 30)
    assert text.shape == (30,) and text.dtype == np.int32
    np.testing.assert_array_equal(text[: CONFIG.context - 3], filled[4:])


def test_next_token_loss(model, tokens):
    windows = jnp.concatenate([tokens, tokens[:, :1]], 1)
    logits = reference_logits(model, windows[:, :-1], *[model.embed.embedding.value] * 2)
    expected = -jnp.take_along_axis(jax.nn.log_softmax(logits), windows[:, 1:, None], -1).mean()
    np.testing.assert_allclose(loss_and_grads(model, windows)[0], expected, rtol=1e-5)


def test_config_refuses_bad_sizes():
    with pytest.raises(ValueError, match=r"kv_heads \(3\) must divide heads \(4\)"):
        llama.Config(vocab_size=5, width=32, layers=1, heads=4, kv_heads=3, hidden=8, context=4)
    with pytest.raises(ValueError, match="head size width // heads must be even"):
        llama.Config(vocab_size=5, width=12, layers=1, heads=4, kv_heads=1, hidden=8, context=4)
    with pytest.raises(ValueError, match="layers must be a positive int, got 0"):
        llama.Config(vocab_size=5, width=8, layers=0, heads=2, kv_heads=1, hidden=8, context=4)


# --- training: the tied head, the EMA, LoRA --------------------------------------------


def windows_for(seed, batch=2):
    ids = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, 200).astype(np.int32)
    return llama.random_windows(ids, CONFIG.context, batch, np.random.default_rng(seed))


def test_tied_head_gets_both_gradients_and_stays_shared(model):
    model = pg.clone(model)
    windows = windows_for(0)
    table = model.embed.embedding.value

    def loss(embedding, head):
        logits = reference(model, jnp.asarray(windows[:, :-1]), embedding, head)
        return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean()

    as_input, as_output = jax.jit(jax.grad(loss, argnums=(0, 1)))(table, table)
    _, grads = loss_and_grads(model, windows)
    np.testing.assert_allclose(
        grads["embed"]["embedding"].value, as_input + as_output, rtol=1e-4, atol=1e-6
    )
    # Split and merged, then one training step: still one table, in both roles.
    graphdef, state = pg.split(model)
    model = pg.merge(graphdef, state)
    assert len([p for p in state.flat_state() if p[0] == "embed"]) == 1
    llama.train_step(model, Optimizer(model, TX), llama.new_metrics(), windows, EMA(model, 0.9))
    new_table = model.embed.embedding.value
    assert not np.allclose(new_table, table)
    np.testing.assert_allclose(
        forward(model, windows[:, :-1]),
        reference_logits(model, windows[:, :-1], new_table, new_table),
        rtol=1e-5,
        atol=1e-5,
    )


def test_ema_follows_the_weights_and_evaluates(model):
    model = pg.clone(model)
    optimizer = Optimizer(model, TX)
    ema = EMA(model, 0.9)
    start = model.layers.mlp.up.kernel.value
    logs = llama.new_metrics()
    llama.train_step(model, optimizer, logs, windows_for(1), ema)
    # The average moved a tenth of the way to the new weights.
    np.testing.assert_allclose(
        ema.params["layers"]["mlp"]["up"]["kernel"].value,
        0.9 * start + 0.1 * model.layers.mlp.up.kernel.value,
        rtol=1e-6,
        atol=1e-7,
    )
    assert int(logs.loss.count.value) == 1 and int(logs.accuracy.count.value) == 2 * 12
    averaged = ema.apply_to(model)
    assert averaged.embed.embedding is ema.params["embed"]["embedding"]  # still one table
    windows = llama.tiled_windows(np.asarray(windows_for(2)).ravel(), CONFIG.context)
    raw, smoothed = llama.evaluate(model, windows), llama.evaluate(averaged, windows)
    assert set(raw) == {"loss", "accuracy"} and 0 <= smoothed["accuracy"] <= 1
    assert np.isfinite(smoothed["loss"]) and smoothed["loss"] != raw["loss"]


def test_lora_trains_the_adapters_alone(model):
    model = pg.clone(model)
    windows = windows_for(3)
    base_loss, _ = loss_and_grads(model, windows)
    llama.add_adapters(model, 2, Rngs(params=5))
    query = model.layers.attention.query
    assert isinstance(query, LoRA) and query.lora_a.value.shape == (2, 32, 2)
    assert query.lora_b.value.shape == (2, 2, 32)
    assert isinstance(model.layers.mlp.down.base_module.kernel, Param)

    base = All(Param, Not(LoRAParam))
    frozen = {path: v.value for path, v in pg.state(model, base).flat_state().items()}
    # Stacked: one kernel per projection and a scale per norm for all layers; the table, a norm.
    assert len(frozen) == 7 + 2 + 2
    optimizer = Optimizer(model, TX, wrt=LoRAParam)
    logs = llama.new_metrics()
    llama.train_step(model, optimizer, logs, windows)
    first = float(logs.loss.compute())
    # Fresh adapters add nothing (lora_b is zero): the first loss is the base model's.
    np.testing.assert_allclose(first, base_loss, rtol=1e-6)
    for _ in range(15):
        llama.train_step(model, optimizer, logs, windows)
    logs.reset()
    llama.train_step(model, optimizer, logs, windows)
    assert float(logs.loss.compute()) < first - 0.3
    after = pg.state(model, base).flat_state()
    assert after.keys() == frozen.keys()
    for path, variable in after.items():
        assert np.array_equal(variable.value, frozen[path]), path
    assert not np.allclose(model.layers.mlp.down.lora_b.value, 0)


# --- the script ------------------------------------------------------------------------


def test_windows():
    ids = np.arange(100, dtype=np.int32)
    tiled = llama.tiled_windows(ids, 8)
    assert tiled.shape == (12, 9)
    np.testing.assert_array_equal(tiled[:, 1:].ravel(), ids[1:97])  # each target once


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-heads", "3"], "argument --kv-heads: must divide --heads (4), got 3"),
        (["--width", "30", "--heads", "4"], "argument --width: must be a multiple of --heads"),
        (["--width", "12", "--heads", "4"], "the head size --width / --heads must be even"),
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--ema-decay", "1"], "argument --ema-decay: must be in [0, 1), got 1.0"),
        (["--lora-rank", "0"], "argument --lora-rank: must be at least 1, got 0"),
        (["--text", "docs/missing.md"], "argument --text: no file at 'docs/missing.md'"),
        (["--context", "5000"], "argument --context: must be at most "),
        (["--prompt", "Café"], "argument --prompt: 'é' never occurs in the texts"),
    ],
    ids=[
        "kv-heads",
        "width-heads",
        "odd-head",
        "steps",
        "ema",
        "rank",
        "text",
        "context",
        "prompt",
    ],
)
def test_bad_arguments_exit_2_before_any_work(args, message, capsys):
    assert_refused(llama.main, args, message, capsys)


def test_short_run_learns_fine_tunes_and_writes(tiny_run):
    stdout, stderr = tiny_run.communicate(timeout=300)
    assert tiny_run.returncode == 0, stdout + stderr
    lines = stdout.splitlines()

    def numbers(prefix, pattern):
        line = next(line for line in lines if line.startswith(prefix))
        return [float(n) for n in re.search(pattern, line).groups()]

    (start,) = numbers("before training:", f"held-out loss {NUMBER}")
    raw, ema = numbers("after pre-training", f"held-out loss {NUMBER}.*EMA.*loss {NUMBER}")
    assert start > 4.0 and raw < start - 1.0  # from about uniform to letter frequencies
    assert np.isfinite(ema) and ema != raw
    (lora_before,) = numbers("LoRA:", f"LoRA text {NUMBER}")
    (lora_after,) = numbers("after fine-tuning:", f"LoRA text {NUMBER}")
    assert lora_after < lora_before - 0.03  # about 0.1 with these arguments
    assert next(line for line in lines if line.startswith("after fine-tuning:")).endswith(
        "base weights unchanged: True"
    )
    assert sum(line.startswith("  step ") for line in lines) == 10  # the logs
    assert sum(line.startswith("  LoRA step ") for line in lines) == 10
    header = next(i for i, line in enumerate(lines) if line.startswith("greedy sample"))
    text = "\n".join(lines[header + 1 : -1])
    assert text.startswith(llama.DEFAULT_PROMPT) and len(text) == len(llama.DEFAULT_PROMPT) + 30
    assert lines[-1] == f"LoRA text held-out loss: {lora_after:.3f} nats/char"
