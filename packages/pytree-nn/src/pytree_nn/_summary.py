"""`tabulate`: a table of a model's Modules, their Variables, sizes and output shapes."""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import pytree_graph
import pytree_module
from pytree_filter import Path, path_text
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


def _record_outputs(model: Any, args: tuple, kwargs: dict[str, Any]) -> dict[Path, str]:
    """The output shapes of every Module of `model` that runs in `model(*args, **kwargs)`,
    found with `pytree_graph.eval_shape` (nothing is computed, and nothing changes).

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
    outputs: dict[Path, str] = {}

    def run(model: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        paths = {
            id(node): path
            for path, node in pytree_graph.iter_graph(model)
            if isinstance(node, pytree_module.Module)
        }
        own = {cls: vars(cls).get("__call__") for cls in originals}
        try:
            for cls, original in originals.items():
                cls.__call__ = _recording(original, paths, outputs)
            return model(*args, **kwargs)
        finally:
            for cls, method in own.items():
                if method is None:
                    del cls.__call__
                else:
                    cls.__call__ = method

    pytree_graph.eval_shape(run, model, args, kwargs)
    return outputs


def _recording(original: Any, paths: dict[int, Path], outputs: dict[Path, str]) -> Callable:
    """`original` (a `__call__`), noting the shapes of what it returns for known Modules."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original.__get__(self, type(self))(*args, **kwargs)
        path = paths.get(id(self))
        if path is not None:
            outputs[path] = pytree_module.tree_pformat(out, width=10**6)
        return out

    return __call__


def tabulate(model: Any, *example_inputs: Any, **example_kwargs: Any) -> str:
    """A table of every Module in a model: its Variables' shapes, dtypes, counts and bytes.

    One row per Module (a shared Module once, at its first path), one column per Variable
    type (`Param`, `BatchStat`, ...; arrays held outside Variables under `array`). Each
    cell lists the Module's own Variables of that type, with their number of values and
    bytes; the last row has the totals per type, and a line after the table the grand
    total. A Variable shared by several Modules is counted once, with the first. Given
    example inputs, the table also shows each Module's output, found by tracing
    `model(*example_inputs, **example_kwargs)` with `pytree_graph.eval_shape`: nothing
    is computed, and the model does not change. The table is Markdown, readable as plain
    text.

    Arguments:
        model: a Module (or any graph of Modules and Variables).
        *example_inputs: inputs to call the model with (arrays or
            `jax.ShapeDtypeStruct`s), to show the output of each Module.
        **example_kwargs: keyword arguments of that call.

    Returns:
        The table, as a string.

    Raises:
        TypeError: `model` is a single value (None, a number, an array), not a model.

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
    """
    check_graph("tabulate", "model", model, "a Module (or any graph of Modules and Variables)")
    items = list(pytree_graph.iter_graph(model))
    modules: dict[Path, Any] = {p: v for p, v in items if isinstance(v, pytree_module.Module)}
    modules.setdefault((), model)
    # Rows in pre-order: a Module comes where the first thing inside it comes.
    first_seen: dict[Path, int] = {}
    for i, (path, _) in enumerate(items):
        for depth in range(len(path) + 1):
            first_seen.setdefault(path[:depth], i)
    order = sorted(modules, key=lambda p: (first_seen.get(p, 0), len(p)))
    columns, cells, amounts = _variables_by_owner(items, modules)
    called = example_inputs or example_kwargs
    outputs = _record_outputs(model, example_inputs, example_kwargs) if called else None

    header = ["path", "type", *(["output"] if outputs is not None else []), *columns]
    rows = []
    for path in order:
        row = [path_text(path, root="(root)"), type(modules[path]).__name__]
        if outputs is not None:
            row.append(outputs.get(path, ""))
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
        ["Total", "", *([""] if outputs is not None else [])]
        + [_amount(*totals[column]) for column in columns]
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


def _variables_by_owner(items: list[tuple[Path, Any]], modules: dict[Path, Any]) -> tuple:
    """The Variable columns, and per `(Module path, column)` the text of each Variable
    the Module holds itself and their `[count, bytes]`."""
    columns: list[str] = []
    cells: dict[tuple[Path, str], list[str]] = {}
    amounts: dict[tuple[Path, str], list[int]] = {}
    for path, leaf in items:
        if isinstance(leaf, pytree_module.Module):
            continue
        owner = max((path[:d] for d in range(len(path)) if path[:d] in modules), key=len)
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
