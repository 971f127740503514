"""`tree_at`: out-of-place replacement of parts of a pytree.

`where` is run on a copy of the pytree in which every leaf is a unique placeholder and
every node a fresh object, so the nodes it returns are found by identity, and the position
of each is known. The result is a copy of the input, built so that an object reached by
several paths (a shared Module or Variable) is still one object in the output: ties survive
`tree_at`. Replacing a node changes the position `where` reached it by, as assigning an
attribute would: the slot of its parent, and so every path through a shared parent.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax

_NOT_GIVEN = object()
_ROOT = ("root",)
_one_level = jax.tree_util.default_registry.flatten_one_level

# Rules for nodes of registered types, see `register_tree_at_rule`.
_RULES: dict[type, Callable[[Any, Any], Any]] = {}


def register_tree_at_rule(cls: type, rule: Callable[[Any, Any], Any]) -> None:
    """Decide what `tree_at` puts in place of a node of type `cls` that `where` picked.

    `rule(old, new)` is called with the picked node `old` (an instance of `cls`, or of a
    subclass, from the input pytree: it must not be changed) and its replacement `new` (the
    `replace` value, or what `replace_fn` returned). It returns one of:

    - `new` itself: `new` takes the place where `where` picked `old`, as it would
      without a rule;
    - another object, which stands for `old` changed (a cell given a new value, say): it
      takes `old`'s place at *every* position of the pytree where `old` is, so a node
      shared by several positions stays shared.

    It may also raise an error that says how to replace the node instead. pytree_graph
    registers a rule for its Variables: a Variable replaced by a bare value keeps its type
    and metadata and gets the value.

    Arguments:
        cls: the node type (its subclasses use the rule too, unless they have their own).
        rule: the function `rule(old, new) -> replacement`.

    Examples:
        >>> from pytree_module import tree_at
        >>> from pytree_module.extend import register_tree_at_rule
        >>> import jax
        >>> @jax.tree_util.register_static
        ... class Unit:
        ...     def __init__(self, name):
        ...         self.name = name
        >>> class Tagged:
        ...     def __init__(self, value, unit):
        ...         self.value, self.unit = value, unit
        >>> _ = jax.tree_util.register_pytree_node(
        ...     Tagged, lambda t: ((t.value,), t.unit), lambda u, c: Tagged(c[0], u)
        ... )
        >>> register_tree_at_rule(
        ...     Tagged, lambda old, new: new if isinstance(new, Tagged) else Tagged(new, old.unit)
        ... )
        >>> shared = Tagged(1.0, Unit("m"))
        >>> out = tree_at(lambda t: t["a"], {"a": shared, "b": shared}, 2.0)
        >>> out["a"].value, out["a"].unit.name, out["a"] is out["b"]
        (2.0, 'm', True)
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_tree_at_rule expects a class, got {cls!r}.")
    if not callable(rule):
        raise TypeError(
            f"register_tree_at_rule({cls.__name__}, rule): the rule must be a function "
            f"`rule(old, new) -> replacement`, got {rule!r}."
        )
    _RULES[cls] = rule


def _rule_for(node: Any) -> Callable[[Any, Any], Any] | None:
    if not _RULES:
        return None
    for klass in type(node).__mro__:
        rule = _RULES.get(klass)
        if rule is not None:
            return rule
    return None


class _Leaf:
    """Unique placeholder for one leaf: `where` can return it, but not look into it."""

    __slots__ = ("is_root", "value")

    def __init__(self, value: Any, is_root: bool):
        self.value = value
        self.is_root = is_root

    def __getattr__(self, name: str) -> Any:
        # Reached only for names a placeholder lacks; AttributeError keeps `hasattr` working.
        raise AttributeError(_into_leaf_message(self, f"reads `.{name}` of"))

    def __getitem__(self, key: Any) -> Any:
        raise TypeError(_into_leaf_message(self, f"indexes `[{key!r}]` into"))

    def __iter__(self) -> Any:
        raise TypeError(_into_leaf_message(self, "iterates over"))

    def __len__(self) -> int:
        raise TypeError(_into_leaf_message(self, "takes the length of"))

    def __bool__(self) -> bool:
        raise TypeError(_into_leaf_message(self, "tests the truth of"))

    def __repr__(self) -> str:
        return f"<leaf {_show(self.value)}>"


