"""`Enumeration`: enum-like classes whose members are pytrees, usable under JAX transforms."""

from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from ._status import register_data_type


class EnumerationMember:
    """A member of an `Enumeration`: a pytree whose one leaf is the member's int32 index.

    The enumeration class is the static part (the treedef), so all members of one
    enumeration share a treedef and `jax.jit` compiles once for any of them.
    """

    __slots__ = ("_enumeration", "_value")

    # `==` returns an array, so members cannot be hashed consistently with it.
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, value: Any, enumeration: "type[Enumeration]"):
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_enumeration", enumeration)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        # Members such as `RESULTS.successful` are shared: changing one changes it everywhere.
        raise AttributeError(
            f"Enumeration members are immutable: cannot set `{name}` on {self!r}. Pick "
            f"another member, e.g. with `{self._enumeration.__name__}.where(...)`."
        )

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Enumeration members are immutable: cannot delete `{name}`.")

    @property
    def index(self) -> Any:
        """The member's position in its enumeration: an int32 array, traced under JAX
        transforms. Use it as the index of `jax.lax.switch`."""
        return self._value

    def is_traced(self) -> bool:
        """Whether the member is traced (inside `jax.jit`, `jax.vmap`, ...), so that which
        member it is is known only at run time: `E[member]` cannot look up its message."""
        return isinstance(self._value, jax.core.Tracer)

    def error_if(self, token: Any, pred: Any, *, on_error: str = "default") -> Any:
        """Raise this member's message where `pred` is true, from run-time values: works
        inside `jax.jit`, `jax.vmap` and loops, as `pytree_transforms.error_if` does.

        The member may be traced (a solver's result, chosen at run time with `where`):
        its message is picked when the check runs. The check is pytree_transforms'
        `branched_error_if` (see `pytree_module.extend.register_error_if`), so
        `pytree_transforms` must have been imported.

        Arguments:
            token: any pytree holding at least one array: returned as it is, with the
                check tied to it (the check runs before anything that uses the returned
                value).
            pred: a boolean array of any shape, or a bool; the check fails if any element
                is true.
            on_error: what a failure does, as for `pytree_transforms.error_if`:
                `"default"` (the environment's), `"raise"`, `"nan"`, `"breakpoint"` or
                `"off"`.

        Returns:
            `token`, with its arrays tied to the check.

        Raises:
            RuntimeError: no check is registered (`pytree_transforms` is not imported).

        Examples:
            >>> import jax, jax.numpy as jnp
            >>> import pytree_transforms  # registers the check
            >>> from pytree_module import Enumeration
            >>> class RESULTS(Enumeration):
            ...     successful = ""
            ...     diverged = "The iteration diverged."
            >>> @jax.jit
            ... def solve(x):
            ...     result = RESULTS.where(x > 10, RESULTS.diverged, RESULTS.successful)
            ...     return result.error_if(x, result != RESULTS.successful)
            >>> solve(jnp.array(1.0))
            Array(1., dtype=float32, weak_type=True)
            >>> try:
            ...     solve(jnp.array(100.0))
            ... except (jax.errors.JaxRuntimeError, ValueError) as error:
            ...     print("The iteration diverged." in str(error))
            True
        """
        if not _ERROR_IF:
            raise RuntimeError(
                f"{self!r}.error_if runs pytree_transforms' run-time check, which "
                "pytree_transforms registers when it is imported: add "
                "`import pytree_transforms` (or use `pytree_transforms.branched_error_if("
                "token, pred, member.index, list of messages)`)."
            )
        messages = list(self._enumeration._messages)
        return _ERROR_IF[0](token, pred, self._value, messages, on_error=on_error)

    def __eq__(self, other: object) -> Any:
        _check_comparable(self, other, "==")
        with jax.ensure_compile_time_eval():
            return jnp.equal(self._value, other._value)  # type: ignore[union-attr]

    def __ne__(self, other: object) -> Any:
        _check_comparable(self, other, "!=")
        with jax.ensure_compile_time_eval():
            return jnp.not_equal(self._value, other._value)  # type: ignore[union-attr]

    def __repr__(self) -> str:
        return f"{self._enumeration.__name__}.{_describe(self._value, self._enumeration)}"

    def __pdoc__(self, **kwargs: Any) -> Any:
        # Called by wadler-lindig, so already imported; a module-level import would cost
        # every `import pytree_module`.
        import wadler_lindig

        return wadler_lindig.TextDoc(repr(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return EnumerationMember, (self._value, self._enumeration)


jax.tree_util.register_pytree_with_keys(
    EnumerationMember,
    lambda m: (((jax.tree_util.GetAttrKey("_value"), m._value),), m._enumeration),
    lambda enumeration, children: EnumerationMember(children[0], enumeration),
    flatten_func=lambda m: ((m._value,), m._enumeration),
)
register_data_type(EnumerationMember)


# The run-time check that members' `error_if` calls (see `register_error_if`).
_ERROR_IF: list[Callable[..., Any]] = []


def register_error_if(check: Callable[..., Any]) -> None:
    """Give `Enumeration` members' `error_if` the run-time check it calls.

    A check that works inside compiled code takes a host callback and its own
    differentiation rule, which belong to pytree_transforms (its `branched_error_if`);
    pytree_module does not depend on it, so pytree_transforms registers that function here
    when it is imported. The latest registered check is the one called.

    Arguments:
        check: called as `check(token, pred, index, msgs, on_error=...)`; it returns `token`
            tied to a check that fails where `pred` is true, with the message
            `msgs[index]` (`index` is the member's int32 index, traced or not).

    Raises:
        TypeError: `check` is not callable.

    Examples:
        >>> import pytree_transforms
        >>> from pytree_module.extend import register_error_if
        >>> register_error_if(pytree_transforms.branched_error_if)  # what its import does
    """
    if not callable(check):
        raise TypeError(
            f"register_error_if expects a function `check(token, pred, index, msgs, "
            f"on_error=...)`, got {type(check).__name__} {check!r:.60}."
        )
    _ERROR_IF[:] = [check]


def _check_comparable(member: EnumerationMember, other: object, op: str) -> None:
    """Raise `TypeError` unless `other` is a member of the same enumeration as `member`."""
    enumeration = member._enumeration
    if isinstance(other, EnumerationMember) and other._enumeration is enumeration:
        return
    name = enumeration.__name__
    if not isinstance(other, EnumerationMember):
        raise TypeError(
            f"Cannot compare {member!r} {op} {other!r}: members of {name} compare only with "
            f"members of {name}, e.g. `result {op} {name}.{_example(enumeration)}`."
        )
    other_name = other._enumeration.__name__
    hint = ""
    if issubclass(enumeration, other._enumeration):
        hint = f" Convert the other one first: `{name}.promote(...)`."
    elif issubclass(other._enumeration, enumeration):
        hint = f" Convert this one first: `{other_name}.promote(...)`."
    raise TypeError(
        f"Cannot compare {member!r} {op} {other!r}: they belong to different enumerations "
        f"({name} and {other_name}).{hint}"
    )


def _example(enumeration: "type[Enumeration]") -> str:
    return enumeration._names[0] if enumeration._names else "<member>"


# Larger batches show their shape only, as a repr should stay one readable line.
_MAX_NAMES_SHOWN = 16


def _describe(value: Any, enumeration: "type[Enumeration]") -> str:
    """The member's name, `<[name, ...]>` for a batch, `<traced>` or `<unknown>`."""
    if isinstance(value, jax.core.Tracer):
        return "<traced>"
    if not isinstance(value, np.ndarray | np.generic | jax.Array) or not jnp.issubdtype(
        value.dtype, jnp.integer
    ):
        # Pytrees are generic in their leaves: `jax.tree.map` may put anything here, and
        # `jax.grad(..., allow_int=True)` puts a float0 array.
        return "<unknown>"
    value = np.asarray(value)
    if value.ndim == 0:
        return _name_of(value, enumeration)
    if value.size > _MAX_NAMES_SHOWN:
        return f"<batch of shape {value.shape}>"
    return f"<{_names_of(value, enumeration)}>"


def _name_of(value: np.ndarray, enumeration: "type[Enumeration]") -> str:
    index = int(value)
    return enumeration._names[index] if 0 <= index < len(enumeration._names) else f"#{index}"


def _names_of(value: np.ndarray, enumeration: "type[Enumeration]") -> str:
    if value.ndim == 0:
        return _name_of(value, enumeration)
    return "[" + ", ".join(_names_of(v, enumeration) for v in value) + "]"


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class _EnumerationMeta(type):
    """Turns the string attributes of an `Enumeration` subclass into its members."""

    _names: tuple[str, ...]
    _messages: tuple[str, ...]
    _offsets: dict[type, np.ndarray]

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], /
    ) -> "_EnumerationMeta":
        if not any(isinstance(base, _EnumerationMeta) for base in bases):
            # `Enumeration` itself: its body is the API (`where`, `promote`), not members.
            return super().__new__(mcs, name, bases, namespace)
        declared = {k: v for k, v in namespace.items() if not _is_dunder(k)}
        _check_declared(name, bases, declared)
        cls = super().__new__(
            mcs, name, bases, {k: v for k, v in namespace.items() if _is_dunder(k)}
        )
        names: list[str] = []
        messages: list[str] = []
        origins: list[type] = []
        offsets: dict[type, np.ndarray] = {}

        def add(member: str, message: str, origin: type) -> int:
            if member in names:
                index = names.index(member)
                if messages[index] != message:
                    raise ValueError(
                        f"Enumeration {name} gets member `{member}` twice with different "
                        f"messages: {messages[index]!r} from {origins[index].__name__} "
                        f"and {message!r} from {origin.__name__}. A member keeps one "
                        "message, so that `promote` preserves its meaning: give one of them "
                        "another name."
                    )
                return index
            names.append(member)
            messages.append(message)
            origins.append(origin)
            return len(names) - 1

        for base in bases:
            for parent in base.__mro__:
                if parent in offsets or parent is Enumeration or parent is object:
                    continue
                offsets[parent] = np.array(
                    [
                        add(n, m, parent)
                        for n, m in zip(parent._names, parent._messages, strict=True)
                    ],
                    dtype=np.int32,
                )
        for member, message in declared.items():
            add(member, message, cls)
        cls._names = tuple(names)
        cls._messages = tuple(messages)
        cls._offsets = offsets
        for index, member in enumerate(names):
            setattr(cls, member, EnumerationMember(np.array(index, dtype=np.int32), cls))
        if cls.__doc__ is None:
            cls.__doc__ = _member_list(name, names, messages)
        return cls

    def __getattr__(cls, name: str) -> NoReturn:
        # Only reached when normal lookup fails, so never for an existing member.
        raise AttributeError(
            f"Enumeration {cls.__name__} has no member `{name}`; its members are: "
            f"{', '.join(cls._names) or '(none)'}."
        )

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        if cls is Enumeration:
            raise TypeError(
                "Enumeration cannot be instantiated: subclass it, with one string attribute "
                "per member, and use the members, e.g. `RESULTS.successful`."
            )
        raise TypeError(
            f"Enumeration {cls.__name__} cannot be instantiated: use its members, e.g. "
            f"`{cls.__name__}.{_example(cls)}`, or "
            f"`{cls.__name__}.where(pred, a, b)` to choose one."
        )

    def __getitem__(cls, member: EnumerationMember) -> str:
        _check_member(cls, member, f"{cls.__name__}[member]")
        value = member._value
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"{cls.__name__}[member] looks up a message, but the member is traced "
                f"(inside jax.jit, jax.vmap, ...), so which one it is is only known at run "
                "time. Look the message up outside the transformation, or branch with "
                "`jax.lax.switch(member.index, ...)`."
            )
        if np.ndim(value) != 0:
            raise TypeError(
                f"{cls.__name__}[member] looks up one message, but {member!r} is a batch "
                f"of shape {np.shape(value)}: pick one first, e.g. "
                "`jax.tree.map(lambda v: v[0], member)`."
            )
        return cls._messages[int(value)]

    def __len__(cls) -> int:
        return len(cls._names)

    def __iter__(cls) -> Iterator[EnumerationMember]:
        return (getattr(cls, name) for name in cls._names)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, EnumerationMember) and (
            cls is Enumeration or instance._enumeration is cls
        )


