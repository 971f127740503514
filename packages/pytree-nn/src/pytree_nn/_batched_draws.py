"""Evaluating a jaxpr with its independent random draws batched: few threefry hashes.

XLA on CPU compiles each threefry hash of a program on its own, whatever its size: 25-65 ms
each on the 2-core machine of the benchmarks. A model's construction traced as one program
(`build`) holds one hash per key taken from an `Rngs` stream and one per draw: the 24-block
transformer of the benchmarks, 384 `random_fold_in` and 144 draws, took 10 s to compile.
The same fold_ins as one fold_in vmapped over the counts, and the draws as one draw per
sampler and shape vmapped over the keys, are four hashes (under 1 s). Threefry's bits depend
only on (key, counter), so a vmapped bind gives every draw the bits its own bind gives: the
values stay those of the unbatched program.

`eval_batching_draws` evaluates a closed jaxpr (inside the trace of the program it becomes
part of) as `jax.core.eval_jaxpr` does, except for its draws: the random primitives
(`_RANDOM`) and the `jit` calls whose body draws (`jax.random.normal`, ...). A draw waits
until nothing else can run; the draws ready then depend on no other draw, and those of one
primitive with the same parameters and input types (for a call: the same traced function,
hence the same shapes) become one bind under `jax.vmap` on their stacked inputs. A call
alone of its kind is evaluated by the same rules on its body, so that the draws inside it
join the others. A threefry `random_bits` is drawn flat (its bits depend on each element's
row-major position only, see `_flat_draws`), so that draws of one size share a bind
whatever their shapes. Draws on keys of other impls (`rbg`, whose bits vmap changes) are
bound one by one; other higher-order primitives (`cond`, `scan`, `custom_jvp_call`, ...)
are bound as they are, their draws unbatched; effectful equations keep their order.

XLA also compiles every other kernel of the program on its own, in about 10 ms: a slice
taking one draw out of a batch, one step of a counter. So nothing is taken apart before it
must be. Each equation's share of a batched bind stays a `Row` of the stacked result: an
equation working row by row (`_ROW_WISE`: a key's wrapping, a draw's scaling and reshaping)
on rows waits and is batched as the draws are, on the stacked arrays, and the results may
be rows, for the caller to take apart outside the program. And a counter's values (an
integer plus literals: an `Rngs` stream's count) stay an `Offset` from its first value, so
that the counts of a batched fold_in are one addition.
"""

import functools
import heapq
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import source_info_util
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, subjaxprs

from ._flat_draws import FLAT_THREEFRY

# The primitives that hash with threefry: each one in a program is compiled on its own.
_RANDOM = frozenset({"random_fold_in", "random_bits", "random_split", "threefry2x32"})
# The calls that may hold draws ("pjit" before JAX named it "jit").
_CALLS = frozenset({"jit", "pjit"})
# Primitives that vmap row by row, each row's result exactly the unbatched one's: batched on
# rows, they spare taking the rows apart.
_ROW_WISE = frozenset(
    {
        "random_wrap",
        "random_unwrap",
        "convert_element_type",
        "reshape",
        "squeeze",
        "expand_dims",
        "broadcast_in_dim",
        "transpose",
        "mul",
        "add",
        "sub",
        "div",
        "neg",
        "max",
        "min",
        "sqrt",
        "select_n",
        "clamp",
    }
)
# Random primitives whose values vmap changes: a body holding one is never batched.
_UNBATCHABLE = frozenset({"rng_bit_generator", "rng_uniform"})

_MISSING = object()


class Row(NamedTuple):
    """Row `index` of `stacked`: one equation's result of a batched bind."""

    stacked: Any
    index: int

    def take(self) -> Any:
        """The row itself (a slice of the stacked array)."""
        return self.stacked[self.index]


class Offset(NamedTuple):
    """`base + offset` for an integer scalar `base`, not yet computed: one of a counter's
    values. Stacked, the values of one base are one addition."""

    base: Any
    offset: int | np.ndarray
    dtype: np.dtype

    def take(self) -> Any:
        """The value itself (values, for an array of offsets)."""
        return jnp.add(jnp.asarray(self.base, self.dtype), _integer(self.offset, self.dtype))


