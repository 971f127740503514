"""Outcomes: what a function run inside a graph transform did, in static form.

An outcome leaves the transform as part of the structure of its output (a pytree with
no leaves, compared by value), so a compiled function keeps it; the dynamic values it
refers to travel next to it, as a list. There are two kinds:

- `ValuesChanged`: the arguments kept their structure; some Variables (or, for some
  transforms, every leaf) got new values.
- `StructureChanged`: the arguments' structure changed (new attributes, swapped
  submodules, new metadata): the whole graph after the call is described again.

`NOTHING_CHANGED` is the usual forward pass: nothing was written and the output is a
single array, so the caller returns that array as it is.
"""

from dataclasses import dataclass

import jax


@dataclass(frozen=True, slots=True)
class ValuesChanged:
    """Only values changed (or nothing did).

    The values that go with it: when `carries_all`, the value of every argument leaf
    (`num_leaves` of them) in leaf order, else the values of the `changed` leaves only;
    then the output's own values.

    Attributes:
        changed: leaf positions of the Variables written.
        out: the record of the output, or None for `None` or a single array.
        out_is_leaf: whether the output is a single array.
        num_leaves: how many leaves the arguments have.
        num_objects: how many objects the arguments and output records number.
        carries_all: the values begin with every argument leaf's value.
        rewrite: write every argument leaf back, not only the Variables in `changed`
            (arrays were replaced, or the transform did not track writes).
    """

    changed: tuple[int, ...] = ()
    out: tuple | None = None
    out_is_leaf: bool = False
    num_leaves: int = 0
    num_objects: int = 0
    carries_all: bool = False
    rewrite: bool = False


@dataclass(frozen=True, slots=True)
class StructureChanged:
    """The arguments' structure changed: the values that go with it are the value of
    every leaf of `args`, then the output's own.

    Attributes:
        args: the record of the arguments after the call.
        out: the record of the output.
        origins: for each object index of the records, the index of the argument object
            it is (updated in place outside), or -1 for a new object.
        num_objects: how many objects the records number.
    """

    args: tuple
    out: tuple
    origins: tuple[int, ...]
    num_objects: int


Outcome = ValuesChanged | StructureChanged

jax.tree_util.register_static(ValuesChanged)
jax.tree_util.register_static(StructureChanged)

# Nothing written, and the output is one array: the caller returns it as it is.
NOTHING_CHANGED = ValuesChanged(out_is_leaf=True)
