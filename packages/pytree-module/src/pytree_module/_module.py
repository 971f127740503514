"""`Module`: classes whose instances are JAX pytrees."""

import dataclasses
import inspect
import operator
from collections.abc import Callable
from types import CodeType, FunctionType, MethodType
from typing import Any, ClassVar

import jax

from ._abstract import (
    abstract_methods,
    is_abstract,
    refuse_unset_abstract_vars,
    unprovided_class_vars_error,
)
from ._bound_method import BoundMethod, MethodDescriptor
from ._errors import TraceContextError
from ._frozen import freeze_static
from ._generated_init import present_generated_init
from ._layout import Layout, SlotSetters, TreedefEntry, get_layout
from ._module_info import ModuleInfo
from ._mutations import touch
from ._status import (
    StatusWrapper,
    check_static_value,
    contains_array,
    contains_wrapper,
    is_data,
    register_data_type,
)
from ._trace import current_trace_token, same_trace
from ._warnings import (
    TRANSFORMED_TYPES,
    calls_post_init,
    warn_if_wrapping_parameters,
    warn_post_init_skipped,
)

# Forced statuses (`data(...)`/`static(...)` assignments) of instances whose `__init__` is
# running, keyed by `id(instance)`. Presence here is what "still initialising" means, and
# `__setattr__` reads it on every assignment.
# - Keyed by id, not by the instance: a subclass may define `__eq__`/`__hash__` that read
#   attributes `__init__` has not set yet, and hashing by id runs no user code. The instance
#   is alive while its entry exists, so its id cannot be reused by another object, and
#   constructions in other threads (or nested ones, a Module built inside another's
#   `__init__`) use other keys.
# - Not a slot on the instance: instances made without `__init__` (rebuilt by a treedef
#   entry, unpickled, copied) would all need it set, on the unflatten hot path.
# - Cleanup: only `_ModuleMeta.__call__` adds an entry, and its `try`/`finally` removes it
#   however `__init__` or `_finish_init` ends, exceptions included.
_INITIALISING: dict[int, dict[str, bool]] = {}

# Attributes Python itself sets on an instance, which are not part of its structure:
# `typing` sets `__orig_class__` after `Generic` subclasses are called as `M[int](...)`.
_UNTRACKED = frozenset({"__orig_class__"})


# ----------------------------------------------------------------------------- pytree


# A module keeps its flattened form `(leaves, treedef entry)` in a slot, in step with
# `__dict__` (every assignment goes through `__setattr__`). So flattening is one C call
# and no Python code runs per module, which is what makes `jax.jit(f)(module, x)` nearly
# as fast as with a dict of arrays.
_flatten = operator.attrgetter("_pm_flat")


def _flatten_with_keys(module: "Module") -> tuple[tuple[Any, ...], TreedefEntry]:
    children, entry = module._pm_flat
    if entry is None:
        raise _not_initialised(module)
    return tuple(zip(entry.layout.key_entries, children, strict=True)), entry


class _Unsettled:
    """Children of a module whose `__init__` is running: iterating explains the error."""

    __slots__ = ("module",)

    def __init__(self, module: "Module"):
        self.module = module

    def __iter__(self):
        raise _not_initialised(self.module)

    def __len__(self) -> int:
        raise _not_initialised(self.module)


# Calling the treedef entry with the leaves rebuilds the module, all in C up to the
# generated builder (see _layout.py).
_unflatten = operator.call


def _not_initialised(module: "Module") -> ValueError:
    return ValueError(
        f"This {type(module).__name__} is still running its __init__, so its pytree "
        "structure is not settled yet and it cannot be flattened. Finish constructing it "
        "before passing it to JAX."
    )


