"""`while_loop`: a while loop over any pytree, optionally reverse-mode differentiable."""

import math
import operator
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core.primitives import convert_element_type_p

from pytree_filter import is_array, path_text

from ._checkpointed_loop import checkpointed_loop
from ._errors import check_callable
from ._progress import LoopMonitor, check_progress_meter
from ._sharing import Sharing, find_sharing, has_repeats

KINDS = ("lax", "checkpointed", "bounded")
BASE = 16  # steps per level of the nested scans of kind="bounded", by default


def check_kind(kind: Any, caller: str, kinds: tuple[str, ...]) -> None:
    """Refuse an unknown `kind`, naming the allowed ones."""
    if not (isinstance(kind, str) and kind in kinds):
        allowed = ", ".join(repr(k) for k in kinds)
        raise ValueError(f"{caller}: unknown kind={kind!r}. Use one of {allowed}.")


def check_count(value: Any, name: str, caller: str, *, minimum: int) -> int | None:
    """`value` as an int of at least `minimum`, or None; refuse anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        what = "a non-negative" if minimum == 0 else "a positive"
        raise ValueError(
            f"{caller}: `{name}` must be {what} Python int or None, but got {value!r}. "
            f"Pass e.g. `{name}=100`."
        )
    return operator.index(value)


def default_checkpoints(max_steps: int | None, caller: str) -> int:
    """The fewest checkpoints with which the backward pass runs no step more than twice
    (recomputed at most once, then for its VJP) when reversing up to `max_steps` steps,
    whether the loop knows its length or places its checkpoints online: the least `c` with
    binom(c + 2, 2) > `max_steps` (Stumm and Walther's bound)."""
    if max_steps is None:
        raise ValueError(
            f'{caller}: kind="checkpointed" needs `checkpoints` when `max_steps` is None: '
            "it keeps that many carries for the backward pass, and cannot size them for an "
            "unbounded loop. Pass `checkpoints=` (e.g. 100), or `max_steps=`."
        )
    return max(1, math.ceil((math.sqrt(8 * (max_steps + 1) + 1) - 3) / 2))


_PYTHON_NUMBERS = (bool, int, float, complex)


def is_carried(leaf: Any) -> bool:
    """Whether a carry leaf is part of the loop's state: an array, or a Python number
    (exactly `bool`, `int`, `float` or `complex`: an `IntEnum` member stays static), which
    `jax.lax` loops make an array too."""
    return is_array(leaf) or type(leaf) in _PYTHON_NUMBERS


def as_array(leaf: Any) -> Any:
    """A carried leaf as a JAX array, as `jax.lax` loops take it: JAX arrays (tracers
    included) keep their weak type, Python numbers become weakly typed arrays (`bool` a
    bool array), NumPy values strongly typed ones."""
    return leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)


def with_weak_type(x: Any, weak: bool) -> Any:
    """`x`, weakly typed or not as `weak` says, with its dtype and values.

    A `jax.lax` loop's outputs have the weak types of its step's outputs; a loop built of
    other primitives (a `lax.cond` keeps its last branch's) is given them here. No public
    function makes a strongly typed array weak, so the primitive is bound directly.
    """
    if jax.typeof(x).weak_type == weak:
        return x
    if not weak:
        return lax.convert_element_type(x, x.dtype)
    return convert_element_type_p.bind(x, new_dtype=x.dtype, weak_type=True, sharding=None)


class _Promote(Exception):
    """A step traced with weakly typed carry leaves returned them with other dtypes:
    the loop is traced again from those leaves converted, as `jax.lax` loops do."""

    def __init__(self, carry: "Carry", dtypes: dict[int, Any]):
        super().__init__("a weakly typed leaf of the carry is promoted; traced again")
        self.carry = carry
        self.dtypes = dtypes


