"""What a derivative of a call is taken with respect to, and (co)tangents per argument.

A derivative transform (`grad`, `vjp`, `jvp`, `custom_vjp`) differentiates some leaves of
a lifted call: `Differentiated` picks them, argument by argument (the Variables a filter
selects in an argument holding Modules, every floating-point value in any other). What
goes in and out per argument has one form everywhere: for an argument holding Modules a
`State` of Variables at their paths in it (a shared Variable once, at its first path),
each holding its (co)tangent; for any other argument its own structure, with Variables
holding their (co)tangent and None where nothing is differentiated. `gradient_of` builds
that form from values by leaf position, `tangent_values` reads it back.
"""

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytree_filter import is_inexact_array_like, path_text

from ._aliases import check_one_spec
from ._boundary import Call, holds_modules
from ._lift import LiftedCall, value_of
from ._records import DICT, LEAF, LIST, PYTREE, SHARED, STATIC, TUPLE, VARIABLE
from ._state import State
from ._traverse import GraphWalk
from ._variables import Variable

# A filter of the Variables to differentiate in an argument holding Modules: its
# predicate and how messages show it (e.g. "wrt=Param"); None: every floating-point one.
Selector = tuple[Callable[[tuple, Any], bool], str] | None


class Differentiated:
    """Which leaves of a call are differentiated.

    Arguments:
        transform: the transform's name, for errors.
        call: how the function is called.
        args: the call's positional arguments.
        selectors: for each differentiated positional argument (an index into `args`),
            how to choose its Variables when it holds Modules (see `Selector`). Other
            arguments, keyword arguments and the function itself are not differentiated.

    Attributes:
        graph_args: for each differentiated argument, whether it holds Modules.
    """

    __slots__ = ("call", "graph_args", "selectors", "transform")

    def __init__(self, transform: str, call: Call, args: tuple, selectors: dict[int, Selector]):
        self.transform = transform
        self.call = call
        self.selectors = selectors
        self.graph_args = {k: holds_modules(args[k]) for k in selectors}

    def selects(self, path: tuple, leaf: Any) -> bool:
        """Whether the leaf at `path` (of the lifted tree) is differentiated.

        Python floats count as floating-point values: JAX makes them arrays.

        Raises:
            TypeError: a filter given for an argument selects a Variable without a
                floating-point value.
        """
        argument, relative = self.call.split_path(path)
        if argument not in self.selectors:
            return False
        value = value_of(leaf)
        selector = self.selectors[argument]
        if not self.graph_args[argument] or selector is None:
            return is_inexact_array_like(value)
        predicate, shown = selector
        if not predicate(relative, leaf):
            return False
        if not is_inexact_array_like(value):
            raise TypeError(
                f"{self.transform}: the {type(leaf).__name__} at {path_text(relative)} of "
                f"argument {argument} matches {shown} but holds {_describe(value)}, which "
                "has no gradient (only floating-point values do). Narrow the filter to "
                "leave it out, e.g. `Param`, with the integer state in another Variable type."
            )
        return True

    def select(self, lifted: LiftedCall, walk: GraphWalk, option: str) -> tuple[bool, ...]:
        """Whether each leaf of `lifted` (walked by `lift_recording_aliases`) is
        differentiated, refusing a shared leaf that is on one path and not on another.

        Arguments:
            option: the option that chose the leaves, for the error (e.g. "argnums=0").
        """
        check_one_spec(
            self.transform,
            option,
            self.call,
            walk,
            self.selects,
            "Its derivative through one argument would leave out its use through the "
            "other. Differentiate every argument that holds it (its derivative comes with "
            "the first), or pass separate objects (e.g. `pytree_graph.clone(model)`).",
            show_spec=_show_differentiated,
        )
        return tuple(map(self.selects, lifted.paths, lifted.leaves))

    def gradients(self, lifted: LiftedCall, selected: tuple[bool, ...], grads: list[Any]) -> dict:
        """`{argument: gradient}` for each differentiated argument, from `grads`, the
        gradients of the `selected` leaves in leaf order (see `gradient_of`)."""
        positions = (p for p, s in enumerate(selected) if s)
        by_position = dict(zip(positions, grads, strict=True))
        return {
            k: gradient_of(self.call, lifted, k, is_graph, by_position)
            for k, is_graph in self.graph_args.items()
        }

    def tangents(
        self,
        lifted: LiftedCall,
        selected: tuple[bool, ...],
        given: dict[int, Any],
        what: str,
        strict: bool = True,
    ) -> list[Any]:
        """The values of the (co)tangents `given` per argument (in the form `gradient_of`
        gives), one for each `selected` leaf in leaf order, zeros where none was given.

        Arguments:
            what: what the values are, for errors (e.g. "tangents[0]").
            strict: refuse a value given for a leaf that is not differentiated (else
                drop it: a backward rule may return cotangents for every input).
        """
        found: dict[int, Any] = {}
        for k, tangent in given.items():
            found.update(
                tangent_values(
                    self.transform,
                    f"{what}[{k}]",
                    self.call,
                    lifted,
                    selected,
                    k,
                    self.graph_args[k],
                    tangent,
                    strict,
                )
            )
        return [
            found[p] if p in found else jnp.zeros_like(value)
            for p, (value, s) in enumerate(zip(lifted.values, selected, strict=True))
            if s
        ]


