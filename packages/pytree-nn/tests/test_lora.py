"""LoRA, LoRALinear and LoRAParam: numerics on fixed weights, training only the adapters or
only the base in both styles, ties through split/merge, jit and the Optimizer, and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_filter import All, Not, OfType, filter
from pytree_graph import Param
from pytree_nn import (
    Linear,
    LoRA,
    LoRALinear,
    LoRAParam,
    Module,
    Optimizer,
    Rngs,
    initializers,
    load_checkpoint,
    save_checkpoint,
)
from pytree_transforms import apply_updates, filter_grad, filter_jit, filter_value_and_grad

BASE_ONLY = All(Param, Not(LoRAParam))


def fixed(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape)


def set_weights(layer, seed=0):
    """Fixed, nonzero weights in every Param of `layer` (so `lora_b` is not zero)."""
    for i, (_, variable) in enumerate(sorted(pg.state(layer).flat_state().items())):
        variable.value = fixed(variable.value.shape, seed + i)
    return layer


def values(model, *filters):
    return {path: np.asarray(v.value) for path, v in pg.state(model, *filters).flat_state().items()}


# ---------------------------------------------------------------------------- numerics


def test_lora_is_x_at_a_at_b_on_fixed_weights():
    adapter = LoRA(5, 2, 3, rngs=0)
    a, b, x = fixed((5, 2), 1), fixed((2, 3), 2), fixed((4, 7, 5), 3)
    adapter.lora_a.value, adapter.lora_b.value = a, b
    np.testing.assert_allclose(adapter(x), jnp.matmul(jnp.matmul(x, a), b), rtol=1e-6)
    # Unbatched input.
    np.testing.assert_allclose(adapter(x[0, 0]), x[0, 0] @ a @ b, rtol=1e-6)
    assert isinstance(adapter.lora_a, LoRAParam) and isinstance(adapter.lora_a, Param)
    assert adapter.base_module is None


def test_lora_adds_its_base_module_and_passes_it_keyword_arguments():
    class Scaled(Module):
        def __init__(self):
            self.w = Param(fixed((4, 3), 5))

        def __call__(self, x, scale=1.0):
            return scale * (x @ self.w.value)

    base = Scaled()
    adapter = LoRA(4, 3, 3, base_module=base, rngs=0)
    a, b, x = fixed((4, 3), 1), fixed((3, 3), 2), fixed((6, 4), 3)
    adapter.lora_a.value, adapter.lora_b.value = a, b
    assert adapter.base_module is base
    np.testing.assert_allclose(adapter(x), x @ a @ b + x @ base.w.value, rtol=1e-5)
    np.testing.assert_allclose(
        adapter(x, scale=2.0), x @ a @ b + 2.0 * (x @ base.w.value), rtol=1e-5
    )


def test_lora_linear_is_linear_plus_adapter_on_fixed_weights():
    layer = set_weights(LoRALinear(5, 3, lora_rank=2, rngs=0))
    x = fixed((2, 4, 5), 9)
    kernel, bias = layer.kernel.value, layer.bias.value
    a, b = layer.lora.lora_a.value, layer.lora.lora_b.value
    assert not np.allclose(b, 0.0)
    expected = jnp.matmul(x, kernel) + bias + jnp.matmul(jnp.matmul(x, a), b)
    np.testing.assert_allclose(layer(x), expected, rtol=1e-5, atol=1e-6)
    no_bias = set_weights(LoRALinear(5, 3, lora_rank=2, use_bias=False, rngs=0))
    assert no_bias.bias is None
    expected = x @ no_bias.kernel.value + x @ no_bias.lora.lora_a.value @ no_bias.lora.lora_b.value
    np.testing.assert_allclose(no_bias(x), expected, rtol=1e-5, atol=1e-6)


def test_dtypes_promote_as_the_layers_do():
    adapter = LoRA(3, 2, 4, rngs=0)
    x16 = jnp.ones((2, 3), jnp.bfloat16)
    assert adapter(x16).dtype == jnp.float32  # promoted with the float32 adapter
    in_bf16 = LoRA(3, 2, 4, dtype=jnp.bfloat16, rngs=0)
    assert in_bf16(jnp.ones((2, 3))).dtype == jnp.bfloat16
    half = LoRA(3, 2, 4, param_dtype=jnp.bfloat16, rngs=0)
    assert half.lora_a.value.dtype == half.lora_b.value.dtype == jnp.bfloat16
    layer = LoRALinear(3, 4, lora_rank=2, lora_param_dtype=jnp.bfloat16, rngs=0)
    assert layer.kernel.value.dtype == jnp.float32
    assert layer.lora.lora_a.value.dtype == jnp.bfloat16
    assert layer(jnp.ones((2, 3))).dtype == jnp.float32
    lora_in_bf16 = LoRALinear(3, 4, lora_rank=2, lora_dtype=jnp.bfloat16, rngs=0)
    assert lora_in_bf16.lora.dtype == jnp.bfloat16 and lora_in_bf16.dtype is None


def test_a_fresh_lora_linear_equals_its_linear():
    x = fixed((8, 6), 1)
    for rngs in (0, Rngs(3), jax.random.key(4)):
        layer = LoRALinear(6, 5, lora_rank=3, rngs=rngs)
        rebuilt = rngs if not isinstance(rngs, Rngs) else Rngs(3)
        linear = Linear(6, 5, rngs=rebuilt)
        # Same keys for the kernel and bias, drawn first: the same Linear, bit for bit.
        assert np.array_equal(layer.kernel.value, linear.kernel.value)
        assert np.array_equal(layer(x), linear(x))
        assert np.array_equal(layer.lora.lora_b.value, np.zeros((3, 5)))
        assert not np.allclose(layer.lora.lora_a.value, 0.0)


def test_keys_come_from_params_in_nnx_order():
    layer = LoRALinear(4, 3, lora_rank=2, rngs=Rngs(params=7))
    keys = Rngs(params=7)
    kernel_key = keys.params()
    keys.params()  # the bias's (zeros)
    a_key = keys.params()
    lecun = initializers.lecun_normal()
    np.testing.assert_array_equal(layer.kernel.value, lecun(kernel_key, (4, 3), jnp.float32))
    he = initializers.he_uniform()
    np.testing.assert_array_equal(layer.lora.lora_a.value, he(a_key, (4, 2), jnp.float32))
    # A shared Rngs counts four draws.
    rngs = Rngs(0)
    LoRALinear(4, 3, lora_rank=2, rngs=rngs)
    assert int(rngs.params.count.value) == 4


def test_initializers_param_type_and_metadata_are_used():
    class Adapter(Param):
        pass

    layer = LoRALinear(
        4,
        3,
        lora_rank=2,
        a_initializer=initializers.ones,
        b_initializer=initializers.constant(0.5),
        lora_param_type=Adapter,
        a_metadata={"sharding": (None, None)},
        b_metadata={"note": "b"},
        rngs=0,
    )
    assert type(layer.lora.lora_a) is Adapter and type(layer.lora.lora_b) is Adapter
    assert np.array_equal(layer.lora.lora_a.value, np.ones((4, 2)))
    assert np.array_equal(layer.lora.lora_b.value, np.full((2, 3), 0.5))
    assert layer.lora.lora_a.metadata["sharding"] == (None, None)
    assert layer.lora.lora_b.metadata["note"] == "b"
    assert sorted(pg.state(layer, Adapter).flat_state()) == [("lora", "lora_a"), ("lora", "lora_b")]
    assert pg.state(layer, LoRAParam).flat_state() == {}


def test_linear_arguments_pass_through():
    ones = initializers.ones
    layer = LoRALinear(
        4, 3, lora_rank=2, use_bias=False, kernel_init=ones, param_dtype=jnp.bfloat16, rngs=0
    )
    assert isinstance(layer, Linear)
    assert layer.bias is None and layer.kernel.value.dtype == jnp.bfloat16
    assert np.array_equal(layer.kernel.value, np.ones((4, 3)))
    with pytest.raises(
        TypeError, match=r"LoRALinear got unexpected keyword argument\(s\) use_biass: .*use_bias\."
    ):
        LoRALinear(4, 3, lora_rank=2, use_biass=False, rngs=0)


# ---------------------------------------------------------------------------- training


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def data():
    return fixed((16, 6), 10), fixed((16, 4), 11)


@pg.jit
def graph_step(model, optimizer, x, y):
    loss, grads = pg.value_and_grad(loss_fn, wrt=optimizer.wrt)(model, x, y)
    optimizer.update(model, grads)
    return loss


def test_training_only_the_adapters_leaves_the_base_bit_identical():
    model = LoRALinear(6, 4, lora_rank=2, rngs=0)
    base_before = values(model, BASE_ONLY)
    lora_before = values(model, LoRAParam)
    optimizer = Optimizer(model, optax.adam(1e-2), wrt=LoRAParam)
    x, y = data()
    losses = [float(graph_step(model, optimizer, x, y)) for _ in range(5)]
    assert losses[-1] < losses[0]
    for path, value in values(model, BASE_ONLY).items():
        assert np.array_equal(value, base_before[path]), path
    for path, value in values(model, LoRAParam).items():
        assert not np.allclose(value, lora_before[path]), path
    assert sorted(optimizer.opt_state[0]["mu"]["lora"]) == ["lora_a", "lora_b"]


def test_training_only_the_base_leaves_the_adapters_bit_identical():
    model = set_weights(LoRALinear(6, 4, lora_rank=2, rngs=0))
    base_before = values(model, BASE_ONLY)
    lora_before = values(model, LoRAParam)
    optimizer = Optimizer(model, optax.sgd(0.05), wrt=BASE_ONLY)
    x, y = data()
    losses = [float(graph_step(model, optimizer, x, y)) for _ in range(3)]
    assert losses[-1] < losses[0]
    for path, value in values(model, LoRAParam).items():
        assert np.array_equal(value, lora_before[path]), path
    for path, value in values(model, BASE_ONLY).items():
        assert not np.allclose(value, base_before[path]), path


def test_adapter_gradients_and_sgd_step_match_hand_written_jax():
    model = set_weights(LoRALinear(6, 4, lora_rank=2, rngs=0))
    k, bias = model.kernel.value, model.bias.value
    a, b = model.lora.lora_a.value, model.lora.lora_b.value
    x, y = data()

    def reference(ab):
        return jnp.mean((x @ k + bias + x @ ab[0] @ ab[1] - y) ** 2)

    grad_a, grad_b = jax.grad(reference)((a, b))
    optimizer = Optimizer(model, optax.sgd(0.1), wrt=LoRAParam)
    graph_step(model, optimizer, x, y)
    np.testing.assert_allclose(model.lora.lora_a.value, a - 0.1 * grad_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.lora.lora_b.value, b - 0.1 * grad_b, rtol=1e-5, atol=1e-6)
    assert np.array_equal(model.kernel.value, k)


def test_training_only_the_adapters_in_the_functional_style():
    """Equinox style: filter_jit, filter_value_and_grad and apply_updates, with OfType."""
    x, y = data()
    adapters = OfType(LoRAParam)
    tx = optax.adam(1e-2)

    @filter_jit
    def step(model, opt_state):
        loss, grads = filter_value_and_grad(loss_fn, arg=adapters)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, filter(model, adapters))
        return apply_updates(model, updates), opt_state, loss

    model = LoRALinear(6, 4, lora_rank=2, rngs=0)
    kernel, bias = model.kernel.value, model.bias.value
    opt_state = tx.init(filter(model, adapters))
    for _ in range(5):
        model, opt_state, _ = step(model, opt_state)
    assert np.array_equal(model.kernel.value, kernel)
    assert np.array_equal(model.bias.value, bias)
    assert isinstance(model.lora.lora_a, LoRAParam)
    # The graph style gives the same adapters.
    graph = LoRALinear(6, 4, lora_rank=2, rngs=0)
    optimizer = Optimizer(graph, tx, wrt=LoRAParam)
    for _ in range(5):
        graph_step(graph, optimizer, x, y)
    for path, value in values(graph, LoRAParam).items():
        np.testing.assert_allclose(values(model, LoRAParam)[path], value, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- ties


class Tied(Module):
    """One LoRALinear in two branches, and a LoRA around a Linear also used on its own."""

    def __init__(self, rngs):
        self.shared = LoRALinear(6, 6, lora_rank=2, rngs=rngs)
        self.left = self.shared
        self.right = self.shared
        self.encoder = Linear(6, 4, rngs=rngs)
        self.adapted = LoRA(6, 3, 4, base_module=self.encoder, rngs=rngs)

    def __call__(self, x):
        h = jnp.tanh(self.left(x)) + jnp.tanh(self.right(2.0 * x))
        return self.adapted(h) + 0.5 * self.encoder(x)


def assert_tied(model):
    assert model.left is model.shared and model.right is model.shared
    assert model.adapted.base_module is model.encoder


def reference_loss(p, x, y):
    """`Tied` on a dict of arrays."""

    def lora_linear(x):
        return x @ p["k"] + p["bias"] + x @ p["a"] @ p["b"]

    def encoder(x):
        return x @ p["ek"] + p["eb"]

    h = jnp.tanh(lora_linear(x)) + jnp.tanh(lora_linear(2.0 * x))
    out = h @ p["a2"] @ p["b2"] + encoder(h) + 0.5 * encoder(x)
    return jnp.mean((out - y) ** 2)


def arrays(model):
    return {
        "k": model.shared.kernel.value,
        "bias": model.shared.bias.value,
        "a": model.shared.lora.lora_a.value,
        "b": model.shared.lora.lora_b.value,
        "ek": model.encoder.kernel.value,
        "eb": model.encoder.bias.value,
        "a2": model.adapted.lora_a.value,
        "b2": model.adapted.lora_b.value,
    }


def test_a_tied_model_stays_tied_through_split_merge():
    model = set_weights(Tied(Rngs(0)))
    graphdef, lora_state, base_state = pg.split(model, LoRAParam, ...)
    assert sorted(lora_state.flat_state()) == [
        ("adapted", "lora_a"),
        ("adapted", "lora_b"),
        ("left", "lora", "lora_a"),
        ("left", "lora", "lora_b"),
    ]
    merged = pg.merge(graphdef, lora_state, base_state)
    assert_tied(merged)
    x = fixed((3, 6), 20)
    np.testing.assert_allclose(merged(x), model(x), rtol=1e-6)


@pytest.mark.parametrize("wrt", [LoRAParam, BASE_ONLY], ids=["adapters", "base"])
def test_a_tied_model_trains_as_hand_written_jax_and_stays_tied(wrt):
    model = set_weights(Tied(Rngs(0)))
    x, y = fixed((8, 6), 21), fixed((8, 4), 22)
    before = arrays(model)
    trained = {"a", "b", "a2", "b2"} if wrt is LoRAParam else {"k", "bias", "ek", "eb"}
    grads = jax.grad(reference_loss)(before, x, y)
    expected = {
        name: value - 0.1 * grads[name] if name in trained else value
        for name, value in before.items()
    }
    optimizer = Optimizer(model, optax.sgd(0.1), wrt=wrt)
    graph_step(model, optimizer, x, y)
    assert_tied(model)
    assert optimizer.model is model
    after = arrays(model)
    for name in before:
        if name in trained:
            np.testing.assert_allclose(after[name], expected[name], rtol=1e-5, atol=1e-6)
            assert not np.array_equal(after[name], before[name]), name
        else:
            assert np.array_equal(after[name], before[name]), name


def test_a_tied_model_stays_tied_in_the_functional_style():
    model = set_weights(Tied(Rngs(0)))
    x, y = fixed((8, 6), 21), fixed((8, 4), 22)
    adapters = OfType(LoRAParam)
    tx = optax.sgd(0.1)
    before = arrays(model)
    grads = jax.grad(reference_loss)(before, x, y)

    @filter_jit
    def step(model, opt_state):
        grads = filter_grad(loss_fn, arg=adapters)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, filter(model, adapters))
        return apply_updates(model, updates), opt_state

    model, _ = step(model, tx.init(filter(model, adapters)))
    assert_tied(model)
    after = arrays(model)
    for name in ("a", "b", "a2", "b2"):
        np.testing.assert_allclose(
            after[name], before[name] - 0.1 * grads[name], rtol=1e-5, atol=1e-6
        )
    for name in ("k", "bias", "ek", "eb"):
        assert np.array_equal(after[name], before[name]), name


def test_checkpoint_round_trip_keeps_the_adapters(tmp_path):
    model = set_weights(Tied(Rngs(0)))
    save_checkpoint(tmp_path / "lora.ckpt", model)
    fresh = Tied(Rngs(1))
    load_checkpoint(tmp_path / "lora.ckpt", fresh)
    assert_tied(fresh)
    assert isinstance(fresh.adapted.lora_a, LoRAParam)
    for name, value in arrays(model).items():
        assert np.array_equal(arrays(fresh)[name], value), name


def test_the_adapters_alone_save_and_load(tmp_path):
    model = set_weights(Tied(Rngs(0)))
    save_checkpoint(tmp_path / "adapters.ckpt", pg.state(model, LoRAParam))
    fresh = set_weights(Tied(Rngs(0)), seed=50)
    base = values(fresh, BASE_ONLY)
    load_checkpoint(tmp_path / "adapters.ckpt", fresh, LoRAParam)
    assert_same = np.testing.assert_array_equal
    for path, value in values(model, LoRAParam).items():
        assert_same(values(fresh, LoRAParam)[path], value)
    for path, value in values(fresh, BASE_ONLY).items():
        assert_same(value, base[path])


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("rank", [0, -1, 1.5, True, "2", None])
def test_a_bad_rank_is_refused_and_draws_no_key(rank):
    rngs = Rngs(0)
    with pytest.raises(ValueError, match=r"LoRA: lora_rank must be a positive int, got"):
        LoRA(3, rank, 4, rngs=rngs)
    with pytest.raises(ValueError, match=r"LoRALinear: lora_rank must be a positive int, got"):
        LoRALinear(3, 4, lora_rank=rank, rngs=rngs)
    assert int(rngs.params.count.value) == 0


def test_lora_linear_needs_a_rank():
    with pytest.raises(TypeError, match="lora_rank"):
        LoRALinear(3, 4, rngs=0)


@pytest.mark.parametrize(
    "layer", [lambda: LoRA(0, 2, 4, rngs=0), lambda: LoRALinear("scalar", 4, lora_rank=2, rngs=0)]
)
def test_bad_features_are_refused(layer):
    with pytest.raises(ValueError, match=r"in_features must be a positive int"):
        layer()


@pytest.mark.parametrize("base", [jnp.tanh, jnp.ones(3), "linear"])
def test_a_base_that_is_not_a_module_is_refused(base):
    with pytest.raises(TypeError, match=r"base_module must be None or a callable Module.*Lambda"):
        LoRA(3, 2, 4, base_module=base, rngs=0)


@pytest.mark.parametrize("param_type", [int, Param(jnp.ones(1)), "LoRAParam"])
def test_a_bad_lora_param_type_is_refused(param_type):
    rngs = Rngs(0)
    with pytest.raises(TypeError, match=r"LoRALinear: lora_param_type must be a Variable type"):
        LoRALinear(3, 4, lora_rank=2, lora_param_type=param_type, rngs=rngs)
    assert int(rngs.params.count.value) == 0
    with pytest.raises(TypeError, match=r"LoRA: lora_param_type must be a Variable type"):
        LoRA(3, 2, 4, lora_param_type=param_type, rngs=0)


def test_bad_metadata_is_refused():
    with pytest.raises(TypeError, match=r"a_metadata must be a mapping"):
        LoRA(3, 2, 4, a_metadata=[("sharding", None)], rngs=0)
    with pytest.raises(TypeError, match=r"b_metadata must be a mapping"):
        LoRALinear(3, 4, lora_rank=2, b_metadata={1: None}, rngs=0)


def test_linear_arguments_are_checked_under_lora_linears_name_before_any_draw():
    rngs = Rngs(0)
    with pytest.raises(
        TypeError,
        match=r"LoRALinear got unexpected keyword argument\(s\) "
        r"bias, lora_alpha: .* it takes Linear's: bias_init, .*use_bias\.",
    ):
        LoRALinear(3, 4, lora_rank=2, bias=True, lora_alpha=2.0, rngs=rngs)
    with pytest.raises(TypeError, match=r"LoRALinear: use_bias must be True or False, got 3"):
        LoRALinear(3, 4, lora_rank=2, use_bias=3, rngs=rngs)
    with pytest.raises(ValueError, match=r"LoRALinear: kernel_sharding has 3 entries"):
        LoRALinear(3, 4, lora_rank=2, kernel_sharding=("a", "b", "c"), rngs=rngs)
    assert int(rngs.params.count.value) == 0


def test_lora_needs_rngs():
    with pytest.raises(TypeError, match=r"LoRA needs `rngs=`"):
        LoRA(3, 2, 4)
    with pytest.raises(TypeError, match=r"LoRALinear needs `rngs=`"):
        LoRALinear(3, 4, lora_rank=2)


def test_call_errors_name_what_is_wrong():
    adapter = LoRA(3, 2, 4, rngs=0)
    with pytest.raises(ValueError, match=r"LoRA expects inputs whose last dimension is in_f"):
        adapter(jnp.ones((2, 5)))
    with pytest.raises(TypeError, match=r"keyword arguments \['train'\].*base_module=None"):
        adapter(jnp.ones((2, 3)), train=True)
    adapter.lora_a.value = jnp.ones((3, 5))
    with pytest.raises(ValueError, match=r"LoRA.lora_a has shape \(3, 5\).*\(3, 2\)"):
        adapter(jnp.ones((2, 3)))
    layer = LoRALinear(3, 4, lora_rank=2, rngs=0)
    with pytest.raises(ValueError, match=r"LoRALinear expects inputs whose last dimension"):
        layer(jnp.ones((2, 5)))


def test_a_base_given_after_construction_is_a_child_and_is_called():
    base = Linear(3, 4, rngs=1)
    adapter = LoRA(3, 2, 4, rngs=0)
    x = jnp.ones((2, 3))
    alone = adapter(x)
    adapter.base_module = base  # no `data(...)` needed: the attribute is a child even as None
    assert adapter.base_module is base
    np.testing.assert_allclose(adapter(x), alone + base(x), rtol=1e-6)
    leaves = jax.tree.leaves(adapter)
    assert any(leaf is base.kernel.value for leaf in leaves)
    graphdef, state = pg.split(adapter)
    assert pg.merge(graphdef, state).base_module.kernel.value.shape == (3, 4)