class Carry:
    """A loop carry taken apart: its arrays (what the loop carries: array leaves and
    Python numbers) and the rest (static, and checked to come back unchanged from every
    step).

    Types follow `jax.lax` loops. A Python number is carried as a weakly typed array. A
    weakly typed leaf that the step returns with another dtype is converted to the
    promoted dtype of the two (a carry started at `0.0` and added to bfloat16 values is
    carried as bfloat16), found by tracing the step once and tracing it again after (the
    loop is run through `run`, which does it). The loop's outputs have the weak types of
    the step's outputs (`finish`).
    """

    def __init__(self, value: Any, caller: str, what: str = "init_val"):
        self.caller = caller
        self.what = what
        pairs, self.treedef = jax.tree_util.tree_flatten_with_path(value)
        # An object (a Module, a Variable) reached twice is carried once and comes back as
        # one object, as through the other filtered transforms.
        self.sharing = _sharing_of(value, self.treedef, pairs)
        if self.sharing is not None:
            pairs = self.sharing.dedupe(pairs)
        self.paths = [path_text(p) for p, _ in pairs]
        leaves = [leaf for _, leaf in pairs]
        self.mask = [is_carried(leaf) for leaf in leaves]
        self.static = [leaf for leaf, m in zip(leaves, self.mask, strict=True) if not m]
        self.arrays = [as_array(leaf) for leaf, m in zip(leaves, self.mask, strict=True) if m]
        self.array_paths = [p for p, m in zip(self.paths, self.mask, strict=True) if m]
        # Whether a step's output may still promote a weakly typed leaf: only the first
        # trace of the step, as `jax.lax` (which traces at most twice).
        self.may_promote = True
        # The weak types of the step's outputs, once a trace of it succeeded.
        self.out_weak: list[bool] | None = None

    def rebuild(self, arrays: list[Any]) -> Any:
        """The carry with these array leaves."""
        arrays_iter, static_iter = iter(arrays), iter(self.static)
        leaves = [next(arrays_iter) if m else next(static_iter) for m in self.mask]
        if self.sharing is not None:
            return self.sharing.unflatten(leaves)
        return self.treedef.unflatten(leaves)

    def run(self, loop: Callable[[], Any]) -> Any:
        """`loop()`, which runs the loop from `self.arrays`; again after promoting the
        weakly typed leaves its step asked for (see `split`)."""
        try:
            return loop()
        except _Promote as promote:
            if promote.carry is not self:
                raise
            dtypes = promote.dtypes
        self.may_promote = False
        for index, dtype in dtypes.items():
            self.arrays[index] = lax.convert_element_type(self.arrays[index], dtype)
        return loop()

    def finish(self, arrays: list[Any]) -> list[Any]:
        """The loop's final arrays with the weak types of the step's outputs."""
        if self.out_weak is None:  # the step was never traced (a loop of no steps)
            return arrays
        return [with_weak_type(a, w) for a, w in zip(arrays, self.out_weak, strict=True)]

    def split(self, value: Any, fun: str) -> list[Any]:
        """The array leaves of what `fun` returned, after checking it is a carry like this."""
        pairs, treedef = jax.tree_util.tree_flatten_with_path(value)
        if treedef != self.treedef:
            raise ValueError(
                f"{self.caller}: `{fun}` must return a carry of the same structure as "
                f"`{self.what}`, but `{self.what}` has structure {self.treedef} and `{fun}` "
                f"returned {treedef}. Return a value of the same structure."
            )
        if self.sharing is not None:
            if _sharing_of(value, treedef, pairs) is not self.sharing:
                raise ValueError(
                    f"{self.caller}: `{fun}` must return a carry whose shared objects (one "
                    f"Module or Variable at several places of `{self.what}`) are still "
                    "shared, each one object at the same places. `jax.tree.map` builds a "
                    "copy at each place: update with `apply_updates` or `tree_at`, which keep "
                    "the sharing."
                )
            pairs = self.sharing.dedupe(pairs)
        arrays = []
        promote = {}
        array_index = static_index = 0
        for (_, leaf), path, m in zip(pairs, self.paths, self.mask, strict=True):
            if m:
                expected = self.arrays[array_index]
                array_index += 1
                if not is_carried(leaf):
                    raise ValueError(
                        f"{self.caller}: `{fun}` returned {type(leaf).__name__} {leaf!r:.40} "
                        f"at {path}, where `{self.what}` has an array of shape "
                        f"{expected.shape} and dtype {expected.dtype}. Return an array "
                        f"there, e.g. `jnp.asarray(..., dtype=jnp.{expected.dtype})`."
                    )
                leaf = as_array(leaf)
                if (
                    leaf.shape == expected.shape
                    and leaf.dtype != expected.dtype
                    and self.may_promote
                    and jax.typeof(expected).weak_type
                ):
                    # As `jax.lax`: the initial value takes the dtype it promotes to with
                    # the output's; if that is not the output's, the next trace refuses it.
                    promote[array_index - 1] = jnp.result_type(expected, leaf)
                    arrays.append(leaf)
                    continue
                if leaf.shape != expected.shape or leaf.dtype != expected.dtype:
                    got = f"{leaf.dtype}{list(leaf.shape)}"
                    want = f"{expected.dtype}{list(expected.shape)}"
                    raise ValueError(
                        f"{self.caller}: `{fun}` changed the array at {path} from {want} to "
                        f"{got}. A loop carry keeps its shapes and dtypes from step to step: "
                        "cast or reshape the new value to the old one's (e.g. "
                        f"`.astype(jnp.{expected.dtype})`)."
                    )
                arrays.append(leaf)
            else:
                expected = self.static[static_index]
                static_index += 1
                if not _same(leaf, expected):
                    raise ValueError(
                        f"{self.caller}: `{fun}` changed the non-array leaf at {path} from "
                        f"{expected!r:.40} to {leaf!r:.40}. Leaves of the carry that are "
                        "neither arrays nor Python numbers are static: they must not change "
                        "across iterations. Make it an array (e.g. `jnp.asarray(...)`) if it "
                        "has to change."
                    )
        if promote:
            raise _Promote(self, promote)
        if self.out_weak is None:
            self.out_weak = [jax.typeof(a).weak_type for a in arrays]
        self.may_promote = False
        return arrays

    def condition(self, cond_fun: Callable[[Any], Any]) -> Callable[[list[Any]], Any]:
        """`cond_fun` on the array leaves, checked to give a scalar bool."""

        def cond(arrays: list[Any]) -> Any:
            out = cond_fun(self.rebuild(arrays))
            if isinstance(out, (bool, np.bool_)):
                return jnp.asarray(out)
            shape = getattr(out, "shape", None)
            dtype = getattr(out, "dtype", None)
            if shape != () or dtype != jnp.bool_:
                got = f"{dtype}{list(shape)}" if shape is not None else type(out).__name__
                raise TypeError(
                    f"{self.caller}: `cond_fun` must return a scalar boolean (a bool, or a "
                    f"bool array of shape ()), but it returned {got}. Reduce it, e.g. "
                    "`jnp.all(...)`, or compare, e.g. `x < 1`."
                )
            return out

        return cond

    def body(self, body_fun: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
        """`body_fun` on the array leaves, checked to keep the carry's structure."""
        return lambda arrays: self.split(body_fun(self.rebuild(arrays)), "body_fun")


def _sharing_of(tree: Any, treedef: Any, pairs: list[Any]) -> Sharing | None:
    """The shared objects of a carry (see `_sharing`), looked for only where the cheap test
    says there may be some."""
    if not has_repeats([leaf for _, leaf in pairs]):
        return None
    return find_sharing(tree, treedef)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # objects whose comparison does not give one truth value
        return False


def buffer_mask(carry: Carry, buffers: Callable[[Any], Any] | None, caller: str) -> list[bool]:
    """Which array leaves of `carry` are the buffers named by `buffers(init_val)`."""
    if buffers is None:
        return [False] * len(carry.arrays)
    check_callable(buffers, caller, "buffers", spelling=f"{caller}(..., buffers={{}})")
    # Found by identity in a rebuilt carry: the user's own init_val may hold numpy arrays or
    # weakly typed ones, which were replaced.
    named = jax.tree.leaves(buffers(carry.rebuild(carry.arrays)))
    ids = {id(leaf) for leaf in named}
    mask = [id(a) in ids for a in carry.arrays]
    if sum(mask) != len(ids):
        raise ValueError(
            f"{caller}: every leaf of `buffers({carry.what})` must be an array leaf of "
            f"`{carry.what}` itself (not a copy or a computed value), e.g. `buffers=lambda "
            "carry: carry['ys']`, but some of them are not."
        )
    return mask


def while_loop(
    cond_fun: Callable[[Any], Any],
    body_fun: Callable[[Any], Any],
    init_val: Any,
    *,
    max_steps: int | None = None,
    kind: Literal["lax", "checkpointed", "bounded"] = "lax",
    checkpoints: int | None = None,
    buffers: Callable[[Any], Any] | None = None,
    base: int = BASE,
    progress_meter: Any = None,
) -> Any:
    """`jax.lax.while_loop` over any pytree, with a reverse-mode differentiable choice.

    The carry follows `jax.lax.while_loop`: Python numbers in it are carried as weakly
    typed arrays (a counter started at `0` comes back an int32 array), its arrays keep
    their shapes and dtypes from step to step except that a weakly typed one takes the
    dtype the step gives it (a `0.0` that the step adds bfloat16 values to is carried as
    bfloat16), and the final carry is weakly typed where the step's outputs are, with every
    `kind`. Other leaves (strings, functions) are static and must come back unchanged.

    Arguments:
        cond_fun: `carry -> bool`, a Python bool or a bool array of shape ().
        body_fun: `carry -> carry`.
        init_val: the initial carry.
        max_steps: stop after this many steps even if `cond_fun` still holds. Required by
            `kind="bounded"`.
        kind: `"lax"`: `jax.lax.while_loop`; forward-mode differentiable, not reverse-mode.
            `"checkpointed"`: reverse-mode differentiable in memory bounded by
            `checkpoints` copies of the carry, whatever the number of steps: they are
            placed online as the loop runs (Stumm--Walther, then Wang--Moin, as Equinox's),
            and the backward pass recomputes steps from them (binomial checkpointing). Also
            forward-mode differentiable (`jax.jvp`, `jax.jacfwd`, and forward over
            reverse such as `jax.hessian`), not reverse over forward. Carry leaves that
            the derivative does not reach get symbolic-zero tangents and cotangents, as
            with `"lax"` (so `nondifferentiable` accepts them).
            `"bounded"`: nested `lax.scan`s of `max_steps` steps in all, skipping those
            after `cond_fun` turns false; differentiable in both modes, with memory growing
            with `max_steps`.
        checkpoints: for `"checkpointed"`, the number of carries kept for the backward pass,
            the initial one included; by default the fewest with which the backward pass
            recomputes no step more than once (about `sqrt(2 * max_steps)`). Required when
            `max_steps` is None.
        buffers: `init_val -> pytree of array leaves of init_val`: large arrays that
            `body_fun` fills in place, `buf.at[i].set(...)`. With `"checkpointed"` they are
            not copied into the checkpoints, on the conditions that every location is
            written at most once (and not also set before the loop) and read only after it
            was written; these are not checked, and breaking them gives wrong gradients.
            The other kinds only check that they are leaves of the carry. A buffer that
            `body_fun` only writes (never reads) costs `"checkpointed"`'s backward pass
            nothing per step; as with Equinox, its cotangent at the locations written is
            then not zeroed, so do not differentiate with respect to its initial values.
        base: for `"bounded"`, the number of steps per level of nested scans (an int >= 2;
            other kinds ignore it, as Equinox's). A larger base compiles faster (fewer
            levels, `ceil(log(max_steps, base))`) and runs a little slower.
        progress_meter: an `AbstractProgressMeter` (`TextProgressMeter`,
            `TqdmProgressMeter`, or one of your own) reporting how far the loop has got,
            from inside the compiled loop: `init()` before the loop, `step(state, progress)`
            after each step and `close(state)` after the loop, its state carried by the
            loop. The progress is `steps / max_steps` unless the meter has a `fraction`
            function of the carry. `None` (the default) or `NoProgressMeter()` for none.
            The backward pass of `"checkpointed"` reports nothing.

    Returns:
        The final carry.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from pytree_transforms import while_loop
        >>> def solve(rate):
        ...     def step(carry):
        ...         t, y = carry
        ...         return t + 0.1, y - 0.1 * rate * y  # explicit Euler for y' = -rate y
        ...     init = (jnp.float32(0.0), jnp.float32(1.0))
        ...     _, y = while_loop(lambda c: c[0] < 0.95, step, init,
        ...                       max_steps=100, kind="checkpointed", checkpoints=3)
        ...     return y
        >>> print(f"{solve(1.0):.4f} {jax.grad(solve)(1.0):.4f}")
        0.3487 -0.3874
    """
    caller = "while_loop"
    check_callable(cond_fun, caller, "cond_fun", spelling=f"{caller}({{}}, body_fun, init_val)")
    check_callable(body_fun, caller, "body_fun", spelling=f"{caller}(cond_fun, {{}}, init_val)")
    check_kind(kind, caller, KINDS)
    max_steps = check_count(max_steps, "max_steps", caller, minimum=0)
    checkpoints = check_count(checkpoints, "checkpoints", caller, minimum=1)
    base = check_base(base, caller)
    meter = check_progress_meter(progress_meter, max_steps, caller)
    if kind == "bounded" and max_steps is None:
        raise ValueError(
            f'{caller}: kind="bounded" needs `max_steps`: it unrolls the loop to that many '
            'steps. Pass `max_steps=` (an int), or use kind="checkpointed" for a loop of '
            "unbounded length."
        )
    if kind == "checkpointed" and checkpoints is None:
        checkpoints = default_checkpoints(max_steps, caller)
    carry = Carry(init_val, caller)
    is_buffer = buffer_mask(carry, buffers, caller)
    cond = carry.condition(cond_fun)
    body = carry.body(body_fun)
    if max_steps == 0:
        return carry.rebuild(carry.arrays)

    progress = None if meter is None else LoopMonitor(meter, carry.rebuild, max_steps)

    def loop() -> list[Any]:
        if kind == "lax":
            return _lax_loop(cond, body, carry.arrays, max_steps, progress)
        if kind == "bounded":
            return bounded_loop(cond, body, carry.arrays, max_steps, base, progress)
        return _checkpointed(cond, body, carry.arrays, is_buffer, max_steps, checkpoints, progress)

    return carry.rebuild(carry.finish(carry.run(loop)))


def check_base(base: Any, caller: str) -> int:
    """`base` as an int of at least 2; refuse anything else."""
    if isinstance(base, bool) or not isinstance(base, (int, np.integer)) or base < 2:
        raise ValueError(
            f"{caller}: `base` must be a Python int of at least 2 (the steps per level of "
            f'kind="bounded"\'s nested scans), but got {base!r}. Pass e.g. `base={BASE}`.'
        )
    return operator.index(base)


def _lax_loop(
    cond: Any, body: Any, arrays: list[Any], max_steps: int | None, progress: Any = None
) -> list[Any]:
    if max_steps is None and progress is None:
        return lax.while_loop(cond, body, arrays)

    def counted_cond(carry: tuple[Any, ...]) -> Any:
        going = cond(carry[1])
        return going if max_steps is None else (carry[0] < max_steps) & going

    extra = None if progress is None else progress.start()
    carry = (jnp.int32(0), arrays, extra)
    _, arrays, extra = lax.while_loop(counted_cond, _counted(body, progress), carry)
    if progress is not None:
        progress.finish(extra)
    return arrays


def _counted(body: Any, progress: Any) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """`body` on `(steps taken, arrays, progress state)`, reporting progress after each step."""

    def counted_body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        i, arrays, extra = carry
        arrays = body(arrays)
        if progress is not None:
            extra = progress.update(i + 1, arrays, extra)
        return i + 1, arrays, extra

    return counted_body


def bounded_loop(
    cond: Any,
    body: Any,
    arrays: list[Any],
    max_steps: int,
    base: int = BASE,
    progress: Any = None,
) -> list[Any]:
    """At most `max_steps` steps as nested scans of `base` steps a level, each step or block
    of steps skipped (`lax.cond`) once the loop has stopped."""

    def going(carry: tuple[Any, ...]) -> Any:
        return (carry[0] < max_steps) & cond(carry[1])

    advance = _counted(body, progress)

    def one(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        return lax.cond(going(carry), advance, lambda c: c, carry)

    def level(depth: int, length: int) -> Callable[[Any], Any]:
        inner = one if depth == 0 else level(depth - 1, base)

        def block(carry: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
            return lax.scan(lambda c, _: (inner(c), None), carry, length=length)[0]

        if depth == 0:
            return block
        return lambda carry: lax.cond(going(carry), block, lambda c: c, carry)

    depth = 0
    while base ** (depth + 1) < max_steps:
        depth += 1
    # The outer level has just enough blocks of base**depth steps to cover max_steps.
    outer = level(depth, -(-max_steps // base**depth)) if depth else level(0, max_steps)
    extra = None if progress is None else progress.start()
    _, arrays, extra = outer((jnp.int32(0), arrays, extra))
    if progress is not None:
        progress.finish(extra)
    return arrays


def _checkpointed(
    cond: Any,
    body: Any,
    arrays: list[Any],
    is_buffer: list[bool],
    max_steps: int | None,
    checkpoints: int,
    progress: Any = None,
) -> list[Any]:
    if max_steps is not None:
        checkpoints = min(checkpoints, max_steps)

    def merge(state: list[Any], buffers: list[Any]) -> list[Any]:
        state_iter, buffer_iter = iter(state), iter(buffers)
        return [next(buffer_iter) if b else next(state_iter) for b in is_buffer]

    def split(values: list[Any]) -> tuple[list[Any], list[Any]]:
        state = [v for v, b in zip(values, is_buffer, strict=True) if not b]
        return state, [v for v, b in zip(values, is_buffer, strict=True) if b]

    def step(state: list[Any], buffers: list[Any], _: list[Any]) -> Any:
        return split(body(merge(state, buffers)))

    def keep_going(state: list[Any], buffers: list[Any]) -> Any:
        return cond(merge(state, buffers))

    monitor = None
    if progress is not None:
        monitor = _SplitProgress(progress, merge)
    state, buffers = split(arrays)
    state, buffers = checkpointed_loop(
        step,
        keep_going,
        state,
        buffers,
        [],
        max_steps=max_steps,
        checkpoints=checkpoints,
        progress=monitor,
    )
    return merge(state, buffers)


class _SplitProgress:
    """A loop's progress reporting, on the carry as `checkpointed_loop` splits it."""

    def __init__(self, progress: Any, merge: Callable[[list[Any], list[Any]], list[Any]]):
        self.progress = progress
        self.merge = merge

    def start(self) -> Any:
        return self.progress.start()

    def update(self, i: Any, state: list[Any], buffers: list[Any], extra: Any) -> Any:
        return self.progress.update(i, self.merge(state, buffers), extra)

    def finish(self, extra: Any) -> None:
        self.progress.finish(extra)