def _check_declared(name: str, bases: tuple[type, ...], declared: dict[str, Any]) -> None:
    """Raise if a base is not an enumeration, or a member is not a string or shadows API."""
    for base in bases:
        if not isinstance(base, _EnumerationMeta):
            raise TypeError(
                f"Enumeration {name} cannot subclass {base.__name__}, which is not an "
                "Enumeration: an enumeration's bases must all be enumerations."
            )
    for member, message in declared.items():
        if not isinstance(message, str):
            raise TypeError(
                f"Enumeration {name}: member `{member}` must be a string (its message), got "
                f'{message!r}. Write `{member} = ""` for a member without a message.'
            )
        if hasattr(Enumeration, member):
            raise ValueError(
                f"Enumeration {name} cannot have a member named `{member}`: it would hide "
                f"`{name}.{member}`. Choose another name."
            )


def _member_list(name: str, names: list[str], messages: list[str]) -> str:
    """A docstring listing the members, shown by `help(...)`."""
    lines = [f"Enumeration {name}, with members:", ""]
    lines += [f"- `{n}`: {m}" if m else f"- `{n}`" for n, m in zip(names, messages, strict=True)]
    return "\n".join(lines)


def _check_member(cls: type, member: Any, where: str) -> None:
    """Raise `TypeError` unless `member` is a member of `cls`."""
    if isinstance(member, EnumerationMember) and member._enumeration is cls:
        return
    name = cls.__name__
    raise TypeError(
        f"{where} expects a member of {name}, such as `{name}.{_example(cls)}`; got {member!r}."
    )


