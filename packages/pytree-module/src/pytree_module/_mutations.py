"""The mutation count: the one number that says whether object graphs may have changed.

Anything derived from the attributes of existing objects (pytree_graph caches its walks of
object graphs, keyed on the objects and their flattened forms) stays valid exactly while
this count stays the same. So every write that changes an existing object's structure in a
way its flattened form does not show (an attribute assigned or deleted after `__init__`, an
object rebuilt in place, a Variable's metadata replaced) must end with `touch()`. Writes
that replace a Module's flattened form need it too: the cache compares those forms by
identity, but other objects of the graph may hold derived data.

The count is bumped *after* the change, so a walk made by another thread while the change
is under way sees the count move afterwards and is thrown away.
"""

from typing import Final


class MutationCount:
    """How many structural writes to existing objects have happened in this process.

    Read `.count`; change it only through `touch()`.
    """

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


mutations: Final = MutationCount()


def touch() -> None:
    """Record that an existing object's structure just changed (see the module docstring).

    Call it after the write. Every writer in these packages calls it: a Module's
    `__setattr__`/`__delattr__` after `__init__`, `rebuild_into`, and pytree_graph's writes
    to Variables and to objects rebuilt in place.

    Examples:
        >>> from pytree_module.extend import mutations, touch
        >>> before = mutations.count
        >>> touch()
        >>> mutations.count == before + 1
        True
    """
    mutations.count += 1
