"""Stacked layers: per-layer paths of a stacked model's state (`unstack_state`,
`stack_state`) through checkpoints and optimizer state, and the scan over layers with a
remat policy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pytree_graph as pg
from pytree_filter import path_text
from pytree_graph import PARTITION_NAME, Carry, Param, State
from pytree_nn import (
    Linear,
    Module,
    Optimizer,
    Rngs,
    load_checkpoint,
    save_checkpoint,
    stack_state,
    unstack_state,
)

LAYERS = {PARTITION_NAME: "layers"}
DEPTH = 3


class Block(Module):
    def __init__(self, rngs):
        self.up = Linear(4, 8, rngs=rngs, kernel_metadata={"sharding": (None, "model")})
        self.down = Linear(8, 4, rngs=rngs, kernel_metadata={"sharding": ("model", None)})

    def __call__(self, x):
        return x + self.down(jax.nn.gelu(self.up(x)))


class Stacked(Module):
    def __init__(self, seed):
        rngs = Rngs(seed)
        self.blocks = pg.vmap(Block, transform_metadata=LAYERS)(rngs.split(DEPTH))
        self.head = Linear(4, 1, rngs=rngs)

    def __call__(self, x):
        @pg.scan(in_axes=(Carry, 0), out_axes=Carry, transform_metadata=LAYERS)
        def forward(x, block):
            return block(x)

        return self.head(forward(x, self.blocks))


class Unstacked(Module):
    def __init__(self, seed):
        rngs = Rngs(seed)
        self.blocks = [Block(rngs) for _ in range(DEPTH)]
        self.head = Linear(4, 1, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _flat(tree):
    """Path -> (Variable type, value, metadata) of a model's (or State's) whole state."""
    state = tree if isinstance(tree, State) else pg.state(tree)
    return {
        path: (type(leaf), np.asarray(leaf.value), dict(leaf.metadata))
        for path, leaf in state.flat_state().items()
    }


def _assert_same(a, b):
    flat_a, flat_b = _flat(a), _flat(b)
    assert flat_a.keys() == flat_b.keys()
    for path, (kind, value, metadata) in flat_a.items():
        other_kind, other_value, other_metadata = flat_b[path]
        assert kind is other_kind, path_text(path)
        np.testing.assert_array_equal(value, other_value, err_msg=path_text(path))
        assert metadata == other_metadata, path_text(path)


def test_unstack_state_gives_each_layer_its_path_and_metadata():
    model = Stacked(0)
    per_layer = unstack_state(pg.state(model), "blocks", transform_metadata=LAYERS)
    flat = per_layer.flat_state()
    assert ("blocks", 2, "up", "kernel") in flat
    assert ("head", "kernel") in flat  # not under the key: kept as it was
    layer = flat[("blocks", 1, "up", "kernel")]
    assert isinstance(layer, Param)
    assert layer.value.shape == (4, 8)
    np.testing.assert_array_equal(layer.value, model.blocks.up.kernel.value[1])
    # The layer axis's name is taken out: one layer's axes, as an unstacked model has them.
    assert layer.metadata["sharding"] == (None, "model")
    assert model.blocks.up.kernel.sharding == ("layers", None, "model")  # model unchanged


def test_per_layer_paths_are_those_of_the_unstacked_model():
    stacked = unstack_state(pg.state(Stacked(0)), "blocks", transform_metadata=LAYERS)
    assert stacked.flat_state().keys() == pg.state(Unstacked(0)).flat_state().keys()


def test_stack_state_inverts_unstack_state():
    model = Stacked(0)
    state = pg.state(model)
    per_layer = unstack_state(state, "blocks", transform_metadata=LAYERS)
    _assert_same(stack_state(per_layer, "blocks", transform_metadata=LAYERS), state)


def test_without_transform_metadata_the_metadata_is_kept():
    model = Stacked(0)
    per_layer = unstack_state(pg.state(model), "blocks")
    assert per_layer["blocks"][0]["up"]["kernel"].sharding == ("layers", None, "model")
    _assert_same(stack_state(per_layer, "blocks"), pg.state(model))


def test_checkpoint_with_per_layer_paths_round_trip(tmp_path):
    path = str(tmp_path / "model.safetensors")
    model = Stacked(0)
    save_checkpoint(path, unstack_state(pg.state(model), "blocks", transform_metadata=LAYERS))

    restored = Stacked(1)
    view = unstack_state(pg.state(restored), "blocks", transform_metadata=LAYERS)
    loaded = load_checkpoint(path, view)
    pg.update(restored, stack_state(loaded, "blocks", transform_metadata=LAYERS))
    _assert_same(restored, model)
    x = jnp.ones((2, 4))
    np.testing.assert_array_equal(restored(x), model(x))


def test_unstacked_checkpoint_loads_into_a_stacked_model_and_back(tmp_path):
    unstacked_path = str(tmp_path / "unstacked.safetensors")
    stacked_path = str(tmp_path / "stacked.safetensors")
    unstacked = Unstacked(0)
    save_checkpoint(unstacked_path, unstacked)

    stacked = Stacked(1)
    view = unstack_state(pg.state(stacked), "blocks", transform_metadata=LAYERS)
    loaded = load_checkpoint(unstacked_path, view)
    pg.update(stacked, stack_state(loaded, "blocks", transform_metadata=LAYERS))
    np.testing.assert_array_equal(
        stacked.blocks.down.kernel.value[2], unstacked.blocks[2].down.kernel.value
    )
    assert stacked.blocks.down.kernel.sharding == ("layers", "model", None)
    x = jnp.ones((2, 4))
    np.testing.assert_allclose(stacked(x), unstacked(x), rtol=1e-6)

    # ...and the stacked model's per-layer checkpoint loads into an unstacked one.
    save_checkpoint(
        stacked_path, unstack_state(pg.state(stacked), "blocks", transform_metadata=LAYERS)
    )
    again = load_checkpoint(stacked_path, Unstacked(2))
    _assert_same(again, unstacked)


def test_optimizer_state_checkpoint_with_per_layer_paths(tmp_path):
    path = str(tmp_path / "optimizer.safetensors")
    x = jnp.ones((2, 4))
    model = Stacked(0)
    optimizer = Optimizer(model, optax.adam(1e-2), wrt=Param)
    grads = pg.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    optimizer.update(model, grads)

    # The optimizer's state holds the model and the optax state (Adam's moments have the
    # model's paths below their own): one key splits both.
    per_layer = unstack_state(pg.state(optimizer), "blocks", transform_metadata=LAYERS)
    keys = {path_text(p) for p in per_layer.flat_state()}
    assert ".model.blocks[1].up.kernel" in keys
    assert ".opt_state[0].mu.blocks[1].up.kernel" in keys
    assert ".opt_state[0].nu.blocks[2].down.bias" in keys
    save_checkpoint(path, per_layer)

    fresh_model = Stacked(1)
    fresh = Optimizer(fresh_model, optax.adam(1e-2), wrt=Param)
    view = unstack_state(pg.state(fresh), "blocks", transform_metadata=LAYERS)
    pg.update(fresh, stack_state(load_checkpoint(path, view), "blocks", transform_metadata=LAYERS))
    _assert_same(fresh, optimizer)
    # Training goes on from the same point.
    for m, o in ((model, optimizer), (fresh_model, fresh)):
        o.update(m, pg.grad(lambda m: jnp.sum(m(x) ** 2))(m))
    _assert_same(fresh, optimizer)


def test_functional_optax_state_splits_like_the_parameters():
    model = Stacked(0)
    params = pg.state(model, Param)
    opt_state = optax.adam(1e-2).init(params)
    per_layer = unstack_state(State({"opt": opt_state[0].mu}), "blocks")
    assert per_layer["opt"]["blocks"][0]["up"]["kernel"].value.shape == (4, 8)


def test_remat_policy_in_the_scan_gives_the_same_gradients():
    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)

    class Remat(Stacked):
        def __call__(self, x):
            @pg.scan(in_axes=(Carry, 0), out_axes=Carry, transform_metadata=LAYERS)
            def forward(x, block):
                run = pg.remat(
                    lambda block, x: block(x), policy=jax.checkpoint_policies.dots_saveable
                )
                return run(block, x)

            return self.head(forward(x, self.blocks))

    plain, remat = Stacked(0), Remat(0)

    def loss(m):
        return jnp.sum(m(x) ** 2)

    expected = pg.grad(loss)(plain)
    got = pg.grad(loss)(remat)
    for (path, a), b in zip(expected.flat_state().items(), got.flat_state().values(), strict=True):
        np.testing.assert_allclose(a.value, b.value, rtol=1e-6, err_msg=path_text(path))
    # The policy is in the program: a checkpoint (remat) whose policy is the one given.
    jaxpr = str(pg.make_jaxpr(lambda m: pg.grad(loss)(m))(remat))
    assert "checkpoint" in jaxpr or "remat" in jaxpr
    assert "dots_saveable" in jaxpr
    assert "dots_saveable" not in str(pg.make_jaxpr(lambda m: pg.grad(loss)(m))(plain))


def test_a_training_step_traces_one_block_whatever_the_depth(monkeypatch):
    # What keeps the first step's time flat in the depth: the scan traces the block once,
    # so the program holds one block (in a loop), not one per layer.
    calls = []
    call = Block.__call__
    monkeypatch.setattr(Block, "__call__", lambda self, x: calls.append(1) or call(self, x))
    x = jnp.ones((2, 4))

    def step(model, optimizer):
        loss, grads = pg.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    equations = {}
    for depth in (2, 9):
        calls.clear()
        model = Stacked(0)
        model.blocks = pg.vmap(Block, transform_metadata=LAYERS)(Rngs(0).split(depth))
        optimizer = Optimizer(model, optax.adam(1e-2), wrt=Param)
        jaxpr = pg.make_jaxpr(step)(model, optimizer)
        assert len(calls) == 1, depth
        equations[depth] = len(jaxpr.jaxpr.eqns)
    assert equations[2] == equations[9]


# ------------------------------------------------------------------------- errors


def test_unstack_state_refuses_what_is_not_a_state():
    with pytest.raises(TypeError, match=r"unstack_state: `state` must be a pytree_graph.State"):
        unstack_state(Stacked(0), "blocks")
    with pytest.raises(TypeError, match=r"stack_state: `state` must be a pytree_graph.State"):
        stack_state({"blocks": {}}, "blocks")


def test_key_must_be_a_path_key():
    state = pg.state(Stacked(0))
    with pytest.raises(TypeError, match=r"`key` must be the str \(or int\) path key"):
        unstack_state(state, ("blocks",))
    with pytest.raises(TypeError, match=r"`key` must be the str"):
        stack_state(state, True)


def test_transform_metadata_must_name_the_axis():
    state = pg.state(Stacked(0))
    with pytest.raises(TypeError, match=r"`transform_metadata` must be None or the dict"):
        unstack_state(state, "blocks", transform_metadata={"sharding": "layers"})


def test_a_key_no_path_holds_is_named():
    with pytest.raises(ValueError, match=r"no path of the state holds the key 'layers'.*\.blocks"):
        unstack_state(pg.state(Stacked(0)), "layers")
    with pytest.raises(ValueError, match=r"no path of the state holds the key 'layers'"):
        stack_state(pg.state(Stacked(0)), "layers")


def test_unstack_state_refuses_unstacked_entries():
    state = State({"blocks": {"w": Param(jnp.ones(3)), "scale": Param(jnp.array(1.0))}})
    with pytest.raises(ValueError, match=r"\.blocks\.scale is under 'blocks' but has no leading"):
        unstack_state(state, "blocks")
    state = State({"blocks": {"a": Param(jnp.ones((3, 2))), "b": Param(jnp.ones((2, 2)))}})
    with pytest.raises(ValueError, match=r"stacks 2 layers but \.blocks\.a stacks 3"):
        unstack_state(state, "blocks")


def test_unstack_state_refuses_a_key_twice_in_a_path():
    state = State({"blocks": {"blocks": Param(jnp.ones((3, 2)))}})
    with pytest.raises(ValueError, match=r"holds the key 'blocks' 2 times"):
        unstack_state(state, "blocks")


def test_wrong_axis_name_is_named_and_nothing_changes():
    model = Stacked(0)
    before = _flat(model)
    with pytest.raises(ValueError, match=r"Param at \.blocks\.(down|up)\.kernel has sharding="):
        unstack_state(pg.state(model), "blocks", transform_metadata={PARTITION_NAME: "depth"})
    _assert_same(model, Stacked(0))
    assert before.keys() == _flat(model).keys()


def test_stack_state_needs_layer_indices():
    state = State({"blocks": {"w": Param(jnp.ones(2))}})
    with pytest.raises(ValueError, match=r"\.blocks\.w is under 'blocks' without a layer index"):
        stack_state(state, "blocks")


def test_stack_state_names_a_missing_layer_entry():
    per_layer = unstack_state(pg.state(Stacked(0)), "blocks")
    flat = dict(per_layer.flat_state())
    del flat[("blocks", 1, "up", "bias")]
    with pytest.raises(ValueError, match=r"\.blocks\[1\]\.up\.bias is missing"):
        stack_state(State.from_flat_path(flat), "blocks")
    flat = dict(per_layer.flat_state())
    del flat[("blocks", 2, "up", "bias")]
    with pytest.raises(ValueError, match=r"\.blocks\[2\]\.up\.bias is missing"):
        stack_state(State.from_flat_path(flat), "blocks")


def test_stack_state_names_a_layer_of_another_shape():
    per_layer = unstack_state(pg.state(Stacked(0)), "blocks")
    flat = dict(per_layer.flat_state())
    flat[("blocks", 2, "up", "bias")] = Param(jnp.ones(5))
    with pytest.raises(ValueError, match=r"\.blocks\[2\]\.up\.bias is Param float32\[5\] where"):
        stack_state(State.from_flat_path(flat), "blocks")
