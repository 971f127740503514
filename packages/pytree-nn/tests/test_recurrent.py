"""LSTMCell, GRUCell, RNN and Bidirectional, against step-by-step references in jax.numpy."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
from pytree_graph import Param, Variable
from pytree_nn import RNN, Bidirectional, GRUCell, LSTMCell, Module, Rngs, initializers

# Non-zero biases, so that every parameter shows in the numbers.
BIAS = initializers.normal(0.5)

# ------------------------------------------------------------------- reference equations
# The equations, written once over plain arrays: run with NumPy in float64 for the
# values, and with jax.numpy for the reference gradients.


def np_sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def jnp_sigmoid(z):
    return 1.0 / (1.0 + jnp.exp(-z))


def lstm_params(cell):
    """The cell's weights by the letters of the textbook equations."""
    params = {g: getattr(cell, "i" + g if g != "f" else "if_").kernel.value for g in "ifgo"}
    params |= {"h" + g: getattr(cell, "h" + g).kernel.value for g in "ifgo"}
    params |= {"b" + g: getattr(cell, "h" + g).bias.value for g in "ifgo"}
    return params


def lstm_step(p, carry, x, gate=np_sigmoid, activation=np.tanh):
    c, h = carry
    i = gate(x @ p["i"] + h @ p["hi"] + p["bi"])
    f = gate(x @ p["f"] + h @ p["hf"] + p["bf"])
    g = activation(x @ p["g"] + h @ p["hg"] + p["bg"])
    o = gate(x @ p["o"] + h @ p["ho"] + p["bo"])
    c = f * c + i * g
    h = o * activation(c)
    return (c, h), h


def gru_params(cell):
    return {
        "wi": cell.dense_i.kernel.value,
        "bi": cell.dense_i.bias.value,
        "wh": cell.dense_h.kernel.value,
    }


def gru_step(p, h, x, gate=np_sigmoid, activation=np.tanh):
    n_h = h.shape[-1]
    w_ir, w_iz, w_in = (p["wi"][:, k * n_h : (k + 1) * n_h] for k in range(3))
    b_r, b_z, b_n = (p["bi"][k * n_h : (k + 1) * n_h] for k in range(3))
    w_hr, w_hz, w_hn = (p["wh"][:, k * n_h : (k + 1) * n_h] for k in range(3))
    r = gate(x @ w_ir + b_r + h @ w_hr)
    z = gate(x @ w_iz + b_z + h @ w_hz)
    n = activation(x @ w_in + b_n + r * (h @ w_hn))
    h = (1 - z) * n + z * h
    return h, h


KINDS = {
    "lstm": (LSTMCell, lstm_params, lstm_step),
    "gru": (GRUCell, gru_params, gru_step),
}


def f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def reference_step(kind, cell, carry, x, **activations):
    _, params, step = KINDS[kind]
    return step(f64(params(cell)), f64(carry), f64(x), **activations)


def run_reference(kind, cell, carry, xs, lengths=None, reverse=False, keep_order=False):
    """Run the equations over time-first `xs` of shape (time, *batch, features), one
    sequence at a time in a Python loop. With lengths, a sequence's carry is the one
    after its last valid step, and the cell runs on over the padding; reversing reads
    the valid steps backwards, then the padding backwards."""
    _, params, step = KINDS[kind]
    params, carry, xs = f64(params(cell)), f64(carry), f64(xs)
    steps, batch = xs.shape[0], xs.shape[1:-1]
    finals, outputs = [], np.zeros((steps, *batch, cell.hidden_features))
    for b in np.ndindex(*batch):
        n = steps if lengths is None else min(max(int(np.asarray(lengths)[b]), 0), steps)
        order = list(range(steps))
        if reverse:
            order = order[:n][::-1] + order[n:][::-1]
        carry_b = jax.tree.map(lambda a, b=b: a[b], carry)
        final = carry_b
        for k, t in enumerate(order):
            carry_b, y = step(params, carry_b, xs[(t, *b)])
            if k == n - 1:
                final = carry_b
            outputs[(order[k] if reverse and keep_order else k, *b)] = y
        finals.append(final)
    final = jax.tree.map(lambda *a: np.stack(a).reshape(*batch, -1), *finals)
    return final, outputs


