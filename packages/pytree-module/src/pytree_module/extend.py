"""The extension surface of pytree_module, for libraries that build on its Modules.

`pytree_module`'s top level is for users; this module is for library authors (pytree_graph
and pytree_transforms are two) who need to see or rebuild a Module's insides, or to keep a
cache of object graphs valid. Everything here is declared and tested: a patch release of
pytree_module never changes it, a minor release may add to it, and only a major release may
change or remove a name (see the "Versions" page of the docs). Nothing outside pytree_module
should reach into its underscore modules or a Module's private slots.

What is here:

- The flattened form of a pytree Module, `flat_form(module) -> (children, entry)`, where the
  entry (a `TreedefEntry`) is the interned builder of that structure and carries its
  `layout` and `statics`. `blank_instance` and `rebuild_into` make and fill a Module
  without running its `__init__`, as merging an object graph with cycles needs.
- `construct(cls, init, *args, **kwargs)`: build an instance running another function
  as its `__init__`, for transforms that decorate `__init__`.
- Per-class facts: `is_pytree_class`, `is_frozen_class`.
- The trace-level guard's tokens: `current_trace_token`, `same_trace`, `trace_of`.
- The mutation count (`mutations`, `touch`): the rule that keeps caches of object graphs
  valid. Every write that changes an existing object's structure ends with `touch()`.
- `BoundMethod`, the pytree a Module's method is when read from an instance (`m.method`):
  its only child is the instance. A library that gets a Python-bound method of a Module
  (Python binds special methods itself: `m.__call__` is a `types.MethodType`) rebuilds it
  as `BoundMethod(method.__func__, method.__self__)`, so the Module is an input of a
  transform, as for every other method.
- `constructor_pdoc`, to print objects the way Modules print.
- `register_tree_at_rule`: what `tree_at` puts in place of a node of a registered type
  that `where` picked (pytree_graph's Variables keep their type and metadata when replaced
  by a bare value).
- `register_error_if`: the run-time check `Enumeration` members' `error_if` calls;
  pytree_transforms registers its `branched_error_if` when imported (pytree_module does
  not depend on it).
- `static_key`, the key by which static values are told apart (`1`, `1.0` and `True`, or
  `0.0` and `-0.0`, are different statics): a library that caches anything per static value
  keys it the same way, so its caches share exactly what Modules' treedefs share.

Examples:
    >>> import jax.numpy as jnp
    >>> from pytree_module import Module, field
    >>> from pytree_module.extend import (
    ...     flat_form, is_frozen_class, is_pytree_class, same_trace, trace_of
    ... )
    >>> class Scale(Module, frozen=True):
    ...     factor: jnp.ndarray
    ...     name: str = field(static=True)
    >>> class Node(Module, pytree=False):
    ...     pass
    >>> scale = Scale(jnp.ones(2), "s")
    >>> children, entry = flat_form(scale)
    >>> entry.layout.data_keys, entry.layout.static_keys, entry.statics
    (('factor',), ('name',), ('s',))
    >>> entry(children).name
    's'
    >>> is_pytree_class(Scale), is_pytree_class(Node), is_frozen_class(Scale)
    (True, False, True)
    >>> same_trace(trace_of(scale))
    True
"""

import operator
from collections.abc import Callable, Sequence
from typing import Any

from ._bound_method import BoundMethod
from ._enumeration import register_error_if
from ._layout import Layout, TreedefEntry
from ._module import Module, _set_trace
from ._module import construct as _construct
from ._mutations import MutationCount, touch
from ._mutations import mutations as _mutations
from ._pformat import constructor_pdoc
from ._static_key import static_key
from ._trace import current_trace_token, same_trace
from ._tree_at import register_tree_at_rule

__all__ = [
    "BoundMethod",
    "Layout",
    "MutationCount",
    "TreedefEntry",
    "blank_instance",
    "construct",
    "constructor_pdoc",
    "current_trace_token",
    "flat_form",
    "is_frozen_class",
    "is_pytree_class",
    "mutations",
    "rebuild_into",
    "register_error_if",
    "register_tree_at_rule",
    "same_trace",
    "static_key",
    "touch",
    "trace_of",
]

# Each of these reads one attribute, in C: graph walks call them once per object. (An
# `attrgetter` takes no `__doc__`, so each is documented by the string after it, and the
# module docstring's example runs them.)
flat_form: Callable[[Module], tuple[tuple[Any, ...], TreedefEntry]] = operator.attrgetter(
    "_pm_flat"
)
"""`flat_form(module)`: the flattened form `(children, entry)` of a pytree Module.

`children` are its data attributes' values in `entry.layout.data_keys` order; `entry` is its
treedef entry: `entry(children)` builds an equal Module, and `entry.layout` and
`entry.statics` describe the structure. This is what `jax.tree_util` sees, read without
flattening. A Module still in its `__init__` has none yet.
"""

