"""Filter objects: small, hashable, composable predicates that see `(path, value)`."""

import builtins
import inspect
from collections.abc import Callable, Hashable
from typing import Any as AnyType

from ._paths import Path


class Filter:
    """Base class of filter objects.

    A filter object is called as `filter(path, value) -> bool`, where `path` is the tuple of
    plain keys leading to `value` (see `path_keys`). Filters compose with `&`, `|` and `~`,
    also with a plain leaf predicate or a type on either side (`is_array & ~PathContains(0)`).
    Subclass it to write your own: implement `__call__`, and keep instances hashable.

    Examples:
        >>> from pytree_filter import Filter, filter
        >>> class Deep(Filter):
        ...     def __call__(self, path, value):
        ...         return len(path) > 1
        ...     def __eq__(self, other):
        ...         return type(other) is Deep
        ...     def __hash__(self):
        ...         return hash(Deep)
        >>> filter({"a": 1, "b": {"c": 2}}, Deep())
        {'a': None, 'b': {'c': 2}}
    """

    __slots__ = ()

    #: Whether `__call__` reads `path`; when no filter does, paths are not computed.
    needs_path: bool = True

    def __call__(self, path: Path, value: AnyType) -> bool:
        raise NotImplementedError

    def leaf_types(self) -> tuple[type, ...]:
        """Types whose instances count as leaves (flattening stops there) for this filter."""
        return ()

    def __and__(self, other: AnyType) -> "All":
        return All(self, other)

    def __or__(self, other: AnyType) -> "Any":
        return Any(self, other)

    # A plain predicate or a type on the left (`is_array & ~PathContains(0)`) has no `&` of
    # its own that accepts a filter, so Python asks the filter on the right.
    def __rand__(self, other: AnyType) -> "All":
        return All(other, self)

    def __ror__(self, other: AnyType) -> "Any":
        return Any(other, self)

    def __invert__(self) -> "Not":
        return Not(self)


