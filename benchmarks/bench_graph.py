"""Benchmark pytree_graph against plain JAX on a dict of arrays and against Flax NNX.

The model is an MLP of width 32 (float32) whose layers are ``Linear`` modules holding two
``pytree_graph.Param`` Variables, ``w`` of shape (32, 32) and ``b`` of shape (32,); its forward
pass applies ``x = relu(x @ w + b)`` layer by layer, without the relu after the last layer. It
is built at depth 32 and at depth 2, from the very same arrays in each form:

* a plain dict of arrays (``layers_0_w``, ``layers_0_b``, ...), with the forward pass in the
  function's code: the baseline;
* a pytree_module Module of ``Linear`` modules holding ``pytree_graph.Param`` Variables
  (Modules and Variables are JAX pytrees, so ``jax.jit`` takes it directly too);
* a ``flax.nnx.Module`` of the same structure: ``nnx.Param`` Variables, the layers in an
  ``nnx.List``.

Measured in one run, with synchronous CPU dispatch:

1. Per call, ``pytree_graph.jit(lambda m, x: m(x))(model, x)`` for an input ``x`` of shape
   (32,), against ``jax.jit(f_dict)(params, x)`` over the same arrays in a dict (the baseline;
   target: at most 1.5x), ``jax.jit(lambda m, x: m(x))(model, x)`` with the model passed
   directly, and ``nnx.jit(lambda m, x: m(x))`` on the NNX model; depth 32 and depth 2.
2. Per call, a training step at depth 32: ``pytree_graph.jit`` of a step that takes
   ``pytree_graph.grad(loss)(model, x)`` and writes ``p.value -= 0.01 * g.value`` into every
   Param (found with ``pytree_graph.iter_graph``), against ``jax.jit`` of ``jax.grad`` and a
   ``jax.tree.map`` update on the dict (the new dict replacing the old one), ``nnx.jit`` of
   ``nnx.grad`` with the same in-place update on the NNX model, and ``jax.jit`` of the same
   functional step with the model passed directly. Every form starts from the same arrays;
   after one step their parameters are checked equal.
3. ``pytree_graph.split(model)`` and ``pytree_graph.merge(graphdef, state)`` of a 500-layer
   model of width 4 (1000 Param Variables), against ``nnx.split`` and ``nnx.merge`` of the
   equivalent NNX model (the baseline of the ratios; targets: at most 1 ms each, absolute),
   and ``jax.tree_util.tree_flatten`` and ``tree_unflatten`` of the pytree_graph model for
   reference. These take milliseconds a call and get fewer, longer repeats.

Usage:
    python benchmarks/bench_graph.py [--quick] [--out PATH]

``--quick`` is a smoke run (mostly compilation); it writes a file only when ``--out`` is
given. A full run writes ``benchmarks/results/graph.md`` unless ``--out`` says otherwise.
Flax is optional: without it the NNX rows say "not installed".
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Case, Runner, Target, built_case, mlp_arrays
from _report import Invocation, log, overhead_section, report_head, run_script, target_lines
from _timing import Settings, dist_version

import pytree_graph
import pytree_module
from pytree_graph import Param
from pytree_module import Module

try:
    from flax import nnx
except ImportError:
    nnx = None

DEEP = 32
SHALLOW = 2
HUGE = 500  # a very deep model: the per-call cost that grows with the number of Variables
WIDTH = 32
LR = 0.01
LONG = 500  # layers of the split/merge model
LONG_WIDTH = 4

NOT_INSTALLED = "flax not installed"

BASE_JIT = "jax.jit(f_dict)(params, x)"
GRAPH_JIT = "pytree_graph.jit(f)(model, x)"
DIRECT_JIT = "jax.jit(f)(model, x), the model passed directly"

GRAPH_JIT_TARGET = Target("<= 1.1x jax.jit on a dict", 1.1)
SPLIT_TARGET = Target("<= 1 ms", 1e-3, absolute=True)
MERGE_TARGET = Target("<= 1 ms", 1e-3, absolute=True)


# --------------------------------------------------------------------------- the models


class Linear(Module):
    def __init__(self, w: jax.Array, b: jax.Array):
        self.w = Param(w)
        self.b = Param(b)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.w.value + self.b.value


class ArrayLinear(Module):
    """Equinox style: plain arrays, no Variables (`pytree_graph.jit` takes these too)."""

    def __init__(self, w: jax.Array, b: jax.Array):
        self.w = w
        self.b = b

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.w + self.b


class MLP(Module):
    def __init__(self, layers: list[Any]):
        self.layers = layers

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


if nnx is not None:

    class NnxLinear(nnx.Module):
        def __init__(self, w: jax.Array, b: jax.Array):
            self.w = nnx.Param(w)
            self.b = nnx.Param(b)

        def __call__(self, x: jax.Array) -> jax.Array:
            return x @ self.w[...] + self.b[...]

    class NnxMLP(nnx.Module):
        def __init__(self, layers: list[NnxLinear]):
            self.layers = getattr(nnx, "List", list)(layers)

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)


def _keys(depth: int) -> list[tuple[str, str]]:
    return [(f"layers_{i}_w", f"layers_{i}_b") for i in range(depth)]


def make_dict_forward(depth: int) -> Callable[[dict[str, jax.Array], jax.Array], jax.Array]:
    keys = _keys(depth)

    def f_dict(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        for kw, kb in keys[:-1]:
            x = jax.nn.relu(x @ params[kw] + params[kb])
        kw, kb = keys[-1]
        return x @ params[kw] + params[kb]

    return f_dict


@dataclasses.dataclass
class Models:
    """One depth: the shared arrays, and builders of each form (the training step mutates
    its models, so it gets fresh ones holding the same arrays)."""

    depth: int
    pairs: list[tuple[jax.Array, jax.Array]]

    def params(self) -> dict[str, jax.Array]:
        params = {}
        for (kw, kb), (w, b) in zip(_keys(self.depth), self.pairs, strict=True):
            params[kw] = w
            params[kb] = b
        return params

    def graph(self) -> MLP:
        return MLP([Linear(w, b) for w, b in self.pairs])

    def plain(self) -> MLP:
        return MLP([ArrayLinear(w, b) for w, b in self.pairs])

    def nnx(self) -> Any:
        return None if nnx is None else NnxMLP([NnxLinear(w, b) for w, b in self.pairs])


def make_models(depth: int, width: int, seed: int) -> Models:
    weights, biases = mlp_arrays(depth, width, seed)
    models = Models(depth, list(zip(weights, biases, strict=True)))
    check_models(models)
    return models


def check_models(models: Models) -> None:
    """Every form holds the very same arrays, as its only pytree leaves."""
    expected = {id(a) for pair in models.pairs for a in pair}
    forms = {"dict": models.params(), "pytree_graph": models.graph()}
    if nnx is not None:
        forms["nnx"] = models.nnx()
    for name, tree in forms.items():
        leaves = jax.tree.leaves(tree)
        assert len(leaves) == 2 * models.depth, (name, len(leaves))
        assert expected == {id(leaf) for leaf in leaves}, name


def _value(leaf: Any) -> Any:
    """The array of a Variable of either library (or the array itself)."""
    if nnx is not None and isinstance(leaf, nnx.Variable):
        return leaf[...]
    if isinstance(leaf, pytree_graph.Variable):
        return leaf.value
    return leaf


def _layer_arrays(model: Any) -> list[Any]:
    """The arrays of a model of either library in layer order (w, b per layer)."""
    return [_value(v) for layer in model.layers for v in (layer.w, layer.b)]


def _dict_arrays(params: dict[str, jax.Array]) -> list[jax.Array]:
    return [params[k] for pair in _keys(len(params) // 2) for k in pair]


def _state_arrays(state: Any) -> list[Any]:
    """The arrays of a State of either library, in the order of their paths."""
    flat = dict(state.flat_state())
    return [_value(flat[path]) for path in sorted(flat)]


# ----------------------------------------------------------------------------- measures


def _nnx_case(name: str, make: Callable[[], Callable[[], Any]], **options: Any) -> Case:
    """A Flax NNX case; one saying "not installed" without Flax."""
    return built_case(name, make, unavailable="" if nnx is not None else NOT_INSTALLED, **options)


def _apply(m: Any, x: jax.Array) -> jax.Array:
    return m(x)


def forward_cases(models: Models, x: jax.Array) -> list[Case]:
    """`pytree_graph.jit(f)(model, x)` and its comparisons, at one depth."""
    model = models.graph()
    return [
        Case(BASE_JIT, partial(jax.jit(make_dict_forward(models.depth)), models.params(), x)),
        built_case(
            GRAPH_JIT, lambda: partial(pytree_graph.jit(_apply), model, x), target=GRAPH_JIT_TARGET
        ),
        built_case(
            f"{GRAPH_JIT}, Equinox style",
            lambda: partial(pytree_graph.jit(_apply), models.plain(), x),
            note="plain arrays in the Modules, no Variables",
            target=GRAPH_JIT_TARGET,
        ),
        Case(DIRECT_JIT, partial(jax.jit(_apply), model, x), note="reference"),
        _nnx_case(
            "nnx.jit(f)(model, x)",
            lambda: partial(nnx.jit(_apply), models.nnx(), x),
            note="flax.nnx.Module",
        ),
    ]


def _loss(m: Any, x: jax.Array) -> jax.Array:
    return jnp.sum(m(x) ** 2)


def _loss_fn(f: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    def loss(params: Any, x: jax.Array) -> jax.Array:
        return jnp.sum(f(params, x) ** 2)

    return loss


@dataclasses.dataclass
class Functional:
    """A functional training step and the tree it is at; a call replaces the tree."""

    step: Callable[[Any, jax.Array], Any]
    tree: Any
    x: jax.Array

    def __call__(self) -> None:
        self.tree = self.step(self.tree, self.x)


def _sgd(tree: Any, grads: Any) -> Any:
    return jax.tree.map(lambda p, g: p - LR * g, tree, grads)


def graph_train_step(m: MLP, x: jax.Array) -> None:
    grads = pytree_graph.grad(_loss)(m, x).flat_state()
    for path, p in pytree_graph.iter_graph(m):
        if isinstance(p, Param):
            p.value -= LR * grads[path].value


def nnx_train_step(m: Any, x: jax.Array) -> None:
    grads = dict(nnx.grad(_loss)(m, x).flat_state())
    for path, p in nnx.iter_graph(m):
        if isinstance(p, nnx.Param):
            p[...] -= LR * grads[path][...]


def train_cases(models: Models, x: jax.Array) -> list[Case]:
    """A jitted training step: gradient, then ``p -= 0.01 * g`` on every parameter."""
    loss_dict = _loss_fn(make_dict_forward(models.depth))

    @jax.jit
    def dict_step(params: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
        return _sgd(params, jax.grad(loss_dict)(params, x))

    @jax.jit
    def direct_step(m: MLP, x: jax.Array) -> MLP:
        return _sgd(m, jax.grad(_loss)(m, x))

    on_dict = Functional(dict_step, models.params(), x)
    direct = Functional(direct_step, models.graph(), x)
    model = models.graph()
    nnx_model = models.nnx()
    return [
        Case(
            "jax.jit(step_dict)(params, x): jax.grad, jax.tree.map",
            on_dict,
            read=lambda _: _dict_arrays(on_dict.tree),
        ),
        built_case(
            "pytree_graph.jit(step)(model, x): pytree_graph.grad, iter_graph, p.value -= ...",
            lambda: partial(pytree_graph.jit(graph_train_step), model, x),
            read=lambda _: _layer_arrays(model),
        ),
        Case(
            "jax.jit(step)(model, x): jax.grad, jax.tree.map, the model passed directly",
            direct,
            note="reference; returns a new model",
            read=lambda _: _layer_arrays(direct.tree),
        ),
        _nnx_case(
            "nnx.jit(step)(model, x): nnx.grad, nnx.iter_graph, p[...] -= ...",
            lambda: partial(nnx.jit(nnx_train_step), nnx_model, x),
            note="flax.nnx.Module",
            read=lambda _: _layer_arrays(nnx_model),
        ),
    ]


NNX_SPLIT = "nnx.split(model)"
NNX_MERGE = "nnx.merge(graphdef, state)"


def split_cases(models: Models) -> list[Case]:
    model = models.graph()
    nnx_model = models.nnx()
    return [
        built_case(
            "pytree_graph.split(model)",
            lambda: partial(pytree_graph.split, model),
            target=SPLIT_TARGET,
            read=lambda out: _state_arrays(out[1]),
        ),
        _nnx_case(
            NNX_SPLIT,
            lambda: partial(nnx.split, nnx_model),
            note="flax.nnx.Module",
            read=lambda out: _state_arrays(out[1]),
        ),
        Case(
            "jax.tree_util.tree_flatten(model)",
            partial(jax.tree_util.tree_flatten, model),
            note="reference: the pytree_graph model as a pytree",
            check=False,
        ),
    ]


def merge_cases(models: Models) -> list[Case]:
    model = models.graph()
    nnx_model = models.nnx()
    leaves, treedef = jax.tree_util.tree_flatten(model)

    def ours() -> Callable[[], Any]:
        return partial(pytree_graph.merge, *pytree_graph.split(model))

    def theirs() -> Callable[[], Any]:
        return partial(nnx.merge, *nnx.split(nnx_model))

    return [
        built_case(
            "pytree_graph.merge(graphdef, state)", ours, target=MERGE_TARGET, read=_layer_arrays
        ),
        _nnx_case(NNX_MERGE, theirs, note="flax.nnx.Module", read=_layer_arrays),
        Case(
            "jax.tree_util.tree_unflatten(treedef, leaves)",
            partial(jax.tree_util.tree_unflatten, treedef, leaves),
            note="reference: the pytree_graph model as a pytree",
            read=_layer_arrays,
        ),
    ]


def slow_settings(quick: bool) -> Settings:
    """split and merge of a 1000-Variable model take milliseconds: fewer, longer repeats."""
    if quick:
        return Settings(repeat=3, repeat_s=0.001, min_number=1, warmup=1)
    return Settings(repeat=21, repeat_s=0.05, min_number=3, warmup=3)


def run(settings: Settings, quick: bool, log: Callable[[str], None]) -> Runner:
    runner = Runner(settings, log)
    deep = make_models(DEEP, WIDTH, seed=0)
    shallow = make_models(SHALLOW, WIDTH, seed=1)
    x = jnp.ones(WIDTH, jnp.float32)

    # (1) jit(f)(model, x) per call, each depth; ratio vs jax.jit on a dict. (A 500-layer
    # model compiles for tens of seconds in each form: left out of a quick run.)
    depths = (deep, shallow) if quick else (deep, shallow, make_models(HUGE, WIDTH, seed=2))
    for models in depths:
        label = f"`jit(f)(model, x)` per call, depth {models.depth} (ratio vs jax.jit on a dict)"
        runner.measure(label, forward_cases(models, x))

    # (2) a training step (grad and an in-place update), depth 32; ratio vs jax on a dict.
    label = f"training step per call, depth {DEEP} (ratio vs jax.jit on a dict)"
    runner.measure(label, train_cases(deep, x))

    # (3) split and merge of a 1000-Variable model; ratio vs NNX, absolute targets.
    long = make_models(LONG, LONG_WIDTH, seed=2)
    slow = slow_settings(quick)
    label = f"`split(model)`, {LONG} layers, {2 * LONG} Variables (ratio vs nnx.split)"
    runner.measure(label, split_cases(long), slow, baseline=NNX_SPLIT)
    label = f"`merge(graphdef, state)`, {LONG} layers, {2 * LONG} Variables (ratio vs nnx.merge)"
    runner.measure(label, merge_cases(long), slow, baseline=NNX_MERGE)
    return runner


# ------------------------------------------------------------------------------- report


def report(runner: Runner, invocation: Invocation) -> str:
    slow = slow_settings(invocation.quick)
    description = (
        f"MLPs of width {WIDTH} (float32) of `Linear` modules holding two `pytree_graph.Param` "
        f"Variables (`w` {WIDTH}x{WIDTH}, `b` {WIDTH}) (in Equinox style: the same arrays "
        f"held directly), relu between layers, at depth {DEEP}, {SHALLOW} and {HUGE} (not in a "
        f"quick run); for split and merge, {LONG} layers of width {LONG_WIDTH} ({2 * LONG} "
        "Params). Each form (dict of arrays, pytree_graph model, flax.nnx.Module) holds the "
        f"very same arrays. Input `x` of shape ({WIDTH},); the training step is "
        f"`p -= {LR:g} * grad` on every parameter, for the loss `sum(model(x) ** 2)`."
    )
    lines = report_head(
        invocation,
        "pytree_graph: graph transforms, split and merge vs jax on a dict of arrays and Flax NNX",
        description,
        runner.rows,
        runner.timings,
        subject="Each jitted time",
        slow=f"Split and merge take milliseconds a call and get {slow.repeat} repeats of loops "
        f"of about {slow.repeat_s * 1e3:g} ms",
        closing="The split and merge targets are absolute times.",
    )
    lines += overhead_section(
        "pytree_graph.jit",
        runner.rows,
        "`jit(f)(model, x)`",
        BASE_JIT,
        GRAPH_JIT,
        DIRECT_JIT,
        "the model",
    )
    lines += target_lines(runner.rows)
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    return report(run(invocation.settings, invocation.quick, log), invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_graph": pytree_graph.__version__,
        "pytree_module": pytree_module.__version__,
        "flax": dist_version("flax") if nnx is not None else None,
    }
    quick_help = "short smoke run (mostly compiling)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