trace_of: Callable[[Module], Any] = operator.attrgetter("_pm_trace")
"""`trace_of(module)`: the token of the JAX trace in which a Module was made or rebuilt.

A Module may be changed in place only in its own trace: compare with `same_trace(token)`.
"""

is_pytree_class: Callable[[type], bool] = operator.attrgetter("__module_pytree__")
"""`is_pytree_class(cls)`: whether instances of a Module class are pytrees.

False for classes declared `class M(Module, pytree=False)`, whose instances are graph
objects that only pytree_graph walks.
"""

is_frozen_class: Callable[[type], bool] = operator.attrgetter("__module_frozen__")
"""`is_frozen_class(cls)`: whether instances of a Module class are frozen after `__init__`."""


mutations: MutationCount = _mutations
"""The process's mutation count: read `mutations.count`, change it only with `touch()`.

A cache of anything derived from existing objects (a walk of an object graph, say) stays
valid while the count it recorded is still the count.
"""


def blank_instance(cls: type[Module]) -> Module:
    """Make an instance of a Module class without running `__init__`: no attributes yet.

    It belongs to the current JAX trace (the trace-level guard lets it be filled in here).
    Fill a pytree class's instance with `rebuild_into`; give a `pytree=False` class's
    instance its attributes with `object.__setattr__`.

    Arguments:
        cls: a subclass of `Module`.

    Returns:
        The new, empty instance.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_module.extend import blank_instance, flat_form, rebuild_into
        >>> class Scale(Module):
        ...     factor: jnp.ndarray
        >>> _, entry = flat_form(Scale(jnp.ones(2)))
        >>> copy = blank_instance(Scale)
        >>> rebuild_into(copy, entry, (jnp.zeros(2),))
        >>> copy.factor
        Array([0., 0.], dtype=float32)
    """
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise TypeError(f"blank_instance expects a subclass of Module, got {cls!r}.")
    module = object.__new__(cls)
    _set_trace(module, current_trace_token())
    return module


def rebuild_into(module: Module, entry: TreedefEntry, children: Sequence[Any]) -> None:
    """Give an existing pytree Module the structure `entry` describes and the data `children`.

    Does what `entry(children)` does, but to an object that already exists: its attributes
    are replaced (unhashable static values are copied, as on every rebuild), its flattened
    form becomes `(children, entry)`, and the write is recorded with `touch()`. Merging an
    object graph with cycles needs this: an object must exist before the children that
    refer back to it are built.

    The caller checks that writing is allowed (the object's trace: see `trace_of`).

    Arguments:
        module: an instance of `entry.layout.cls`.
        entry: a treedef entry, from `flat_form` of a Module of that class.
        children: the data attributes' values, in `entry.layout.data_keys` order.

    Raises:
        TypeError: when `module` is not an instance of the entry's class.
    """
    layout = entry.layout
    if type(module) is not layout.cls:
        raise TypeError(
            f"rebuild_into: the entry builds {layout.cls.__name__} instances, but the module "
            f"is a {type(module).__name__}. Pass an entry taken from a "
            f"{type(module).__name__} (`flat_form(other)[1]`)."
        )
    layout.rebuild_into(module, children, entry)
    touch()


def construct(cls: type[Module], init: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Module:
    """Build an instance of a Module class as `cls(*args, **kwargs)` does, but with `init`
    run as its `__init__`: the same statuses, converters, checks and `__check_init__`.

    A transform that decorates `__init__` (`pytree_graph.vmap` on `__init__`, as Flax
    NNX's idiom for a stack of layers) builds the object inside the transform with the
    function it wraps, not with `cls.__init__`, which is the transform itself (and any
    decorator above it).

    Arguments:
        cls: a subclass of `Module`.
        init: called as `init(instance, *args, **kwargs)`, like an `__init__`.
        *args: its positional arguments.
        **kwargs: its keyword arguments.

    Returns:
        The new instance.

    Examples:
        >>> from pytree_module import Module
        >>> from pytree_module.extend import construct
        >>> class Counter(Module):
        ...     def __init__(self, start):
        ...         self.count = start
        >>> construct(Counter, lambda self, start: setattr(self, "count", start + 1), 1).count
        2
    """
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise TypeError(f"construct expects a subclass of Module, got {cls!r}.")
    if not callable(init):
        raise TypeError(f"construct: init must be callable, got {init!r}.")
    return _construct(cls, init, args, kwargs)