class _ModuleMeta(type):
    """Builds Module classes: dataclass fields, method wrapping, pytree registration."""

    def __new__(
        mcs,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        /,
        *,
        frozen: bool | None = None,
        pytree: bool | None = None,
        **kwargs: Any,
    ) -> type:
        annotations = namespace.get("__annotations__", {})
        for key, value in list(namespace.items()):
            if (
                isinstance(value, FunctionType)
                and not (key.startswith("__") and key.endswith("__"))
                and key not in annotations
            ):
                namespace[key] = MethodDescriptor(value)
        for option, value in (("frozen", frozen), ("pytree", pytree)):
            if value is not None and not isinstance(value, bool):
                raise TypeError(
                    f"class {name}(Module, {option}=...) expects True or False, got {value!r}."
                )
        is_root = not any(isinstance(base, _ModuleMeta) for base in bases)
        if not is_root:
            _refuse_slots(name, namespace)
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        # Options are inherited unless a subclass sets them again.
        inherited = getattr(cls, "__module_info__", None)
        if frozen is None:
            frozen = inherited.frozen if inherited is not None else False
        if pytree is None:
            pytree = inherited.pytree if inherited is not None else True
        custom_init = not is_root and _has_custom_init(cls)
        # The root keeps its own `__init__` (see `Module.__init__`).
        generated_init = not (is_root or custom_init)
        if custom_init and _newly_skips_post_init(cls):
            warn_post_init_skipped(cls)
        # Read before `dataclasses` replaces it; the root's describes `super().__init__(...)`
        # forwarding, not the generated one.
        inherited_doc = (
            cls.__init__.__doc__ if generated_init and cls.__init__ is not Module.__init__ else None
        )
        _make_dataclass(cls, init=generated_init)
        cls.__module_info__ = info = ModuleInfo.of(
            cls,
            frozen=frozen,
            pytree=pytree,
            custom_init=custom_init,
            infer_fields=inherited is not None and inherited.infer_fields,
        )
        # Python refuses to instantiate a class whose `__abstractmethods__` is not empty,
        # which honours `@abc.abstractmethod` without `ABCMeta` and its slower isinstance.
        cls.__abstractmethods__ = abstract_methods(cls)
        if generated_init:
            present_generated_init(cls, info.converters, inherited_doc)
        # Copies of two of its facts, for `pytree_module.extend.is_pytree_class` and
        # `is_frozen_class`: graph walks ask once per object, and reading one class attribute
        # takes about half the time of reading `__module_info__.pytree` (both in C).
        cls.__module_pytree__ = pytree
        cls.__module_frozen__ = frozen
        if pytree:
            jax.tree_util.register_pytree_with_keys(
                cls, _flatten_with_keys, _unflatten, flatten_func=_flatten
            )
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return construct(cls, cls.__init__, args, kwargs)

    @property
    def __signature__(cls) -> inspect.Signature | None:
        """The signature of `__init__` without `self`, for `inspect.signature(cls)`.

        Without it, `inspect` would show the metaclass's `__call__(*args, **kwargs)`.
        """
        try:
            signature = inspect.signature(cls.__init__)
        except (TypeError, ValueError):
            return None
        return signature.replace(parameters=list(signature.parameters.values())[1:])


