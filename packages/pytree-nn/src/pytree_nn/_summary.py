"""`tabulate`: a table of a model's Modules, their Variables, sizes, output shapes and
FLOPs."""

import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import pytree_graph
import pytree_module
from pytree_filter import Path, is_array, is_inexact_array, path_text
from pytree_graph import Variable

from ._checks import check_graph

_ARRAYS = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)
_ARRAY_COLUMN = "array"  # the column of arrays held outside Variables
_LISTED = 4  # a cell lists up to this many Variables by name, else only counts them


def _size(value: Any) -> tuple[int, int]:
    """`(number of values, bytes)` of the arrays (and Python numbers) in `value`."""
    count = size = 0
    for leaf in jax.tree.leaves(value):
        if isinstance(leaf, _ARRAYS):
            n = int(np.prod(np.shape(leaf), dtype=np.int64))
            count, size = count + n, size + n * leaf.dtype.itemsize
        elif isinstance(leaf, bool | int | float | complex):
            count, size = count + 1, size + np.asarray(leaf).itemsize
    return count, size


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError  # the loop always returns


def _amount(count: int, size: int) -> str:
    return f"{count:,} ({_bytes(size)})"


class _Calls:
    """What each Module of a model does in one call of it: its output, and, when asked,
    the FLOPs of its call and of the call's VJP, per Module path. A Module called more
    than once has the output of its first call and the FLOPs of all its calls."""

    def __init__(self, flops: bool, vjp_flops: bool):
        self.flops, self.vjp_flops = flops, vjp_flops
        self.outputs: dict[Path, str] = {}
        self.forward: dict[Path, int] = {}
        self.backward: dict[Path, int] = {}


# Set while a Module's call is lowered on its own for its FLOPs: the Modules it calls are
# then not recorded (their own FLOPs come from their own calls).
_lowering = threading.local()


