"""`closure_to_pytree`: Python closures as pytrees whose leaves are what they capture.

A plain function is a leaf for JAX, so `filter_jit` holds it static: the arrays it closes
over are baked into the compilation as constants, and a new closure made each step (an
optimiser built anew for a new learning rate) is a new static value, traced again. Converted,
the function is a node whose children are its captured values (its closure cells), and
whose static part is its code: two closures made by one `def` with equal captured values
and defaults share a compilation, and captured arrays are traced.
"""

import functools
import types
from typing import Any

import jax
from jax.tree_util import DictKey

from ._static_key import static_key


class _Empty:
    """Stands for a closure cell not yet filled (a variable assigned after the `def`)."""

    def __repr__(self) -> str:
        return "<empty cell>"


_EMPTY = _Empty()


class _Code:
    """The static part of a converted closure: everything that rebuilds the function but
    its cells. Equal for functions made by one `def` (the same code object) in the same
    globals, with equal defaults; it holds no cell, so keeping it (in a treedef, in a
    compilation cache) keeps none of the captured values alive."""

    __slots__ = ("_key", "code", "defaults", "globals", "kwdefaults", "name", "qualname", "wrapper")

    def __init__(self, fn: types.FunctionType):
        self.code = fn.__code__
        self.globals = fn.__globals__
        self.name = fn.__name__
        self.qualname = fn.__qualname__
        # `__module__`, `__doc__`, `__annotations__`..., as `functools.wraps` copies them.
        self.wrapper = {
            name: getattr(fn, name)
            for name in functools.WRAPPER_ASSIGNMENTS
            if name not in ("__name__", "__qualname__") and hasattr(fn, name)
        }
        self.defaults = fn.__defaults__
        self.kwdefaults = None if fn.__kwdefaults__ is None else dict(fn.__kwdefaults__)
        key: Any = (self.code, id(self.globals), static_key((self.defaults, self.kwdefaults)))
        try:
            hash(key)
        except TypeError:  # defaults that cannot be hashed (an array): equal to itself only
            key = object()
        self._key = key

    def __eq__(self, other: object) -> bool:
        return type(other) is _Code and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"<code of {self.qualname}>"

    def rebuild(self, contents: tuple[Any, ...]) -> types.FunctionType:
        """The function, with cells holding `contents`."""
        cells = tuple(
            types.CellType() if value is _EMPTY else types.CellType(value) for value in contents
        )
        fn = types.FunctionType(self.code, self.globals, self.name, self.defaults, cells or None)
        fn.__qualname__ = self.qualname
        for name, value in self.wrapper.items():
            setattr(fn, name, value)
        if self.kwdefaults is not None:
            fn.__kwdefaults__ = dict(self.kwdefaults)
        return fn


class Closure:
    """A function as a pytree: its children are the values it captured (its closure cells,
    named by the captured variables), its static part its code and defaults.

    Made by `closure_to_pytree`; call it as the original function.
    """

    __slots__ = ("_code", "contents")

    def __init__(self, code: _Code, contents: tuple[Any, ...]):
        self._code = code
        self.contents = contents

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._code.rebuild(self.contents)(*args, **kwargs)

    @property
    def __name__(self) -> str:
        return self._code.name

    @property
    def __wrapped__(self) -> types.FunctionType:
        # What `inspect.signature` and error messages read: the function, with these cells.
        return self._code.rebuild(self.contents)

    def __repr__(self) -> str:
        names = ", ".join(self._code.code.co_freevars)
        return f"closure_to_pytree(<function {self._code.qualname}> capturing [{names}])"


def _flatten(closure: Closure) -> tuple[list[tuple[DictKey, Any]], _Code]:
    names = closure._code.code.co_freevars
    return [(DictKey(n), v) for n, v in zip(names, closure.contents, strict=True)], closure._code


def _unflatten(code: _Code, contents: Any) -> Closure:
    return Closure(code, tuple(contents))


jax.tree_util.register_pytree_with_keys(
    Closure, _flatten, _unflatten, lambda c: (c.contents, c._code)
)


def closure_to_pytree(tree: Any) -> Any:
    """Make every Python function in `tree` a pytree whose leaves are the values it captured.

    A function is a leaf for JAX, so `filter_jit` holds it static: the arrays a closure
    captured are compiled in as constants, and a closure made anew (an optimiser rebuilt
    with a new learning rate, a loss made inside a training step) is a new static value,
    traced again. Here every function leaf of `tree` (a `types.FunctionType`: a `def` or a
    `lambda`) becomes a callable pytree whose children are its closure cells, each converted
    in turn, and whose static part is its code: closures made by the same `def` with
    captured values of one structure share a compilation, and the captured arrays are
    traced like any argument. Captured numbers and strings are leaves too, which
    `filter_jit` holds static as usual.

    Only closures gain leaves: a function at module level captures nothing (its globals are
    looked up when it runs, as before). A function captured by itself (a recursive local
    function) is kept as it is inside its own cells.

    Arguments:
        tree: any pytree; a function on its own is a pytree of one leaf.

    Returns:
        `tree`, with each function leaf replaced by its pytree form, which is called as the
        function was. Two forms of functions made by one `def` (in the same module), with
        equal defaults, have equal static parts.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import closure_to_pytree, filter_jit
        >>> def make_step(lr):
        ...     scale = jnp.asarray(lr)
        ...     return lambda x: x - scale * x
        >>> step = closure_to_pytree(make_step(0.1))
        >>> jax.tree.leaves(step)
        [Array(0.1, dtype=float32, weak_type=True)]
        >>> apply = filter_jit(lambda f, x: f(x))
        >>> apply(step, jnp.ones(2))  # `scale` is traced, not compiled in
        Array([0.9, 0.9], dtype=float32)
        >>> apply(closure_to_pytree(make_step(0.5)), jnp.ones(2))  # the same compilation
        Array([0.5, 0.5], dtype=float32)
    """
    return jax.tree.map(lambda leaf: _convert(leaf, set()), tree)


def _convert(leaf: Any, converting: set[int]) -> Any:
    if not isinstance(leaf, types.FunctionType):
        return leaf
    converting = converting | {id(leaf)}
    contents = []
    for cell in leaf.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            contents.append(_EMPTY)
            continue
        contents.append(
            jax.tree.map(lambda x: x if id(x) in converting else _convert(x, converting), value)
        )
    return Closure(_Code(leaf), tuple(contents))