def _integer(value: int | np.ndarray, dtype: Any) -> np.ndarray:
    """`value` in the integer `dtype`, wrapped around as XLA's integer addition wraps."""
    bits = 8 * np.dtype(dtype).itemsize
    wrapped = np.asarray(value, dtype=object) % (1 << bits)
    return np.asarray(wrapped, dtype=f"uint{bits}").view(dtype)


def eval_batching_draws(closed_jaxpr: ClosedJaxpr, *args: Any) -> list[Any]:
    """Evaluate `closed_jaxpr` on `args` (under the current trace), its independent random
    draws batched: the values of `jax.core.eval_jaxpr`, in few threefry hashes. A result
    may be a `Row` of a stacked array."""
    results = _Program(closed_jaxpr.jaxpr, closed_jaxpr.consts, args, {}).run()
    return [value if isinstance(value, Row) else _taken(value) for value in results]


class _Equation:
    """An equation over numbered value slots; an effectful one also waits for the
    effectful equation before it (`after`) and marks itself `done`."""

    __slots__ = ("after", "done", "draws", "eqn", "inputs", "outputs")

    def __init__(self, eqn: JaxprEqn, inputs: list[int], outputs: list[int], draws: bool):
        self.eqn = eqn
        self.inputs = inputs
        self.outputs = outputs
        self.draws = draws
        self.after: int | None = None
        self.done: int | None = None