def construct(cls: Any, init: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """Build an instance of `cls` as `cls(*args, **kwargs)` does, running `init` as its
    `__init__` (see `pytree_module.extend.construct`)."""
    info = cls.__module_info__
    if info.abstract_class_vars:
        raise unprovided_class_vars_error(cls, info.abstract_class_vars)
    self = cls.__new__(cls)
    key = id(self)
    forced: dict[str, bool] = {}
    _INITIALISING[key] = forced
    try:
        _set_trace(self, current_trace_token())
        _set_flat(self, (_Unsettled(self), None))
        try:
            init(self, *args, **kwargs)
        except TypeError as error:
            _raise_if_bad_arguments(cls, args, kwargs, error)
            raise
        _finish_init(self, forced)
    finally:
        del _INITIALISING[key]
    for check_init in info.check_inits:
        check_init(self)
    return self


def _refuse_slots(name: str, namespace: dict[str, Any]) -> None:
    """Refuse non-empty `__slots__`: values in slots are invisible to the pytree."""
    slots = namespace.get("__slots__", ())
    if isinstance(slots, str):
        slots = (slots,)
    if slots:
        raise TypeError(
            f"class {name}(Module) declares __slots__ = {tuple(slots)!r}. A Module keeps its "
            "attributes in its __dict__, which is what JAX flattens and pytree_graph walks: "
            "values stored in slots would silently drop out of the pytree. Remove "
            "__slots__ (or leave it empty, `__slots__ = ()`), and declare the attributes "
            "as fields or assign them in __init__."
        )


def _make_dataclass(cls: type, *, init: bool) -> None:
    """Make `cls` a dataclass whose fields are its annotations less the abstract ones.

    `AbstractVar`/`AbstractClassVar` annotations declare no field, so `dataclasses` must not
    see them; they are put back afterwards, for `abstract_attributes` and for readers.
    """
    annotations = inspect.get_annotations(cls)
    concrete = {k: v for k, v in annotations.items() if not is_abstract(k, v)}
    if len(concrete) == len(annotations):
        dataclasses.dataclass(cls, init=init, repr=False, eq=False)
        return
    cls.__annotations__ = concrete
    try:
        dataclasses.dataclass(cls, init=init, repr=False, eq=False)
    finally:
        cls.__annotations__ = annotations


def _newly_skips_post_init(cls: type) -> bool:
    """Whether `cls`, whose `__init__` is hand-written, is the first to skip a `__post_init__`.

    Only a generated `__init__` calls `__post_init__`. Equinox warns for every such class;
    this warns where the combination is made (a subclass that changes neither method was
    warned about in its parent), and not when `__init__` calls `__post_init__` itself.
    """
    post_init = getattr(cls, "__post_init__", None)
    if post_init is None or calls_post_init(cls.__init__):
        return False
    parent = next(klass for klass in cls.__mro__[1:] if isinstance(klass, _ModuleMeta))
    already_skipped = (
        parent.__module_info__.custom_init
        and parent.__init__ is cls.__init__
        and getattr(parent, "__post_init__", None) is post_init
    )
    return not already_skipped


def _has_custom_init(cls: type) -> bool:
    """Whether `cls` uses an `__init__` written by hand rather than a generated one.

    As in Equinox: its own `__init__`, or the first one along the MRO, which may belong to
    a plain (non-Module) mixin; a Module parent passes on what it has.
    """
    if "__init__" in cls.__dict__:
        return True
    for klass in cls.__mro__[1:]:
        if isinstance(klass, _ModuleMeta):
            return klass.__module_info__.custom_init
        if "__init__" in klass.__dict__:
            return True
    return False


def _fields_signature(cls: type) -> inspect.Signature:
    """The signature a generated `__init__` of `cls` would have."""
    positional, keyword = [], []
    for f in cls.__module_info__.fields:
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory
        else:
            default = inspect.Parameter.empty
        kind = (
            inspect.Parameter.KEYWORD_ONLY if f.kw_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        (keyword if f.kw_only else positional).append(
            inspect.Parameter(f.name, kind, default=default)
        )
    return inspect.Signature(positional + keyword)


class Module(metaclass=_ModuleMeta):
    """Base class for models: subclasses are JAX pytrees.

    Two ways to declare attributes, freely mixed:

    * **Equinox style**: annotate fields on the class. An `__init__` taking them is
      generated unless the class (or a parent) defines one. Annotated fields are data
      unless declared `field(static=True)` / `static()`.
    * **NNX style**: assign attributes in `__init__`. When `__init__` returns, each
      unannotated attribute is data if `is_data(value)` (arrays, Modules, containers of
      those), else static. Force a status with `self.x = data(v)` / `static(v)`.

    Class options: `class M(Module, frozen=True)` refuses assignment after `__init__`
    (update copies with `tree_at`); `class M(Module, pytree=False)` is not a pytree and runs
    no status checks (use it through pytree_graph).

    Abstract classes: `@abc.abstractmethod` methods, `x: AbstractVar[T]` attributes and
    `y: AbstractClassVar[T]` class attributes must be provided by a subclass before it can
    be instantiated (`TypeError` otherwise). A `__post_init__` runs at the end of a
    generated `__init__`; next to a hand-written `__init__` it never runs, and defining
    both warns.

    Mutating a Module from inside a JAX trace other than the one it was created in raises
    `TraceContextError`. Modules hash and compare by identity; use `tree_equal` for values.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_module import Module
        >>> class Linear(Module):
        ...     def __init__(self, din, dout):
        ...         self.din, self.dout = din, dout        # static: ints
        ...         self.weight = jnp.zeros((din, dout))   # data: array
        ...     def __call__(self, x):
        ...         return x @ self.weight
        >>> layer = Linear(2, 3)
        >>> [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(layer)]
        ['.weight']
        >>> jax.jit(lambda m, x: m(x))(layer, jnp.ones(2)).shape
        (3,)
    """

    __slots__ = ("__dict__", "__weakref__", "_pm_flat", "_pm_trace")

    __module_info__: ClassVar[ModuleInfo]
    __module_pytree__: ClassVar[bool]
    __module_frozen__: ClassVar[bool]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Assign the declared fields from arguments, as a generated `__init__` would.

        Reached through `super().__init__(...)`: from a hand-written `__init__` (usually
        without arguments, which does nothing), or from a plain mixin's `__init__` that
        passes its arguments on, as in `class M(Mixin, Module)`.
        """
        if not args and not kwargs:
            return
        cls = type(self)
        try:
            signature = _fields_signature(cls)
            bound = signature.bind(*args, **kwargs)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"Module.__init__ assigns the fields of {cls.__name__} from the arguments "
                f"passed on by super().__init__(...), but got {error}. Pass arguments that "
                f"match the fields, or assign the fields in {cls.__name__}.__init__."
            ) from None
        for name, value in bound.arguments.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        forced = _INITIALISING.get(id(self))
        if forced is not None:
            _set_during_init(self, forced, name, value)
        else:
            _set_after_init(self, name, value)

    def __delattr__(self, name: str) -> None:
        info = type(self).__module_info__
        initialising = id(self) in _INITIALISING
        if not initialising:
            _check_mutable(self, info, name, "delete")
        object.__delattr__(self, name)
        if not initialising:
            if info.pytree:
                _relayout(self, {})
            touch()

    def __repr__(self) -> str:
        from ._pformat import tree_pformat

        return tree_pformat(self)

    def __pdoc__(self, **kwargs: Any) -> Any:
        from ._pformat import constructor_pdoc

        return constructor_pdoc(self, repr_items(self), **kwargs)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Callable) -> Any:
        from treescope import repr_lib

        return repr_lib.render_object_constructor(
            object_type=type(self),
            attributes=dict(repr_items(self)),
            path=path,
            subtree_renderer=subtree_renderer,
            roundtrippable=False,
        )

    def __getstate__(self) -> tuple[dict[str, Any], tuple[str, ...] | None]:
        entry = getattr(self, "_pm_flat", (None, None))[1]
        return dict(self.__dict__), (entry.layout.data_keys if entry is not None else None)

    def __setstate__(self, state: tuple[dict[str, Any], tuple[str, ...] | None]) -> None:
        values, data_keys = state
        self.__dict__.update(values)
        _set_trace(self, current_trace_token())
        if data_keys is not None and type(self).__module_info__.pytree:
            order = canonical_order(type(self), values)
            statuses = [k in data_keys for k in order]
            # Static containers come back frozen; freezing again covers older pickles.
            for name, status in zip(order, statuses, strict=True):
                if not status:
                    self.__dict__[name] = freeze_static(values[name], type(self).__name__, name)
            _install_layout(self, order, statuses)


register_data_type(Module)
register_data_type(BoundMethod)

_SETTERS = SlotSetters(
    flat=Module._pm_flat.__set__,  # type: ignore[attr-defined]
    trace=Module._pm_trace.__set__,  # type: ignore[attr-defined]
)
_set_flat, _set_trace = _SETTERS


def canonical_order(cls: type, values: dict[str, Any]) -> list[str]:
    """Attribute order of a layout: declared fields first, then other names sorted.

    Sorting makes the structure independent of assignment order, so two instances built
    along different code paths still have equal treedefs.
    """
    index = cls.__module_info__.field_index
    declared = sorted((k for k in values if k in index), key=index.__getitem__)
    others = sorted(k for k in values if k not in index and k not in _UNTRACKED)
    return declared + others


def _install_layout(module: Module, order: list[str], statuses: list[bool]) -> None:
    values = module.__dict__
    unhashable = [not d and _is_unhashable(values[k]) for k, d in zip(order, statuses, strict=True)]
    layout = get_layout(type(module), order, statuses, unhashable, _SETTERS)
    _set_flat(module, (layout.get_data(values), layout.entry(values)))


def _is_unhashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return True
    return False


def _relayout(module: Module, changed: dict[str, bool]) -> None:
    """Recompute the layout after attributes were added, removed or changed status."""
    layout = module._pm_flat[1].layout
    values = module.__dict__
    order = canonical_order(type(module), values)
    data_keys = layout.data_keys
    statuses = [changed.get(k, k in data_keys) for k in order]
    _install_layout(module, order, statuses)


# ------------------------------------------------------------------------- assignment


def _describe(module: Module, name: str) -> Callable[[], str]:
    return lambda: f"Attribute '{name}' of {type(module).__name__}"


# Types of the values that assignment looks at more closely: bound methods (refused when bound
# to the module itself) and the callables JAX transforms return (which may hide parameters).
# One lookup of the exact type costs less than one `isinstance`, and assignment is a hot
# path; neither `MethodType` nor `BoundMethod` is subclassed.
_CALLABLE_TYPES = frozenset({BoundMethod, MethodType}) | TRANSFORMED_TYPES


def _check_assignable(module: Module, name: str, value: Any) -> None:
    """Checks every assignment runs, whatever the status."""
    if type(value) in _CALLABLE_TYPES:
        _check_callable(module, name, value)
    try:
        wrapped = contains_wrapper(value)
    except RecursionError:
        # Only a container that holds itself nests this deep; the walk is not worth
        # guarding on every assignment, so the rare case is told apart here.
        raise ValueError(
            f"Attribute '{name}' of {type(module).__name__} holds a list, tuple or dict "
            "that contains itself (directly or through other containers): a pytree cannot "
            "hold a cycle, as flattening it would never end. Break the cycle, or hold the "
            "shared part in a `pytree=False` Module, whose cycles pytree_graph supports."
        ) from None
    if wrapped:
        raise ValueError(
            f"Attribute '{name}' of {type(module).__name__}: found data(...)/static(...) "
            "inside a container. These wrappers mark a whole attribute and must be the "
            f"assigned value itself: `self.{name} = data([...])`, not `[data(...)]`."
        )


def _check_callable(module: Module, name: str, value: Any) -> None:
    cls = type(module)
    if type(value) is BoundMethod or type(value) is MethodType:
        if value.__self__ is module:
            raise ValueError(
                f"Cannot assign a bound method of this {cls.__name__} to its own "
                f"attribute '{name}': the module would contain itself. Define a method "
                "instead, or store the plain function and call it with the module."
            )
    else:
        warn_if_wrapping_parameters(cls, name, value, _generated_init_code(cls))


def _generated_init_code(cls: type) -> tuple[CodeType, ...]:
    """The code of `cls`'s generated `__init__`, if it has one: warnings pass over it."""
    if cls.__module_info__.custom_init:
        return ()
    return (cls.__init__.__code__,)


def _unwrap(module: Module, name: str, value: Any) -> tuple[bool | None, Any]:
    """Split a `data(...)`/`static(...)` wrapper into (forced status, value)."""
    if not isinstance(value, StatusWrapper):
        return None, value
    if not value.is_data and contains_array(value.value):
        raise ValueError(
            f"Found Arrays in value of type '{type(value.value).__name__}' annotated with "
            f"static(...) when setting attribute '{name}' of {type(module).__name__}: "
            "static values are never traced. Assign it as `data(...)`, or without static(...)."
        )
    return value.is_data, value.value


def _status_for(
    info: ModuleInfo,
    name: str,
    value: Any,
    forced: bool | None,
    layout: Layout | None,
    infer: bool = True,
) -> bool | None:
    """Whether attribute `name` is data (True) or static (False): the one status rule.

    The first that applies decides: *forced* (`data(...)`/`static(...)`, passed as `forced`),
    *kept* (an attribute of the module's current `layout` keeps its status), *declared*
    (`field(static=...)`), *inferred* (`is_data(value)`). While `__init__` runs the value may
    still be replaced, so inference waits until it returns: `infer=False` answers None for
    an attribute that nothing forced or declared.

    Callers pass `forced` and `layout` positionally: keyword arguments would add a few
    percent to every assignment after `__init__`.
    """
    if forced is not None:
        return forced
    if layout is not None:
        if name in layout.data_keys:
            return True
        if name in layout.static_keys:
            return False
    declared_static = info.field_static.get(name)
    if declared_static is not None:
        return not declared_static
    return is_data(value) if infer else None


def _set_during_init(module: Module, forced: dict[str, bool], name: str, value: Any) -> None:
    cls = type(module)
    info = cls.__module_info__
    if not same_trace(module._pm_trace):
        raise _trace_error(module, name, "assign")
    if not info.pytree or info.is_data_descriptor(cls, name):
        object.__setattr__(module, name, value.value if isinstance(value, StatusWrapper) else value)
        return
    status, value = _unwrap(module, name, value)
    if status is None:
        # Unwrapped: refuse arrays now if an earlier `static(...)` or the declaration already
        # makes the attribute static (checks that need inference run when `__init__` returns).
        known = _status_for(info, name, value, forced.get(name), None, infer=False)
        if known is False:
            _refuse_data_in_static(module, name, value)
    if (
        info.frozen
        and info.field_index
        and name not in info.field_index
        and name not in info.abstract_vars
    ):
        raise ValueError(
            f"Cannot set attribute '{name}' on frozen {cls.__name__}: it is not one of its "
            f"fields {list(info.field_index)}. Declare it with an annotation in "
            f"the class body (`{name}: type`)."
        )
    _check_assignable(module, name, value)
    if status is not None:
        forced[name] = status
    object.__setattr__(module, name, value)


def _refuse_data_in_static(module: Module, name: str, value: Any) -> None:
    if contains_array(value):
        cls = type(module)
        # Flax NNX's wording: "unexpected" when the class declares the attribute static,
        # "assigned to" when an earlier assignment made it static.
        declared = cls.__module_info__.field_static.get(name) is True
        opening = (
            f"Found unexpected Arrays on value of type '{type(value).__name__}' in static "
            f"attribute '{name}' of {cls.__name__} (declared static)"
            if declared
            else f"Found Arrays on value of type '{type(value).__name__}' assigned to static "
            f"attribute '{name}' of {cls.__name__}"
        )
        raise ValueError(
            f"{opening}: static values are never traced. To change its status explicitly, "
            f"wrap the value: `.{name} = data(...)`; for a field declared static, declare "
            "it without `static=True`."
        )


def _check_mutable(module: Module, info: ModuleInfo, name: str, action: str) -> None:
    cls = type(module)
    if info.frozen:
        raise dataclasses.FrozenInstanceError(
            f"Cannot {action} attribute '{name}' of {cls.__name__}: it is frozen "
            f"(`class {cls.__name__}(Module, frozen=True)`), so it is immutable after "
            f"__init__. Make an updated copy instead: "
            f"`tree_at(lambda m: m.{name}, module, new_value)`."
        )
    if not same_trace(module._pm_trace):
        raise _trace_error(module, name, action)


def _trace_error(module: Module, name: str, action: str) -> TraceContextError:
    kind = type(module).__name__
    return TraceContextError(
        f"Cannot mutate '{kind}' from different trace level (Flax NNX's words). "
        f"Cannot {action} attribute '{name}' of {kind}: this {kind} was created outside "
        "the JAX transformation (jit, grad, vmap, scan, ...) that is tracing now, so the "
        "change would leak tracers out of it. Pass the module into the transformed "
        "function as an argument and return it (or the new values), or use "
        "pytree_graph's transforms, which write updates back to the caller's objects."
    )


def _set_after_init(module: Module, name: str, value: Any) -> None:
    if name in _UNTRACKED:
        # Not part of the structure, and set by Python right after construction even on
        # frozen modules (as Equinox allows).
        object.__setattr__(module, name, value)
        return
    cls = type(module)
    info = cls.__module_info__
    _check_mutable(module, info, name, "assign")
    if not info.pytree or info.is_data_descriptor(cls, name):
        object.__setattr__(module, name, value.value if isinstance(value, StatusWrapper) else value)
        touch()
        return
    layout = module._pm_flat[1].layout
    forced, value = _unwrap(module, name, value)
    _check_assignable(module, name, value)
    status = _status_for(info, name, value, forced, layout)
    if not status:
        if forced is None:
            _refuse_data_in_static(module, name, value)
        check_static_value(value, _describe(module, name))
        value = freeze_static(value, cls.__name__, name)
    was_data = name in layout.data_keys
    object.__setattr__(module, name, value)
    if status and was_data:
        # Same structure: only the leaves change.
        _set_flat(module, (layout.get_data(module.__dict__), module._pm_flat[1]))
    else:
        _relayout(module, {name: status})
    touch()


# ----------------------------------------------------------------------------- __init__


def _raise_if_bad_arguments(cls: type, args: tuple, kwargs: dict, error: TypeError) -> None:
    """Turn a TypeError from binding constructor arguments into one naming the class."""
    try:
        signature = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as bind_error:
        parameters = [
            p.replace(annotation=inspect.Parameter.empty)
            for p in list(signature.parameters.values())[1:]
        ]
        shown = signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)
        raise TypeError(f"{cls.__name__}{shown} got bad arguments: {bind_error}.") from error


def _finish_init(module: Module, forced: dict[str, bool]) -> None:
    """After `__init__`: defaults, converters, statuses, checks, layout."""
    cls = type(module)
    info = cls.__module_info__
    if info.abstract_vars:
        refuse_unset_abstract_vars(module, info.abstract_vars)
    values = module.__dict__
    missing = []
    provided = info.class_provided
    for f in info.fields:
        if f.name in values or f.name in provided:
            continue
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
        else:
            missing.append(f.name)
    if missing:
        raise ValueError(
            f"{cls.__name__}.__init__ did not set the annotated field(s) "
            f"{', '.join(repr(m) for m in missing)}. Assign them in __init__ "
            f"(`self.{missing[0]} = ...`), give them a default in the class body, or "
            "remove the annotation."
        )
    for name, converter in info.converters:
        values[name] = converter(values[name])
    if not info.pytree:
        return
    order = canonical_order(cls, values)
    statuses = []
    for name in order:
        value = values[name]
        status = _status_for(info, name, value, forced.get(name), None)
        if contains_wrapper(value):
            _check_assignable(module, name, value)
        if not status:
            check_static_value(value, _describe(module, name))
            values[name] = freeze_static(value, cls.__name__, name)
        statuses.append(status)
    _install_layout(module, order, statuses)


def repr_items(module: Module) -> list[tuple[str, Any]]:
    """The (name, value) pairs that `repr` shows, in layout order."""
    cls = type(module)
    values = module.__dict__
    hidden = {f.name for f in cls.__module_info__.fields if not f.repr}
    return [(k, values[k]) for k in canonical_order(cls, values) if k not in hidden]