def _refuse_operator(name: str) -> Callable[..., Any]:
    def refuse(self: _Leaf, *other: Any) -> Any:
        raise TypeError(_into_leaf_message(self, f"computes (`{name}`) with"))

    refuse.__name__ = name
    return refuse


for _name in [
    "add",
    "sub",
    "mul",
    "matmul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "lshift",
    "rshift",
    "and",
    "or",
    "xor",
    "radd",
    "rsub",
    "rmul",
    "rmatmul",
    "rtruediv",
    "rfloordiv",
    "rmod",
    "rpow",
    "rlshift",
    "rrshift",
    "rand",
    "ror",
    "rxor",
    "lt",
    "le",
    "gt",
    "ge",
    "neg",
    "pos",
    "abs",
    "invert",
]:
    setattr(_Leaf, f"__{_name}__", _refuse_operator(f"__{_name}__"))
del _name


def _into_leaf_message(leaf: _Leaf, what: str) -> str:
    text = (
        f"tree_at: `where` {what} the leaf {_show(leaf.value)}. `where` is called on a "
        "copy of the pytree whose leaves are placeholders: it may only navigate the "
        "structure (attributes of Modules, items of lists, tuples and dicts) and return "
        "nodes or whole leaves, never look into a leaf or compute with it. To change part "
        "of a leaf, return the whole leaf and pass `replace_fn=`, e.g. "
        "`replace_fn=lambda x: x.at[0].set(1.0)` for an array."
    )
    if leaf.is_root:
        text += (
            " Here the pytree itself is a single leaf, so the only node `where` can "
            "return is all of it: `where=lambda x: x`."
        )
    return text


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any = _NOT_GIVEN,
    replace_fn: Callable[[Any], Any] | Any = _NOT_GIVEN,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Return a copy of `pytree` with the node(s) picked by `where` replaced.

    This is how frozen Modules are updated, and works on any pytree. The input is never
    changed; the output is a copy (its leaves are the same objects).

    Sharing is kept: an object reached by several paths (a Module or Variable held at two
    places) is one object in the output too. Replacing a node changes the place `where`
    reached it by, as assigning an attribute does: `tree_at(lambda m: m.b, model, new)`
    with `model.b is model.a` gives a model whose `b` is `new` and whose `a` is (a copy of)
    the old one, while `tree_at(lambda m: m.b.w, model, x)` changes `w` of the one shared
    object, seen through `a` and `b` alike. A pytree_graph Variable replaced by a bare
    value (`where=lambda m: m.kernel` with an array) keeps its type and metadata: the
    value goes into a new Variable of the same kind, which takes the old one's place
    everywhere (a tied Param stays tied). A Variable, a Module or `None` given as the
    replacement is put in as it is.

    Arguments:
        where: a function taking the pytree and returning the node to replace, or a tuple
            or list of nodes. It must only navigate the pytree structure (attributes, items).
            A list or tuple that is itself a node of the pytree (`lambda m: m.layers`) is
            that one node, replaced whole; any other list or tuple (`lambda m: (m.a, m.b)`)
            means several nodes.
        pytree: the pytree to update. It is not modified.
        replace: the new value, or a sequence of new values matching `where`'s sequence.
        replace_fn: alternatively, a function from the old node to its new value.
        is_leaf: treat matching subtrees as leaves. Needed to replace a `None` (which is an
            empty node for JAX) where there are several: `is_leaf=lambda x: x is None`.

    Returns:
        The updated copy.

    Raises:
        ValueError: when `where` returns something that is not a node of the pytree (a
            static attribute, a new object), a node found at several places that cannot
            be told apart (`None`), or nodes that overlap.
        TypeError: when `where` looks into a leaf or computes with one.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import tree_at
        >>> tree = {"a": jnp.zeros(2), "b": [1, 2]}
        >>> tree_at(lambda t: t["b"][0], tree, 10)["b"]
        [10, 2]
        >>> tree_at(lambda t: (t["b"][0], t["b"][1]), tree, replace_fn=lambda x: -x)["b"]
        [-1, -2]
        >>> tree_at(lambda t: t["b"], tree, [7, 8, 9])["b"]
        [7, 8, 9]
        >>> tree_at(lambda t: t[0], [(), ()], "hello")
        ['hello', ()]
    """
    if (replace is _NOT_GIVEN) == (replace_fn is _NOT_GIVEN):
        raise ValueError("tree_at needs exactly one of `replace=` or `replace_fn=`.")
    for name, function in (("where", where), ("replace_fn", replace_fn)):
        if function is not _NOT_GIVEN and not callable(function):
            raise TypeError(
                f"tree_at: `{name}` must be a function, got {function!r}. `where` takes the "
                "pytree and returns the node(s) to replace (`where=lambda m: m.layers[0]`); "
                "`replace_fn` takes an old node and returns its new value."
            )
    copier = _StandIns(is_leaf)
    stand_ins = copier.copy(pytree, _ROOT, None)
    picked = where(stand_ins)
    # As in Equinox: a list or tuple is one node when it is found in the tree by identity
    # (every container in `stand_ins` is a fresh object), else a sequence of nodes.
    several = isinstance(picked, tuple | list) and id(picked) not in copier.places
    nodes: Sequence[Any] = tuple(picked) if several else (picked,)
    if replace is not _NOT_GIVEN:
        if several:
            if not isinstance(replace, tuple | list) or len(replace) != len(nodes):
                raise ValueError(
                    f"tree_at: `where` returned {len(nodes)} nodes, so `replace` must be a "
                    f"tuple or list of {len(nodes)} values; got {replace!r}."
                )
            new_values: Sequence[Any] = tuple(replace)
        else:
            new_values = (replace,)
    if len({id(node) for node in nodes}) != len(nodes):
        raise ValueError("tree_at: `where` returned the same node more than once.")
    builder = _Builder(is_leaf)
    for index, node in enumerate(nodes):
        place, old = copier.place_of(node)
        if place in builder.at_place:
            raise ValueError(
                f"tree_at: `where` returned {_describe(node)} and another node that are "
                "one position of the pytree (one object reached by two paths, such as a "
                "shared Module): return it once."
            )
        rule = _rule_for(old)
        if rule is None:
            given = new_values[index] if replace_fn is _NOT_GIVEN else _NOT_GIVEN
            builder.at_place[place] = (index, given)
            continue
        # A rule may turn the node into another object standing everywhere it stands,
        # which the build must know before it first meets that object.
        new = new_values[index] if replace_fn is _NOT_GIVEN else replace_fn(builder.copy(old))
        made = rule(old, new)
        if made is new:
            builder.at_place[place] = (index, new)
        elif id(old) in builder.changed:
            raise ValueError(
                f"tree_at: `where` returned {_describe(node)} twice, by two paths to one "
                "shared object: return it once."
            )
        else:
            builder.changed[id(old)] = (index, made, old)
    result = builder.build(pytree, replace_fn)
    for index, node in enumerate(nodes):
        if index not in builder.done:
            raise ValueError(
                f"tree_at: `where` returned {_describe(node)}, which lies inside another "
                "node it returned, so it is replaced with that node: return only one of "
                "them."
            )
    return result


class _StandIns:
    """Builds the copy `where` is called on, and remembers where each of its nodes stands.

    A node's place is its parent's *anchor* (the nearest enclosing object with an identity,
    a Module or Variable say, or the root) with the path of child indices from there: one
    place for every path through a shared object, and one per occurrence otherwise.
    """

    def __init__(self, is_leaf: Callable[[Any], bool] | None):
        self.is_leaf = is_leaf
        # id(stand-in) -> (place, original, stand-in); the stand-in is held so that its id
        # stays its own. An object found at several places (`None`, one object in every
        # tree) is counted in `repeated` instead.
        self.places: dict[int, tuple[Any, Any, Any]] = {}
        self.repeated: dict[int, int] = {}

    def copy(self, node: Any, place: Any, anchor: Any) -> Any:
        if (self.is_leaf is not None and self.is_leaf(node)) or _is_empty_tuple(node):
            made: Any = _Leaf(node, place is _ROOT)
        else:
            if _one_level(node) is None:
                made = _Leaf(node, place is _ROOT)
            else:
                children, treedef = _children(node)
                anchor, path = _anchor(node, anchor, place)
                made = treedef.unflatten(
                    [
                        self.copy(child, (anchor, (*path, i)), anchor)
                        for i, child in enumerate(children)
                    ]
                )
        key = id(made)
        if key in self.places or key in self.repeated:
            self.repeated[key] = self.repeated.get(key, 1) + 1
            self.places.pop(key, None)
        else:
            self.places[key] = (place, node, made)
        return made

    def place_of(self, node: Any) -> tuple[Any, Any]:
        """The place and original of a node `where` returned (or a clear error)."""
        count = self.repeated.get(id(node))
        if count is not None:
            raise ValueError(
                f"tree_at: `where` returned {_describe(node)}, which appears {count} times "
                "in the pytree as one object, so the replacement is ambiguous. `None` is a "
                "shared object: pass `is_leaf` to make the Nones distinct leaves, e.g. "
                "`is_leaf=lambda x: x is None`."
            )
        if id(node) not in self.places:
            raise ValueError(
                f"tree_at: `where` returned {_describe(node)}, which is not a node of the "
                "pytree. `where` may only navigate the structure: static attributes are "
                "not part of the pytree, and `None` is an empty node, so to replace a "
                "`None` pass `is_leaf=lambda x: x is None`."
            )
        place, original, _ = self.places[id(node)]
        return place, original


class _Builder:
    """Builds the output from the input: fresh nodes, sharing kept, replacements made."""

    def __init__(self, is_leaf: Callable[[Any], bool] | None):
        self.is_leaf = is_leaf
        # place -> (index in `where`'s nodes, new value or _NOT_GIVEN for `replace_fn`)
        self.at_place: dict[Any, tuple[int, Any]] = {}
        # id(original object) -> (index, object standing for it everywhere, original)
        self.changed: dict[int, tuple[int, Any, Any]] = {}
        # id(original object with an identity) -> (its copy, original)
        self.built: dict[int, tuple[Any, Any]] = {}
        self.done: set[int] = set()
        self.replace_fn: Callable[[Any], Any] | None = None

    def build(self, pytree: Any, replace_fn: Any) -> Any:
        self.replace_fn = None if replace_fn is _NOT_GIVEN else replace_fn
        return self._at(pytree, _ROOT, None)

    def copy(self, node: Any) -> Any:
        """A copy of `node` for `replace_fn`, sharing its objects with the output."""
        return self._node(node, None)

    def _at(self, node: Any, place: Any, anchor: Any) -> Any:
        wanted = self.at_place.get(place)
        if wanted is None:
            return self._node(node, anchor, place)
        index, new = wanted
        self.done.add(index)
        if new is _NOT_GIVEN:
            new = self.replace_fn(self._node(node, anchor, place))
        return new

    def _node(self, node: Any, anchor: Any, place: Any = None) -> Any:
        changed = self.changed.get(id(node))
        if changed is not None:
            index, made, _ = changed
            self.done.add(index)
            return made
        if self.is_leaf is not None and self.is_leaf(node):
            return node
        if _one_level(node) is None or _is_empty_tuple(node):
            return node
        identity = _has_identity(node)
        if identity:
            found = self.built.get(id(node))
            if found is not None:
                return found[0]
        children, treedef = _children(node)
        anchor, path = _anchor(node, anchor, place)
        made = treedef.unflatten(
            [self._at(child, (anchor, (*path, i)), anchor) for i, child in enumerate(children)]
        )
        if identity:
            self.built[id(node)] = (made, node)
        return made


def _anchor(node: Any, anchor: Any, place: Any) -> tuple[Any, tuple[int, ...]]:
    """The anchor and path from it that a node's children extend."""
    if _has_identity(node):
        return id(node), ()
    if place is _ROOT or place is None:
        return place, ()
    return anchor, place[1]


def _children(node: Any) -> tuple[list[Any], Any]:
    """A node's children and its one-level treedef."""
    return jax.tree.flatten(node, is_leaf=lambda x: x is not node)


def _has_identity(node: Any) -> bool:
    """Whether `node` is an object that can be shared (not a builtin container or None)."""
    return node is not None and not isinstance(node, tuple | list | dict)


def _is_empty_tuple(node: Any) -> bool:
    # The empty tuple is one object in Python, so it would be found at every place that
    # holds one; as in Equinox, each is made a distinct placeholder instead.
    return type(node) is tuple and not node


def _describe(node: Any) -> str:
    if isinstance(node, _Leaf):
        return f"the leaf {_show(node.value)}"
    text = repr(node)
    return text if len(text) <= 60 else f"a {type(node).__name__}"


def _show(value: Any) -> str:
    from ._pformat import tree_pformat

    text = tree_pformat(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"
