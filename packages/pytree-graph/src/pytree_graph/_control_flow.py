"""Control flow over object graphs: `cond`, `switch`, `fori_loop`, `while_loop`, `scan`.

Each takes the same arguments as its `jax.lax` counterpart, but the operands, carries and
scanned values may hold Modules and Variables (shared ones included). Variables written
inside are written back to the caller's objects afterwards. Their structure must stay
the same inside (only values change): a loop carry cannot grow an attribute. Python
numbers in a loop carry are part of its state, as in `jax.lax`: they become arrays.

Each lifts its operands, carry or scanned values (`lift_once`), rebuilds them inside
(`Inside`), and ends with `LiftedCall.apply`. The branches, and scan over `xs`, describe
their writes with `Inside.finish`; a loop's carry is checked and passed from step to step
by `_carried` instead, and written back once, after the loop (`_write_back`).
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pytree_module import Module

from ._boundary import Inside
from ._graphdef import build
from ._lift import LiftedCall, lift_once, value_of
from ._traverse import GraphWalk
from ._variables import Variable


def _branch(fun: Callable[..., Any], lifted: LiftedCall, transform: str) -> Callable[..., Any]:
    def run(values: list[Any]) -> Any:
        inside = Inside(lifted.graphdef, values)
        # Branches must agree on their outcome, so none lists which Variables it wrote.
        return inside.finish(fun(*inside.tree), structure="fixed", transform=transform, track=False)

    return run


def _finish(lifted: LiftedCall, result: tuple) -> Any:
    outcome, values = result
    return lifted.apply(outcome, values)


def cond(
    pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any
) -> Any:
    """`jax.lax.cond` whose operands may hold Modules and Variables.

    Both branches get the operands (rebuilt, sharing kept) and must return outputs of the
    same structure; Variables either writes are written back to the caller's objects.

    Arguments:
        pred: a boolean scalar.
        true_fun: called with the operands when `pred` is true.
        false_fun: called with the operands otherwise.
        *operands: the arguments of both branches.

    Returns:
        The output of the branch taken.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Variable, cond
        >>> count = Variable(jnp.array(0))
        >>> def increment(c):
        ...     c.value += 1
        >>> cond(jnp.array(True), increment, lambda c: None, count)
        >>> int(count.value)
        1
    """
    lifted = lift_once(operands)
    result = jax.lax.cond(
        pred,
        _branch(true_fun, lifted, "cond"),
        _branch(false_fun, lifted, "cond"),
        lifted.values,
    )
    return _finish(lifted, result)


def switch(index: Any, branches: Sequence[Callable[..., Any]], *operands: Any) -> Any:
    """`jax.lax.switch` whose operands may hold Modules and Variables.

    Arguments:
        index: an integer scalar choosing the branch (clamped to the valid range).
        branches: the functions, each called with the operands; their outputs must have
            the same structure.
        *operands: the arguments of the branches.

    Returns:
        The output of the branch taken; Variables it wrote are written back.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Variable, switch
        >>> v = Variable(jnp.array(10.0))
        >>> def double(v):
        ...     v.value *= 2
        >>> def halve(v):
        ...     v.value /= 2
        >>> switch(jnp.array(1), [double, halve], v)
        >>> float(v.value)
        5.0
    """
    lifted = lift_once(operands)
    result = jax.lax.switch(index, [_branch(f, lifted, "switch") for f in branches], lifted.values)
    return _finish(lifted, result)


_PYTHON_NUMBERS = (bool, int, float, complex)


def _is_python_number(value: Any) -> bool:
    return type(value) in _PYTHON_NUMBERS


def _stops(value: Any) -> bool:
    return isinstance(value, Module | Variable)


def _numbers_as_arrays(carry: Any) -> Any:
    """A loop carry with its Python numbers made (weakly typed) arrays, as `jax.lax`
    loops make them: they are the loop's state, not static values. Numbers inside
    Modules and Variables are left as they are (Module attributes are static)."""
    leaves, treedef = jax.tree_util.tree_flatten(carry, is_leaf=_stops)
    if not any(map(_is_python_number, leaves)):
        return carry
    return treedef.unflatten([jnp.asarray(x) if _is_python_number(x) else x for x in leaves])


def _carried(lifted: LiftedCall, value: Any, transform: str, what: str) -> list[Any]:
    """The values of a loop carry, checking it kept the structure it came in with.

    Not `Inside.finish`: a loop step's output is the next step's input, not a change to
    write back. `finish` describes the arguments after the call and, apart, the output
    (sharing the arguments' objects), and its outcome is known only once traced; a loop
    carry must be the values alone, in the initial carry's leaf order, from the first
    step. The caller's objects are written once, after the loop (`_write_back`).
    """
    walk = GraphWalk()
    graphdef = walk.graphdef(_numbers_as_arrays(value))
    if graphdef != lifted.graphdef:
        raise ValueError(
            f"{transform}: {what} must return a carry of the same structure as the initial "
            f"one, with the same sharing (got {graphdef!r}, expected {lifted.graphdef!r}). "
            "Only the values of its Variables and arrays may change in the loop: make "
            "structural changes before or after it."
        )
    return list(map(value_of, walk.leaves))


def _loop_body(
    body_fun: Callable[..., Any], lifted: LiftedCall, transform: str
) -> Callable[..., Any]:
    def body(*call: Any) -> list[Any]:
        *index, values = call
        inside = Inside(lifted.graphdef, values)
        return _carried(lifted, body_fun(*index, inside.tree), transform, "body_fun")

    return body


def _write_back(lifted: LiftedCall, values: list[Any], transform: str) -> Any:
    """Give the caller's objects a loop's final carry `values`; return the final carry.

    The values are those of a carry of the initial structure: rebuilt from them, `finish`
    describes that carry as the output of a function returning its arguments, and
    `apply` writes every value back and returns the carry made of the caller's objects.
    """
    inside = Inside(lifted.graphdef, values)
    outcome, values = inside.finish(
        inside.tree, structure="fixed", transform=transform, track=False
    )
    return lifted.apply(outcome, values)


def fori_loop(
    lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any, **kwargs: Any
) -> Any:
    """`jax.lax.fori_loop` whose carry may hold Modules and Variables.

    The caller's objects in `init_val` hold the final values afterwards, and are what is
    returned (arrays in the carry come back new).

    Arguments:
        lower: the first index.
        upper: the index after the last.
        body_fun: `body_fun(i, val) -> val`, returning the carry with the same structure.
        init_val: the initial carry. Python numbers in it are carried as arrays, as
            `jax.lax` does (`fori_loop(0, 3, lambda i, c: c + 1, 0)` returns an array).
        **kwargs: passed on to `jax.lax.fori_loop` (e.g. `unroll`).

    Returns:
        The final carry.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Variable, fori_loop
        >>> class Accumulator(Module):
        ...     def __init__(self):
        ...         self.total = Variable(jnp.array(0))
        >>> acc = Accumulator()
        >>> def body(i, a):
        ...     a.total.value += i
        ...     return a
        >>> fori_loop(0, 5, body, acc) is acc, int(acc.total.value)
        (True, 10)
    """
    lifted = lift_once(_numbers_as_arrays(init_val))
    body = _loop_body(body_fun, lifted, "fori_loop")
    final = jax.lax.fori_loop(lower, upper, body, lifted.values, **kwargs)
    return _write_back(lifted, final, "fori_loop")


def while_loop(
    cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any
) -> Any:
    """`jax.lax.while_loop` whose carry may hold Modules and Variables.

    Arguments:
        cond_fun: `cond_fun(val) -> bool scalar`; it must not change the carry.
        body_fun: `body_fun(val) -> val`, returning the carry with the same structure.
        init_val: the initial carry. Python numbers in it are carried as arrays, as
            `jax.lax` does (`fori_loop(0, 3, lambda i, c: c + 1, 0)` returns an array).

    Returns:
        The final carry (the caller's objects, holding the final values).

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Variable, while_loop
        >>> v = Variable(jnp.array(1))
        >>> def double(v):
        ...     v.value *= 2
        ...     return v
        >>> _ = while_loop(lambda v: v.value < 100, double, v)
        >>> int(v.value)
        128
    """
    lifted = lift_once(_numbers_as_arrays(init_val))

    def condition(values: list[Any]) -> Any:
        inside = Inside(lifted.graphdef, values)
        result = cond_fun(inside.tree)
        after = _carried(lifted, inside.tree, "while_loop", "cond_fun")
        if any(a is not b for a, b in zip(after, values, strict=True)):
            raise ValueError(
                "while_loop: cond_fun changed a value of the carry; only body_fun may "
                "change it (cond_fun's changes would be lost)."
            )
        return result

    body = _loop_body(body_fun, lifted, "while_loop")
    final = jax.lax.while_loop(condition, body, lifted.values)
    return _write_back(lifted, final, "while_loop")


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """`jax.lax.scan` whose carry and scanned values may hold Modules and Variables.

    The carry (e.g. a model updated step by step) keeps its structure; `xs` may hold
    Modules whose Variables have a leading axis (e.g. a stack of layers), each step
    getting the Module with one slice of every Variable. Variables written inside are
    written back: the carry's final values, and, for the scanned objects, every step's
    values stacked.

    Arguments:
        f: `f(carry, x) -> (carry, y)`.
        init: the initial carry (Python numbers in it are carried as arrays).
        xs: what to scan over, along the leading axis of every array and Variable.
        length: the number of steps, when `xs` has no arrays.
        reverse: scan from the end.
        unroll: how many steps to unroll in the compiled loop.
        **kwargs: passed on to `jax.lax.scan`.

    Returns:
        `(carry, ys)`: the final carry (the caller's objects, updated) and the stacked
        outputs.

    Examples:
        >>> import jax.numpy as jnp
        >>> from pytree_module import Module
        >>> from pytree_graph import Param, scan
        >>> class Layer(Module):
        ...     def __init__(self, w):
        ...         self.w = Param(w)
        ...     def __call__(self, x):
        ...         return x * self.w.value
        >>> stack = Layer(jnp.array([1.0, 2.0, 3.0]))  # three layers, stacked
        >>> y, _ = scan(lambda x, layer: (layer(x), None), jnp.array(1.0), stack)
        >>> float(y)
        6.0
    """
    carry_lifted = lift_once(_numbers_as_arrays(init))
    xs_lifted = lift_once(xs)
    both = {id(o) for o in carry_lifted.objects} & {id(o) for o in xs_lifted.objects}
    if both:
        raise ValueError(
            "scan: the same Module or Variable is both in the carry and in xs. An object "
            "is either carried from step to step or scanned over, slice by slice: keep "
            "it in one of them."
        )

    def body(carry_values: list[Any], x_values: list[Any]) -> Any:
        carry_inside = Inside(carry_lifted.graphdef, carry_values)
        x_inside = Inside(xs_lifted.graphdef, x_values)
        out = f(carry_inside.tree, x_inside.tree)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(f"scan: f must return a pair (carry, y), got {type(out).__name__}.")
        carry, y = out
        new_carry = _carried(carry_lifted, carry, "scan", "f")
        x_outcome, x_after = x_inside.finish(None, structure="fixed", transform="scan")
        # Only what was written is stacked out of the loop.
        written = x_after if x_outcome.rewrite else [x_after[p] for p in x_outcome.changed]
        # `y` is walked on its own, not as `x_inside.finish`'s output: each step's `y` is
        # stacked into new objects, even where it holds a slice of xs's (which `apply`
        # would give back as the caller's xs objects, holding every step's values).
        walk = GraphWalk()
        y_graphdef = walk.graphdef(y)
        y_values = list(map(value_of, walk.leaves))
        return new_carry, (written, y_values, (x_outcome, y_graphdef))

    final, (written, y_values, static) = jax.lax.scan(
        body,
        carry_lifted.values,
        xs_lifted.values,
        length=length,
        reverse=reverse,
        unroll=unroll,
        **kwargs,
    )
    x_outcome, y_graphdef = static
    if not x_outcome.rewrite:
        full = list(xs_lifted.values)
        for position, value in zip(x_outcome.changed, written, strict=True):
            full[position] = value
        written = full
    xs_lifted.apply(x_outcome, written)
    carry = _write_back(carry_lifted, final, "scan")
    return carry, build(y_graphdef, y_values)
