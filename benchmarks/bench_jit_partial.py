"""Benchmark a training step through pytree_graph.jit_partial against plain JAX and Flax NNX.

The model is an MLP of depth 32 whose layers are ``Linear`` modules holding two
``pytree_graph.Param`` Variables, ``w`` (width x width) and ``b`` (width), with ``relu``
between layers, held in a ``pytree_module.List`` (as the NNX model holds them in an
``nnx.List``; one more row holds them in a plain list); the step computes the loss
``sum(model(x) ** 2)`` and its gradient, runs an ``optax.adam(1e-3)`` update and writes the
new parameters and optimizer state back. It is measured at width 32 (the call's fixed cost
dominates) and width 512 (the computation does).
Each form starts from the very same arrays:

* ``jax.jit`` of a step on a dict of arrays (``layers_0_w``, ...) and its optax state, both
  returned and rebound by the caller: the baseline (target for ``jit_partial``: at most
  1.05x);
* ``pytree_graph.jit_partial(step, model, optimizer)(x)``: the model and a
  ``pytree_nn.Optimizer`` bound once; and the same with the layers in a plain list, which
  each call compares item by item (a ``List`` reports its changes instead);
* ``pytree_graph.jit(step)(model, optimizer, x)``;
* ``nnx.jit(step)(model, optimizer, x)``, ``nnx.cached_partial`` of it, and
  ``nnx.jit_partial(step, model, optimizer)``, on a ``flax.nnx.Module`` of the same
  structure with an ``nnx.Optimizer``.

After one step, the parameters of every form are checked equal. Synchronous CPU dispatch.

Usage:
    python benchmarks/bench_jit_partial.py [--quick] [--out PATH]

``--quick`` is a smoke run (mostly compilation); it writes a file only when ``--out`` is
given. A full run writes ``benchmarks/results/jit_partial.md`` unless ``--out`` says
otherwise. Flax is optional: without it the NNX rows say "not installed".
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Case, Runner, Target, built_case, mlp_arrays
from _report import Invocation, log, report_head, run_script, section, target_lines
from _timing import dist_version

# The same models as bench_graph's (a `Linear` of two Params; NNX's equivalent).
from bench_graph import MLP, Linear, nnx

import pytree_graph
import pytree_module
from pytree_module import List
from pytree_nn import Optimizer

if nnx is not None:
    from bench_graph import NnxLinear, NnxMLP

DEPTH = 32
WIDTHS = (32, 512)
LR = 1e-3
NOT_INSTALLED = "flax not installed"

BASE = "jax.jit(step)(params, opt_state, x), rebound"
PARTIAL = "pytree_graph.jit_partial(step, model, optimizer)(x)"
PARTIAL_PLAIN = "pytree_graph.jit_partial(step, model, optimizer)(x), layers in a plain list"
GRAPH_JIT = "pytree_graph.jit(step)(model, optimizer, x)"
PARTIAL_TARGET = Target("<= 1.05x jax.jit on a dict", 1.05)


def _keys(depth: int) -> list[tuple[str, str]]:
    return [(f"layers_{i}_w", f"layers_{i}_b") for i in range(depth)]


@dataclasses.dataclass
class Models:
    """The arrays of one width, and builders of each form (each step mutates its model,
    so every case gets its own, holding the same arrays)."""

    pairs: list[tuple[jax.Array, jax.Array]]

    def params(self) -> dict[str, jax.Array]:
        keys = _keys(len(self.pairs))
        return {
            k: a
            for (kw, kb), (w, b) in zip(keys, self.pairs, strict=True)
            for k, a in ((kw, w), (kb, b))
        }

    def graph(self, layers: Callable[[list[Linear]], Any] = List) -> tuple[MLP, Optimizer]:
        model = MLP(layers([Linear(w, b) for w, b in self.pairs]))
        return model, Optimizer(model, optax.adam(LR))

    def nnx(self) -> tuple[Any, Any]:
        model = NnxMLP([NnxLinear(w, b) for w, b in self.pairs])
        return model, nnx.Optimizer(model, optax.adam(LR), wrt=nnx.Param)


# ---------------------------------------------------------------------------- the steps


def _loss(m: Any, x: jax.Array) -> jax.Array:
    return jnp.sum(m(x) ** 2)


def graph_step(model: MLP, optimizer: Optimizer, x: jax.Array) -> jax.Array:
    loss, grads = pytree_graph.value_and_grad(_loss)(model, x)
    optimizer.update(model, grads)
    return loss


def nnx_step(model: Any, optimizer: Any, x: jax.Array) -> jax.Array:
    loss, grads = nnx.value_and_grad(_loss)(model, x)
    optimizer.update(model, grads)
    return loss


def make_dict_step(depth: int) -> Callable[..., Any]:
    keys = _keys(depth)
    tx = optax.adam(LR)

    def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        for kw, kb in keys[:-1]:
            x = jax.nn.relu(x @ params[kw] + params[kb])
        kw, kb = keys[-1]
        return x @ params[kw] + params[kb]

    @jax.jit
    def dict_step(params: dict[str, jax.Array], opt_state: Any, x: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(lambda p: jnp.sum(forward(p, x) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return dict_step


@dataclasses.dataclass
class OnDict:
    """The dict step, and the parameters and optimizer state it is at (rebound each call)."""

    step: Callable[..., Any]
    params: dict[str, jax.Array]
    opt_state: Any
    x: jax.Array

    def __call__(self) -> jax.Array:
        self.params, self.opt_state, loss = self.step(self.params, self.opt_state, self.x)
        return loss


# ----------------------------------------------------------------------------- measures


def _value(leaf: Any) -> Any:
    if nnx is not None and isinstance(leaf, nnx.Variable):
        return leaf[...]
    return leaf.value


def _layer_arrays(model: Any) -> list[Any]:
    return [_value(v) for layer in model.layers for v in (layer.w, layer.b)]


def _dict_arrays(params: dict[str, jax.Array]) -> list[jax.Array]:
    return [params[k] for pair in _keys(len(params) // 2) for k in pair]


def _nnx_case(name: str, make: Callable[[], Callable[[], Any]], **options: Any) -> Case:
    return built_case(name, make, unavailable="" if nnx is not None else NOT_INSTALLED, **options)


def train_cases(models: Models, x: jax.Array) -> list[Case]:
    on_dict = OnDict(
        make_dict_step(len(models.pairs)), models.params(), optax.adam(LR).init(models.params()), x
    )
    model_p, optimizer_p = models.graph()
    model_l, optimizer_l = models.graph(list)
    model_g, optimizer_g = models.graph()
    cases = [
        Case(BASE, on_dict, read=lambda _: _dict_arrays(on_dict.params)),
        built_case(
            PARTIAL,
            lambda: partial(pytree_graph.jit_partial(graph_step, model_p, optimizer_p), x),
            target=PARTIAL_TARGET,
            read=lambda _: _layer_arrays(model_p),
        ),
        built_case(
            PARTIAL_PLAIN,
            lambda: partial(pytree_graph.jit_partial(graph_step, model_l, optimizer_l), x),
            read=lambda _: _layer_arrays(model_l),
        ),
        built_case(
            GRAPH_JIT,
            lambda: partial(pytree_graph.jit(graph_step), model_g, optimizer_g, x),
            read=lambda _: _layer_arrays(model_g),
        ),
    ]
    if nnx is None:
        forms: list[tuple[Any, Any]] = [(None, None)] * 3
    else:
        forms = [models.nnx() for _ in range(3)]
    (model_j, optimizer_j), (model_c, optimizer_c), (model_n, optimizer_n) = forms

    def nnx_cached() -> Callable[[], Any]:
        with nnx.set_graph_mode(True), nnx.set_graph_updates(True):
            step = nnx.jit(nnx_step)
            return partial(nnx.cached_partial(step, model_c, optimizer_c), x)

    cases += [
        _nnx_case(
            "nnx.jit(step)(model, optimizer, x)",
            lambda: partial(nnx.jit(nnx_step), model_j, optimizer_j, x),
            note="flax.nnx.Module",
            read=lambda _: _layer_arrays(model_j),
        ),
        _nnx_case(
            "nnx.cached_partial(nnx.jit(step), model, optimizer)(x)",
            nnx_cached,
            note="graph mode",
            read=lambda _: _layer_arrays(model_c),
        ),
        _nnx_case(
            "nnx.jit_partial(step, model, optimizer)(x)",
            lambda: partial(nnx.jit_partial(nnx_step, model_n, optimizer_n, graph=False), x),
            note="flax.nnx.Module",
            read=lambda _: _layer_arrays(model_n),
        ),
    ]
    return cases


def run(invocation: Invocation) -> Runner:
    runner = Runner(invocation.settings, log)
    for seed, width in enumerate(WIDTHS):
        weights, biases = mlp_arrays(DEPTH, width, seed)
        models = Models(list(zip(weights, biases, strict=True)))
        x = jnp.ones(width, jnp.float32)
        label = (
            f"adam training step per call, depth {DEPTH}, width {width} "
            "(ratio vs jax.jit on a dict)"
        )
        runner.measure(label, train_cases(models, x))
    return runner


# ------------------------------------------------------------------------------- report


def overhead_lines(runner: Runner) -> list[str]:
    """The time jit_partial and pytree_graph.jit add per call, against the dict."""
    by_label: dict[str, dict[str, Any]] = {}
    for row in runner.rows:
        by_label.setdefault(row.measurement, {})[row.implementation] = row
    lines = []
    for label, rows in by_label.items():
        base, ours, graph = rows.get(BASE), rows.get(PARTIAL), rows.get(GRAPH_JIT)
        if base is None or base.time_us is None or ours is None or ours.time_us is None:
            continue
        where = label.split(" per call, ")[1].split(" (")[0]
        text = f"- {where}: jit_partial {ours.time_us - base.time_us:+.1f} us"
        plain = rows.get(PARTIAL_PLAIN)
        if plain is not None and plain.time_us is not None:
            text += f" ({plain.time_us - base.time_us:+.1f} us with a plain list of layers)"
        if graph is not None and graph.time_us is not None:
            text += f", pytree_graph.jit {graph.time_us - base.time_us:+.1f} us"
        lines.append(text + ".")
    if not lines:
        return []
    return [*section("overhead", ["Time added per call, against the dict:", "", *lines]), ""]


def report(runner: Runner, invocation: Invocation) -> str:
    description = (
        f"A training step on an MLP of depth {DEPTH} of `Linear` modules (two "
        "`pytree_graph.Param` Variables each, `w` and `b`; relu between layers), at widths "
        f"{' and '.join(map(str, WIDTHS))} (float32): loss `sum(model(x) ** 2)`, its gradient, "
        f"`optax.adam({LR:g})`, parameters and optimizer state written back (or, for the dict, "
        "returned and rebound). Every form starts from the same arrays; their parameters are "
        "checked equal after one step."
    )
    lines = report_head(
        invocation,
        "pytree_graph.jit_partial: a training step vs jax.jit on a dict and Flax NNX",
        description,
        runner.rows,
        runner.timings,
    )
    lines += overhead_lines(runner)
    lines += target_lines(runner.rows)
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    return report(run(invocation), invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_graph": pytree_graph.__version__,
        "pytree_module": pytree_module.__version__,
        "flax": dist_version("flax") if nnx is not None else None,
        "optax": dist_version("optax"),
    }
    quick_help = "short smoke run (mostly compiling)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