@functools.partial(jax.jit, static_argnames="options")
def run_rnn(cell, inputs, initial_carry=None, seq_lengths=None, options=()):
    """`RNN(cell, return_carry=True, **options)(inputs, ...)`, compiled once per structure."""
    rnn = RNN(cell, return_carry=True, **dict(options))
    return rnn(inputs, initial_carry=initial_carry, seq_lengths=seq_lengths)


def random_carry(cell, input_shape, seed=1):
    zeros = cell.initialize_carry(input_shape)
    leaves, treedef = jax.tree.flatten(zeros)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    draws = [jax.random.normal(k, a.shape) for k, a in zip(keys, leaves, strict=True)]
    return treedef.unflatten(draws)


def assert_close(actual, expected, tol=1e-5):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert jnp.shape(a) == jnp.shape(e)
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e), atol=tol, rtol=tol)


# ------------------------------------------------------------------------------- the cells


@pytest.mark.parametrize("kind", KINDS)
def test_cell_step_matches_the_equations(kind):
    Cell = KINDS[kind][0]
    cell = Cell(3, 4, bias_init=BIAS, rngs=0)
    for batch in [(), (2,), (2, 3)]:  # unbatched, and one or two batch dimensions
        x = jax.random.normal(jax.random.key(2), (*batch, 3))
        carry = random_carry(cell, x.shape)
        new_carry, y = cell(carry, x)
        assert_close((new_carry, y), reference_step(kind, cell, carry, x))
        assert y.shape == (*batch, 4)


