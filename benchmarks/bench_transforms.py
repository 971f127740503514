"""Benchmark the pytree_transforms transforms against plain JAX on a dict of arrays and Equinox.

The model is an MLP of width 32 (float32) with a callable activation (``jax.nn.relu``); its
forward pass applies ``x = activation(x @ weight + bias)`` layer by layer. It is built at depth
32 and at depth 2, from the very same arrays in each form:

* a plain dict of arrays (``layers_0_weight``, ``layers_0_bias``, ...), with the activation in
  the function's code: the baseline;
* a pytree_module Module, NNX style (attributes assigned in ``__init__``): the activation is
  static, it lives in the treedef;
* a pytree_module Module, Equinox style (annotated fields ``layers: list`` and
  ``activation: Callable``): the activation is a data leaf, which ``filter_jit`` holds static
  because it is not an array;
* an ``equinox.Module`` of the same structure, for ``eqx.filter_jit`` and friends: with the
  activation a static field next to the NNX style, a plain field next to the Equinox style.

Measured in one run, per call, with synchronous CPU dispatch:

1. ``filter_jit(lambda m, x: m(x))(model, x)`` for an input ``x`` of shape (32,), against
   ``jax.jit(f_dict)(params, x)`` over the same arrays in a dict (the baseline; target: at most
   1.25x), ``eqx.filter_jit`` on the Equinox model, and ``jax.jit`` with the Module passed
   directly (target: at most 1.2x); depth 32 and depth 2, each Module style.
2. ``filter_jit(filter_grad(loss))(model, x)`` against ``jax.jit(jax.grad(loss_dict))``, the
   same with ``filter_value_and_grad``, and ``filter_jit`` of a ``filter_vmap`` over a batch
   ``xs`` of shape (8, 32) against ``jax.jit`` of a ``jax.vmap``; depth 32.
3. The same three transforms un-jitted (eager), where their wrapper's own cost shows: against
   ``jax.grad``, ``jax.value_and_grad`` and ``jax.vmap`` on the dict; depth 2 and depth 32
   (depth 2 only in a quick run).

Then, with JAX's default asynchronous CPU dispatch turned back on, a check that dispatch stays
asynchronous: the time a ``filter_jit`` call of a computation lasting about 200 ms takes to
return, against the time until its result is ready (and the same for ``jax.jit`` and
``eqx.filter_jit``). Transforms that ``pytree_transforms`` does not provide give rows saying
"not available".

Usage:
    python benchmarks/bench_transforms.py [--quick] [--out PATH]

``--quick`` is a smoke run (mostly compilation); it writes a file only when ``--out`` is
given. A full run writes ``benchmarks/results/transforms.md`` unless ``--out`` says otherwise.
Equinox is optional: without it its rows say "not installed".
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.extend.backend
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import Case, Runner, Target, built_case, check_cases, mlp_arrays
from _report import (
    Invocation,
    log,
    overhead_section,
    report_head,
    run_script,
    section,
    target_lines,
)
from _timing import Settings

import pytree_module
import pytree_transforms
from pytree_module import Module

try:
    import equinox as eqx
except ImportError:
    eqx = None

DEEP = 32
SHALLOW = 2
HUGE = 500  # a very deep model: the per-call cost that grows with the number of leaves
WIDTH = 32
BATCH = 8
ACTIVATION = jax.nn.relu

NNX_STYLE = "NNX style"
EQX_STYLE = "Equinox style"
STYLES = (NNX_STYLE, EQX_STYLE)

FILTER_JIT_TARGET = Target("<= 1.1x jax.jit on a dict", 1.1)
DIRECT_JIT_TARGET = Target("<= 1.2x jax.jit on a dict", 1.2)
ASYNC_TARGET = "returns before its result is ready"
# "Well before": a call must return in at most this fraction of the time its result takes.
ASYNC_FRACTION = 0.1
ASYNC_SECONDS = 0.2

NOT_INSTALLED = "equinox not installed"


def _transform(name: str) -> Callable[..., Any] | None:
    """A transform of pytree_transforms, or None where the package does not provide it."""
    return getattr(pytree_transforms, name, None)


def _not_available(name: str) -> str:
    return f"not available: pytree_transforms has no {name}"


# --------------------------------------------------------------------------- the models


class Linear(Module):
    """NNX style: attributes assigned in ``__init__`` (arrays are data)."""

    def __init__(self, weight: jax.Array, bias: jax.Array):
        self.weight = weight
        self.bias = bias


class MLP(Module):
    """NNX style: the activation, a function, is static (it lives in the treedef)."""

    def __init__(self, layers: list[Linear], activation: Callable[[jax.Array], jax.Array]):
        self.layers = layers
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = self.activation(x @ layer.weight + layer.bias)
        return x


class FieldLinear(Module):
    """Equinox style: annotated fields and a generated ``__init__``."""

    weight: jax.Array
    bias: jax.Array


class FieldMLP(Module):
    """Equinox style: the activation is a data field, so a (non-array) leaf."""

    layers: list[FieldLinear]
    activation: Callable[[jax.Array], jax.Array]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = self.activation(x @ layer.weight + layer.bias)
        return x


if eqx is not None:

    class EqxLinear(eqx.Module):
        weight: jax.Array
        bias: jax.Array

    class EqxMLP(eqx.Module):
        """The activation a plain field: a leaf, as in ``eqx.nn.MLP``."""

        layers: list[EqxLinear]
        activation: Callable[[jax.Array], jax.Array]

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers:
                x = self.activation(x @ layer.weight + layer.bias)
            return x

    class EqxStaticMLP(eqx.Module):
        """The activation a static field: in the treedef, as in the NNX style."""

        layers: list[EqxLinear]
        activation: Callable[[jax.Array], jax.Array] = eqx.field(static=True)

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers:
                x = self.activation(x @ layer.weight + layer.bias)
            return x


def _keys(depth: int) -> list[tuple[str, str]]:
    return [(f"layers_{i}_weight", f"layers_{i}_bias") for i in range(depth)]


def make_dict_forward(depth: int) -> Callable[[dict[str, jax.Array], jax.Array], jax.Array]:
    keys = _keys(depth)

    def f_dict(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        for kw, kb in keys:
            x = ACTIVATION(x @ params[kw] + params[kb])
        return x

    return f_dict


@dataclasses.dataclass
class Models:
    """One depth: the arrays as a dict, as both Module styles and as Equinox modules."""

    depth: int
    arrays: list[jax.Array]
    params: dict[str, jax.Array]
    f_dict: Callable[[dict[str, jax.Array], jax.Array], jax.Array]
    ours: dict[str, Module]
    eqx: dict[str, Any]


def make_models(depth: int, seed: int = 0) -> Models:
    weights, biases = mlp_arrays(depth, WIDTH, seed)
    pairs = list(zip(weights, biases, strict=True))
    params = {}
    for (kw, kb), (w, b) in zip(_keys(depth), pairs, strict=True):
        params[kw] = w
        params[kb] = b
    ours = {
        NNX_STYLE: MLP([Linear(w, b) for w, b in pairs], ACTIVATION),
        EQX_STYLE: FieldMLP([FieldLinear(w, b) for w, b in pairs], ACTIVATION),
    }
    theirs = {}
    if eqx is not None:
        theirs = {
            NNX_STYLE: EqxStaticMLP([EqxLinear(w, b) for w, b in pairs], ACTIVATION),
            EQX_STYLE: EqxMLP([EqxLinear(w, b) for w, b in pairs], ACTIVATION),
        }
    models = Models(depth, weights + biases, params, make_dict_forward(depth), ours, theirs)
    check_models(models)
    return models


def check_models(models: Models) -> None:
    """Every form holds the very same arrays; the activation is a leaf only where expected."""
    expected = {id(a) for a in models.arrays}
    n = 2 * models.depth
    forms = {"dict": models.params, **models.ours, **{f"eqx {k}": v for k, v in models.eqx.items()}}
    for name, tree in forms.items():
        leaves = jax.tree.leaves(tree)
        arrays = [leaf for leaf in leaves if isinstance(leaf, jax.Array)]
        assert len(arrays) == n and expected == {id(a) for a in arrays}, name
        assert len(leaves) == n + (EQX_STYLE in name), (name, len(leaves))


def _canonical(out: Any) -> list[Any]:
    """The arrays of an output in layer order, whatever holds them (dict, Module, tuple)."""
    if isinstance(out, tuple | list):
        return [a for part in out for a in _canonical(part)]
    if isinstance(out, dict):
        return [out[k] for pair in _keys(len(out) // 2) for k in pair]
    if hasattr(out, "layers"):
        return [a for layer in out.layers for a in (layer.weight, layer.bias)]
    return [out]


# ----------------------------------------------------------------------------- measures


def _apply(m: Any, x: jax.Array) -> jax.Array:
    return m(x)


def forward_cases(models: Models, style: str, x: jax.Array) -> list[Case]:
    """`filter_jit(f)(model, x)` and its comparisons, for one Module style."""
    model = models.ours[style]
    direct = Case(
        "jax.jit(f)(model, x), the Module passed directly",
        partial(jax.jit(_apply), model, x),
        target=DIRECT_JIT_TARGET if style == NNX_STYLE else None,
    )
    if style == EQX_STYLE:
        direct.expect_error = (
            "not applicable: jax.jit refuses the activation, a non-array leaf (TypeError)"
        )
    cases = [
        Case("jax.jit(f_dict)(params, x)", partial(jax.jit(models.f_dict), models.params, x)),
        _ours(
            "pytree_transforms.filter_jit(f)(model, x)",
            ("filter_jit",),
            lambda: partial(_transform("filter_jit")(_apply), model, x),
            target=FILTER_JIT_TARGET,
        ),
        direct,
    ]
    kind = "a static field" if style == NNX_STYLE else "a plain field, a leaf"
    cases.append(
        Case(
            "eqx.filter_jit(f)(model, x)",
            None if eqx is None else partial(eqx.filter_jit(_apply), models.eqx[style], x),
            why=NOT_INSTALLED,
            note=f"equinox.Module; activation {kind}",
        )
    )
    return cases


def _loss_dict(f_dict: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    def loss_dict(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return jnp.sum(f_dict(params, x) ** 2)

    return loss_dict


def _loss(m: Any, x: jax.Array) -> jax.Array:
    return jnp.sum(m(x) ** 2)


def _ours(
    label: str, needed: tuple[str, ...], make: Callable[[], Callable[[], Any]], **options: Any
) -> Case:
    """A case of ours; a "not available" one where a transform it needs is missing, and a
    failed one where applying the transforms raises."""
    missing = [name for name in needed if _transform(name) is None]
    unavailable = _not_available(", ".join(missing)) if missing else ""
    return built_case(label, make, unavailable=unavailable, **options)


def _identity(f: Callable[..., Any]) -> Callable[..., Any]:
    return f


def grad_cases(models: Models, x: jax.Array, *, jit: bool, value: bool) -> list[Case]:
    """`filter_grad` (or `filter_value_and_grad`), under `filter_jit` or eager."""
    loss_dict = _loss_dict(models.f_dict)
    jax_grad = jax.value_and_grad if value else jax.grad
    ours_name = "filter_value_and_grad" if value else "filter_grad"
    eqx_grad = None if eqx is None else eqx.filter_value_and_grad if value else eqx.filter_grad
    nnx_model = models.ours[NNX_STYLE]
    jitted = jax.jit if jit else _identity
    if jit:
        base = f"jax.jit(jax.{jax_grad.__name__}(loss_dict))(params, x)"
        ours_label = f"filter_jit({ours_name}(loss))(model, x)"
        direct = f"jax.jit(jax.{jax_grad.__name__}(loss))(model, x)"
        theirs = f"eqx.filter_jit(eqx.{ours_name}(loss))(model, x)"
    else:
        base = f"jax.{jax_grad.__name__}(loss_dict)(params, x)"
        ours_label = f"{ours_name}(loss)(model, x)"
        direct = f"jax.{jax_grad.__name__}(loss)(model, x)"
        theirs = f"eqx.{ours_name}(loss)(model, x)"
    cases = [Case(base, partial(jitted(jax_grad(loss_dict)), models.params, x))]
    needed = ("filter_jit", ours_name) if jit else (ours_name,)
    for style in STYLES:

        def make(style: str = style) -> Callable[[], Any]:
            fun = _transform(ours_name)(_loss)
            if jit:
                fun = _transform("filter_jit")(fun)
            return partial(fun, models.ours[style], x)

        cases.append(_ours(f"{ours_label}, {style}", needed, make))
    cases.append(
        Case(
            direct,
            partial(jitted(jax_grad(_loss)), nnx_model, x),
            note=f"{NNX_STYLE} Module passed directly",
        )
    )
    if eqx is None:
        cases.append(Case(theirs, None, why=NOT_INSTALLED))
    else:
        fun = eqx_grad(_loss)
        fun = eqx.filter_jit(fun) if jit else fun
        note = "equinox.Module; activation a plain field"
        cases.append(Case(theirs, partial(fun, models.eqx[EQX_STYLE], x), note=note))
    return cases


def vmap_cases(models: Models, xs: jax.Array, *, jit: bool) -> list[Case]:
    """`filter_vmap` of the forward pass over a batch, under `filter_jit` or eager."""
    f_dict = models.f_dict
    params = models.params
    nnx_model = models.ours[NNX_STYLE]

    if jit:

        @jax.jit
        def jax_batched(d: dict[str, jax.Array], xs: jax.Array) -> jax.Array:
            return jax.vmap(lambda x: f_dict(d, x))(xs)

        @jax.jit
        def jax_batched_module(m: Any, xs: jax.Array) -> jax.Array:
            return jax.vmap(lambda x: m(x))(xs)

        base = Case(
            "jax.jit(lambda d, xs: jax.vmap(lambda x: f_dict(d, x))(xs))(params, xs)",
            partial(jax_batched, params, xs),
        )
        ours_label = "filter_jit(lambda m, xs: filter_vmap(lambda x: m(x))(xs))(model, xs)"
    else:
        base = Case(
            "jax.vmap(lambda x: f_dict(params, x))(xs)",
            partial(jax.vmap(lambda x: f_dict(params, x)), xs),
        )
        ours_label = "filter_vmap(lambda x: model(x))(xs)"
    cases = [base]
    needed = ("filter_jit", "filter_vmap") if jit else ("filter_vmap",)
    for style in STYLES:
        model = models.ours[style]

        def make(model: Any = model) -> Callable[[], Any]:
            filter_vmap = _transform("filter_vmap")
            if jit:

                def batched(m: Any, xs: jax.Array) -> jax.Array:
                    return filter_vmap(lambda x: m(x))(xs)

                return partial(_transform("filter_jit")(batched), model, xs)
            return partial(filter_vmap(lambda x: model(x)), xs)

        cases.append(_ours(f"{ours_label}, {style}", needed, make))
    if jit:
        cases.append(
            Case(
                "jax.jit(lambda m, xs: jax.vmap(lambda x: m(x))(xs))(model, xs)",
                partial(jax_batched_module, nnx_model, xs),
                note=f"{NNX_STYLE} Module passed directly",
            )
        )
    else:
        cases.append(
            Case(
                "jax.vmap(lambda x: model(x))(xs)",
                partial(jax.vmap(lambda x: nnx_model(x)), xs),
                note=NNX_STYLE,
            )
        )
    theirs = (
        "eqx.filter_jit(lambda m, xs: eqx.filter_vmap(lambda x: m(x))(xs))(model, xs)"
        if jit
        else "eqx.filter_vmap(lambda x: model(x))(xs)"
    )
    if eqx is None:
        cases.append(Case(theirs, None, why=NOT_INSTALLED))
    else:
        eqx_model = models.eqx[EQX_STYLE]
        if jit:

            @eqx.filter_jit
            def eqx_batched(m: Any, xs: jax.Array) -> jax.Array:
                return eqx.filter_vmap(lambda x: m(x))(xs)

            call = partial(eqx_batched, eqx_model, xs)
        else:
            call = partial(eqx.filter_vmap(lambda x: eqx_model(x)), xs)
        cases.append(Case(theirs, call, note="equinox.Module; activation a plain field"))
    return cases


def eager_settings(depth: int, quick: bool) -> Settings:
    """Eager transforms run op by op (milliseconds a call): fewer, longer repeats."""
    if quick:
        return Settings(repeat=3, repeat_s=0.001, min_number=1, warmup=1)
    if depth > SHALLOW:
        return Settings(repeat=11, repeat_s=0.2, min_number=1, warmup=2)
    return Settings(repeat=31, repeat_s=0.05, min_number=3, warmup=5)


def run(settings: Settings, quick: bool, log: Callable[[str], None]) -> Runner:
    runner = Runner(settings, log, read=_canonical)
    deep, shallow = make_models(DEEP), make_models(SHALLOW, seed=1)
    x = jnp.ones(WIDTH, jnp.float32)
    xs = jnp.asarray(np.random.default_rng(2).standard_normal((BATCH, WIDTH), dtype=np.float32))

    # (1) filter_jit(f)(model, x), each depth and Module style; ratio vs jax.jit on a dict.
    # (A 500-layer model compiles for tens of seconds in each form: left out of a quick run.)
    for models in (deep, shallow) if quick else (deep, shallow, make_models(HUGE, seed=2)):
        for style in STYLES:
            label = (
                f"`filter_jit(f)(model, x)` per call, depth {models.depth}, {style} "
                "(ratio vs jax.jit on a dict)"
            )
            runner.measure(label, forward_cases(models, style, x))

    # (2) grad, value_and_grad and vmap under jit, depth 32; ratio vs jax on a dict.
    for value in (False, True):
        name = "filter_value_and_grad" if value else "filter_grad"
        label = f"`filter_jit({name}(loss))(model, x)` per call, depth {DEEP} (ratio vs jax.jit)"
        runner.measure(label, grad_cases(deep, x, jit=True, value=value))
    label = (
        f"`filter_jit` of `filter_vmap(f)(xs)` per call, xs {BATCH}x{WIDTH}, depth {DEEP} "
        "(ratio vs jax.jit)"
    )
    runner.measure(label, vmap_cases(deep, xs, jit=True))

    # (3) the same transforms eager, where their wrapper's cost shows; depth 2 and 32 (a
    # depth-32 eager grad takes about 0.2 s a call: left out of a quick run).
    for models in (shallow,) if quick else (shallow, deep):
        eager = eager_settings(models.depth, quick)
        for value in (False, True):
            name = "filter_value_and_grad" if value else "filter_grad"
            label = f"`{name}(loss)(model, x)` eager, depth {models.depth} (ratio vs jax)"
            runner.measure(label, grad_cases(models, x, jit=False, value=value), eager)
        label = (
            f"`filter_vmap(f)(xs)` eager, xs {BATCH}x{WIDTH}, depth {models.depth} (ratio vs jax)"
        )
        runner.measure(label, vmap_cases(models, xs, jit=False), eager)
    return runner


# ------------------------------------------------------------------- asynchronous dispatch


class Heavy(Module):
    """One square matrix and the activation (NNX style: the activation is static)."""

    def __init__(self, weight: jax.Array, activation: Callable[[jax.Array], jax.Array]):
        self.weight = weight
        self.activation = activation


if eqx is not None:

    class EqxHeavy(eqx.Module):
        weight: jax.Array
        activation: Callable[[jax.Array], jax.Array]


def _heavy(steps: int) -> tuple[Callable[..., jax.Array], Callable[..., jax.Array]]:
    """Functions of (model, x) and of (dict, x) repeating ``x = act(x @ weight)`` ``steps``
    times (a loop inside the program, so ``steps`` only sets its duration)."""

    def heavy(m: Any, x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, steps, lambda i, y: m.activation(y @ m.weight), x)

    def heavy_dict(d: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, steps, lambda i, y: ACTIVATION(y @ d["weight"]), x)

    return heavy, heavy_dict


def _best_seconds(call: Callable[[], Any], repeat: int = 3) -> float:
    """The shortest time from a call until its result is ready (after a first, compiling call)."""
    jax.block_until_ready(call())
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(call())
        best = min(best, time.perf_counter() - start)
    return best


@dataclasses.dataclass
class DispatchRow:
    """Median times from a call until it returns and until its result is ready."""

    implementation: str
    returned_s: float | None
    ready_s: float | None
    target: bool = False
    note: str = ""

    @property
    def asynchronous(self) -> bool | None:
        if self.returned_s is None or self.ready_s is None:
            return None
        return self.returned_s <= ASYNC_FRACTION * self.ready_s


def enable_async_dispatch() -> None:
    """Turn JAX's default asynchronous CPU dispatch back on.

    The flag is read when JAX creates its CPU client, so the client is created anew: every
    array made before this call is invalid afterwards.
    """
    jax.config.update("jax_cpu_enable_async_dispatch", True)
    jax.extend.backend.clear_backends()


def dispatch_check(quick: bool, log: Callable[[str], None]) -> tuple[list[DispatchRow], str]:
    """Call-return and result-ready times of a ~200 ms computation, dispatch asynchronous."""
    log("checking that dispatch is asynchronous ...")
    enable_async_dispatch()
    size = 512
    rng = np.random.default_rng(3)
    weight = jnp.asarray(rng.standard_normal((size, size), dtype=np.float32) * (2 / size) ** 0.5)
    x = jnp.asarray(rng.standard_normal((size, size), dtype=np.float32))
    params = {"weight": weight}

    # Choose the number of steps so that one call lasts about ASYNC_SECONDS: estimate from a
    # short loop, then correct once at the chosen length (fixed costs skew a short loop).
    steps = 8
    for _ in range(2):
        seconds = _best_seconds(partial(jax.jit(_heavy(steps)[1]), params, x))
        steps = max(1, round(steps * ASYNC_SECONDS / seconds))
    heavy, heavy_dict = _heavy(steps)

    cases = [
        Case("jax.jit(f_dict)(params, x)", partial(jax.jit(heavy_dict), params, x), check=False),
        _ours(
            "pytree_transforms.filter_jit(f)(model, x)",
            ("filter_jit",),
            lambda: partial(_transform("filter_jit")(heavy), Heavy(weight, ACTIVATION), x),
            check=False,
        ),
        Case(
            "eqx.filter_jit(f)(model, x)",
            None
            if eqx is None
            else partial(eqx.filter_jit(heavy), EqxHeavy(weight, ACTIVATION), x),
            why=NOT_INSTALLED,
            check=False,
        ),
    ]
    why = check_cases(cases, log)  # the first call of each compiles it
    runnable = {c.name: c.call for c in cases if c.name not in why}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runnable}
    names = list(runnable)
    for i in range(2 if quick else 7):
        shift = i % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            result = runnable[name]()
            returned = time.perf_counter()
            jax.block_until_ready(result)
            samples[name].append((returned - start, time.perf_counter() - start))
    rows = []
    for name in (c.name for c in cases):
        ours = name.startswith("pytree_transforms")
        if name not in samples:
            rows.append(DispatchRow(name, None, None, ours, why.get(name, "not run")))
            continue
        returned = statistics.median(s[0] for s in samples[name])
        ready = statistics.median(s[1] for s in samples[name])
        rows.append(DispatchRow(name, returned, ready, ours))
    repeats = len(next(iter(samples.values()), []))
    how = (
        f"A {size}x{size} float32 input through {steps} steps of `x = relu(x @ weight)` in "
        f"a `lax.fori_loop` (calibrated to about {ASYNC_SECONDS * 1e3:g} ms); medians of "
        f"{repeats} calls each, made after compiling, in a rotating order, each waited for "
        "before the next."
    )
    return rows, how


def dispatch_table(rows: list[DispatchRow]) -> str:
    lines = [
        "| implementation | call returns after (ms) | result ready after (ms) | target | met? |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if row.returned_s is None or row.ready_s is None:
            cells = (f"{row.implementation} ({row.note})", "n/a", "n/a", "", "")
        else:
            target = ASYNC_TARGET if row.target else "—"
            met = "" if not row.target else "yes" if row.asynchronous else "**no**"
            cells = (
                row.implementation,
                f"{row.returned_s * 1e3:.2f}",
                f"{row.ready_s * 1e3:.1f}",
                target,
                met,
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- report


def report(runner: Runner, dispatch: tuple[list[DispatchRow], str], invocation: Invocation) -> str:
    description = (
        f"MLPs of width {WIDTH} (float32) with a callable activation (`jax.nn.relu`), at depth "
        f"{DEEP}, {SHALLOW} and {HUGE} (not in a quick run); each form (dict of arrays, "
        "pytree_module Module in NNX and in Equinox style, equinox.Module) holds the very "
        "same arrays. Input `x` of shape "
        f"({WIDTH},); batches `xs` of shape ({BATCH}, {WIDTH})."
    )
    lines = report_head(
        invocation,
        "pytree_transforms: filtered transforms vs jax on a dict of arrays and Equinox",
        description,
        runner.rows,
        runner.timings,
        subject="Each jitted time",
        slow="Eager transforms take milliseconds a call and get fewer, longer repeats",
    )
    lines += overhead_section(
        "filter_jit",
        runner.rows,
        "`filter_jit(f)(model, x)`",
        "jax.jit(f_dict)(params, x)",
        "pytree_transforms.filter_jit(f)(model, x)",
        "jax.jit(f)(model, x), the Module passed directly",
        "the Module",
    )
    dispatch_rows, how = dispatch
    text = (
        "**Dispatch stays asynchronous.** With JAX's default asynchronous CPU dispatch "
        "(turned back on for this part), the time a call takes to return, against the time "
        f"until its result is ready. {how} Met when the call returns in at most "
        f"{ASYNC_FRACTION:.0%} of the time its result takes."
    )
    lines += [*section("dispatch", [text, "", dispatch_table(dispatch_rows)]), ""]
    blocking = [r for r in dispatch_rows if r.target and r.asynchronous is False]
    unmeasured = [r for r in dispatch_rows if r.target and r.returned_s is None]
    lines += target_lines(
        runner.rows,
        missed=[f"- {r.implementation}: blocks until its result is ready" for r in blocking],
        unmeasured=[f"- {r.implementation}, dispatch: {r.note}" for r in unmeasured],
    )
    return "\n".join(lines) + "\n"


def benchmark(invocation: Invocation) -> str:
    """Run every measurement; return the report."""
    runner = run(invocation.settings, invocation.quick, log)
    # Last, as it recreates JAX's CPU client: no array made before survives it.
    dispatch = dispatch_check(invocation.quick, log)
    return report(runner, dispatch, invocation)


def main(argv: list[str] | None = None) -> int:
    versions = {
        "pytree_transforms": getattr(pytree_transforms, "__version__", None),
        "pytree_module": pytree_module.__version__,
        "equinox": eqx.__version__ if eqx is not None else None,
    }
    quick_help = "short smoke run (mostly compiling)"
    return run_script(argv, __file__, __doc__, quick_help, versions, benchmark)


if __name__ == "__main__":
    raise SystemExit(main())
