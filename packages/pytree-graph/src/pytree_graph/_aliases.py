"""Every path to a shared Variable or array, and refusing specs that disagree on it.

A transform's arguments share objects (`f(model, model)`, a model and an optimizer
holding it). A lifted call holds each shared Variable once, at the first path that
reaches it; but options given per argument (`in_axes`, `in_specs`, `in_shardings`,
`argnums`) may say different things about its other paths. A Variable has one value,
so such options contradict each other: they are refused, naming the paths.
"""

from collections.abc import Callable
from typing import Any

from pytree_filter import path_text

from ._boundary import Call
from ._lift import LiftedCall, lift_walked
from ._traverse import GraphWalk, Path


def lift_recording_aliases(tree: Any) -> tuple[LiftedCall, GraphWalk]:
    """The `LiftedCall` of `tree`, and its walk, which recorded every path to each Module
    and Variable (for `leaf_aliases` and `check_one_spec`)."""
    walk = GraphWalk(record_shared=True)
    return lift_walked(walk, walk.graphdef(tree)), walk


def leaf_aliases(walk: GraphWalk) -> dict[int, list[Path]]:
    """For each leaf reachable by more than one path, every path to it (the first one
    first), from a `lift_recording_aliases` walk.

    A leaf's paths go through shared objects: each object on a path may be reached by
    any of its own paths, so every combination is a path (each object at most once per
    path, so a cycle adds none).
    """
    shared_paths = walk.shared_paths
    assert shared_paths is not None
    if all(len(paths) == 1 for paths in shared_paths.values()):
        return {}
    # Every prefix of a path the walk met is the first path of the object there.
    at_first_path = {paths[0]: index for index, paths in shared_paths.items()}

    def objects_on(path: Path, stop: int) -> list[tuple[int, int]]:
        """`(prefix length, object index)` of the objects on `path`, up to `stop`."""
        return [(k, at_first_path[path[:k]]) for k in range(stop + 1) if path[:k] in at_first_path]

    aliases = {}
    for position, first in enumerate(walk.paths):
        chain = objects_on(first, len(first))
        if all(len(shared_paths[index]) == 1 for _, index in chain):
            continue
        found = [first]
        seen = {first}
        pending = [(first, chain)]
        while pending:
            path, chain = pending.pop()
            for k, index in chain:
                for other in shared_paths[index]:
                    new = other + path[k:]
                    if new in seen:
                        continue
                    new_chain = objects_on(other, len(other) - 1) + [
                        (len(other) + j - k, i) for j, i in chain if j >= k
                    ]
                    if len({i for _, i in new_chain}) < len(new_chain):
                        continue  # round a cycle
                    seen.add(new)
                    found.append(new)
                    pending.append((new, new_chain))
        aliases[position] = found
    return aliases


def show_argument_path(call: Call, path: Path) -> str:
    """Where a path of a call's tree is, in the caller's terms: `argument 0 at .w`."""
    argument, relative = call.split_path(path)
    if argument is None:
        where = "the function itself"
    elif isinstance(argument, str):
        where = f"keyword argument {argument!r}"
    else:
        where = f"argument {argument}"
    return where if not relative else f"{where} at {path_text(relative)}"


def check_one_spec(
    transform: str,
    option: str,
    call: Call,
    walk: GraphWalk,
    spec_of: Callable[[Path, Any], Any],
    fix: str,
    show_spec: Callable[[Any], str] = repr,
) -> None:
    """Refuse a shared Variable or array whose paths get different specs.

    Arguments:
        transform: the transform's name, for the error.
        option: the option the specs come from (e.g. "in_axes").
        call: how the function is called (which argument a path is in).
        walk: a `lift_recording_aliases` walk of the call's tree.
        spec_of: the spec of the leaf at a path: `spec_of(path, leaf)`.
        fix: how to resolve the conflict, for the error.
        show_spec: a spec as the error shows it.

    Raises:
        ValueError: naming the leaf's two paths and their specs.
    """
    for position, paths in leaf_aliases(walk).items():
        leaf = walk.leaves[position]
        first = spec_of(paths[0], leaf)
        for path in paths[1:]:
            other = spec_of(path, leaf)
            if other != first:
                # Opens with Flax NNX's words, then each path with its spec as NNX
                # lists them ("path: spec"), so both kinds of reader find their way.
                here, there = (show_argument_path(call, p) for p in (paths[0], path))
                raise ValueError(
                    f"{transform}: Inconsistent aliasing detected: the "
                    f"{type(leaf).__name__} reached as {here} and as {there} is one object, "
                    f"but {option} gives it two specs:\n  {here}: {show_spec(first)}\n"
                    f"  {there}: {show_spec(other)}\nIt has one value, which cannot follow "
                    f"both. {fix}"
                )
