"""A loop that reverse-mode autodiff goes through in bounded memory: binomial checkpointing.

The forward pass is a `lax.while_loop` that counts its steps and stores at most
`checkpoints` of its states as it runs (`_checkpoint_schedule`: where the backward pass's
first sweep would put them when the number of steps is known, online otherwise). The
backward pass reverses the steps from the newest of those:
for each step to reverse, it advances from the newest checkpoint, pushing the states
reached at the positions that Griewank and Walther's rule picks (`binomial_split`), the
fewest recomputations for the slots left, then takes the VJP of that one step and pops the
checkpoint there.

The derivative is a `jax.custom_jvp` whose tangent is a linear primitive (`_tangent_p`) with
two implementations: evaluated (`jax.jvp`) it runs the loop again in forward mode; transposed
(`jax.grad`, `jax.vjp`) it runs the backward pass above. Which carry leaves the derivative
reaches (are "perturbed") is worked out when traced, from which inputs have symbolic-zero
tangents; the others get symbolic-zero tangents out, as a `lax` loop gives them.

Everything here works on flat lists of arrays; `_while_loop` and `_scan` turn pytrees into
those lists and back.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.interpreters import ad, batching, mlir

from pytree_filter import is_inexact_array

from ._checkpoint_schedule import (
    OfflinePlacement,
    OnlinePlacement,
    binomial_split,
    empty_stack,
    place_offline,
    place_online,
    push_if,
    sort_stack,
)
from ._closure import filter_closure_convert
from ._nondifferentiable import nondifferentiable_backward

Step = Callable[[list[Any], list[Any], list[Any]], tuple[list[Any], list[Any]]]
Cond = Callable[[list[Any], list[Any]], Any]


def _merge(mask: Sequence[bool], chosen: list[Any], others: list[Any]) -> list[Any]:
    """Interleave two lists back into one, `chosen` where `mask` is true."""
    chosen_iter, others_iter = iter(chosen), iter(others)
    return [next(chosen_iter) if m else next(others_iter) for m in mask]


def _pick(mask: Sequence[bool], values: Sequence[Any]) -> list[Any]:
    return [v for v, m in zip(values, mask, strict=True) if m]


def _drop(mask: Sequence[bool], values: Sequence[Any]) -> list[Any]:
    return [v for v, m in zip(values, mask, strict=True) if not m]


_REVERSE_OVER_FORWARD = (
    'The forward-mode derivative of a kind="checkpointed" loop (reverse mode over forward '
    "mode is not supported: take the second derivative in forward mode, e.g. "
    "`jax.jacfwd(jax.grad(f))` rather than `jax.grad` of a `jax.jvp`)"
)

# The tangent of the loop: linear in its last inputs (the tangents of the loop's perturbed
# inputs) given the first `num_res` (what the forward pass kept). `forward(res, lin)` gives
# the output tangents and `transpose(res, cts)` the input cotangents, both on flat lists.
_tangent_p = jax.extend.core.Primitive("checkpointed_loop_tangent")
_tangent_p.multiple_results = True


def _tangent_impl(*args: Any, forward: Any, transpose: Any, num_res: int, out_avals: Any) -> Any:
    return forward(list(args[:num_res]), list(args[num_res:]))


def _tangent_abstract_eval(*args: Any, out_avals: Any, **params: Any) -> Any:
    return list(out_avals)


def _tangent_jvp(
    primals: Any, tangents: Any, *, forward: Any, transpose: Any, num_res: int, out_avals: Any
) -> Any:
    params = dict(forward=forward, transpose=transpose, num_res=num_res, out_avals=out_avals)
    res, lin = list(primals[:num_res]), list(primals[num_res:])
    t_res, t_lin = tangents[:num_res], tangents[num_res:]
    out = _tangent_p.bind(*primals, **params)
    t_lin = [ad.instantiate_zeros(t) for t in t_lin]
    t_out = _tangent_p.bind(*res, *t_lin, **params)
    if any(type(t) is not ad.Zero for t in t_res):
        # A second derivative through what the forward pass kept: forward mode only (this
        # part is a `lax.while_loop`, which reverse mode cannot transpose: refused with a
        # message that says what to do instead).
        t_res = [ad.instantiate_zeros(t) for t in t_res]
        _, more = jax.jvp(lambda r: forward(r, lin), (res,), (t_res,))
        more = nondifferentiable_backward(more, name=_REVERSE_OVER_FORWARD)
        t_out = [a + b for a, b in zip(t_out, more, strict=True)]
    return out, t_out


def _tangent_transpose(
    cts: Any, *args: Any, forward: Any, transpose: Any, num_res: int, out_avals: Any
) -> list[Any]:
    res = list(args[:num_res])
    if any(ad.is_undefined_primal(r) for r in res):
        raise NotImplementedError(
            f"{_REVERSE_OVER_FORWARD} cannot be differentiated in reverse mode."
        )
    cts = [
        jnp.zeros(a.shape, a.dtype) if type(c) is ad.Zero else c
        for c, a in zip(cts, out_avals, strict=True)
    ]
    return [None] * num_res + list(transpose(res, cts))


def _tangent_batch(
    args: Any, dims: Any, *, forward: Any, transpose: Any, num_res: int, out_avals: Any
) -> Any:
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims, strict=True)]
    res, lin = moved[:num_res], moved[num_res:]
    res_axes = [None if d is None else 0 for d in dims[:num_res]]
    # Every tangent batched, so that the transpose's cotangents all are too.
    lin = [
        jnp.broadcast_to(a, (size, *jnp.shape(a))) if d is None else a
        for a, d in zip(lin, dims[num_res:], strict=True)
    ]

    def batched_forward(res: list[Any], lin: list[Any]) -> Any:
        return jax.vmap(forward, in_axes=(res_axes, 0))(res, lin)

    def batched_transpose(res: list[Any], cts: list[Any]) -> Any:
        return jax.vmap(transpose, in_axes=(res_axes, 0))(res, cts)

    batched_avals = tuple(a.update(shape=(size, *a.shape)) for a in out_avals)
    out = _tangent_p.bind(
        *res,
        *lin,
        forward=batched_forward,
        transpose=batched_transpose,
        num_res=num_res,
        out_avals=batched_avals,
    )
    return out, [0] * len(out)


_tangent_p.def_impl(_tangent_impl)
_tangent_p.def_abstract_eval(_tangent_abstract_eval)
mlir.register_lowering(_tangent_p, mlir.lower_fun(_tangent_impl, multiple_results=True))
ad.primitive_jvps[_tangent_p] = _tangent_jvp
ad.primitive_transposes[_tangent_p] = _tangent_transpose
batching.primitive_batchers[_tangent_p] = _tangent_batch


def _reached(
    fun: Callable[..., list[Any]], values: list[Any], mask: list[bool], n_out: int
) -> list[bool]:
    """Which of the `n_out` outputs of `fun(*values)` depend differentiably on the inputs
    where `mask` holds. Worked out when traced (in `jax.eval_shape`), at no run cost."""
    found: dict[int, bool] = {}

    def recorder(k: int) -> Any:
        @jax.custom_jvp
        def record(x: Any) -> Any:
            return x

        def record_jvp(primals: Any, tangents: Any) -> Any:
            found[k] = type(tangents[0]) is not SymbolicZero
            return primals[0], tangents[0]

        record.defjvp(record_jvp, symbolic_zeros=True)
        return record

    def probe(diff: list[Any], rest: list[Any]) -> None:
        def linear(*diff: Any) -> Any:
            out = fun(*_merge(mask, list(diff), rest))
            return [recorder(k)(o) if is_inexact_array(o) else o for k, o in enumerate(out)]

        # `linearize`, not `jvp`: the step may hold `custom_vjp` functions.
        jax.linearize(linear, *diff)

    shapes = [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for v in values]
    if any(mask):
        jax.eval_shape(probe, _pick(mask, shapes), _drop(mask, shapes))
    return [found.get(k, False) for k in range(n_out)]


def checkpointed_loop(
    step: Step,
    cond: Cond | None,
    state: list[Any],
    buffers: list[Any],
    xs: list[Any],
    *,
    max_steps: int | None,
    checkpoints: int,
    reverse_xs: bool = False,
    progress: Any = None,
) -> tuple[list[Any], list[Any]]:
    """Run `state, buffers = step(state, buffers, x_i)` while `cond(state, buffers)` holds (and
    fewer than `max_steps` steps ran), differentiably in both modes, reverse mode in bounded
    memory.

    `x_i` is `[x[i] for x in xs]` (`x[max_steps - 1 - i]` with `reverse_xs`); `xs` needs
    `max_steps`. Only `state` is checkpointed; `buffers` are written in place by `step`, each
    location at most once, and read only where written. `step` and `cond` may close over
    arrays: those get gradients (`step`'s) or none (`cond`'s). `progress`, if given, has
    `start()`, `update(i, state, buffers, extra)` and `finish(extra)`, called
    by the loop itself only, never by the recomputations of the backward pass.

    Returns the final `(state, buffers)`.
    """
    x_example = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs]
    step_converted = filter_closure_convert(step, state, buffers, x_example)
    step_consts, step_def = jax.tree.flatten(step_converted)
    if cond is None:
        cond_consts, cond_def = [], None
    else:
        cond_converted = filter_closure_convert(cond, state, buffers)
        cond_consts, cond_def = jax.tree.flatten(cond_converted)
        cond_consts = [lax.stop_gradient(c) for c in cond_consts]

    groups = (state, buffers, xs, step_consts, cond_consts)
    sizes = [len(g) for g in groups]
    n_state, n_carry = sizes[0], sizes[0] + sizes[1]

    def ungroup(values: Sequence[Any]) -> list[list[Any]]:
        out, start = [], 0
        for size in sizes:
            out.append(list(values[start : start + size]))
            start += size
        return out

    inputs = [leaf for group in groups for leaf in group]
    # Which inputs can carry a derivative: floating-point ones, except what `cond` closes
    # over. Decided here, on the inputs themselves: inside the derivative rules weakly typed
    # values may have lost what tells their dtype.
    inexact = [is_inexact_array(x) for x in inputs[: sum(sizes[:4])]] + [False] * sizes[4]

    def x_at(xs: list[Any], i: Any) -> list[Any]:
        index = max_steps - 1 - i if reverse_xs else i
        return [lax.dynamic_index_in_dim(x, index, keepdims=False) for x in xs]

    def run_step(consts: list[Any], state: list[Any], buffers: list[Any], x: list[Any]) -> Any:
        return jax.tree.unflatten(step_def, consts)(state, buffers, x)

    def forward(inputs: list[Any], saving: bool) -> tuple[Any, ...]:
        """The loop; with `saving`, also the checkpoints it stores for the backward pass
        (see `place`): `(count, state, buffers[, (stack, positions), top])`."""
        state, buffers, xs, step_consts, cond_consts = ungroup(inputs)

        def keep_going(carry: tuple[Any, ...]) -> Any:
            i, state, buffers = carry[:3]
            going = jnp.bool_(True) if max_steps is None else i < max_steps
            if cond_def is not None:
                going = going & jax.tree.unflatten(cond_def, cond_consts)(state, buffers)
            return going

        def advance(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            i, state, buffers, extra, *saved = carry
            if saving:
                stack, placement = saved
                save, slot, placement = place(i, placement, stack[1][:-1])
                saved = [push_if(save, stack, slot, state, i), placement]
            state, buffers = run_step(step_consts, state, buffers, x_at(xs, i))
            if progress is not None:
                extra = progress.update(i + 1, state, buffers, extra)
            return i + 1, state, buffers, extra, *saved

        extra = None if progress is None else progress.start()
        carry: tuple[Any, ...] = (jnp.int32(0), state, buffers, extra)
        if saving:
            carry += (empty_stack(state, checkpoints), start_placement())
        count, state, buffers, extra, *saved = lax.while_loop(keep_going, advance, carry)
        if progress is not None:
            progress.finish(extra)
        if saving:
            saved = sort_stack(saved[0], count)
        return count, state, buffers, *saved

    # With one checkpoint there is nothing to place: it holds the initial state.
    saving = checkpoints > 1
    if cond is None and max_steps is not None:
        # Exactly `max_steps` steps: placed as the backward pass would, knowing the length.
        def start_placement() -> Any:
            return OfflinePlacement.start(checkpoints, max_steps)

        def place(i: Any, placement: Any, positions: Any) -> Any:
            return place_offline(i, placement, max_steps, checkpoints)

    else:

        def start_placement() -> Any:
            return OnlinePlacement.start(checkpoints)

        def place(i: Any, placement: Any, positions: Any) -> Any:
            return place_online(i, placement, positions, max_steps)

    def primal(inputs: list[Any]) -> list[Any]:
        _, state, buffers, *_ = forward(inputs, saving=False)
        return [*state, *buffers]

    def perturbed_carry(inputs: list[Any], given: list[bool]) -> list[bool]:
        """The carry leaves that the derivative reaches, from the inputs it enters by
        (`given`): those, and what any number of steps carries them to."""
        given_carry = given[:n_carry]
        state, buffers, _, consts, _ = ungroup(inputs)
        _, _, given_xs, given_consts, _ = ungroup(given)
        examples = [*state, *buffers, *x_example, *consts]

        def one_step(*values: Any) -> list[Any]:
            state, buffers = list(values[:n_state]), list(values[n_state:n_carry])
            x, consts = values[n_carry : n_carry + sizes[2]], values[n_carry + sizes[2] :]
            new_state, new_buffers = run_step(list(consts), state, buffers, list(x))
            return [*new_state, *new_buffers]

        perturbed = list(given_carry)
        while True:
            mask = [*perturbed, *given_xs, *given_consts]
            reached = _reached(one_step, examples, mask, n_carry)
            new = [g or r for g, r in zip(given_carry, reached, strict=True)]
            if new == perturbed:
                return perturbed
            perturbed = [p or n for p, n in zip(perturbed, new, strict=True)]

    def loop_jvp(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
        ((inputs,), (t_inputs,)) = primals, tangents
        given = [i and type(t) is not SymbolicZero for i, t in zip(inexact, t_inputs, strict=True)]
        perturbed = perturbed_carry(inputs, given)
        count, final_state, final_buffers, *saved = forward(inputs, saving)
        out = [*final_state, *final_buffers]
        zeros = [
            SymbolicZero(jax.core.ShapedArray(jnp.shape(o), jnp.result_type(o)).to_tangent_aval())
            for o in out
        ]
        if not any(perturbed):
            return out, zeros
        tangent = _Tangent(
            ungroup, sizes, given, perturbed, x_at, run_step, checkpoints, max_steps, reverse_xs
        )
        res = [*inputs, count, *final_buffers]
        if saved:
            (stack, positions), top = saved
            res += [*stack, positions, top]
        lin = _pick(given, t_inputs)
        avals = tuple(
            jax.core.ShapedArray(jnp.shape(o), jnp.result_type(o)) for o in _pick(perturbed, out)
        )
        t_out = _tangent_p.bind(
            *res,
            *lin,
            forward=tangent.forward,
            transpose=tangent.transpose,
            num_res=len(res),
            out_avals=avals,
        )
        return out, _merge(perturbed, t_out, _drop(perturbed, zeros))

    loop = jax.custom_jvp(primal)
    loop.defjvp(loop_jvp, symbolic_zeros=True)
    out = loop(inputs)
    return out[:n_state], out[n_state:n_carry]


class _Tangent:
    """The two implementations of the loop's tangent map, on flat lists: `forward(res, lin)`
    runs the loop in forward mode, `transpose(res, cts)` reverses it (treeverse).

    `res` is the loop's inputs, its step count and final buffers, and the checkpoints the
    forward pass saved if any; `lin` the tangents of the inputs marked in `given`; the
    outputs are the tangents of the carry leaves marked in `perturbed`.
    """

    def __init__(
        self,
        ungroup: Callable[[Sequence[Any]], list[list[Any]]],
        sizes: list[int],
        given: list[bool],
        perturbed: list[bool],
        x_at: Callable[[list[Any], Any], list[Any]],
        run_step: Callable[..., Any],
        checkpoints: int,
        max_steps: int | None,
        reverse_xs: bool,
    ):
        self.ungroup = ungroup
        self.sizes = sizes
        self.given = given
        self.perturbed = perturbed
        self.p_state, self.p_buffers = perturbed[: sizes[0]], perturbed[sizes[0] :]
        _, _, self.g_xs, self.g_consts, _ = ungroup(given)
        self.x_at = x_at
        self.run_step = run_step
        self.checkpoints = checkpoints
        self.max_steps = max_steps
        self.reverse_xs = reverse_xs

    def unpack(self, res: list[Any]) -> tuple[list[Any], Any, list[Any], Any]:
        n_inputs = sum(self.sizes)
        inputs, count = res[:n_inputs], res[n_inputs]
        final_buffers = res[n_inputs + 1 : n_inputs + 1 + self.sizes[1]]
        rest = res[n_inputs + 1 + self.sizes[1] :]
        saved = None
        if rest:
            stack, (positions, top) = rest[: self.sizes[0]], rest[self.sizes[0] :]
            saved = (stack, positions, top)
        return inputs, count, final_buffers, saved

    def step_on(
        self,
        state: list[Any],
        buffers: list[Any],
        x: list[Any],
        consts: list[Any],
        diff: list[bool] | None = None,
    ) -> Callable[..., Any]:
        """The step as a function of the carry leaves marked in `diff` (by default the
        perturbed ones), the given x and consts; it returns the perturbed carry leaves."""
        diff = self.perturbed if diff is None else diff

        def f(d_carry: list[Any], d_x: list[Any], d_consts: list[Any]) -> Any:
            carry = _merge(diff, d_carry, _drop(diff, [*state, *buffers]))
            n = self.sizes[0]
            new_state, new_buffers = self.run_step(
                _merge(self.g_consts, d_consts, _drop(self.g_consts, consts)),
                carry[:n],
                carry[n:],
                _merge(self.g_xs, d_x, _drop(self.g_xs, x)),
            )
            return _pick(self.perturbed, [*new_state, *new_buffers]), (new_state, new_buffers)

        return f

    def write_only(self, state: list[Any], buffers: list[Any], xs: list[Any], consts: list[Any]):
        """Which buffers the step only writes into (`.at[i].set`, `lax.dynamic_update_slice`)
        and never reads: read off the step's jaxpr, when traced."""
        n_state, n_buffers = len(state), len(buffers)
        examples = [
            jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v))
            for v in [*state, *buffers, *self.x_at(xs, jnp.int32(0)), *consts]
        ]

        def step(*values: Any) -> Any:
            s, b = list(values[:n_state]), list(values[n_state : n_state + n_buffers])
            x = list(values[n_state + n_buffers : len(values) - len(consts)])
            new_state, new_buffers = self.run_step(
                list(values[len(values) - len(consts) :]), s, b, x
            )
            return [*new_state, *new_buffers]

        jaxpr = jax.make_jaxpr(step)(*examples).jaxpr
        result = []
        for k in range(n_buffers):
            written = {id(jaxpr.invars[n_state + k])}
            only = True
            for eqn in jaxpr.eqns:
                uses = [j for j, v in enumerate(eqn.invars) if id(v) in written]
                if not uses:
                    continue
                if eqn.primitive.name in ("scatter", "dynamic_update_slice") and uses == [0]:
                    written.add(id(eqn.outvars[0]))
                else:
                    only = False
            outs = [j for j, v in enumerate(jaxpr.outvars) if id(v) in written]
            result.append(only and outs == [n_state + k])
        return result

    def forward(self, res: list[Any], lin: list[Any]) -> list[Any]:
        inputs, count, _, _ = self.unpack(res)
        state, buffers, xs, consts, _ = self.ungroup(inputs)
        tangents = self.ungroup(_merge(self.given, lin, [None] * (len(inputs) - len(lin))))
        t_carry = [
            jnp.zeros_like(v) if t is None else t
            for v, t, p in zip(
                [*state, *buffers], [*tangents[0], *tangents[1]], self.perturbed, strict=True
            )
            if p
        ]
        t_xs, t_consts = _pick(self.g_xs, tangents[2]), _pick(self.g_consts, tangents[3])

        def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            i, state, buffers, t_carry = carry
            x = self.x_at(xs, i)
            f = self.step_on(state, buffers, x, consts)
            primals = (_pick(self.perturbed, [*state, *buffers]), _pick(self.g_xs, x))
            primals += (_pick(self.g_consts, consts),)
            _, t_carry, (state, buffers) = jax.jvp(
                f, primals, (t_carry, self.x_at(t_xs, i), t_consts), has_aux=True
            )
            return i + 1, state, buffers, t_carry

        carry = (jnp.int32(0), state, buffers, t_carry)
        return lax.while_loop(lambda c: c[0] < count, body, carry)[3]

    def transpose(self, res: list[Any], cts: list[Any]) -> list[Any]:
        inputs, count, final_buffers, saved = self.unpack(res)
        state, _, xs, consts, _ = self.ungroup(inputs)
        checkpoints, max_steps = self.checkpoints, self.max_steps
        # The cotangent of a buffer the step only writes into is the same before and after
        # every step, since each location is written once and never read (so the VJP of a
        # write need not zero it): the buffer is not differentiated, and its cotangent is
        # not carried through the loop, where XLA would copy it at every step to zero one
        # location. Its writes still give the values written their cotangents.
        n_state = self.sizes[0]
        write_only = [False] * n_state + self.write_only(state, final_buffers, xs, consts)
        diff = [p and not w for p, w in zip(self.perturbed, write_only, strict=True)]
        fixed = [w for p, w in zip(self.perturbed, write_only, strict=True) if p]
        fixed_cts = [c for c, w in zip(cts, fixed, strict=True) if w]

        g_xs, g_consts = self.g_xs, self.g_consts

        def split_at(position: Any, target: Any, top: Any) -> Any:
            """Where the advance from a checkpoint at `position` (the newest, in slot
            `top - 1`) stops: at `target`, or where `binomial_split` puts the next
            checkpoint."""
            return lax.cond(
                position < target,
                lambda: position + binomial_split(target + 1 - position, checkpoints - (top - 1)),
                lambda: position,
            )

        def iteration(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            """One step forward from the working state, or, when it is at `target`, the VJP
            of that step, then a reload from the newest checkpoint.

            One flat loop, with no loop or `lax.cond` around the stack or the cotangents:
            XLA then updates them (and `xs`' cotangents, as long as the loop) in place and
            runs each iteration without launching inner loops."""
            target, top, positions, stack, state, position, goal, cts = carry
            ct_carry, ct_xs, ct_consts = cts
            reversing = position == target
            x = self.x_at(xs, position)
            f = self.step_on(state, final_buffers, x, consts, diff)
            primals = (_pick(diff, [*state, *final_buffers]), _pick(g_xs, x))
            primals += (_pick(g_consts, consts),)
            _, vjp, (new_state, _) = jax.vjp(f, *primals, has_aux=True)

            # Reads of the buffers see their final values: each location read was written
            # before this step and never again. Writes have VJPs that do not depend on the
            # values overwritten.
            def reverse(ct_carry: list[Any]) -> Any:
                return vjp(_merge(fixed, fixed_cts, ct_carry))

            def keep(ct_carry: list[Any]) -> Any:
                zeros = [jnp.zeros_like(v) for v in primals[1] + primals[2]]
                return ct_carry, zeros[: len(primals[1])], zeros[len(primals[1]) :]

            ct_carry, ct_x, ct_step_consts = lax.cond(reversing, reverse, keep, ct_carry)
            index = max_steps - 1 - position if self.reverse_xs else position
            # Not reversing, the row written is the spare last one.
            row = jnp.where(reversing, index, max_steps) if ct_xs else None
            ct_xs = [
                lax.dynamic_update_index_in_dim(c, u, row, 0)
                for c, u in zip(ct_xs, ct_x, strict=True)
            ]
            ct_consts = [a + b for a, b in zip(ct_consts, ct_step_consts, strict=True)]

            # Advancing: the state one step on, pushed if it is where the advance stops.
            advanced = position + 1
            reached = ~reversing & (advanced == goal)
            push = reached & (advanced < target)
            stack, positions = push_if(push, (stack, positions), top, new_state, advanced)
            # Read after the push (which leaves slot `top - 1` as it was): a read before a
            # write would make XLA copy the array.
            newest_position = positions[top - 1]
            # Reversing: the checkpoint at the reversed step is no longer needed.
            popped = jnp.where(newest_position == target, top - 1, top)
            top = jnp.where(reversing, popped, jnp.where(push, top + 1, top))
            target = jnp.where(reversing, target - 1, target)
            newest = [lax.dynamic_index_in_dim(s, top - 1, keepdims=False) for s in stack]
            state = [jnp.where(reversing, n, s) for n, s in zip(newest, new_state, strict=True)]
            position = jnp.where(reversing, positions[top - 1], advanced)
            restart = reversing | push
            goal = jnp.where(
                restart, split_at(position, target, top), jnp.where(reached, target, goal)
            )
            return (
                target,
                top,
                positions,
                stack,
                state,
                position,
                goal,
                (ct_carry, ct_xs, ct_consts),
            )

        if saved is not None:
            stack, positions, top = saved
        else:
            (stack, positions), top = empty_stack(state, checkpoints), jnp.int32(1)
        ct_init = (
            _drop(fixed, cts),
            # One spare row, where the iterations that do not reverse a step write.
            [jnp.zeros((x.shape[0] + 1, *x.shape[1:]), x.dtype) for x in _pick(g_xs, xs)],
            [jnp.zeros_like(c) for c in _pick(g_consts, consts)],
        )
        target = count - 1
        state = [lax.dynamic_index_in_dim(s, top - 1, keepdims=False) for s in stack]
        position = positions[top - 1]
        goal = split_at(position, target, top)
        carry = (target, top, positions, stack, state, position, goal, ct_init)
        *_, (ct_carry, ct_xs, ct_consts) = lax.while_loop(
            lambda carry: carry[0] >= 0, iteration, carry
        )
        ct_xs = [c[:-1] for c in ct_xs]
        # The cotangents of the inputs the tangents came in by (`given`), in their order.
        n_carry = len(self.perturbed)
        incoming = _merge(self.perturbed, cts, [None] * (n_carry - len(cts)))
        from_loop = _merge(diff, ct_carry, [None] * (n_carry - len(ct_carry)))
        full_carry = [
            i if w else c for c, i, w in zip(from_loop, incoming, write_only, strict=True)
        ]
        g_carry = self.given[:n_carry]
        return [*_pick(g_carry, full_carry), *ct_xs, *ct_consts]
