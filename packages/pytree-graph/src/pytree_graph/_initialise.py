"""A graph transform decorating a pytree Module's `__init__` (`jit`, `remat`): the object is
built by the transformed function `cls(*args)` (which runs `__init__` plainly), then the
object being initialised is given its attributes.

A pytree Module in its `__init__` has no layout yet, so it cannot be lifted as an argument;
building a new one inside the transform and copying its attributes out gives the same
object as running `__init__` outside.
"""

import functools
import inspect
from collections.abc import Callable
from typing import Any

from pytree_module import Module, data, static
from pytree_module.extend import flat_form, is_pytree_class


def initialising(args: tuple) -> bool:
    """Whether a transform's call is a pytree Module's `__init__` (its first argument still
    has no layout)."""
    return bool(
        args
        and isinstance(args[0], Module)
        and flat_form(args[0])[1] is None
        and is_pytree_class(type(args[0]))
    )


class Initialiser:
    """Runs a transformed `__init__` (see the module's docstring).

    Arguments:
        fun: the `__init__` the transform decorates.
        transform: the transform's name, for errors (e.g. "jit").
        make: `make(construct, class_name)` gives `construct` (a function that builds
            the object from `__init__`'s arguments after `self`) transformed; it raises
            for options that cannot apply.
    """

    __slots__ = ("_constructing", "_constructors", "_fun", "_make", "_transform")

    def __init__(
        self,
        fun: Callable[..., Any],
        transform: str,
        make: Callable[[Callable[..., Any], str], Callable[..., Any]],
    ):
        self._fun = fun
        self._transform = transform
        self._make = make
        self._constructors: dict[type, Callable[..., Any]] = {}
        self._constructing = 0  # > 0 while a constructor is traced

    def __call__(self, owner: Any, module: Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Initialise `module` with `args` and `kwargs`; `owner` is the transformed
        `__init__` (the object its class holds)."""
        cls = type(module)
        if self._constructing:  # `cls(...)`, called by the constructor being traced
            return self._fun(module, *args, **kwargs)
        if cls.__init__ is not owner or vars(module):
            raise TypeError(
                f"pytree_graph.{self._transform} on {cls.__name__}.__init__: only the "
                "`__init__` of the class being built can be transformed, and it must set "
                "every attribute (here it is a parent's `__init__`, called from a subclass, "
                "or the object has attributes already). Transform the subclass's `__init__` "
                f"instead, or a function that builds the object: "
                f"`{self._transform}(lambda *a: Model(*a))(...)`."
            )
        constructor = self._constructors.get(cls)
        if constructor is None:

            def construct(*args: Any, **kwargs: Any) -> Any:
                self._constructing += 1
                try:
                    return cls(*args, **kwargs)
                finally:
                    self._constructing -= 1

            functools.update_wrapper(construct, self._fun)
            # The constructor takes `__init__`'s arguments after `self`.
            signature = inspect.signature(self._fun)
            construct.__signature__ = signature.replace(  # type: ignore[attr-defined]
                parameters=list(signature.parameters.values())[1:]
            )
            constructor = self._constructors[cls] = self._make(construct, cls.__name__)
        built = constructor(*args, **kwargs)
        data_keys = flat_form(built)[1].layout.data_keys
        # Wrapped, so that each attribute keeps the status it got inside.
        for name, value in vars(built).items():
            setattr(module, name, data(value) if name in data_keys else static(value))
        return None


def without_self(
    transform: str, class_name: str, options: dict[str, Any], names: tuple[str, ...]
) -> dict[str, Any]:
    """A transformed `__init__`'s options for the constructor, which takes the arguments
    after `self`: the argument numbers in the options `names` (counted with `self`, as for
    the method) move down by one.

    Raises:
        ValueError: an option names `self`, the object being built.
    """
    options = dict(options)
    for option in names:
        numbers = options.get(option)
        if numbers is None:
            continue
        numbers = (numbers,) if isinstance(numbers, int) else tuple(numbers)
        if 0 in numbers:
            raise ValueError(
                f"pytree_graph.{transform} on {class_name}.__init__: `{option}` names "
                "argument 0, `self`, the object being built, which is the output, not an "
                "argument. Count the arguments after it from 1, as in the signature (e.g. "
                f"`{option}=(1,)` for the first argument after `self`)."
            )
        options[option] = tuple(n - 1 if n > 0 else n for n in numbers)
    return options