class _Program:
    """A jaxpr's equations over numbered value slots, with its constants and arguments."""

    def __init__(
        self, jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any], drawing: dict[int, bool]
    ):
        self.values: list[Any] = []
        self.equations: list[_Equation] = []
        # Whether a call's body draws, by the body's id (the bodies are held by the jaxpr).
        self._drawing = drawing
        literals: dict[Hashable, int] = {}
        self._literals: set[int] = set()
        env = {var: self._slot(value) for var, value in zip(jaxpr.constvars, consts, strict=True)}
        env.update((var, self._slot(value)) for var, value in zip(jaxpr.invars, args, strict=True))

        def read(atom: Any) -> int:
            if not isinstance(atom, Literal):
                return env[atom]
            if np.ndim(atom.val):
                return self._slot(atom.val)
            # Equal scalar literals share a slot: a batch passes them once, unstacked (by
            # their repr, which tells -0.0 from 0.0).
            key = (type(atom.val), atom.aval, repr(atom.val))
            if key not in literals:
                literals[key] = self._slot(atom.val)
                self._literals.add(literals[key])
            return literals[key]

        last_effect: int | None = None
        for eqn in jaxpr.eqns:
            inputs = [read(atom) for atom in eqn.invars]
            outputs = [self._slot() for _ in eqn.outvars]
            env.update(zip(eqn.outvars, outputs, strict=True))
            # An effectful equation is never batched: vmap would change its effects.
            equation = _Equation(eqn, inputs, outputs, self._draws(eqn) and not eqn.effects)
            if eqn.effects:
                # Effects keep their order: each effectful equation waits for the one before.
                equation.after, equation.done = last_effect, self._slot()
                last_effect = equation.done
            self.equations.append(equation)
        self.results = [read(atom) for atom in jaxpr.outvars]

    def _slot(self, value: Any = _MISSING) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def _draws(self, eqn: JaxprEqn) -> bool:
        """Whether `eqn` is a draw to batch: a random primitive on threefry keys, or a call
        whose body draws so and nothing that vmap would change."""
        if _unbatchable(eqn):
            return False
        if eqn.primitive.name in _RANDOM:
            return True
        if eqn.primitive.name not in _CALLS:
            return False
        body = eqn.params["jaxpr"].jaxpr
        if id(body) not in self._drawing:
            self._drawing[id(body)] = not _holds_unbatchable(body) and any(
                self._draws(inner) for inner in body.eqns
            )
        return self._drawing[id(body)]

    def _batched(self, equation: _Equation) -> bool:
        """Whether `equation`, ready, waits to be batched: a draw, or row-wise on rows."""
        if equation.draws:
            return True
        return equation.eqn.primitive.name in _ROW_WISE and any(
            isinstance(self.values[slot], Row) for slot in equation.inputs
        )

    def run(self) -> list[Any]:
        """Evaluate every equation: the others in order as their inputs come, the draws
        (and row-wise equations on rows) in batches when nothing else can run. The results,
        rows among them."""
        waiting: list[int] = []
        consumers: dict[int, list[int]] = defaultdict(list)
        ready: list[int] = []  # a heap of equation numbers: the program's order
        batched: list[int] = []

        def schedule(number: int) -> None:
            if self._batched(self.equations[number]):
                batched.append(number)
            else:
                heapq.heappush(ready, number)

        for number, equation in enumerate(self.equations):
            slots = {*equation.inputs, *([] if equation.after is None else [equation.after])}
            missing = [slot for slot in slots if self.values[slot] is _MISSING]
            waiting.append(len(missing))
            for slot in missing:
                consumers[slot].append(number)
            if not missing:
                schedule(number)

        def provide(equation: _Equation, results: list[Any]) -> None:
            done = [] if equation.done is None else [(equation.done, True)]
            for slot, value in [*zip(equation.outputs, results, strict=True), *done]:
                self.values[slot] = value
                for number in consumers.pop(slot, ()):
                    waiting[number] -= 1
                    if not waiting[number]:
                        schedule(number)

        while ready or batched:
            while ready:
                equation = self.equations[heapq.heappop(ready)]
                step = self._counter_step(equation)
                if step is None:
                    provide(equation, _bind(equation.eqn, self._inputs(equation)))
                else:
                    provide(equation, [step])
            batch = [self.equations[number] for number in batched]
            batched.clear()
            for group in _groups(batch):
                for equation, results in zip(group, self._bind_group(group), strict=True):
                    provide(equation, results)
        return [self.values[slot] for slot in self.results]

    def _inputs(self, equation: _Equation) -> list[Any]:
        """`equation`'s inputs, rows and offsets computed (once: the value is kept)."""
        for slot in equation.inputs:
            self.values[slot] = _taken(self.values[slot])
        return [self.values[slot] for slot in equation.inputs]

    def _counter_step(self, equation: _Equation) -> Offset | None:
        """`equation` as an `Offset` (not computed) when it adds a literal to, or subtracts
        one from, an integer scalar; otherwise None."""
        eqn = equation.eqn
        if eqn.primitive.name not in ("add", "sub"):
            return None
        aval = eqn.outvars[0].aval
        if aval.shape != () or aval.weak_type or not jnp.issubdtype(aval.dtype, jnp.integer):
            return None
        x, y = equation.inputs
        if y in self._literals:
            base, step = x, int(self.values[y])
        elif x in self._literals and eqn.primitive.name == "add":
            base, step = y, int(self.values[x])
        else:
            return None
        step = step if eqn.primitive.name == "add" else -step
        value = self.values[base]
        if isinstance(value, Row):
            return None
        if isinstance(value, Offset):
            return Offset(value.base, value.offset + step, aval.dtype)
        return Offset(value, step, aval.dtype)

    def _bind_group(self, group: list[_Equation]) -> list[list[Any]]:
        """Each equation's results: the group bound as one, vmapped over the inputs that
        differ (rows); a call alone evaluated on its body, by these rules."""
        first = group[0].eqn
        if len(group) == 1 and first.primitive.name in _CALLS:
            body: ClosedJaxpr = first.params["jaxpr"]
            inputs = [self.values[slot] for slot in group[0].inputs]  # rows stay rows
            return [_Program(body.jaxpr, body.consts, inputs, self._drawing).run()]
        params = _batch_params(first)
        shapes = [var.aval.shape for var in first.outvars]
        columns = list(zip(*([self.values[s] for s in e.inputs] for e in group), strict=True))
        stacked = [_stacked(column) for column in columns]
        if len(group) == 1 or all(column is None for column, _ in stacked):
            # One equation, or several with the same inputs (pure: the same results).
            results = _bind(first, [shared for _, shared in stacked], params)
            return [[_shaped(r, s) for r, s in zip(results, shapes, strict=True)]] * len(group)
        in_axes = [None if column is None else 0 for column, _ in stacked]
        args = [column if column is not None else shared for column, shared in stacked]
        results = jax.vmap(lambda *a: _bind(first, list(a), params), in_axes=in_axes)(*args)
        results = [_shaped(r, (len(group), *s)) for r, s in zip(results, shapes, strict=True)]
        return [[Row(result, i) for result in results] for i in range(len(group))]


def _shaped(value: Any, shape: tuple[int, ...]) -> Any:
    return value if value.shape == shape else value.reshape(shape)