def test_parameter_layout():
    lstm = LSTMCell(3, 5, rngs=Rngs(params=0))
    for name in ("ii", "if_", "ig", "io"):
        layer = getattr(lstm, name)
        assert layer.kernel.value.shape == (3, 5) and layer.bias is None
    for name in ("hi", "hf", "hg", "ho"):
        layer = getattr(lstm, name)
        assert layer.kernel.value.shape == (5, 5) and layer.bias.value.shape == (5,)
    assert len(jax.tree.leaves(pg.state(lstm, Param))) == 12
    gru = GRUCell(3, 5, rngs=0)
    assert gru.dense_i.kernel.value.shape == (3, 15) and gru.dense_i.bias.value.shape == (15,)
    assert gru.dense_h.kernel.value.shape == (5, 15) and gru.dense_h.bias is None
    # The recurrent kernels are orthogonal by default, the biases zero.
    kernel = np.asarray(lstm.hf.kernel.value)
    np.testing.assert_allclose(kernel @ kernel.T, np.eye(5), atol=1e-5)
    assert not np.asarray(lstm.hf.bias.value).any()
    kernel = np.asarray(gru.dense_h.kernel.value)
    np.testing.assert_allclose(kernel @ kernel.T, np.eye(5), atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_cell_options_gate_fn_activation_fn_and_inits(kind):
    Cell = KINDS[kind][0]
    cell = Cell(
        2,
        3,
        gate_fn=jax.nn.hard_sigmoid,
        activation_fn=jax.nn.relu,
        kernel_init=initializers.ones,
        recurrent_kernel_init=initializers.constant(0.5),
        bias_init=initializers.constant(-1.0),
        rngs=0,
    )
    leaves = jax.tree.leaves(pg.state(cell, Param))
    assert {float(v) for leaf in leaves for v in np.unique(leaf)} == {1.0, 0.5, -1.0}
    x = jnp.array([[0.3, -2.0], [1.0, 0.5]])
    carry = random_carry(cell, x.shape)

    def hard_sigmoid(z):
        return np.clip(z / 6 + 0.5, 0.0, 1.0)

    def relu(z):
        return np.maximum(z, 0.0)

    expected = reference_step(kind, cell, carry, x, gate=hard_sigmoid, activation=relu)
    assert_close(cell(carry, x), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_cell_dtypes(kind):
    Cell = KINDS[kind][0]
    x = jax.random.normal(jax.random.key(3), (2, 3))
    # dtype: computes in bfloat16; the carry keeps its own dtype (float32 here).
    cell = Cell(3, 4, bias_init=BIAS, dtype=jnp.bfloat16, rngs=0)
    carry = random_carry(cell, x.shape)
    new_carry, y = cell(carry, x)
    assert y.dtype == jnp.bfloat16
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(new_carry))
    assert_close(y, reference_step(kind, cell, carry, x)[1], tol=5e-2)
    # No dtype: the promoted type of input, carry and parameters.
    cell = Cell(3, 4, rngs=0)
    _, y = cell(cell.initialize_carry(x.shape), x.astype(jnp.bfloat16))
    assert y.dtype == jnp.float32
    # param_dtype: the parameters and the initial carry (orthogonal init in half precision).
    cell = Cell(3, 4, param_dtype=jnp.bfloat16, rngs=0)
    assert {a.dtype for a in jax.tree.leaves(pg.state(cell, Param))} == {jnp.dtype("bfloat16")}
    carry = cell.initialize_carry(x.shape)
    assert all(a.dtype == jnp.bfloat16 for a in jax.tree.leaves(carry))
    new_carry, y = cell(carry, x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    assert all(a.dtype == jnp.bfloat16 for a in jax.tree.leaves(new_carry))


def test_initialize_carry():
    lstm = LSTMCell(3, 4, rngs=0)
    c, h = lstm.initialize_carry((5, 2, 3))
    assert c.shape == h.shape == (5, 2, 4) and not c.any() and not h.any()
    assert GRUCell(3, 4, rngs=0).initialize_carry((3,)).shape == (4,)
    c, h = lstm.initialize_carry((2, 3), rngs=0, carry_init=initializers.normal(1.0))
    assert c.shape == (2, 4) and c.any() and not np.array_equal(c, h)
    with pytest.raises(TypeError, match="needs rngs= to draw the carry with carry_init"):
        lstm.initialize_carry((2, 3), carry_init=initializers.ones)
    with pytest.raises(ValueError, match=r"in_features=3\), got \(2, 5\)"):
        lstm.initialize_carry((2, 5))
    with pytest.raises(ValueError, match=r"in_features=3\), got \(\)"):
        lstm.initialize_carry(())
    with pytest.raises(TypeError, match="as a tuple of ints"):
        lstm.initialize_carry(jnp.ones((2, 3)))


@pytest.mark.parametrize("kind", KINDS)
def test_cell_errors(kind):
    Cell = KINDS[kind][0]
    name = Cell.__name__
    with pytest.raises(TypeError, match=f"{name} needs `rngs=`"):
        Cell(3, 4)
    with pytest.raises(ValueError, match=f"{name}: hidden_features must be a positive int"):
        Cell(3, 0, rngs=0)
    with pytest.raises(ValueError, match=f"{name}: in_features must be a positive int"):
        Cell(2.0, 4, rngs=0)
    cell = Cell(3, 4, rngs=0)
    carry = cell.initialize_carry((2, 3))
    with pytest.raises(ValueError, match=rf"{name} expects .* in_features=3, got .* \(2, 5\)"):
        cell(carry, jnp.ones((2, 5)))
    with pytest.raises(ValueError, match=rf"{name} expects .* in_features=3, got .* \(\)"):
        cell(carry, jnp.array(1.0))
    wrong = jax.tree.map(lambda a: a[0], carry)  # the batch dimension missing
    part = "c" if kind == "lstm" else "h"
    with pytest.raises(ValueError, match=rf"carry's {part} has shape \(4,\), expected \(2, 4\)"):
        cell(wrong, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"has shape \(2, 5\), expected \(2, 4\)"):
        cell(jax.tree.map(lambda a: jnp.ones((2, 5)), carry), jnp.ones((2, 3)))
    if kind == "lstm":
        with pytest.raises(TypeError, match=r"carry must be a pair \(c, h\)"):
            cell(jnp.zeros((2, 4)), jnp.ones((2, 3)))
    else:
        with pytest.raises(TypeError, match="carry must be one array h"):
            cell((carry, carry), jnp.ones((2, 3)))


# ------------------------------------------------------------------------------------ RNN


@pytest.mark.parametrize("kind", KINDS)
def test_rnn_equals_a_loop_of_the_equations(kind):
    Cell = KINDS[kind][0]
    cell = Cell(3, 4, bias_init=BIAS, rngs=0)
    steps = 5
    for batch, time_major in [((), False), ((2, 3), False), ((2, 3), True)]:
        xs = jax.random.normal(jax.random.key(4), (steps, *batch, 3))  # time first
        inputs = xs if time_major else jnp.moveaxis(xs, 0, len(batch))
        initial = random_carry(cell, xs.shape[1:], seed=7)
        expected_carry, expected = run_reference(kind, cell, initial, xs)
        options = (("time_major", time_major),)
        carry, outputs = run_rnn(cell, inputs, initial_carry=initial, options=options)
        assert_close(carry, expected_carry)
        assert_close(outputs, expected if time_major else np.moveaxis(expected, 0, len(batch)))
    # The default initial carry: zeros.
    zeros = cell.initialize_carry(xs.shape[1:])
    expected_carry, expected = run_reference(kind, cell, zeros, xs)
    assert_close(RNN(cell, time_major=True)(inputs), expected)


def test_rnn_equals_a_python_loop_of_the_cell():
    cell = LSTMCell(3, 4, bias_init=BIAS, rngs=0)
    x = jax.random.normal(jax.random.key(5), (2, 6, 3))
    carry = cell.initialize_carry((2, 3))
    ys = []
    for t in range(6):
        carry, y = cell(carry, x[:, t])
        ys.append(y)
    final, outputs = RNN(cell, return_carry=True, unroll=2)(x)
    assert_close(outputs, jnp.stack(ys, axis=1))
    assert_close(final, carry)


@pytest.mark.parametrize("kind", KINDS)
def test_rnn_reverse_keep_order_and_seq_lengths(kind):
    Cell = KINDS[kind][0]
    cell = Cell(2, 3, bias_init=BIAS, rngs=0)
    xs = jax.random.normal(jax.random.key(6), (5, 4, 2))  # time first
    initial = random_carry(cell, xs.shape[1:])
    # lengths 0 (the initial carry comes back) and past the end (clipped) included
    lengths = jnp.array([9, 3, 1, 0])
    for reverse, keep_order in [(False, False), (True, False), (True, True)]:
        for seq_lengths in (None, lengths):
            expected_carry, expected = run_reference(
                kind, cell, initial, xs, seq_lengths, reverse, keep_order
            )
            options = (("reverse", reverse), ("keep_order", keep_order))
            carry, outputs = run_rnn(
                cell, jnp.swapaxes(xs, 0, 1), initial, seq_lengths, options=options
            )
            assert_close(carry, expected_carry)
            assert_close(outputs, np.swapaxes(expected, 0, 1))


def test_rnn_time_major_seq_lengths_with_several_batch_dims():
    cell = LSTMCell(2, 3, bias_init=BIAS, rngs=0)
    xs = jax.random.normal(jax.random.key(9), (4, 2, 3, 2))  # (time, batch, batch, features)
    lengths = jnp.array([[4, 1, 2], [0, 3, 4]])
    initial = random_carry(cell, xs.shape[1:])
    expected_carry, expected = run_reference(
        "lstm", cell, initial, xs, lengths, reverse=True, keep_order=True
    )
    options = (("time_major", True), ("reverse", True), ("keep_order", True))
    carry, outputs = run_rnn(cell, xs, initial, lengths, options=options)
    assert_close(carry, expected_carry)
    assert_close(outputs, expected)


def test_rnn_settings_and_call_overrides():
    cell = GRUCell(2, 3, rngs=0)
    x = jax.random.normal(jax.random.key(8), (2, 5, 2))
    backward = RNN(cell, reverse=True)(x)
    assert backward.shape == (2, 5, 3)
    np.testing.assert_allclose(backward, RNN(cell)(x[:, ::-1]), atol=1e-6)
    kept = RNN(cell, reverse=True)(x, keep_order=True)
    np.testing.assert_allclose(kept, backward[:, ::-1], atol=1e-6)
    np.testing.assert_allclose(RNN(cell)(x, reverse=True), backward, atol=1e-6)
    carry, outputs = RNN(cell, return_carry=True)(x)
    np.testing.assert_allclose(carry, outputs[:, -1], atol=1e-6)
    assert RNN(cell, return_carry=True)(x, return_carry=False).shape == (2, 5, 3)
    np.testing.assert_allclose(RNN(cell, time_major=True)(x, time_major=False), outputs, atol=1e-6)


def test_rnn_carry_keeps_its_dtype():
    cell = GRUCell(2, 3, rngs=0)
    x = jnp.ones((2, 4, 2))
    carry, y = run_rnn(cell, x, jnp.zeros((2, 3), jnp.bfloat16))
    assert carry.dtype == jnp.bfloat16 and y.dtype == jnp.float32
    carry, y = run_rnn(LSTMCell(2, 3, dtype=jnp.bfloat16, rngs=0), x)
    assert y.dtype == jnp.bfloat16 and carry[0].dtype == jnp.float32


def _reference_in_jax(step, p, carry, xs, lengths):
    """The forward reference with lengths, traceable, for gradients."""
    finals, outputs = [], []
    for b in range(xs.shape[1]):
        carry_b = jax.tree.map(lambda a, b=b: a[b], carry)
        final, ys = carry_b, []
        for t in range(xs.shape[0]):
            carry_b, y = step(p, carry_b, xs[t, b], gate=jnp_sigmoid, activation=jnp.tanh)
            ys.append(y)
            if t == lengths[b] - 1:
                final = carry_b
        finals.append(final)
        outputs.append(jnp.stack(ys))
    return jax.tree.map(lambda *a: jnp.stack(a), *finals), jnp.stack(outputs, axis=1)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_flow_and_match_the_reference(kind):
    Cell, params, step = KINDS[kind]
    rnn = RNN(Cell(2, 3, bias_init=BIAS, rngs=0), return_carry=True)
    x = jax.random.normal(jax.random.key(10), (2, 4, 2))
    lengths = jnp.array([4, 2])

    def loss(model):
        carry, y = model(x, seq_lengths=lengths)
        return (y**2).sum() + sum((a**3).sum() for a in jax.tree.leaves(carry))

    grads = pg.jit(pg.grad(loss))(rnn)
    leaves = jax.tree.leaves(grads)
    assert len(leaves) == len(jax.tree.leaves(pg.state(rnn, Param)))
    assert all(bool(jnp.isfinite(g).all()) and bool(jnp.abs(g).sum() > 0) for g in leaves)

    @jax.jit
    @jax.grad
    def reference_grads(p):
        initial = rnn.cell.initialize_carry((2, 2))
        carry, y = _reference_in_jax(step, p, initial, jnp.swapaxes(x, 0, 1), [4, 2])
        return (y**2).sum() + sum((a**3).sum() for a in jax.tree.leaves(carry))

    as_cell = pg.clone(rnn.cell)
    pg.update(as_cell, grads["cell"])  # the gradients, laid out as the cell's parameters
    assert_close(params(as_cell), reference_grads(params(rnn.cell)), tol=1e-4)


def test_rnn_captured_by_jax_transforms():
    rnn = RNN(LSTMCell(2, 3, rngs=0))
    x = jnp.ones((2, 4, 2))
    expected = rnn(x)
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(rnn, x), expected, atol=1e-6)
    # Captured, not passed: the cell is only read, so this works too.
    np.testing.assert_allclose(jax.vmap(rnn)(x), expected, atol=1e-6)
    dx = jax.grad(lambda x: rnn(x).sum())(x)
    assert dx.shape == x.shape and bool(jnp.abs(dx).sum() > 0)


def test_rnn_errors():
    cell = LSTMCell(3, 4, rngs=0)
    rnn = RNN(cell)
    with pytest.raises(ValueError, match=r"inputs of shape \(\*batch, time, features\), got"):
        rnn(jnp.ones(3))
    with pytest.raises(ValueError, match=r"have 5 features, but the cell \(LSTMCell\) takes"):
        rnn(jnp.ones((2, 7, 5)))
    with pytest.raises(ValueError, match=r"initial_carry has shapes \(\(4,\), \(4,\)\), expected"):
        rnn(jnp.ones((2, 7, 3)), initial_carry=cell.initialize_carry((3,)))
    with pytest.raises(ValueError, match="initial_carry has shapes"):
        rnn(jnp.ones((2, 7, 3)), initial_carry=jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"seq_lengths must have the batch shape \(2,\)"):
        rnn(jnp.ones((2, 7, 3)), seq_lengths=jnp.array([7, 7, 7]))
    with pytest.raises(ValueError, match=r"batch shape \(7,\)"):  # read as time-major
        rnn(jnp.ones((2, 7, 3)), seq_lengths=jnp.array([2, 2]), time_major=True)
    with pytest.raises(TypeError, match="seq_lengths must hold integers"):
        rnn(jnp.ones((2, 7, 3)), seq_lengths=jnp.array([7.0, 3.0]))
    with pytest.raises(TypeError, match="RNN expects a cell"):
        RNN(jnp.tanh)
    with pytest.raises(ValueError, match="unroll must be an int >= 1"):
        RNN(cell, unroll=0)


class CountingCell(Module):
    """A cell that tries to count its steps in a Variable."""

    def __init__(self):
        self.inner = GRUCell(2, 3, rngs=0)
        self.steps = Variable(jnp.array(0))

    def __call__(self, carry, x):
        self.steps.value = self.steps.value + 1
        return self.inner(carry, x)

    def initialize_carry(self, input_shape):
        return self.inner.initialize_carry(input_shape)


def test_a_cell_that_writes_variables_is_refused():
    cell = CountingCell()
    with pytest.raises(ValueError, match="Cannot set the value of a Variable created outside"):
        RNN(cell)(jnp.ones((2, 5, 2)))
    assert int(cell.steps.value) == 0


# -------------------------------------------------------------------------- Bidirectional


def test_bidirectional_merges_a_forward_and_a_backward_pass():
    forward_cell = LSTMCell(2, 3, bias_init=BIAS, rngs=0)
    backward_cell = GRUCell(2, 4, bias_init=BIAS, rngs=1)
    layer = Bidirectional(RNN(forward_cell), RNN(backward_cell), return_carry=True)
    xs = jax.random.normal(jax.random.key(11), (5, 3, 2))  # time first
    lengths = jnp.array([5, 2, 3])
    (carry_f, carry_b), outputs = pg.jit(lambda m, x, n: m(x, seq_lengths=n))(
        layer, jnp.swapaxes(xs, 0, 1), lengths
    )
    zeros_f = forward_cell.initialize_carry((3, 2))
    zeros_b = backward_cell.initialize_carry((3, 2))
    expected_f = run_reference("lstm", forward_cell, zeros_f, xs, lengths)
    expected_b = run_reference("gru", backward_cell, zeros_b, xs, lengths, True, True)
    assert_close((carry_f, carry_b), (expected_f[0], expected_b[0]))
    expected = np.concatenate([expected_f[1], expected_b[1]], axis=-1)
    assert_close(outputs, np.swapaxes(expected, 0, 1))
    # time-major, a custom merge, and given initial carries
    added = Bidirectional(RNN(backward_cell), RNN(backward_cell), merge_fn=jnp.add)
    initial = jnp.ones((3, 4))
    out = added(xs, time_major=True, initial_carry=(initial, initial))
    forward = run_reference("gru", backward_cell, initial, xs)[1]
    backward = run_reference("gru", backward_cell, initial, xs, reverse=True, keep_order=True)[1]
    assert_close(out, forward + backward)


def test_bidirectional_errors():
    rnn = RNN(GRUCell(2, 3, rngs=0))
    with pytest.raises(TypeError, match="backward_rnn must be an RNN"):
        Bidirectional(rnn, GRUCell(2, 3, rngs=0))
    with pytest.raises(TypeError, match="merge_fn must be callable"):
        Bidirectional(rnn, rnn, merge_fn="concat")
    with pytest.raises(TypeError, match=r"initial_carry must be a pair \(forward_carry"):
        Bidirectional(rnn, rnn)(jnp.ones((4, 2)), initial_carry=jnp.zeros(3))
