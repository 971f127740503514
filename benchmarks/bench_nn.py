"""Benchmark pytree_nn training steps against hand-written JAX + optax, Equinox and Flax NNX.

Two models, each built once with pytree_nn layers; every other form is given the very same
arrays (float32):

* a small CNN on 28x28x1 images, batch 64: ``Conv(1, 16, (3, 3))``, relu, 2x2 average pool,
  ``Conv(16, 32, (3, 3))``, relu, 2x2 average pool, ``Linear(7 * 7 * 32, 10)``; softmax
  cross-entropy against integer labels;
* a stack of 4 pre-norm transformer blocks of width 128 (4 heads, MLP 512 with gelu, causal
  self-attention) on sequences of 64, batch 8; mean squared error against a random target.

Each form runs the same training step, ``optax.adam(1e-3)`` on every parameter:

* hand-written: a dict of arrays and a forward pass written with ``jax.lax`` / ``jax.numpy``,
  ``jax.value_and_grad``, ``tx.update`` and ``optax.apply_updates`` under ``jax.jit``: the
  baseline (target for pytree_nn: at least 0.98x its throughput, so at most 1/0.98 = 1.020x
  its time per step);
* pytree_nn, graph style: ``Optimizer(model, tx, wrt=Param)`` and ``optimizer.update(model,
  grads)`` inside ``pytree_graph.jit``, with ``pytree_graph.value_and_grad``;
* pytree_nn, functional style: ``filter_value_and_grad``, ``tx.update`` and ``apply_updates``
  inside ``pytree_transforms.filter_jit``;
* Equinox: ``eqx.nn`` layers (channels-first and unbatched, as Equinox writes them, under
  ``jax.vmap``), ``eqx.filter_value_and_grad`` and ``eqx.apply_updates`` in
  ``eqx.filter_jit``;
* Flax NNX: ``nnx`` layers, ``nnx.Optimizer`` and ``nnx.value_and_grad`` in ``nnx.jit``.

Before timing, one step of each is checked against the others: the loss it returns (at the
shared starting weights) and the loss after it (so the update itself is compared).

Measured in one run, with synchronous CPU dispatch:

1. The time per training step of each form, for both models (ratios against hand-written).
2. The time of the first call of a freshly wrapped step on a 24-layer stack of the same
   transformer blocks: tracing, compiling and running one step (ratios against
   hand-written). For the hand-written step the report also splits this into tracing,
   lowering and compiling, with JAX's ahead-of-time API.
3. The time to build the CNN outside ``jit``, compiling its random draws included (JAX's
   caches cleared before each build; ratios against drawing the same arrays with
   ``jax.nn.initializers`` into a dict).
4. The time to build the 24-block stack eagerly and by one compiled program
   (``pytree_nn.build``, ``nnx.jit`` and ``eqx.filter_jit`` on a constructor), the first
   call (compiling) and the next (the program kept); ratios against pytree_nn's eager
   construction, target for ``build``'s first call: at least 3x faster.

Usage:
    python benchmarks/bench_nn.py [--quick] [--out PATH]

``--quick`` is a smoke run (smaller first-call stack, few repeats); it writes a file only when
``--out`` is given. A full run writes ``benchmarks/results/nn.md`` unless ``--out`` says
otherwise. Equinox and Flax are optional: without them their rows say "not installed".
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Case, Runner, Target, built_case, first_line
from _report import (
    Invocation,
    log,
    record_table,
    report_head,
    run_script,
    section,
    target_lines,
)
from _timing import Row, Settings, dist_version

import pytree_graph
import pytree_nn
import pytree_transforms
from pytree_filter import filter as filter_tree
from pytree_filter import is_inexact_array
from pytree_graph import Param
from pytree_nn import Conv, LayerNorm, Linear, MultiHeadAttention, Optimizer, avg_pool

try:
    import equinox as eqx
except ImportError:
    eqx = None
try:
    from flax import nnx
except ImportError:
    nnx = None

LEARNING_RATE = 1e-3
EPSILON = 1e-6  # LayerNorm's, set alike in every library
IMAGE = (28, 28, 1)
CLASSES = 10


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sizes of a run: the batch of the CNN, and the transformer's."""

    cnn_batch: int
    width: int
    heads: int
    sequence: int
    batch: int
    stack: int  # blocks in the stack whose training step is timed
    deep_stack: int  # blocks in the stack whose first call is timed

    @property
    def hidden(self) -> int:
        return 4 * self.width


FULL = Shapes(cnn_batch=64, width=128, heads=4, sequence=64, batch=8, stack=4, deep_stack=24)
# A smoke run checks that everything runs: small shapes compile in a fraction of the time.
QUICK = Shapes(cnn_batch=4, width=16, heads=2, sequence=8, batch=2, stack=1, deep_stack=1)

HAND = "hand-written: jax.jit, jax.value_and_grad, optax"
GRAPH = "pytree_nn, graph style: pytree_graph.jit, Optimizer.update"
FUNCTIONAL = "pytree_nn, functional style: filter_jit, filter_value_and_grad, apply_updates"
EQUINOX = "Equinox: eqx.filter_jit, eqx.filter_value_and_grad, eqx.apply_updates"
NNX = "Flax NNX: nnx.jit, nnx.value_and_grad, nnx.Optimizer.update"

