"""`List` and `Dict`: containers that are always data, and that report their changes.

A plain list or dict can change in place without anyone knowing, so a cache of an object
graph (pytree_graph keeps its walks between calls) must compare every plain container it
holds, item by item, on every call. `List` and `Dict` instead end every in-place change
with `touch()` (see `_mutations`): a graph cache checks them only when the mutation count
moved, at no cost per call otherwise.
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.tree_util import DictKey, SequenceKey

from ._errors import TraceContextError
from ._mutations import touch
from ._status import register_data_type
from ._trace import current_trace_token, trace_state

# The current trace's token, as `current_trace_token()` gives it, but without a Python
# frame where JAX's trace state can be read: the guard reads it at every change.
_token = (
    current_trace_token if trace_state is None else functools.partial(getattr, trace_state, "value")
)


def _touching(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` of the built-in base, refused outside the container's own trace (as a
    Module's assignments are), followed by `touch()` (after the change, as the mutation
    count requires)."""
    action = method.__name__

    @functools.wraps(method)
    def changed(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        made_in, now = self._pm_trace, _token()
        if made_in is not now and made_in != now:
            raise _trace_error(self, action)
        result = method(self, *args, **kwargs)
        touch()
        return result

    return changed


def _trace_error(container: Any, action: str) -> TraceContextError:
    kind = type(container).__name__
    return TraceContextError(
        f"Cannot mutate '{kind}' from different trace level (Flax NNX's words). This "
        f"{kind} was created outside the JAX transformation (jit, grad, vmap, scan, ...) "
        f"that is tracing now, so `{action}` on it would leak tracers out of it. Pass the "
        f"{kind} (or the Module holding it) into the transformed function as an argument "
        "and return it, or use pytree_graph's transforms, which write changes back to the "
        "caller's objects."
    )


@register_data_type
class List(list):
    """A list that a Module always treats as data, whatever it holds, and whose changes
    graph caches see.

    A plain list holding modules or arrays is already data, and so is an empty one; `List`
    documents intent, and also makes a list of plain numbers data (leaves). Every in-place
    change (`append`, `l[i] = ...`, `del`, `sort`, ...) bumps
    `pytree_module.extend.mutations.count`, so the graph transforms of pytree_graph need
    not compare a `List`'s items on every call, as they must a plain list's: a model
    holding many containers is cheaper to call through `pytree_graph.jit_partial` with
    `List`s.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import List
        >>> jax.tree.leaves(List([jnp.zeros(2), 1.0]))
        [Array([0., 0.], dtype=float32), 1.0]
        >>> from pytree_module.extend import mutations
        >>> layers, before = List(), mutations.count
        >>> layers.append(jnp.ones(1))
        >>> mutations.count > before
        True
    """

    # The trace it was made in: changes from another are refused (the trace-level guard).
    __slots__ = ("_pm_trace",)

    def __init__(self, *args: Any) -> None:
        list.__init__(self, *args)
        _set_list_trace(self, current_trace_token())

    __setitem__ = _touching(list.__setitem__)
    __delitem__ = _touching(list.__delitem__)
    __iadd__ = _touching(list.__iadd__)
    __imul__ = _touching(list.__imul__)
    append = _touching(list.append)
    extend = _touching(list.extend)
    insert = _touching(list.insert)
    pop = _touching(list.pop)
    remove = _touching(list.remove)
    clear = _touching(list.clear)
    sort = _touching(list.sort)
    reverse = _touching(list.reverse)

    def __repr__(self) -> str:
        return f"List({list.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Items after construction (as a list's own), so that a List holding itself copies.
        return type(self), (), None, iter(self)


@register_data_type
class Dict(dict):
    """A dict that a Module always treats as data, whatever it holds, and whose changes
    graph caches see.

    Flattens like a plain dict (keys sorted, leaves in key order). Every in-place change
    (`d[k] = ...`, `del`, `update`, `pop`, ...) bumps `pytree_module.extend.mutations.count`,
    as `List`'s do (see there).

    A string key is also an attribute, as in Flax NNX's `nnx.Dict`: `d.encoder` reads
    `d["encoder"]`, `d.encoder = ...` sets it and `del d.encoder` removes it. A key that
    is the name of a dict method (`keys`, `items`, `pop`...) is reached by `d[...]` only.

    Unlike a plain dict, a `Dict` is an object of a graph for pytree_graph: held in two
    places, it is one `Dict` again after `split`/`merge` and the graph transforms.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Dict
        >>> jax.tree.leaves(Dict(b=2.0, a=jnp.zeros(1)))
        [Array([0.], dtype=float32), 2.0]
        >>> layers = Dict(encoder=1.0)
        >>> layers.decoder = 2.0
        >>> layers.encoder, layers["decoder"]
        (1.0, 2.0)
    """

    __slots__ = ("_pm_trace",)  # as List's

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        _set_dict_trace(self, current_trace_token())

    def __getattr__(self, name: str) -> Any:
        # Called only when no attribute of the class has the name: a key, or an error.
        try:
            return self[name]
        except KeyError:
            pass
        if name.startswith("__") and name.endswith("__"):
            # Protocol lookups (`__deepcopy__`, `__array__`...) are not keys.
            raise AttributeError(name)
        keys = ", ".join(repr(k) for k in self)
        raise AttributeError(
            f"Dict has no key {name!r} (keys: {keys or 'none'}). Set it with "
            f"`d.{name} = ...` or `d[{name!r}] = ...` first."
        ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(type(self), name):
            raise AttributeError(
                f"Dict key {name!r} is also the name of a Dict method, so it cannot be set "
                f"as an attribute: write `d[{name!r}] = ...` (and read it as `d[{name!r}]`)."
            )
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(
                f"Dict has no key {name!r} to delete (keys: "
                f"{', '.join(repr(k) for k in self) or 'none'})."
            ) from None

    __setitem__ = _touching(dict.__setitem__)
    __delitem__ = _touching(dict.__delitem__)
    __ior__ = _touching(dict.__ior__)
    pop = _touching(dict.pop)
    popitem = _touching(dict.popitem)
    clear = _touching(dict.clear)
    update = _touching(dict.update)
    setdefault = _touching(dict.setdefault)

    def __repr__(self) -> str:
        return f"Dict({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (), None, None, iter(self.items())


def _sorted_keys(d: dict) -> tuple[Any, ...]:
    try:
        return tuple(sorted(d))
    except TypeError:
        return tuple(d)


def _flatten_dict(d: Dict) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    keys = _sorted_keys(d)
    return tuple(d[k] for k in keys), keys


def _flatten_dict_with_keys(d: Dict) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    keys = _sorted_keys(d)
    return tuple((DictKey(k), d[k]) for k in keys), keys


# The slots' setters, called directly: unflatten runs on every call of a jitted function
# whose output holds containers, and `List(children)` through `__init__` costs twice as much.
_set_list_trace = List.__dict__["_pm_trace"].__set__
_set_dict_trace = Dict.__dict__["_pm_trace"].__set__


def _unflatten_list(_: None, children: Any) -> List:
    xs = list.__new__(List)
    list.extend(xs, children)
    _set_list_trace(xs, _token())
    return xs


def _unflatten_dict(keys: tuple[Any, ...], children: Any) -> Dict:
    d = dict.__new__(Dict)
    dict.update(d, zip(keys, children, strict=True))
    _set_dict_trace(d, _token())
    return d


jax.tree_util.register_pytree_with_keys(
    List,
    lambda xs: (tuple((SequenceKey(i), x) for i, x in enumerate(xs)), None),
    _unflatten_list,
    flatten_func=lambda xs: (tuple(xs), None),
)
jax.tree_util.register_pytree_with_keys(
    Dict, _flatten_dict_with_keys, _unflatten_dict, flatten_func=_flatten_dict
)