def _taken(value: Any) -> Any:
    return value.take() if isinstance(value, Row | Offset) else value


def _stacked(column: tuple[Any, ...]) -> tuple[Any, Any]:
    """One input of a group's equations, for a vmapped bind: `(stacked, None)`, or
    `(None, value)` for one value given to all. Rows of one stacked array are taken from it
    (as they are, when they are all its rows in order), never sliced apart and stacked."""
    first = column[0]
    if all(value is first for value in column):
        return None, _taken(first)
    # A counter's values (the first one, its base, among them): one addition.
    counter = next((value for value in column if isinstance(value, Offset)), None)
    if counter is not None and all(
        value is counter.base or (isinstance(value, Offset) and value.base is counter.base)
        for value in column
    ):
        offsets = [value.offset if isinstance(value, Offset) else 0 for value in column]
        return Offset(counter.base, np.array(offsets, dtype=object), counter.dtype).take(), None
    if isinstance(first, Row) and all(
        isinstance(value, Row) and value.stacked is first.stacked for value in column
    ):
        indices = [row.index for row in column]
        if indices == list(range(len(first.stacked))):
            return first.stacked, None
        return first.stacked[np.asarray(indices)], None
    return jnp.stack([_taken(value) for value in column]), None


def _bind(eqn: JaxprEqn, args: list[Any], params: dict[str, Any] | None = None) -> list[Any]:
    """`eqn`'s primitive bound on `args` as `jax.core.eval_jaxpr` binds it (with `params`
    instead of its own where given), its results as a list."""
    primitive = eqn.primitive
    params = primitive.get_bind_params(eqn.params if params is None else params)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with (
        source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
        eqn.ctx.manager,
    ):
        results = primitive.bind(*args, **params)
    return list(results) if primitive.multiple_results else [results]


def _batch_params(eqn: JaxprEqn) -> dict[str, Any]:
    """The parameters to bind `eqn` with in a batch: a `random_bits` (on threefry keys) in a
    shape of other than one axis draws flat (the same bits, reshaped after), so that draws
    of one size share a bind whatever their shapes."""
    if eqn.primitive.name != "random_bits" or len(eqn.params["shape"]) == 1:
        return eqn.params
    return {**eqn.params, "shape": (math.prod(eqn.params["shape"]),)}


@functools.cache
def _threefry_keys() -> tuple[Any, ...]:
    """The dtypes of threefry keys, drawn flat or not: vmap keeps their bits."""
    data = jax.ShapeDtypeStruct((2,), jnp.uint32)
    return tuple(
        jax.eval_shape(functools.partial(jax.random.wrap_key_data, impl=impl), data).dtype
        for impl in ("threefry2x32", FLAT_THREEFRY)
    )


def _unbatchable(eqn: JaxprEqn) -> bool:
    """Whether vmap may change `eqn`'s values: a random primitive of another kind, or keys
    of another impl (`rbg`, whose bits vmap changes)."""
    if eqn.primitive.name in _UNBATCHABLE:
        return True
    return any(
        jax.dtypes.issubdtype(var.aval.dtype, jax.dtypes.prng_key)
        and var.aval.dtype not in _threefry_keys()
        for var in (*eqn.invars, *eqn.outvars)
        if hasattr(var.aval, "dtype")
    )


def _holds_unbatchable(jaxpr: Jaxpr) -> bool:
    """Whether `jaxpr`, or a jaxpr inside it, holds an equation that vmap may change."""
    return any(_unbatchable(eqn) for eqn in jaxpr.eqns) or any(
        _holds_unbatchable(inner) for inner in subjaxprs(jaxpr)
    )


def _groups(batch: list[_Equation]) -> list[list[_Equation]]:
    """`batch` (independent equations) in groups that can be one vmapped bind: one
    primitive, the same parameters (as bound in a batch) and the same input types."""
    groups: dict[Hashable, list[_Equation]] = {}
    for number, equation in enumerate(batch):
        eqn = equation.eqn
        params = _batch_params(eqn)
        key: Hashable = (
            eqn.primitive,
            tuple(sorted(params.items())),
            tuple(atom.aval for atom in eqn.invars),
        )
        try:
            hash(key)
        except TypeError:  # parameters that do not hash: a group of its own
            key = ("unhashable", number)
        groups.setdefault(key, []).append(equation)
    return list(groups.values())