THROUGHPUT_TARGET = Target(">= 0.98x throughput (<= 1.020x time)", 1 / 0.98)
MISSING = {"equinox": "equinox not installed", "flax": "flax not installed"}


def _unavailable(library: Any, name: str) -> str:
    return "" if library is not None else MISSING[name]


# ------------------------------------------------------------------------------ the models


class CNN(pytree_nn.Module):
    """The small CNN, in pytree_nn layers (channels-last)."""

    def __init__(self, rngs: Any):
        self.conv1 = Conv(1, 16, (3, 3), rngs=rngs)
        self.conv2 = Conv(16, 32, (3, 3), rngs=rngs)
        self.head = Linear(7 * 7 * 32, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = avg_pool(jax.nn.relu(self.conv1(x)), (2, 2), strides=(2, 2))
        x = avg_pool(jax.nn.relu(self.conv2(x)), (2, 2), strides=(2, 2))
        return self.head(x.reshape(x.shape[0], -1))


class Block(pytree_nn.Module):
    """A pre-norm transformer block: causal self-attention, then a gelu MLP."""

    def __init__(self, width: int, heads: int, rngs: Any):
        self.ln1 = LayerNorm(width, epsilon=EPSILON, rngs=rngs)
        self.attn = MultiHeadAttention(heads, width, rngs=rngs)
        self.ln2 = LayerNorm(width, epsilon=EPSILON, rngs=rngs)
        self.up = Linear(width, 4 * width, rngs=rngs)
        self.down = Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class Transformer(pytree_nn.Module):
    """A stack of `Block`s."""

    def __init__(self, depth: int, width: int, heads: int, rngs: Any):
        self.blocks = [Block(width, heads, rngs) for _ in range(depth)]

    def __call__(self, x: jax.Array) -> jax.Array:
        mask = causal_mask(x.shape[-2])[None, None]
        for block in self.blocks:
            x = block(x, mask)
        return x


def causal_mask(length: int) -> jax.Array:
    """True where a position may attend: itself and the positions before it."""
    return jnp.tril(jnp.ones((length, length), bool))


def flat_arrays(model: Any) -> dict[str, jax.Array]:
    """A pytree_nn model's parameters by path (``"blocks/0/attn/query/kernel"``)."""
    flat = pytree_graph.state(model, Param).flat_state()
    return {"/".join(map(str, path)): variable.value for path, variable in flat.items()}


# ------------------------------------------------------------- hand-written: a dict of arrays


def dense(p: dict[str, jax.Array], name: str, x: jax.Array) -> jax.Array:
    return x @ p[f"{name}/kernel"] + p[f"{name}/bias"]


def conv(p: dict[str, jax.Array], name: str, x: jax.Array) -> jax.Array:
    y = jax.lax.conv_general_dilated(
        x, p[f"{name}/kernel"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y + p[f"{name}/bias"]


def pool(x: jax.Array) -> jax.Array:
    summed = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return summed / 4.0


def cnn_forward(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    x = pool(jax.nn.relu(conv(p, "conv1", x)))
    x = pool(jax.nn.relu(conv(p, "conv2", x)))
    return dense(p, "head", x.reshape(x.shape[0], -1))


def layer_norm(p: dict[str, jax.Array], name: str, x: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    normed = (x - mean) * jax.lax.rsqrt(variance + EPSILON)
    return normed * p[f"{name}/scale"] + p[f"{name}/bias"]


def attention(p: dict[str, jax.Array], name: str, x: jax.Array, mask: jax.Array) -> jax.Array:
    def project(part: str, x: jax.Array, axes: int) -> jax.Array:
        kernel, bias = p[f"{name}/{part}/kernel"], p[f"{name}/{part}/bias"]
        return jnp.tensordot(x, kernel, axes=axes) + bias

    q, k, v = (project(part, x, 1) for part in ("query", "key", "value"))
    logits = jnp.einsum("bqhk,bshk->bhqs", q / math.sqrt(q.shape[-1]), k)
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    mixed = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(logits, axis=-1), v)
    return project("out", mixed, 2)


def transformer_forward(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    depth = len({key.split("/")[1] for key in p})
    mask = causal_mask(x.shape[-2])[None, None]  # made once, as the layered forms do
    for i in range(depth):
        block = f"blocks/{i}"
        x = x + attention(p, f"{block}/attn", layer_norm(p, f"{block}/ln1", x), mask)
        h = jax.nn.gelu(dense(p, f"{block}/up", layer_norm(p, f"{block}/ln2", x)))
        x = x + dense(p, f"{block}/down", h)
    return x


# ------------------------------------------------------------------------------ Equinox


def _equinox_linear(p: dict[str, jax.Array], name: str) -> Any:
    kernel = p[f"{name}/kernel"]
    layer = eqx.nn.Linear(kernel.shape[0], kernel.shape[1], key=jax.random.key(0))
    return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (kernel.T, p[f"{name}/bias"]))


def _equinox_conv(p: dict[str, jax.Array], name: str) -> Any:
    kernel = p[f"{name}/kernel"]  # HWIO; Equinox's is OIHW, its bias (O, 1, 1)
    layer = eqx.nn.Conv2d(
        kernel.shape[2], kernel.shape[3], 3, padding="SAME", key=jax.random.key(0)
    )
    weight, bias = kernel.transpose(3, 2, 0, 1), p[f"{name}/bias"][:, None, None]
    return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (weight, bias))


def _equinox_norm(p: dict[str, jax.Array], name: str) -> Any:
    layer = eqx.nn.LayerNorm(p[f"{name}/scale"].shape[0], eps=EPSILON)
    return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (p[f"{name}/scale"], p[f"{name}/bias"]))


def _equinox_attention(p: dict[str, jax.Array], name: str) -> Any:
    width, heads, _ = p[f"{name}/query/kernel"].shape
    layer = eqx.nn.MultiheadAttention(
        heads,
        width,
        use_query_bias=True,
        use_key_bias=True,
        use_value_bias=True,
        use_output_bias=True,
        key=jax.random.key(0),
    )
    # Ours are (in, heads, head_dim) and (heads, head_dim, out); Equinox's are (out, in).
    projections = [
        (p[f"{name}/{part}/kernel"].reshape(width, width).T, p[f"{name}/{part}/bias"].ravel())
        for part in ("query", "key", "value")
    ]
    out = (p[f"{name}/out/kernel"].reshape(width, width).T, p[f"{name}/out/bias"])
    leaves = [array for pair in [*projections, out] for array in pair]

    def where(m: Any) -> tuple[Any, ...]:
        return tuple(
            leaf
            for proj in (m.query_proj, m.key_proj, m.value_proj, m.output_proj)
            for leaf in (proj.weight, proj.bias)
        )

    return eqx.tree_at(where, layer, tuple(leaves))


if eqx is not None:

    class EquinoxCNN(eqx.Module):
        conv1: Any
        conv2: Any
        head: Any
        pool: Any

        def __init__(self, p: dict[str, jax.Array]):
            self.conv1 = _equinox_conv(p, "conv1")
            self.conv2 = _equinox_conv(p, "conv2")
            self.head = _equinox_linear(p, "head")
            self.pool = eqx.nn.AvgPool2d(2, 2)

        def __call__(self, image: jax.Array) -> jax.Array:  # one (C, H, W) image
            x = self.pool(jax.nn.relu(self.conv1(image)))
            x = self.pool(jax.nn.relu(self.conv2(x)))
            # Flatten in (H, W, C) order, as the channels-last forms do.
            return self.head(x.transpose(1, 2, 0).ravel())

    class EquinoxBlock(eqx.Module):
        ln1: Any
        attn: Any
        ln2: Any
        up: Any
        down: Any

        def __init__(self, p: dict[str, jax.Array], name: str):
            self.ln1 = _equinox_norm(p, f"{name}/ln1")
            self.attn = _equinox_attention(p, f"{name}/attn")
            self.ln2 = _equinox_norm(p, f"{name}/ln2")
            self.up = _equinox_linear(p, f"{name}/up")
            self.down = _equinox_linear(p, f"{name}/down")

        def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:  # one example
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h, mask=mask)
            h = jax.nn.gelu(jax.vmap(self.up)(jax.vmap(self.ln2)(x)))
            return x + jax.vmap(self.down)(h)

    class EquinoxTransformer(eqx.Module):
        blocks: list

        def __init__(self, p: dict[str, jax.Array]):
            depth = len({key.split("/")[1] for key in p})
            self.blocks = [EquinoxBlock(p, f"blocks/{i}") for i in range(depth)]

        def __call__(self, x: jax.Array) -> jax.Array:
            mask = causal_mask(x.shape[0])
            for block in self.blocks:
                x = block(x, mask)
            return x


def equinox_cnn_forward(model: Any, x: jax.Array) -> jax.Array:
    return jax.vmap(model)(x.transpose(0, 3, 1, 2))  # NHWC -> NCHW


def equinox_transformer_forward(model: Any, x: jax.Array) -> jax.Array:
    return jax.vmap(model)(x)


# ------------------------------------------------------------------------------- Flax NNX


def _nnx_with_arrays(model: Any, p: dict[str, jax.Array]) -> Any:
    """`model` (an NNX module of the same attribute names) holding the arrays of `p`."""
    state = nnx.state(model, nnx.Param)
    for path, variable in state.flat_state():
        variable.value = p["/".join(map(str, path))]
    nnx.update(model, state)
    return model


if nnx is not None:

    class NnxCNN(nnx.Module):
        def __init__(self, rngs: Any):
            self.conv1 = nnx.Conv(1, 16, (3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(16, 32, (3, 3), rngs=rngs)
            self.head = nnx.Linear(7 * 7 * 32, CLASSES, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            x = nnx.avg_pool(jax.nn.relu(self.conv1(x)), (2, 2), strides=(2, 2))
            x = nnx.avg_pool(jax.nn.relu(self.conv2(x)), (2, 2), strides=(2, 2))
            return self.head(x.reshape(x.shape[0], -1))

    class NnxBlock(nnx.Module):
        def __init__(self, width: int, heads: int, rngs: Any):
            self.ln1 = nnx.LayerNorm(width, epsilon=EPSILON, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(width, epsilon=EPSILON, rngs=rngs)
            self.up = nnx.Linear(width, 4 * width, rngs=rngs)
            self.down = nnx.Linear(4 * width, width, rngs=rngs)

        def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))

    class NnxTransformer(nnx.Module):
        def __init__(self, depth: int, width: int, heads: int, rngs: Any):
            self.blocks = nnx.List([NnxBlock(width, heads, rngs) for _ in range(depth)])

        def __call__(self, x: jax.Array) -> jax.Array:
            mask = causal_mask(x.shape[-2])[None, None]
            for block in self.blocks:
                x = block(x, mask)
            return x


if eqx is not None:

    class EqxBuiltBlock(eqx.Module):
        """The transformer block in Equinox layers, built from a key (for the build times)."""

        ln1: Any
        attn: Any
        ln2: Any
        up: Any
        down: Any

        def __init__(self, width: int, heads: int, key: jax.Array):
            keys = jax.random.split(key, 3)
            self.ln1 = eqx.nn.LayerNorm(width, eps=EPSILON)
            self.attn = eqx.nn.MultiheadAttention(
                heads,
                width,
                use_query_bias=True,
                use_key_bias=True,
                use_value_bias=True,
                use_output_bias=True,
                key=keys[0],
            )
            self.ln2 = eqx.nn.LayerNorm(width, eps=EPSILON)
            self.up = eqx.nn.Linear(width, 4 * width, key=keys[1])
            self.down = eqx.nn.Linear(4 * width, width, key=keys[2])

    def equinox_built_transformer(depth: int, width: int, heads: int, key: jax.Array) -> Any:
        return [EqxBuiltBlock(width, heads, k) for k in jax.random.split(key, depth)]


# -------------------------------------------------------------------------- the problems


@dataclasses.dataclass
class Problem:
    """A model, as pytree_nn builds it, its data and loss, and each library's form of it."""

    name: str
    model: Any  # the pytree_nn model; every other form holds copies of its arrays
    x: jax.Array
    y: jax.Array
    loss: Callable[[jax.Array, jax.Array], jax.Array]  # (prediction, y) -> scalar
    dict_forward: Callable[[dict[str, jax.Array], jax.Array], jax.Array]
    equinox: Callable[[dict[str, jax.Array]], Any]
    equinox_forward: Callable[[Any, jax.Array], jax.Array]
    nnx: Callable[[], Any]  # an NNX model of the same structure (arrays copied in after)

    def arrays(self) -> dict[str, jax.Array]:
        return flat_arrays(self.model)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def squared_error(prediction: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean((prediction - target) ** 2)


def cnn_problem(shapes: Shapes) -> Problem:
    images = jax.random.normal(jax.random.key(1), (shapes.cnn_batch, *IMAGE))
    labels = jax.random.randint(jax.random.key(2), (shapes.cnn_batch,), 0, CLASSES)
    return Problem(
        "small CNN",
        CNN(pytree_nn.Rngs(0)),
        images,
        labels,
        cross_entropy,
        cnn_forward,
        lambda p: EquinoxCNN(p),
        equinox_cnn_forward,
        lambda: NnxCNN(nnx.Rngs(0)),
    )


def transformer_problem(shapes: Shapes, depth: int) -> Problem:
    data_shape = (shapes.batch, shapes.sequence, shapes.width)
    x = jax.random.normal(jax.random.key(3), data_shape)
    y = jax.random.normal(jax.random.key(4), data_shape)
    return Problem(
        f"{depth}-block transformer",
        Transformer(depth, shapes.width, shapes.heads, pytree_nn.Rngs(0)),
        x,
        y,
        squared_error,
        transformer_forward,
        lambda p: EquinoxTransformer(p),
        equinox_transformer_forward,
        lambda: NnxTransformer(depth, shapes.width, shapes.heads, nnx.Rngs(0)),
    )


# -------------------------------------------------------------------- the training steps


@dataclasses.dataclass
class Trainer:
    """One form's training: `step()` takes a step and returns its loss (the loss before it);
    `loss()` is the loss at the current parameters."""

    step: Callable[[], jax.Array]
    loss: Callable[[], jax.Array]
    inputs: Callable[[], tuple[Any, ...]] | None = None  # the step's arguments


def tx() -> optax.GradientTransformation:
    return optax.adam(LEARNING_RATE)


def functional(
    problem: Problem,
    model: Any,
    forward: Callable[[Any, jax.Array], jax.Array],
    jit: Callable[[Callable], Callable],
    value_and_grad: Callable[[Callable], Callable],
    params_of: Callable[[Any], Any],
    apply_updates: Callable[[Any, Any], Any],
) -> Trainer:
    """A functional step, with each library's jit, gradient, filter and update: each call
    replaces the model and the optimizer state with new ones."""
    optimizer = tx()

    def loss_fn(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return problem.loss(forward(model, x), y)

    @jit
    def step(model: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any, Any]:
        loss, grads = value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params_of(model))
        return apply_updates(model, updates), opt_state, loss

    carry = [model, optimizer.init(params_of(model))]

    def call() -> jax.Array:
        carry[0], carry[1], loss = step(carry[0], carry[1], problem.x, problem.y)
        return loss

    evaluate = jit(loss_fn)
    return Trainer(
        call,
        lambda: evaluate(carry[0], problem.x, problem.y),
        lambda: (carry[0], carry[1], problem.x, problem.y),
    )


def in_place(
    problem: Problem,
    model: Any,
    optimizer: Any,
    jit: Callable[[Callable], Callable],
    value_and_grad: Callable[[Callable], Callable],
) -> Trainer:
    """A graph-style step: the optimizer updates the model's Variables in place."""

    def loss_fn(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return problem.loss(model(x), y)

    @jit
    def step(model: Any, optimizer: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        loss, grads = value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    evaluate = jit(loss_fn)
    return Trainer(
        lambda: step(model, optimizer, problem.x, problem.y),
        lambda: evaluate(model, problem.x, problem.y),
        lambda: (model, optimizer, problem.x, problem.y),
    )


def _call(model: Any, x: jax.Array) -> jax.Array:
    return model(x)


def _identity(tree: Any) -> Any:
    return tree


def hand_written(problem: Problem, jit: Callable[[Callable], Any] = jax.jit) -> Trainer:
    return functional(
        problem,
        problem.arrays(),
        problem.dict_forward,
        jit,
        jax.value_and_grad,
        _identity,
        optax.apply_updates,
    )


# Each form takes the `jit` that wraps its functions (its library's, by default), so that a
# benchmark can reach the wrapped step itself, e.g. to lower it.


def functional_style(problem: Problem, jit: Callable | None = None) -> Trainer:
    return functional(
        problem,
        pytree_graph.clone(problem.model),
        _call,
        jit or pytree_transforms.filter_jit,
        pytree_transforms.filter_value_and_grad,
        lambda model: filter_tree(model, is_inexact_array),
        pytree_transforms.apply_updates,
    )


def equinox_style(problem: Problem, jit: Callable | None = None) -> Trainer:
    return functional(
        problem,
        problem.equinox(problem.arrays()),
        problem.equinox_forward,
        jit or eqx.filter_jit,
        eqx.filter_value_and_grad,
        lambda model: eqx.filter(model, eqx.is_inexact_array),
        eqx.apply_updates,
    )


def graph_style(problem: Problem, jit: Callable | None = None) -> Trainer:
    model = pytree_graph.clone(problem.model)
    optimizer = Optimizer(model, tx(), wrt=Param)
    jit = jit or pytree_graph.jit
    return in_place(problem, model, optimizer, jit, pytree_graph.value_and_grad)


def nnx_style(problem: Problem, jit: Callable | None = None) -> Trainer:
    model = _nnx_with_arrays(problem.nnx(), problem.arrays())
    optimizer = nnx.Optimizer(model, tx(), wrt=nnx.Param)
    return in_place(problem, model, optimizer, jit or nnx.jit, nnx.value_and_grad)


FORMS: list[tuple[str, Callable[[Problem], Trainer], Any, str]] = [
    (HAND, hand_written, True, ""),
    (GRAPH, graph_style, True, ""),
    (FUNCTIONAL, functional_style, True, ""),
    (EQUINOX, equinox_style, eqx, "equinox"),
    (NNX, nnx_style, nnx, "flax"),
]


def _ours(name: str) -> bool:
    return name in (GRAPH, FUNCTIONAL)


def step_cases(problem: Problem) -> list[Case]:
    """A training step of each form; each checked by its first loss and the loss after it."""
    cases = []
    for name, make, library, dist in FORMS:
        trainer: list[Trainer] = []

        def build(make: Callable[[Problem], Trainer] = make, trainer: list = trainer) -> Any:
            trainer.append(make(problem))
            return trainer[0].step

        cases.append(
            built_case(
                name,
                build,
                unavailable="" if library is True else _unavailable(library, dist),
                target=THROUGHPUT_TARGET if _ours(name) else None,
                read=lambda loss, trainer=trainer: [loss, trainer[0].loss()],
            )
        )
    return cases


# ------------------------------------------------------------------ trace and compile time


def first_call_seconds(make: Callable[[Problem], Trainer], problem: Problem) -> float:
    """The time of the first step of a freshly built form: trace, compile and one step."""
    trainer = make(problem)  # builds the form and wraps a new step function: nothing cached
    start = time.perf_counter()
    jax.block_until_ready(trainer.step())
    return time.perf_counter() - start


def median_rows(
    forms: list[tuple[str, Any, Any, str]],
    seconds: Callable[[Any], float],
    repeats: int,
    label: str,
    doing: str,
) -> tuple[list[Row], dict[str, float]]:
    """The median of `repeats` timings `seconds(form)` of each `(name, form, library,
    distribution)` of `forms`, as table rows with ratios against the first form."""
    medians: dict[str, float] = {}
    why: dict[str, str] = {}
    for name, form, library, dist in forms:
        if library is None:
            why[name] = MISSING[dist]
            continue
        log(f"  {doing}: {name}")
        try:
            times = [seconds(form) for _ in range(repeats)]
        except Exception as error:
            why[name] = f"failed: {first_line(error)}"
            log(f"  {name}: {why[name]}")
            continue
        medians[name] = statistics.median(times)
    base = medians.get(forms[0][0])
    rows = []
    for name, *_ in forms:
        if name not in medians:
            rows.append(Row(label, name, None, note=why.get(name, "not run")))
            continue
        ratio = None if base is None else medians[name] / base
        rows.append(Row(label, name, medians[name] * 1e6, ratio, "—"))
    return rows, medians


def first_call_rows(
    problem: Problem, repeats: int, label: str
) -> tuple[list[Row], dict[str, float]]:
    """Median first-call time of each form over `repeats` fresh builds, as table rows."""
    seconds = partial(first_call_seconds, problem=problem)
    return median_rows(FORMS, seconds, repeats, label, "first call")


def aot_split(problem: Problem) -> dict[str, float]:
    """Tracing, lowering and compiling the hand-written step, timed apart (seconds)."""
    wrapped: list[Any] = []

    def jit(f: Callable) -> Any:
        wrapped.append(jax.jit(f))
        return wrapped[-1]

    trainer = hand_written(problem, jit)
    step = wrapped[0]  # the training step (then the loss)
    start = time.perf_counter()
    traced = step.trace(*trainer.inputs())
    traced_at = time.perf_counter()
    lowered = traced.lower()
    lowered_at = time.perf_counter()
    lowered.compile()
    compiled_at = time.perf_counter()
    return {
        "trace": traced_at - start,
        "lower": lowered_at - traced_at,
        "compile": compiled_at - lowered_at,
    }


# ------------------------------------------------------------------------ building eagerly


def _hand_built_cnn() -> dict[str, jax.Array]:
    keys = iter(jax.random.split(jax.random.key(0), 6))
    lecun = jax.nn.initializers.lecun_normal()
    zeros = jax.nn.initializers.zeros
    return {
        "conv1/kernel": lecun(next(keys), (3, 3, 1, 16)),
        "conv1/bias": zeros(next(keys), (16,)),
        "conv2/kernel": lecun(next(keys), (3, 3, 16, 32)),
        "conv2/bias": zeros(next(keys), (32,)),
        "head/kernel": lecun(next(keys), (7 * 7 * 32, CLASSES)),
        "head/bias": zeros(next(keys), (CLASSES,)),
    }


def _equinox_built_cnn() -> list[Any]:
    keys = jax.random.split(jax.random.key(0), 3)
    return [
        eqx.nn.Conv2d(1, 16, 3, padding="SAME", key=keys[0]),
        eqx.nn.Conv2d(16, 32, 3, padding="SAME", key=keys[1]),
        eqx.nn.Linear(7 * 7 * 32, CLASSES, key=keys[2]),
    ]


# name, build, library (True: always there), distribution; each build returns a pytree.
BUILDS: list[tuple[str, Callable[[], Any], Any, str]] = [
    ("hand-written: jax.nn.initializers into a dict", _hand_built_cnn, True, ""),
    ("pytree_nn: CNN(Rngs(0))", lambda: CNN(pytree_nn.Rngs(0)), True, ""),
    ("Equinox: eqx.nn.Conv2d, Conv2d, Linear", _equinox_built_cnn, eqx, "equinox"),
    ("Flax NNX: NnxCNN(nnx.Rngs(0))", lambda: nnx.state(NnxCNN(nnx.Rngs(0))), nnx, "flax"),
]


def build_seconds(build: Callable[[], Any], fresh: bool) -> float:
    """The time to build a model eagerly; with `fresh`, as in a fresh process (every draw
    compiled anew)."""
    if fresh:
        jax.clear_caches()
    start = time.perf_counter()
    jax.block_until_ready(jax.tree.leaves(build()))
    return time.perf_counter() - start


def build_rows(repeats: int, label: str, fresh: bool = True) -> list[Row]:
    """Median build time of each form over `repeats` builds, as table rows (`fresh`: each
    after clearing JAX's caches; a quick run keeps them, to spare the compiling)."""
    # A persistent compilation cache (JAX_COMPILATION_CACHE_DIR) would serve the draws
    # compiled by the first build to the next: off while timing.
    cache_was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        seconds = partial(build_seconds, fresh=fresh)
        return median_rows(BUILDS, seconds, repeats, label, "building")[0]
    finally:
        jax.config.update("jax_enable_compilation_cache", cache_was)


# ---------------------------------------------------------- building the deep stack in jit

BUILD_TARGET = Target("<= 0.333x eager (>= 3x faster)", 1 / 3)
BUILD_FIRST = "pytree_nn: pytree_nn.build(Transformer, ...), first call"


def deep_builds(shapes: Shapes) -> list[tuple[str, tuple[Callable[[], Any], bool], Any, str]]:
    """The forms of building the deep stack: (name, (build, fresh), library, distribution).

    A `fresh` build runs after `jax.clear_caches()`, as in a new process; the build after
    a compiled one keeps its program ("again"), so it times running the kept program.
    """
    sizes = (shapes.deep_stack, shapes.width, shapes.heads)
    ours = [
        (
            "pytree_nn: Transformer(...), eager",
            lambda: Transformer(*sizes, pytree_nn.Rngs(0)),
            True,
        ),
        (BUILD_FIRST, lambda: pytree_nn.build(Transformer, *sizes, pytree_nn.Rngs(0)), True),
        (
            "pytree_nn: pytree_nn.build(Transformer, ...), again",
            lambda: pytree_nn.build(Transformer, *sizes, pytree_nn.Rngs(1)),
            False,
        ),
    ]
    forms = [(name, (build, fresh), True, "") for name, build, fresh in ours]
    if nnx is not None:
        kept = nnx.jit(lambda rngs: nnx.state(NnxTransformer(*sizes, rngs)))
        forms += [
            (
                "Flax NNX: NnxTransformer(...), eager",
                (lambda: nnx.state(NnxTransformer(*sizes, nnx.Rngs(0))), True),
                nnx,
                "flax",
            ),
            (
                "Flax NNX: nnx.jit(constructor), first call",
                (lambda: kept(nnx.Rngs(0)), True),
                nnx,
                "flax",
            ),
            (
                "Flax NNX: nnx.jit(constructor), again",
                (lambda: kept(nnx.Rngs(1)), False),
                nnx,
                "flax",
            ),
        ]
    else:
        forms += [(f"Flax NNX: {what}", (None, True), None, "flax") for what in ("eager",)]
    if eqx is not None:
        built = eqx.filter_jit(equinox_built_transformer)
        forms += [
            (
                "Equinox: EqxBuiltBlock(...) list, eager",
                (lambda: equinox_built_transformer(*sizes, jax.random.key(0)), True),
                eqx,
                "equinox",
            ),
            (
                "Equinox: eqx.filter_jit(constructor), first call",
                (lambda: built(*sizes, jax.random.key(0)), True),
                eqx,
                "equinox",
            ),
            (
                "Equinox: eqx.filter_jit(constructor), again",
                (lambda: built(*sizes, jax.random.key(1)), False),
                eqx,
                "equinox",
            ),
        ]
    else:
        forms += [(f"Equinox: {what}", (None, True), None, "equinox") for what in ("eager",)]
    return forms


def deep_build_rows(shapes: Shapes, repeats: int, label: str) -> list[Row]:
    """Median time of each form of building the deep stack, as table rows (ratios against
    pytree_nn's eager construction; `build`'s first call has the target)."""
    cache_was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        rows, _ = median_rows(
            deep_builds(shapes),
            lambda form: build_seconds(*form),
            repeats,
            label,
            "building",
        )
    finally:
        jax.config.update("jax_enable_compilation_cache", cache_was)
    for row in rows:
        if row.implementation == BUILD_FIRST and row.ratio is not None:
            row.target, row.met = BUILD_TARGET.label, BUILD_TARGET.met(0.0, row.ratio)
    return rows


# ---------------------------------------------------------------------------------- run


def step_settings(quick: bool) -> Settings:
    """Training steps take milliseconds: fewer, longer repeats than the microbenchmarks."""
    if quick:
        return Settings(repeat=3, repeat_s=0.01, min_number=1, warmup=1)
    return Settings(repeat=21, repeat_s=0.2, min_number=5, warmup=10)


@dataclasses.dataclass
class Results:
    runner: Runner
    first_call: list[Row]
    first_call_medians: dict[str, float]
    aot: dict[str, float]
    build: list[Row]
    build_repeats: int
    shapes: Shapes
    repeats: int
    deep_build: list[Row]


def run(settings: Settings, quick: bool) -> Results:
    runner = Runner(settings, log)
    shapes = QUICK if quick else FULL
    for problem in (cnn_problem(shapes), transformer_problem(shapes, shapes.stack)):
        label = f"training step, {problem.name} (ratio vs hand-written)"
        runner.measure(label, step_cases(problem))

    depth = shapes.deep_stack
    repeats = 1 if quick else 3
    deep = transformer_problem(shapes, depth)
    label = f"first call (trace, compile, one step), {deep.name} (ratio vs hand-written)"
    log(f"timing {label} ...")
    rows, medians = first_call_rows(deep, repeats, label)
    aot = aot_split(deep)
    label = "building the CNN outside jit, draws compiled (ratio vs hand-written)"
    log(f"timing {label} ...")
    build_repeats = 1 if quick else 5
    built = build_rows(build_repeats, label, fresh=not quick)
    label = f"building {deep.name} (ratio vs pytree_nn eager)"
    log(f"timing {label} ...")
    deep_built = deep_build_rows(shapes, 1, label)
    return Results(runner, rows, medians, aot, built, build_repeats, shapes, repeats, deep_built)


# ------------------------------------------------------------------------------- report


def throughput_lines(rows: list[Row]) -> list[str]:
    """Each form's throughput relative to the hand-written step, by model."""
    lines = ["Throughput relative to the hand-written step (1 / time ratio):", ""]
    for row in rows:
        if row.ratio is None or row.implementation == HAND:
            continue
        model = row.measurement.split(", ")[1].split(" (")[0]
        library = row.implementation.split(":")[0]
        lines.append(f"- {model}, {library}: {1 / row.ratio:.3f}x")
    return [*section("throughput", lines), ""]


def first_call_title(results: Results) -> str:
    return f"First call of a {results.shapes.deep_stack}-block transformer step"


def first_call_lines(results: Results) -> list[str]:
    from _timing import markdown_table

    aot = results.aot
    split = ", ".join(f"{part} {seconds:.2f} s" for part, seconds in aot.items())
    explanation = (
        "Each form is built afresh and its step function wrapped anew, so nothing is cached; "
        "the time is that of its first call: tracing, compiling and running one step, the "
        f"median of {results.repeats} builds. Times in the table are in microseconds."
    )
    aot_line = f"The hand-written step, with JAX's ahead-of-time API: {split}."
    table = markdown_table(results.first_call)
    return [
        f"## {first_call_title(results)}",
        "",
        *section("first-call", [explanation, "", table, "", aot_line]),
        "",
    ]


BUILD_TITLE = "Building the CNN outside jit"


def build_lines(results: Results, quick: bool) -> list[str]:
    from _timing import markdown_table

    # A quick run keeps JAX's caches between builds (build_rows): say what was timed.
    how = (
        "with JAX's caches kept from the rest of the run (a quick run: not what a fresh "
        "process pays)"
        if quick
        else "after `jax.clear_caches()` (so every random draw is compiled again, as in a "
        "fresh process; the persistent compilation cache is off)"
    )
    explanation = (
        f"Each form builds the CNN's parameters op by op, outside `jit`, {how}; the median "
        f"of {results.build_repeats} builds. On CPU, XLA is slow to compile a draw over a "
        "shape of several small axes (the convolution kernels); pytree_nn draws them flat, "
        "with the same values. Times are in microseconds."
    )
    return [
        f"## {BUILD_TITLE}",
        "",
        *section("build", [explanation, "", markdown_table(results.build)]),
        "",
    ]


def deep_build_title(results: Results) -> str:
    return f"Building a {results.shapes.deep_stack}-block transformer, eagerly and in jit"


def deep_build_lines(results: Results) -> list[str]:
    from _timing import markdown_table

    explanation = (
        "The parameters of the stack whose first training step is timed above, built "
        "eagerly (each draw dispatched, and compiled once per shape) and by one compiled "
        "program: `pytree_nn.build(Transformer, ...)`, `nnx.jit` on a function building "
        "the Flax NNX model, `eqx.filter_jit` on one building the Equinox blocks. A *first "
        "call* and an eager build run after `jax.clear_caches()` (as in a new process, the "
        "persistent compilation cache off), so they include compiling; *again* is the next "
        "build, which runs the kept program. One build each; times in microseconds. The "
        "target: `build`'s first call at least 3x faster than eager construction."
    )
    return [
        f"## {deep_build_title(results)}",
        "",
        *section("deep-build", [explanation, "", markdown_table(results.deep_build)]),
        "",
    ]


def report(results: Results, invocation: Invocation) -> str:
    settings = step_settings(invocation.quick)
    shapes = results.shapes
    description = (
        f"A training step (`optax.adam({LEARNING_RATE:g})` on every parameter) of a small "
        f"CNN (two 3x3 convolutions of 16 and 32 channels, 2x2 average pooling, a dense "
        f"layer to {CLASSES} classes; images 28x28x1, batch {shapes.cnn_batch}) and of a "
        f"stack of {shapes.stack} pre-norm transformer blocks (width {shapes.width}, "
        f"{shapes.heads} heads, MLP {shapes.hidden} with gelu, causal self-attention; sequences "
        f"of {shapes.sequence}, batch {shapes.batch}), float32. The "
        "model is built once with pytree_nn layers; the hand-written, Equinox and Flax NNX "
        "forms hold copies of its arrays, and one step of each is checked against the "
        "others (the loss before and after it) before timing."
    )
    lines = report_head(
        dataclasses.replace(invocation, settings=settings),
        "pytree_nn: training steps vs hand-written JAX + optax, Equinox and Flax NNX",
        description,
        results.runner.rows,
        results.runner.timings,
        subject="Each step time",
        slow="",
        closing=(
            f"Steps are timed in loops of about {settings.repeat_s * 1e3:g} ms. The target is "
            "the issue's: at least 0.98x the throughput of the hand-written step."
        ),
    )
    lines += throughput_lines(results.runner.rows)
    lines += first_call_lines(results)
    record_table(invocation, first_call_title(results), results.first_call)
    lines += build_lines(results, invocation.quick)
    record_table(invocation, BUILD_TITLE, results.build)
    lines += deep_build_lines(results)
    record_table(invocation, deep_build_title(results), results.deep_build)
    lines += target_lines([*results.runner.rows, *results.deep_build])
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    settings = step_settings(invocation.quick)
    return report(run(settings, invocation.quick), invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_nn": pytree_nn.__version__,
        "optax": dist_version("optax"),
        "equinox": dist_version("equinox") if eqx is not None else None,
        "flax": dist_version("flax") if nnx is not None else None,
    }
    quick_help = "short smoke run (a 2-block first-call stack, few repeats)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