class Enumeration(metaclass=_EnumerationMeta):
    """Enum-like classes whose members are pytrees: usable under `jax.jit`, `jax.vmap`,
    `jax.lax.cond` and `jax.lax.switch`.

    Subclass with one string attribute per member, its message. Each member is a pytree
    whose one leaf is its int32 index, and whose static part is the enumeration: members
    pass through `jax.jit` as arguments and results, batch under `jax.vmap`, and can be
    chosen at run time with `where`. Members compare with `==`/`!=` to a boolean array
    (traced under a transform), and only with members of the same enumeration.
    `RESULTS[member]` is the member's message; `member.index` is its position, for
    `jax.lax.switch`. A subclass extends its parents' members; `promote` converts a
    parent's member into the subclass's. Enumeration classes cannot be instantiated, and
    `isinstance(x, RESULTS)` tells whether `x` is a member of `RESULTS`.

    Examples:
        >>> import jax
        >>> from pytree_module import Enumeration
        >>> class RESULTS(Enumeration):
        ...     successful = ""
        ...     max_steps_reached = "The maximum number of solver steps was reached."
        >>> RESULTS.successful
        RESULTS.successful
        >>> RESULTS.successful == RESULTS.max_steps_reached
        Array(False, dtype=bool)
        >>> @jax.jit
        ... def check(steps):
        ...     return RESULTS.where(steps < 10, RESULTS.successful, RESULTS.max_steps_reached)
        >>> result = check(12)
        >>> result, RESULTS[result]
        (RESULTS.max_steps_reached, 'The maximum number of solver steps was reached.')
    """

    # Set on each subclass: member names and messages by index, and for each enumeration
    # it extends, the member indices here of that parent's members (`promote`).
    _names: ClassVar[tuple[str, ...]] = ()
    _messages: ClassVar[tuple[str, ...]] = ()
    _offsets: ClassVar[dict[type, np.ndarray]] = {}

    @classmethod
    def where(cls, pred: Any, a: EnumerationMember, b: EnumerationMember) -> EnumerationMember:
        """Choose between two members with a (possibly traced) predicate, as `jnp.where`.

        Arguments:
            pred: a boolean, or a boolean array (a batch of choices).
            a: the member where `pred` is true; a member of this enumeration.
            b: the member where `pred` is false; a member of this enumeration.

        Returns:
            A member of this enumeration.

        Examples:
            >>> from pytree_module import Enumeration
            >>> class STATUS(Enumeration):
            ...     ok = ""
            ...     failed = "It failed."
            >>> STATUS.where(False, STATUS.ok, STATUS.failed)
            STATUS.failed
        """
        _check_member(cls, a, f"{cls.__name__}.where(pred, a=...)")
        _check_member(cls, b, f"{cls.__name__}.where(pred, b=...)")
        if jnp.result_type(pred) != jnp.bool_:
            raise TypeError(
                f"{cls.__name__}.where(pred, a, b) needs a boolean `pred`, got dtype "
                f"{jnp.result_type(pred)}; compare first, e.g. `steps < max_steps`."
            )
        if a._value is b._value:
            return a
        with jax.ensure_compile_time_eval():
            return EnumerationMember(jnp.where(pred, a._value, b._value), cls)

    @classmethod
    def promote(cls, member: EnumerationMember) -> EnumerationMember:
        """Convert a member of a parent enumeration into the same-named member of this one.

        A member of this enumeration itself is returned unchanged. Works on traced and
        batched members.

        Arguments:
            member: a member of this enumeration or of an enumeration it extends.

        Returns:
            The member of this enumeration with the same name.

        Examples:
            >>> from pytree_module import Enumeration
            >>> class RESULTS(Enumeration):
            ...     successful = ""
            >>> class SOLVER_RESULTS(RESULTS):
            ...     diverged = "The solver diverged."
            >>> SOLVER_RESULTS.promote(RESULTS.successful)
            SOLVER_RESULTS.successful
        """
        name = cls.__name__
        if not isinstance(member, EnumerationMember):
            raise TypeError(
                f"{name}.promote(member) expects an enumeration member, got {member!r}."
            )
        source = member._enumeration
        if source is cls:
            return member
        offsets = cls._offsets.get(source)
        if offsets is None:
            parents = ", ".join(p.__name__ for p in cls._offsets) or "none"
            raise TypeError(
                f"{name}.promote(member) converts members of the enumerations {name} extends "
                f"(here: {parents}), but {member!r} belongs to {source.__name__}."
            )
        with jax.ensure_compile_time_eval():
            return EnumerationMember(jnp.asarray(offsets)[member._value], cls)
