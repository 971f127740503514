"""`view_info`: what `view` can set on a model, read from its Modules' `set_view` methods."""

import inspect
import re
from typing import Any

from pytree_filter import to_predicate

from ._iteration import iter_modules

# The argument sections of a docstring, Google style ("Args:") or this project's.
_SECTION = re.compile(r"^(Args|Arguments):\s*$")


def _argument_docs(doc: str) -> dict[str, list[str]]:
    """Each argument's description lines, from the docstring's argument section."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if _SECTION.match(line.strip())), None)
    if start is None:
        return {}
    docs: dict[str, list[str]] = {}
    indent = None
    current: list[str] | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        if width < indent or (width == 0 and line.rstrip().endswith(":")):
            break  # the next section
        if width == indent and ":" in line:
            name, _, text = line.strip().partition(":")
            current = docs[name.strip().split(" ")[0]] = [text.strip()] if text.strip() else []
        elif current is not None:
            current.append(line.strip())
    return docs


def _describe(cls: type) -> list[str]:
    set_view = cls.set_view  # type: ignore[attr-defined]
    signature = inspect.signature(set_view)
    doc = inspect.getdoc(set_view)
    if not doc:
        return [f"  set_view{signature}"]
    docs = _argument_docs(doc)
    out = []
    for name, parameter in signature.parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        line = f"  {name}"
        if parameter.annotation is not parameter.empty:
            line += f": {inspect.formatannotation(parameter.annotation)}"
        if parameter.default is not parameter.empty:
            line += f" = {parameter.default!r}"
        out.append(line)
        out.extend(f"    {text}" for text in docs.get(name, ()))
    return out


def view_info(node: Any, /, *, only: Any = ..., graph: bool | None = None) -> str:
    """What `view` can set on the Modules of `node`: each class's `set_view` arguments.

    A Module class that defines `set_view` says which attributes `view` sets through it
    (`Dropout`: `deterministic`, `BatchNorm`: `use_running_average`, ...). This lists, once
    per class and sorted by name, its arguments with their annotations, defaults and
    descriptions (from the docstring's `Args:` or `Arguments:` section; the signature alone
    when it has no docstring), as Flax NNX's `view_info` does.

    Arguments:
        node: a Module, or a list, dict or tuple holding Modules.
        only: a filter choosing the Modules (seeing `(path, module)`), all by default.
        graph: accepted for Flax NNX's signature; the listing is the same in both modes.

    Returns:
        The listing, one class after another (empty if no selected Module has `set_view`).

    Example:
        >>> from pytree_module import Module
        >>> import pytree_graph as pg
        >>> class Noisy(Module):
        ...     def __init__(self):
        ...         self.deterministic = False
        ...     def set_view(self, deterministic: bool | None = None):
        ...         '''Args:
        ...           deterministic: if True, adds no noise.
        ...         '''
        ...         if deterministic is not None:
        ...             self.deterministic = deterministic
        >>> print(pg.view_info([Noisy(), Noisy()]))
        Noisy:
          deterministic: bool | None = None
            if True, adds no noise.
    """
    if graph is not None and not isinstance(graph, bool):
        raise TypeError(f"view_info: graph= takes True, False or None; got {graph!r}.")
    selected = to_predicate(only)
    classes = {
        type(module)
        for path, module in iter_modules(node)
        if callable(getattr(type(module), "set_view", None)) and selected(path, module)
    }
    lines: list[str] = []
    for cls in sorted(classes, key=lambda c: c.__qualname__):
        lines.append(f"{cls.__qualname__}:")
        lines.extend(_describe(cls))
    return "\n".join(lines)