class _Value(Filter):
    """Shared machinery of filter objects defined by a tuple of fields."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _key(self) -> tuple[AnyType, ...]:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(v) for v in self._key())})"

    def __setattr__(self, name: str, value: AnyType) -> None:
        raise AttributeError(f"{type(self).__name__} filters are immutable.")


def _init(obj: Filter, **values: AnyType) -> None:
    for name, value in values.items():
        object.__setattr__(obj, name, value)


class Everything(_Value):
    """Matches every leaf. `...` in a filter means `Everything()`.

    Examples:
        >>> from pytree_filter import Everything, filter
        >>> filter([1, "a"], Everything())
        [1, 'a']
    """

    __slots__ = ()
    needs_path = False

    def __call__(self, path: Path, value: AnyType) -> bool:
        return True


class Nothing(_Value):
    """Matches no leaf.

    Examples:
        >>> from pytree_filter import Nothing, filter
        >>> filter([1, "a"], Nothing())
        [None, None]
    """

    __slots__ = ()
    needs_path = False

    def __call__(self, path: Path, value: AnyType) -> bool:
        return False


class OfType(_Value):
    """Matches leaves that are instances of `type_`; a bare type in a filter means this.

    Instances of `type_` also count as leaves: flattening stops at them, so filtering by a
    pytree node type (a Variable type, a Module class) selects whole nodes.

    Arguments:
        type_: a class, or a tuple of classes.

    Examples:
        >>> from pytree_filter import OfType, filter
        >>> filter({"a": 1, "b": "x", "c": 2.0}, OfType(int))
        {'a': 1, 'b': None, 'c': None}
    """

    __slots__ = ("type",)
    _fields = ("type",)
    needs_path = False

    def __init__(self, type_: type | tuple[type, ...]):
        types = type_ if isinstance(type_, tuple) else (type_,)
        if not types or not all(isinstance(t, type) for t in types):
            raise TypeError(f"OfType expects a class or a tuple of classes, got {type_!r}.")
        _init(self, type=type_)

    def __call__(self, path: Path, value: AnyType) -> bool:
        return isinstance(value, self.type)

    def leaf_types(self) -> tuple[type, ...]:
        return self.type if isinstance(self.type, tuple) else (self.type,)


class PathContains(_Value):
    """Matches leaves whose path contains `key` as one whole entry (or, with
    `exact=False`, as part of one).

    Paths are plain keys: attribute names, dict keys and sequence indices, so
    `PathContains("bias")` matches `.layers[0].bias` and `{"bias": ...}` alike, but not
    `.bias_scale`. With `exact=False` the key and the path entries are compared as text, as
    Flax NNX's `PathContains(key, exact=False)` does: `PathContains("bias", exact=False)`
    matches `.bias_scale` too, and `PathContains(1, exact=False)` matches `[1]`, `[10]` and
    `.layer1`.

    Arguments:
        key: an attribute name, dict key or index.
        exact: whether an entry must equal `key` (the default) or only contain it as a
            substring of its text.

    Examples:
        >>> from pytree_filter import PathContains, filter
        >>> filter({"w": 1, "b": {"bias": 2}}, PathContains("bias"))
        {'b': {'bias': 2}, 'w': None}
        >>> filter({"bias": 1, "bias_scale": 2, "w": 3}, PathContains("bias", exact=False))
        {'bias': 1, 'bias_scale': 2, 'w': None}
    """

    __slots__ = ("exact", "key")
    _fields = ("key", "exact")

    def __init__(self, key: Hashable, exact: bool = True):
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"PathContains expects a hashable key, got {key!r}.") from None
        if not isinstance(exact, bool):
            raise TypeError(
                f"PathContains: exact must be True or False, got {exact!r}. "
                f"PathContains({key!r}, exact=False) matches entries containing {str(key)!r}."
            )
        _init(self, key=key, exact=exact)

    def __call__(self, path: Path, value: AnyType) -> bool:
        if self.exact:
            return self.key in path
        text = str(self.key)
        return builtins.any(text in str(entry) for entry in path)

    def __repr__(self) -> str:
        return (
            f"PathContains({self.key!r})"
            if self.exact
            else f"PathContains({self.key!r}, exact=False)"
        )


class WithTag(_Value):
    """Matches values whose `tag` attribute equals `tag`; a string in a filter means this.

    Flax NNX's string filters: an `RngStream` and its `RngKey` and `RngCount` Variables
    carry the stream's name as `tag`, so `"dropout"` selects that stream's state (in
    `StateAxes`, `split_rngs(only=...)`, `pg.state(model, "dropout")`). Values without a
    `tag` never match; to select by attribute or key name use `PathContains`.

    Arguments:
        tag: the tag to match.

    Examples:
        >>> from types import SimpleNamespace
        >>> from pytree_filter import WithTag, to_predicate
        >>> to_predicate("dropout") == WithTag("dropout")
        True
        >>> WithTag("dropout")((), SimpleNamespace(tag="dropout")), WithTag("dropout")((), 1.0)
        (True, False)
    """

    __slots__ = ("tag",)
    _fields = ("tag",)
    needs_path = False

    def __init__(self, tag: str):
        if not isinstance(tag, str):
            raise TypeError(f"WithTag expects the tag as a str (such as 'dropout'), got {tag!r}.")
        _init(self, tag=tag)

    def __call__(self, path: Path, value: AnyType) -> bool:
        return getattr(value, "tag", None) == self.tag


class _Combination(_Value):
    __slots__ = ("filters",)
    _fields = ("filters",)

    def __init__(self, *filters: AnyType):
        converted = tuple(as_filter(f) for f in filters)
        _init(self, filters=converted)
        object.__setattr__(self, "needs_path", builtins.any(f.needs_path for f in converted))

    def leaf_types(self) -> tuple[type, ...]:
        return tuple(t for f in self.filters for t in f.leaf_types())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(f) for f in self.filters)})"


class Any(_Combination):
    """Matches leaves that match at least one of `filters` (`f | g` is `Any(f, g)`).

    Arguments:
        *filters: filters of any accepted kind (types, predicates, filter objects, ...).

    Examples:
        >>> from pytree_filter import Any, PathContains, filter
        >>> filter({"a": 1, "b": "x", "c": 2.0}, Any(int, PathContains("c")))
        {'a': 1, 'b': None, 'c': 2.0}
    """

    __slots__ = ("needs_path",)

    def __call__(self, path: Path, value: AnyType) -> bool:
        return builtins.any(f(path, value) for f in self.filters)


class All(_Combination):
    """Matches leaves that match every one of `filters` (`f & g` is `All(f, g)`).

    Arguments:
        *filters: filters of any accepted kind.

    Examples:
        >>> from pytree_filter import All, PathContains, filter
        >>> filter({"a": 1, "b": 2.0}, All(float, PathContains("b")))
        {'a': None, 'b': 2.0}
    """

    __slots__ = ("needs_path",)

    def __call__(self, path: Path, value: AnyType) -> bool:
        return builtins.all(f(path, value) for f in self.filters)


class Not(_Value):
    """Matches leaves that `filter_` does not match (`~f` is `Not(f)`).

    Arguments:
        filter_: a filter of any accepted kind.

    Examples:
        >>> from pytree_filter import Not, filter
        >>> filter({"a": 1, "b": "x"}, Not(str))
        {'a': 1, 'b': None}
    """

    __slots__ = ("filter", "needs_path")
    _fields = ("filter",)

    def __init__(self, filter_: AnyType):
        converted = as_filter(filter_)
        _init(self, filter=converted, needs_path=converted.needs_path)

    def __call__(self, path: Path, value: AnyType) -> bool:
        return not self.filter(path, value)

    def leaf_types(self) -> tuple[type, ...]:
        return self.filter.leaf_types()


class _LeafPredicate(_Value):
    """A plain `f(leaf) -> bool` predicate, as a filter object."""

    __slots__ = ("predicate",)
    _fields = ("predicate",)
    needs_path = False

    def __init__(self, predicate: Callable[[AnyType], AnyType]):
        _init(self, predicate=predicate)

    def __call__(self, path: Path, value: AnyType) -> bool:
        return bool(self.predicate(value))

    def __repr__(self) -> str:
        return getattr(self.predicate, "__name__", repr(self.predicate))


class _PathPredicate(_Value):
    """A plain `f(path, value) -> bool` function (Flax NNX's form), as a filter object."""

    __slots__ = ("predicate",)
    _fields = ("predicate",)

    def __init__(self, predicate: Callable[[Path, AnyType], AnyType]):
        _init(self, predicate=predicate)

    def __call__(self, path: Path, value: AnyType) -> bool:
        return bool(self.predicate(path, value))

    def __repr__(self) -> str:
        return getattr(self.predicate, "__name__", repr(self.predicate))


# Whether a function takes `(path, value)`, per function: the signature is read once, not
# on every conversion (`split(model, f)` converts its filters on every call). Bounded, as
# functions made afresh each time (lambdas in a loop) would otherwise pile up.
_takes_path: dict[AnyType, bool] = {}


def _function_filter(function: Callable[..., AnyType]) -> Filter:
    """A plain function as a filter: `f(value)` or `f(path, value)`, told by its signature."""
    try:
        known = _takes_path.get(function)
    except TypeError:  # an unhashable callable object
        known = None
    if known is None:
        known = _reads_path(function)
        try:
            if len(_takes_path) >= 256:
                _takes_path.clear()
            _takes_path[function] = known
        except TypeError:
            pass
    return _PathPredicate(function) if known else _LeafPredicate(function)


def _reads_path(function: Callable[..., AnyType]) -> bool:
    """Whether `function` is called as `f(path, value)` (two required positional
    parameters) rather than `f(value)` (one); anything else is refused."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False  # no readable signature (some builtins): a leaf predicate, as always
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.kind in positional and p.default is p.empty]
    keyword_only = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if len(required) in (1, 2) and not keyword_only:
        return len(required) == 2
    name = getattr(function, "__name__", repr(function))
    also = f" and required keyword-only parameters {keyword_only}" if keyword_only else ""
    raise TypeError(
        f"The function {name} cannot be a filter: it has {len(required)} required "
        f"positional parameters{also}. "
        "A filter function takes one argument, `f(value) -> bool` (such as `is_array`), or "
        "two, `f(path, value) -> bool` as in Flax NNX, where `path` is a tuple of keys "
        "such as ('layers', 0, 'kernel')."
    )


_EVERYTHING = Everything()
_NOTHING = Nothing()


def as_filter(spec: AnyType) -> Filter:
    """Convert one filter (not a prefix pytree) to a filter object."""
    if isinstance(spec, Filter):
        return spec
    if isinstance(spec, bool):
        return _EVERYTHING if spec else _NOTHING
    if spec is Ellipsis:
        return _EVERYTHING
    if isinstance(spec, type):
        return OfType(spec)
    if isinstance(spec, str):
        # Flax NNX's reading of a string: a tag (a random stream's name), not a path entry.
        return WithTag(spec)
    if spec is None:
        return _NOTHING
    if isinstance(spec, tuple | list):
        # Flax NNX's spelling of `Any`; a tuple of types stays one `OfType` (one isinstance).
        if spec and all(isinstance(t, type) for t in spec):
            return OfType(tuple(spec))
        return Any(*spec)
    if callable(spec):
        return _function_filter(spec)
    raise TypeError(
        f"Unsupported filter {spec!r} of type {type(spec).__name__}. A filter is one of: "
        "True or False; a predicate `f(leaf) -> bool` such as `is_array`, or `f(path, "
        "leaf) -> bool`; a type (its instances are selected whole); `...` (everything); "
        "None (nothing); a str (a tag, such as a random stream's name); a filter object "
        "(OfType, PathContains, WithTag, Any, All, Not, Everything, Nothing); a tuple "
        "or list of filters (any of them); and, for filter/partition, a prefix pytree of "
        "those."
    )


def to_predicate(filter_: AnyType) -> Callable[[Path, AnyType], bool]:
    """Turn any filter into a `(path, value) -> bool` predicate.

    This is the one conversion every consumer of filters uses: library code that accepts
    user filters calls it once and then tests leaves with their paths.

    A plain function is told apart by its signature, read once here: one required
    positional parameter makes it a leaf predicate `f(value)`, two make it a path
    predicate `f(path, value)` (Flax NNX's form); any other number is refused. A function
    whose signature cannot be read (some builtins) is a leaf predicate. A tuple or list of
    filters matches what any of them matches (`Any`), as in Flax NNX.

    Arguments:
        filter_: `True`/`False`, a function `f(leaf)` or `f(path, leaf)`, a type, `...`,
            `None` (nothing), a string (`WithTag`: values whose `tag` is that string, as
            Flax NNX reads a string), a filter object, or a tuple or list of filters.

    Returns:
        A filter object, called as `predicate(path, value)`. Its `leaf_types()` says which
        types to treat as leaves when flattening.

    Raises:
        TypeError: `filter_` is none of the above, or a function taking neither one nor
            two positional arguments.

    Examples:
        >>> from pytree_filter import to_predicate, is_array
        >>> import jax.numpy as jnp
        >>> predicate = to_predicate(is_array)
        >>> predicate(("layers", 0), jnp.ones(2)), predicate(("name",), "mlp")
        (True, False)
        >>> in_layers = to_predicate(lambda path, x: path[0] == "layers")
        >>> in_layers(("layers", 0), 1.0), in_layers(("head",), 1.0)
        (True, False)
        >>> to_predicate((int, str))((), "x"), to_predicate([float, in_layers])(("w",), 1)
        (True, False)
    """
    return as_filter(filter_)
