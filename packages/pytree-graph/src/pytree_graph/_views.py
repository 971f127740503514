"""Switching Modules' attributes (`deterministic`, `use_running_average`...): in place
(`set_attributes`), or on a view of the model sharing its Variables (`view`,
`with_attributes`)."""

import inspect
from collections.abc import Callable
from typing import Any

from pytree_filter import path_text, to_predicate
from pytree_module import Module
from pytree_module.extend import is_frozen_class

from ._graphdef import merge
from ._iteration import iter_modules
from ._split_merge import split


def _set_view_arguments(module: Module, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of `kwargs` that `module`'s `set_view` method takes, or None if its
    class has no `set_view`."""
    # Looked up on the class: an instance's `__getattr__` may answer any name (an `Rngs`
    # gives its default stream), which is no `set_view`.
    if not callable(getattr(type(module), "set_view", None)):
        return None
    set_view = module.set_view  # type: ignore[attr-defined]
    parameters = inspect.signature(set_view).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(kwargs)
    named = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {name: value for name, value in kwargs.items() if name in named}


def _set(
    node: Any,
    selected: Callable[[Any, Any], bool],
    attributes: dict[str, Any],
    raise_if_not_found: bool,
    function: str,
    use_set_view: bool = False,
    graph: bool | None = True,
) -> None:
    """Set `attributes` on the selected Modules of `node` that have them, in place; all
    is checked (frozen Modules, attributes no Module has) before anything is written."""
    writes: list[tuple[Module, dict[str, Any], bool]] = []
    found: set[str] = set()
    for path, module in iter_modules(node, graph=graph):
        if not selected(path, module):
            continue
        by_set_view = _set_view_arguments(module, attributes) if use_set_view else None
        if by_set_view is not None:
            writes.append((module, by_set_view, True))
            found.update(by_set_view)
            continue
        names = {name: value for name, value in attributes.items() if name in vars(module)}
        if not names:
            continue
        if is_frozen_class(type(module)):
            raise ValueError(
                f"{function}: the {type(module).__name__} at {path_text(path)} has "
                f"{sorted(names)} but is frozen, so they cannot be set. Leave it out with a "
                "filter, or build it again with the values you want."
            )
        writes.append((module, names, False))
        found.update(names)
    missing = sorted(set(attributes) - found)
    if missing and raise_if_not_found:
        # Opens with Flax NNX's words for the same error (its `nnx.view`, and
        # `set_attributes` showing the names as a set).
        opening = (
            f"Unused keys found in nnx.view: {missing} (view)"
            if function == "view"
            else f"{function}: Could not find at least one instance of the following "
            f"attributes: {{{', '.join(map(repr, missing))}}}"
        )
        raise ValueError(
            f"{opening}: no selected Module has the attribute(s) {missing}. Check the "
            "spelling, or pass raise_if_not_found=False to set only those that exist."
        )
    for module, values, by_set_view in writes:
        if by_set_view:
            module.set_view(**values)  # type: ignore[attr-defined]
        else:
            for name, value in values.items():
                setattr(module, name, value)


def _selection(filters: tuple[Any, ...]) -> Callable[[Any, Any], bool]:
    predicates = [to_predicate(f) for f in filters]
    return lambda path, module: any(p(path, module) for p in predicates)


def set_attributes(
    node: Any,
    *filters: Any,
    raise_if_not_found: bool = True,
    graph: bool | None = None,
    **attributes: Any,
) -> None:
    """Set attributes on every Module of a graph that has them, in place.

    Arguments:
        node: a Module (or a list, dict or tuple holding Modules).
        *filters: which Modules to change (a Module type, a predicate, a filter object
            seeing `(path, module)`); all of them when none is given.
        raise_if_not_found: raise if no selected Module has one of the attributes.
        graph: `False` for tree mode (see `pytree_graph.split`); `None` reads
            `set_graph_mode`.
        **attributes: the attributes and their values, e.g. `deterministic=True`.

    Raises:
        ValueError: no selected Module has one of the attributes (with
            `raise_if_not_found`), or a frozen Module has one. Nothing is changed then.

    Examples:
        >>> from pytree_module import Module
        >>> from pytree_graph import set_attributes
        >>> class Dropout(Module):
        ...     def __init__(self):
        ...         self.deterministic = False
        >>> class Block(Module):
        ...     def __init__(self):
        ...         self.first = Dropout()
        ...         self.second = Dropout()
        >>> block = Block()
        >>> set_attributes(block, deterministic=True)
        >>> block.first.deterministic, block.second.deterministic
        (True, True)
        >>> set_attributes(block, lambda path, m: path == ("first",), deterministic=False)
        >>> block.first.deterministic, block.second.deterministic
        (False, True)
    """
    selected = _selection(filters) if filters else (lambda path, module: True)
    _set(node, selected, attributes, raise_if_not_found, "set_attributes", graph=graph)


def with_attributes(
    node: Any,
    /,
    *,
    only: Any = ...,
    raise_if_not_found: bool = True,
    graph: bool | None = None,
    **attributes: Any,
) -> Any:
    """A view of a model with attributes set: new Modules, the same Variables.

    Every Module of the view is a new object (so `node` keeps its attributes), while its
    Variables are `node`'s own: training through the view trains `node`. Arrays held
    directly as attributes (not in Variables) are the same arrays at the time of the
    call. Sharing and cycles are kept.

    Arguments:
        node: a Module (or a list, dict or tuple holding Modules).
        only: which Modules to change (a filter seeing `(path, module)`); default all.
        raise_if_not_found: raise if no selected Module has one of the attributes.
        graph: `False` for tree mode (see `pytree_graph.split`); `None` reads
            `set_graph_mode`.
        **attributes: the attributes and their values.

    Returns:
        The view.

    Raises:
        ValueError: as `set_attributes`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, with_attributes
        >>> class Dropout(Module):
        ...     def __init__(self):
        ...         self.deterministic = False
        ...         self.w = Param(jnp.ones(2))
        >>> model = Dropout()
        >>> evaluating = with_attributes(model, deterministic=True)
        >>> evaluating.deterministic, model.deterministic, evaluating.w is model.w
        (True, False, True)
    """
    new = merge(*split(node, graph=graph))
    _set(new, to_predicate(only), attributes, raise_if_not_found, "with_attributes")
    return new


def view(
    node: Any,
    /,
    *,
    only: Any = ...,
    raise_if_not_found: bool = True,
    graph: bool | None = None,
    **kwargs: Any,
) -> Any:
    """A view of a model in another mode: new Modules, the same Variables.

    As `with_attributes`, except that a Module class may define a `set_view(self, ...)`
    method to say what a view argument means for it (e.g. `decode=True` setting several
    attributes): such a Module gets `set_view` called with the arguments its signature
    takes, and the others get the attributes they have set directly.

    Arguments:
        node: a Module (or a list, dict or tuple holding Modules).
        only: which Modules to change (a filter seeing `(path, module)`); default all.
        raise_if_not_found: raise if an argument is taken by no selected Module (neither
            by its `set_view` nor as an attribute).
        graph: `False` for tree mode (see `pytree_graph.split`); `None` reads
            `set_graph_mode`.
        **kwargs: the view's arguments, e.g. `deterministic=True`.

    Returns:
        The view.

    Raises:
        ValueError: as `set_attributes`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, view
        >>> class Norm(Module):
        ...     def __init__(self):
        ...         self.use_running_average = False
        ...         self.mean = Param(jnp.zeros(2))
        >>> class Model(Module):
        ...     def __init__(self):
        ...         self.norm = Norm()
        >>> model = Model()
        >>> serving = view(model, use_running_average=True)
        >>> serving.norm.use_running_average, model.norm.use_running_average
        (True, False)
        >>> serving.norm.mean is model.norm.mean
        True
    """
    new = merge(*split(node, graph=graph))
    _set(new, to_predicate(only), kwargs, raise_if_not_found, "view", use_set_view=True)
    return new