def _record_calls(model: Any, args: tuple, kwargs: dict[str, Any], calls: _Calls) -> None:
    """Fill `calls` for every Module of `model` that runs in `model(*args, **kwargs)`,
    traced with `pytree_graph.eval_shape` (nothing is computed, and nothing changes).

    While it traces, each Module class of the model has its `__call__` wrapped to note
    what it returns; the classes are restored afterwards.
    """
    classes = {
        type(node)
        for _, node in pytree_graph.iter_graph(model)
        if isinstance(node, pytree_module.Module)
    }
    originals = {}
    for cls in classes:
        found = next((vars(k)["__call__"] for k in cls.__mro__ if "__call__" in vars(k)), None)
        if found is not None:
            originals[cls] = found

    def run(model: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        paths = {
            id(node): path
            for path, node in pytree_graph.iter_graph(model)
            if isinstance(node, pytree_module.Module)
        }
        own = {cls: vars(cls).get("__call__") for cls in originals}
        try:
            for cls, original in originals.items():
                cls.__call__ = _recording(original, paths, calls)
            return model(*args, **kwargs)
        finally:
            for cls, method in own.items():
                if method is None:
                    del cls.__call__
                else:
                    cls.__call__ = method

    pytree_graph.eval_shape(run, model, args, kwargs)


def _recording(original: Any, paths: dict[int, Path], calls: _Calls) -> Callable:
    """`original` (a `__call__`), noting what it returns, and its FLOPs, for known Modules."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original.__get__(self, type(self))(*args, **kwargs)
        path = paths.get(id(self))
        if path is not None and not getattr(_lowering, "active", False):
            calls.outputs.setdefault(path, pytree_module.tree_pformat(out, width=10**6))
            if calls.flops or calls.vjp_flops:
                forward, backward = _call_flops(original, self, args, kwargs, calls)
                for table, value in ((calls.forward, forward), (calls.backward, backward)):
                    if value is not None:
                        table[path] = table.get(path, 0) + value
        return out

    return __call__


def _call_flops(
    original: Any, module: Any, args: tuple, kwargs: dict[str, Any], calls: _Calls
) -> tuple[int | None, int | None]:
    """XLA's FLOP estimate for `module(*args, **kwargs)` compiled on its own, and for its
    VJP (the cotangents of its floating-point inputs and Variables, given its outputs as
    output cotangents), from the lowered programs' cost analysis: nothing is run."""
    graphdef, state = pytree_graph.split(module)
    leaves, treedef = jax.tree.flatten((state, args, kwargs))
    dynamic = [i for i, leaf in enumerate(leaves) if is_array(leaf)]
    abstract = [jax.ShapeDtypeStruct(np.shape(leaves[i]), leaves[i].dtype) for i in dynamic]

    def call(*arrays: Any) -> Any:
        full = list(leaves)
        for i, x in zip(dynamic, arrays, strict=True):
            full[i] = x
        state, args, kwargs = treedef.unflatten(full)
        return original(pytree_graph.merge(graphdef, state), *args, **kwargs)

    def vjp(*arrays: Any) -> Any:
        differentiated = [is_inexact_array(x) for x in arrays]

        def inexact_outputs(*chosen: Any) -> list[Any]:
            picked = iter(chosen)
            full = [next(picked) if d else x for x, d in zip(arrays, differentiated, strict=True)]
            return [x for x in jax.tree.leaves(call(*full)) if is_inexact_array(x)]

        chosen = [x for x, d in zip(arrays, differentiated, strict=True) if d]
        outputs, pullback = jax.vjp(inexact_outputs, *chosen)
        return pullback(outputs)

    _lowering.active = True
    try:
        forward = _flops(jax.jit(call).lower(*abstract)) if calls.flops else None
        backward = _flops(jax.jit(vjp).lower(*abstract)) if calls.vjp_flops else None
    finally:
        _lowering.active = False
    return forward, backward


def _flops(lowered: Any) -> int:
    """The `flops` of a lowered program's cost analysis (0 when XLA gives none)."""
    cost = lowered.cost_analysis()
    if isinstance(cost, list | tuple):  # one entry per program in some JAX versions
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        cost = lowered.compile().cost_analysis()
        if isinstance(cost, list | tuple):
            cost = cost[0] if cost else None
    return int(cost["flops"]) if cost and "flops" in cost else 0


def tabulate(
    model: Any,
    *example_inputs: Any,
    depth: int | None = None,
    compute_flops: bool = False,
    compute_vjp_flops: bool = False,
    **example_kwargs: Any,
) -> str:
    """A table of every Module in a model: its Variables' shapes, dtypes, counts and bytes,
    and, given example inputs, its output and FLOPs.

    One row per Module (a shared Module once, at its first path), one column per Variable
    type (`Param`, `BatchStat`, ...; arrays held outside Variables under `array`). Each
    cell lists the Module's own Variables of that type, with their number of values and
    bytes; the last row has the totals per type, and a line after the table the grand
    total. A Variable shared by several Modules is counted once, with the first. Given
    example inputs, the table also shows each Module's output, found by tracing
    `model(*example_inputs, **example_kwargs)` with `pytree_graph.eval_shape`: nothing
    is computed, and the model does not change (an abstract model, made with
    `pytree_graph.eval_shape`, works too). The table is Markdown, readable as plain text.

    Arguments:
        model: a Module (or any graph of Modules and Variables).
        *example_inputs: inputs to call the model with (arrays or
            `jax.ShapeDtypeStruct`s), to show the output of each Module.
        depth: show only the Modules whose path has at most this many entries (0: the
            model alone; `.layers[0]`, an attribute then an index, is 2 deep); the
            Variables of the Modules below are listed in their ancestor's row, by their path
            from it. None (the default) shows every Module.
        compute_flops: add a `flops` column: XLA's estimate of the floating-point
            operations of each Module's call (all its calls, for a Module called more than
            once), each compiled on its own from the example inputs' shapes (lowered, not
            run). Needs example inputs.
        compute_vjp_flops: add a `vjp_flops` column: the same for the VJP of each call
            (the cotangents of its floating-point inputs and Variables). Needs example
            inputs.
        **example_kwargs: keyword arguments of that call.

    Returns:
        The table, as a string.

    Raises:
        TypeError: `model` is a single value (None, a number, an array), not a model.
        ValueError: a bad `depth`, or FLOPs asked for without example inputs.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_nn import Linear, Sequential, tabulate
        >>> model = Sequential(Linear(2, 4, rngs=0), Linear(4, 1, rngs=1))
        >>> print(tabulate(model, jnp.ones((3, 2))))
        | path       | type       | output   | Param                                   |
        | ---------- | ---------- | -------- | --------------------------------------- |
        | (root)     | Sequential | f32[3,1] |                                         |
        | .layers[0] | Linear     | f32[3,4] | 12 (48 B): bias f32[4], kernel f32[2,4] |
        | .layers[1] | Linear     | f32[3,1] | 5 (20 B): bias f32[1], kernel f32[4,1]  |
        | Total      |            |          | 17 (68 B)                               |
        <BLANKLINE>
        Total: 17 (68 B) in 3 Modules.
        >>> print(tabulate(model, jnp.ones((3, 2)), compute_flops=True))
        | path       | type       | output   | flops | Param                                   |
        | ---------- | ---------- | -------- | ----- | --------------------------------------- |
        | (root)     | Sequential | f32[3,1] | 87    |                                         |
        | .layers[0] | Linear     | f32[3,4] | 60    | 12 (48 B): bias f32[4], kernel f32[2,4] |
        | .layers[1] | Linear     | f32[3,1] | 27    | 5 (20 B): bias f32[1], kernel f32[4,1]  |
        | Total      |            |          |       | 17 (68 B)                               |
        <BLANKLINE>
        Total: 17 (68 B) in 3 Modules.
    """
    check_graph("tabulate", "model", model, "a Module (or any graph of Modules and Variables)")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise ValueError(
            f"tabulate: `depth` must be None or an int >= 0 (0 shows the model alone), got "
            f"{depth!r}."
        )
    called = bool(example_inputs or example_kwargs)
    if (compute_flops or compute_vjp_flops) and not called:
        raise ValueError(
            "tabulate: `compute_flops` and `compute_vjp_flops` need example inputs, to "
            "compile each Module's call for their shapes: pass them after the model, e.g. "
            "`tabulate(model, jax.ShapeDtypeStruct((8, 3), jnp.float32), compute_flops=True)`."
        )
    items = list(pytree_graph.iter_graph(model))
    modules: dict[Path, Any] = {p: v for p, v in items if isinstance(v, pytree_module.Module)}
    modules.setdefault((), model)
    shown = {p: m for p, m in modules.items() if depth is None or len(p) <= depth}
    # Rows in pre-order: a Module comes where the first thing inside it comes.
    first_seen: dict[Path, int] = {}
    for i, (path, _) in enumerate(items):
        for level in range(len(path) + 1):
            first_seen.setdefault(path[:level], i)
    order = sorted(shown, key=lambda p: (first_seen.get(p, 0), len(p)))
    columns, cells, amounts = _variables_by_owner(items, shown)
    calls = _Calls(compute_flops, compute_vjp_flops)
    if called:
        _record_calls(model, example_inputs, example_kwargs, calls)
    extra = (["output"] if called else []) + (["flops"] if compute_flops else [])
    extra += ["vjp_flops"] if compute_vjp_flops else []

    header = ["path", "type", *extra, *columns]
    rows = []
    for path in order:
        row = [path_text(path, root="(root)"), type(modules[path]).__name__]
        if called:
            row.append(calls.outputs.get(path, ""))
        for wanted, found in ((compute_flops, calls.forward), (compute_vjp_flops, calls.backward)):
            if wanted:
                row.append(f"{found[path]:,}" if path in found else "")
        for column in columns:
            listed = cells.get((path, column), [])
            amount = _amount(*amounts.get((path, column), (0, 0)))
            if not listed:
                row.append("")
            elif len(listed) > _LISTED:
                noun = "arrays" if column == _ARRAY_COLUMN else "Variables"
                row.append(f"{amount} in {len(listed)} {noun}")
            else:
                row.append(f"{amount}: {', '.join(listed)}")
        rows.append(row)
    totals = {column: [0, 0] for column in columns}
    for (_, column), (count, size) in amounts.items():
        totals[column][0] += count
        totals[column][1] += size
    rows.append(
        ["Total", "", *[""] * len(extra)] + [_amount(*totals[column]) for column in columns]
    )
    count = sum(t[0] for t in totals.values())
    size = sum(t[1] for t in totals.values())
    number = sum(isinstance(m, pytree_module.Module) for m in modules.values())
    lines = [
        *_markdown([header, *rows]),
        "",
        f"Total: {_amount(count, size)} in {number} Module{'' if number == 1 else 's'}.",
    ]
    for paths in pytree_graph.find_duplicates(model):
        first, *others = (path_text(p, root="(root)") for p in paths)
        lines.append(f"Shared: {first} is also at {', '.join(others)} (counted once).")
    return "\n".join(lines)


def _variables_by_owner(items: list[tuple[Path, Any]], shown: dict[Path, Any]) -> tuple:
    """The Variable columns, and per `(Module path, column)` the text of each Variable
    the Module holds, itself or through Modules not `shown`, and their `[count, bytes]`."""
    columns: list[str] = []
    cells: dict[tuple[Path, str], list[str]] = {}
    amounts: dict[tuple[Path, str], list[int]] = {}
    for path, leaf in items:
        if isinstance(leaf, pytree_module.Module):
            continue
        owner = max((path[:d] for d in range(len(path)) if path[:d] in shown), key=len)
        column = type(leaf).__name__ if isinstance(leaf, Variable) else _ARRAY_COLUMN
        if column not in columns:
            columns.append(column)
        value = leaf.value if isinstance(leaf, Variable) else leaf
        name = path_text(path[len(owner) :]).lstrip(".")
        text = pytree_module.tree_pformat(value, width=10**6)
        cells.setdefault((owner, column), []).append(f"{name} {text}")
        count, size = _size(value)
        amount = amounts.setdefault((owner, column), [0, 0])
        amount[0] += count
        amount[1] += size
    return columns, cells, amounts


def _markdown(table: list[list[str]]) -> list[str]:
    """The lines of a Markdown table (first row the header), columns padded to align."""
    table = [[text.replace("|", "\\|").replace("\n", " ") for text in row] for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [
        "| " + " | ".join(t.ljust(w) for t, w in zip(row, widths, strict=True)) + " |"
        for row in table
    ]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return lines
