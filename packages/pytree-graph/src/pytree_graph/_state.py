"""`State`: the Variables and arrays of a graph, as a nested mapping that is a pytree."""

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import jax
from jax.tree_util import DictKey

from pytree_filter import Everything, Path, to_predicate

from ._pure_values import write_pure_dict
from ._variables import Variable


class State(MutableMapping):
    """The Variables and arrays of an object graph, nested by attribute name and index.

    `split` and `state` return States; `merge` and `update` take them. A State is a pytree
    (its leaves are the arrays inside its Variables), so it goes through `jax.jit`,
    `jax.grad` and optax as it is. Read it like nested dicts (`state["layers"][0]["w"]`) or
    by attribute (`state.layers[0].w`); `flat_state()` gives `{path: leaf}`.

    Arguments:
        mapping: nested mappings whose leaves are Variables or arrays (default: empty).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_graph import Param, State
        >>> state = State({"linear": {"w": Param(jnp.ones(2)), "b": Param(jnp.zeros(2))}})
        >>> state.linear.w.value.tolist()
        [1.0, 1.0]
        >>> jax.tree.map(lambda x: x + 1, state).to_pure_dict()["linear"]["b"].tolist()
        [1.0, 1.0]
        >>> sorted(state.flat_state())
        [('linear', 'b'), ('linear', 'w')]
    """

    # A State made by `split` keeps its leaves flat, `(paths, leaves)`, and nests them
    # only when first read as a mapping: `merge` of that State reads the flat form,
    # which makes `merge(*split(model))` cost no dictionary work at all.
    __slots__ = ("_flat", "_nested")

    def __init__(self, mapping: Mapping[Any, Any] | None = None):
        if mapping is not None and not isinstance(mapping, Mapping):
            shown = repr(mapping)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise TypeError(
                f"State expects a mapping of keys to values or nested mappings, e.g. "
                f"State({{'w': Param(...)}}); got {shown} (of type {type(mapping).__name__}). "
                "Build one from flat paths with `State.from_flat_path`, or take a model's "
                "with `pytree_graph.state(model)`."
            )
        items: dict[Any, Any] = {}
        for key, value in (mapping or {}).items():
            items[key] = State(value) if isinstance(value, Mapping) else value
        object.__setattr__(self, "_nested", items)
        object.__setattr__(self, "_flat", None)

    @classmethod
    def _of_flat(cls, paths: tuple[Path, ...], leaves: list[Any]) -> "State":
        """A State of `leaves` at `paths` (valid, distinct paths), nested when first read."""
        state = object.__new__(cls)
        object.__setattr__(state, "_nested", None)
        object.__setattr__(state, "_flat", (paths, leaves))
        return state

    @property
    def _mapping(self) -> dict[Any, Any]:
        nested = self._nested
        if nested is None:
            paths, leaves = self._flat
            nested = State.from_flat_path(dict(zip(paths, leaves, strict=True)))._nested
            object.__setattr__(self, "_nested", nested)
            object.__setattr__(self, "_flat", None)
        return nested

    def __reduce__(self) -> tuple:
        # Rebuilt from its nested mapping (pickle, copy and deepcopy would otherwise set
        # the slots through `__setattr__`, which sets keys).
        return (State, (self._mapping,))

    def _flat_form(self) -> tuple[tuple[Path, ...], list[Any]] | None:
        """`(paths, leaves)` if this State was never nested, else None."""
        return self._flat

    # ------------------------------------------------------------------ mapping protocol

    def __getitem__(self, key: Any) -> Any:
        try:
            return self._mapping[key]
        except KeyError:
            raise KeyError(f"State has no key {key!r}; its keys: {list(self._mapping)}.") from None

    def __setitem__(self, key: Any, value: Any) -> None:
        self._mapping[key] = State(value) if isinstance(value, Mapping) else value

    def __delitem__(self, key: Any) -> None:
        del self._mapping[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._mapping)

    def __len__(self) -> int:
        return len(self._mapping)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_nested", "_flat"):
            raise AttributeError(name)
        mapping = self._mapping
        if name in mapping:
            return mapping[name]
        raise AttributeError(f"State has no key {name!r}; its keys: {list(mapping)}.")

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    # Identity, as for Modules: element-wise comparison of arrays has no single truth
    # value. Compare States with `pytree_module.tree_equal`.
    __eq__ = object.__eq__
    __hash__ = None  # type: ignore[assignment]

    # --------------------------------------------------------------------- flat views

    def flat_state(self) -> dict[Path, Any]:
        """`{path: leaf}` for every Variable or array, paths being tuples of keys."""
        if self._flat is not None:
            return dict(zip(*self._flat, strict=True))
        flat: dict[Path, Any] = {}
        _flatten_into(self, (), flat)
        return flat

    @classmethod
    def from_flat_path(cls, flat: Mapping[Path, Any]) -> "State":
        """The State with leaves `flat` (`{path: leaf}`), the inverse of `flat_state`.

        Arguments:
            flat: a mapping from tuples of keys to Variables or arrays.

        Returns:
            The nested State.

        Examples:
            >>> from pytree_graph import State
            >>> State.from_flat_path({("a", "b"): 1.0}).to_pure_dict()
            {'a': {'b': 1.0}}
        """
        root: dict[Any, Any] = {}
        for path, leaf in flat.items():
            if not path:
                raise ValueError("A State path cannot be empty: every leaf needs a key.")
            node = root
            for key in path[:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise ValueError(f"Path {path} goes through a leaf at {key!r}.")
            node[path[-1]] = leaf
        return cls(root)

    def to_pure_dict(self) -> dict[Any, Any]:
        """Plain nested dicts of the values (each Variable replaced by its `.value`)."""
        return {
            k: v.to_pure_dict()
            if isinstance(v, State)
            else (v.value if isinstance(v, Variable) else v)
            for k, v in self._mapping.items()
        }

    def to_dict(self) -> dict[Any, Any]:
        """Plain nested dicts of the leaves (Variables kept as Variables)."""
        return {k: v.to_dict() if isinstance(v, State) else v for k, v in self._mapping.items()}

    def replace_by_pure_dict(self, pure_dict: Mapping[Any, Any]) -> None:
        """`replace_by_pure_dict(self, pure_dict)`: write plain nested dicts' values into
        this State's Variables, in place, after checking paths, shapes and dtypes.

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_graph import Param, State
            >>> state = State({"w": Param(jnp.zeros(2))})
            >>> state.replace_by_pure_dict({"w": jnp.ones(2)})
            >>> state.w.value.tolist()
            [1.0, 1.0]
        """
        write_pure_dict(self, pure_dict, "State.replace_by_pure_dict")

    # ---------------------------------------------------------------------- filtering

    def filter(self, first: Any, /, *filters: Any) -> Any:
        """The leaves matching each filter, as one State per filter.

        Arguments:
            first: a filter (a Variable type, `...`, a filter object, a predicate on the
                leaf); filters see `(path, leaf)`, and a leaf goes to the first filter it
                matches. Leaves matching none are left out.
            *filters: more filters, one State each.

        Returns:
            A State, or a tuple of States when several filters are given.

        Examples:
            >>> import jax.numpy as jnp
            >>> from pytree_graph import BatchStat, Param, State
            >>> state = State({"w": Param(jnp.ones(1)), "mean": BatchStat(jnp.zeros(1))})
            >>> list(state.filter(Param))
            ['w']
        """
        parts = _partition(self.flat_state(), (first, *filters), exhaustive=False)
        states = tuple(State.from_flat_path(part) for part in parts[:-1])
        return states[0] if len(states) == 1 else states

    def split(self, first: Any, /, *filters: Any) -> Any:
        """Like `filter`, but every leaf must match a filter (end with `...` for the rest)."""
        parts = _partition(self.flat_state(), (first, *filters), exhaustive=True)
        states = tuple(State.from_flat_path(part) for part in parts[:-1])
        return states[0] if len(states) == 1 else states

    @staticmethod
    def merge(state: "State", /, *states: "State") -> "State":
        """One State holding the leaves of all of them (later ones win on equal paths).

        Examples:
            >>> from pytree_graph import State
            >>> State.merge(State({"a": 1.0}), State({"b": 2.0})).to_pure_dict()
            {'a': 1.0, 'b': 2.0}
        """
        flat: dict[Path, Any] = {}
        for part in (state, *states):
            flat.update(part.flat_state())
        return State.from_flat_path(flat)

    def __or__(self, other: "State") -> "State":
        return State.merge(self, other)

    # -------------------------------------------------------------------------- display

    def __repr__(self) -> str:
        from pytree_module import tree_pformat

        return tree_pformat(self)

    def __pdoc__(self, **kwargs: Any) -> Any:
        import wadler_lindig as wl

        return wl.bracketed(
            begin=wl.TextDoc("State({"),
            docs=[
                wl.ConcatDoc(wl.pdoc(k, **kwargs), wl.TextDoc(": "), wl.pdoc(v, **kwargs))
                for k, v in self._mapping.items()
            ],
            sep=wl.comma,
            end=wl.TextDoc("})"),
            indent=kwargs.get("indent", 2),
        )

    def __treescope_repr__(self, path: str | None, subtree_renderer: Callable) -> Any:
        from treescope import repr_lib

        return repr_lib.render_dictionary_wrapper(
            object_type=type(self),
            wrapped_dict=self._mapping,
            path=path,
            subtree_renderer=subtree_renderer,
        )


def _flatten_into(mapping: Mapping[Any, Any], prefix: Path, flat: dict[Path, Any]) -> None:
    """Add `{path: leaf}` of nested mappings (States or plain dicts) to `flat`."""
    items = mapping._mapping.items() if isinstance(mapping, State) else mapping.items()
    for key, value in items:
        if isinstance(value, Mapping):
            _flatten_into(value, (*prefix, key), flat)
        else:
            flat[(*prefix, key)] = value


def _partition(
    flat: Mapping[Path, Any], filters: tuple[Any, ...], exhaustive: bool
) -> list[dict[Path, Any]]:
    """Split `{path: leaf}` by filters (first match wins); the last part is the rest."""
    check_everything_last(filters)
    predicates = [to_predicate(f) for f in filters]
    parts: list[dict[Path, Any]] = [{} for _ in range(len(filters) + 1)]
    for path, leaf in flat.items():
        for i, predicate in enumerate(predicates):
            if predicate(path, leaf):
                parts[i][path] = leaf
                break
        else:
            if exhaustive:
                raise ValueError(_unmatched_message(path, leaf, filters))
            parts[-1][path] = leaf
    return parts


def _matches_everything(spec: Any) -> bool:
    return spec is ... or spec is True or isinstance(spec, Everything)


def show_filter(spec: Any) -> str:
    """A filter as written: `...`, a type's name, a tuple of them, or its repr."""
    if isinstance(spec, tuple):
        return "(" + ", ".join(map(show_filter, spec)) + ")"
    return "..." if spec is ... else getattr(spec, "__name__", repr(spec))


def check_everything_last(filters: Sequence[Any]) -> None:
    """Refuse `...` (or another filter matching everything) before the last filter: a leaf
    goes to the first filter it matches, so the filters after it would get nothing.

    Raises:
        ValueError: naming the filter and where it is.
    """
    for i, spec in enumerate(filters[:-1]):
        if _matches_everything(spec):
            shown = ", ".join(map(show_filter, filters))
            rest = [show_filter(f) for j, f in enumerate(filters) if j != i]
            raise ValueError(
                "`...` or `True` can only be used as the last filters, got "
                f"{show_filter(spec)} at position {i} of ({shown}): it matches every "
                f"leaf, so the filters after it ({', '.join(rest[i:])}) "
                f"could never match anything. `...` catches the rest and must come last: "
                f"({', '.join([*rest, show_filter(spec)])})."
            )


def _unmatched_message(path: Path, leaf: Any, filters: tuple[Any, ...]) -> str:
    """The error for a leaf no filter matched, where the filters must cover everything."""
    kind = type(leaf).__name__
    shown = ", ".join(map(show_filter, filters))
    return (
        "Non-exhaustive filters, got a non-empty remainder. "
        f"No filter matched the {kind} at path {path}: with filters ({shown}) every "
        f"Variable and array must match one. Add a filter for it (e.g. {kind}), or end "
        "the filters with `...` to collect everything else."
    )


def _flatten_with_keys(state: State) -> tuple[tuple[tuple[DictKey, Any], ...], tuple]:
    mapping = state._mapping
    return tuple((DictKey(k), v) for k, v in mapping.items()), tuple(mapping)


def _flatten(state: State) -> tuple[tuple[Any, ...], tuple]:
    mapping = state._mapping
    return tuple(mapping.values()), tuple(mapping)


def _unflatten(keys: tuple, children: Any) -> State:
    state = object.__new__(State)
    object.__setattr__(state, "_nested", dict(zip(keys, children, strict=True)))
    object.__setattr__(state, "_flat", None)
    return state


jax.tree_util.register_pytree_with_keys(State, _flatten_with_keys, _unflatten, _flatten)