def _show_differentiated(selected: bool) -> str:
    return "differentiated" if selected else "not differentiated"


def _describe(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return f"{dtype} values" if dtype is not None else f"a {type(value).__name__}"


def gradient_of(
    call: Call, lifted: LiftedCall, argument: int, is_graph: bool, by_position: dict[int, Any]
) -> Any:
    """The gradient for one argument, from gradients by leaf position: a State for an
    argument holding Modules, else its own structure."""
    if is_graph:
        flat = {}
        for position, grad in by_position.items():
            arg, relative = call.split_path(lifted.paths[position])
            if arg == argument:
                leaf = lifted.leaves[position]
                flat[relative] = leaf._pg_flat[1]((grad,)) if isinstance(leaf, Variable) else grad
        return State.from_flat_path(flat)
    return rebuild_with(call.argument_record(lifted.graphdef, argument), by_position)


def rebuild_with(record: tuple, grads: dict[int, Any]) -> Any:
    """A gradient shaped like the argument `record` describes (Variables holding their
    gradient), with None where nothing was differentiated."""
    tag = record.tag
    if tag == LEAF:
        return grads.get(record.position)
    if tag == VARIABLE:
        grad = grads.get(record.position)
        return None if grad is None else record.kind((grad,))
    if tag == LIST:
        return record.cls(rebuild_with(r, grads) for r in record.children)
    if tag == TUPLE:
        return tuple(rebuild_with(r, grads) for r in record.children)
    if tag == DICT:
        return record.cls(
            (k, rebuild_with(r, grads)) for k, r in zip(record.keys, record.children, strict=True)
        )
    if tag == PYTREE:
        return record.treedef.unflatten([rebuild_with(r, grads) for r in record.children])
    return None


def tangent_values(
    transform: str,
    what: str,
    call: Call,
    lifted: LiftedCall,
    selected: tuple[bool, ...],
    argument: int,
    is_graph: bool,
    tangent: Any,
    strict: bool = True,
) -> dict[int, Any]:
    """`{leaf position: value}` of one argument's (co)tangent, checked against the
    argument: the inverse of `gradient_of`. None stands for zeros; a State may leave
    Variables out (zeros for them). Values for leaves that are not differentiated are
    refused when `strict`, else dropped.

    Raises:
        TypeError, ValueError: the tangent does not fit the argument, naming where.
    """
    if tangent is None:
        return {}
    found: dict[int, Any] = {}
    check = partial(_check_tangent, transform, lifted, selected, found, strict)
    if not is_graph:
        record = call.argument_record(lifted.graphdef, argument)
        _read(record, tangent, (), check, what, transform, strict)
        return found
    if isinstance(tangent, dict):
        tangent = State(tangent)
    if not isinstance(tangent, State):
        raise TypeError(
            f"{transform}: {what} is for an argument holding Modules, so it must be a State "
            f"(or nested dict) of its Variables by path (as `grad` returns), got a "
            f"{type(tangent).__name__}. Make "
            "one with e.g. `jax.tree.map(jnp.ones_like, pytree_graph.state(model, Param))`, "
            "or pass None for a zero tangent."
        )
    positions = {}
    for position, path in enumerate(lifted.paths):
        arg, relative = call.split_path(path)
        if arg == argument:
            positions[relative] = position
    for relative, leaf in tangent.flat_state().items():
        position = positions.get(relative)
        if position is None or (strict and not selected[position]):
            shown = ", ".join(path_text(r) for r, p in positions.items() if selected[p]) or "none"
            raise ValueError(
                f"{transform}: {what} has an entry at {path_text(relative)}, but argument "
                f"{argument} has no differentiated Variable there (those it has: {shown}). "
                "Leave it out of the State."
            )
        check(f"{what}{path_text(relative, root='')}", position, leaf)
    return found


def _check_tangent(
    transform: str,
    lifted: LiftedCall,
    selected: tuple[bool, ...],
    found: dict[int, Any],
    strict: bool,
    where: str,
    position: int,
    tangent: Any,
) -> None:
    """Record `tangent` (a Variable holding it, or the value) for leaf `position`."""
    value = value_of(tangent) if isinstance(tangent, Variable) else tangent
    if value is None:
        return
    primal = lifted.values[position]
    if not selected[position]:
        if not strict:
            return
        raise ValueError(
            f"{transform}: {where} is given a tangent, but the value there "
            f"({_describe(primal)}) is not differentiated. Pass None there."
        )
    if not is_inexact_array_like(value):
        raise TypeError(
            f"{transform}: {where} must hold a floating-point array, got {_describe(value)}."
        )
    if np.shape(value) != np.shape(primal):
        raise ValueError(
            f"{transform}: {where} has shape {np.shape(value)}, but the value it goes with "
            f"has shape {np.shape(primal)}: a tangent has its primal's shape."
        )
    found[position] = jnp.asarray(value, dtype=jnp.result_type(primal))


def _read(
    record: tuple,
    tangent: Any,
    path: tuple,
    check: Callable[[str, int, Any], None],
    what: str,
    transform: str,
    strict: bool,
) -> None:
    """Walk `tangent` along the argument `record` describes, checking each leaf."""
    tag = record.tag
    where = what + path_text(path, root="")
    if tangent is None or tag in (SHARED, STATIC):
        if tangent is not None and tag == STATIC and strict:
            raise ValueError(
                f"{transform}: {where} is given a tangent, but the value there is not an "
                "array (it has no tangent). Pass None there."
            )
        return
    if tag in (LEAF, VARIABLE):
        check(where, record.position, tangent)
        return
    if tag == DICT:
        if not isinstance(tangent, dict) or set(tangent) != set(record.keys):
            raise ValueError(
                f"{transform}: {where} must be a dict with keys {sorted(record.keys, key=str)} "
                f"(as the argument), got {_shape_of(tangent)}."
            )
        for key, child in zip(record.keys, record.children, strict=True):
            _read(child, tangent[key], (*path, key), check, what, transform, strict)
        return
    if tag in (LIST, TUPLE):
        kind = list if tag == LIST else tuple
        if not isinstance(tangent, kind) or len(tangent) != len(record.children):
            raise ValueError(
                f"{transform}: {where} must be a {kind.__name__} of {len(record.children)} "
                f"items (as the argument), got {_shape_of(tangent)}."
            )
        for i, (child, item) in enumerate(zip(record.children, tangent, strict=True)):
            _read(child, item, (*path, i), check, what, transform, strict)
        return
    if tag == PYTREE:
        try:
            children = record.treedef.flatten_up_to(tangent)
        except (TypeError, ValueError):
            raise ValueError(
                f"{transform}: {where} must have the argument's structure {record.treedef}, "
                f"got {_shape_of(tangent)}."
            ) from None
        for i, (child, item) in enumerate(zip(record.children, children, strict=True)):
            _read(child, item, (*path, i), check, what, transform, strict)
        return
    raise TypeError(f"{transform}: {where} cannot hold a tangent (it is a Module's place).")


def _shape_of(value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(value, key=str)}"
    return f"a {type(value).__name__}"


def zeros_for(values: list[Any]) -> list[Any]:
    """Zero cotangents for `values` (float0 for integer ones, as JAX wants them)."""
    return [
        jnp.zeros_like(v)
        if is_inexact_array_like(v)
        else np.zeros(np.shape(v), dtype=jax.dtypes.float0)
        for v in values
    ]
