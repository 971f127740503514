"""`split_rngs`, `fork_rngs`, `restore_rngs`, `reseed`, `with_rngs`, and the initializer
shortcuts of `Rngs` and `RngStream`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from distribution_args import DISTRIBUTION_ARGS

import pytree_graph as pg
from pytree_filter import PathContains
from pytree_nn import (
    Dropout,
    Linear,
    Module,
    RngKey,
    Rngs,
    RngState,
    RngStream,
    SplitBackups,
    fork_rngs,
    initializers,
    reseed,
    restore_rngs,
    split_rngs,
    with_rngs,
)


def data(key):
    return np.asarray(jax.random.key_data(key))


def count(stream):
    return np.asarray(stream.count.value).tolist()


def nth_key(seed, n):
    """The key a stream seeded with `seed` (an int or a key) gives at its `n`-th draw."""
    key = jax.random.key(seed) if isinstance(seed, int) else seed
    return jax.random.fold_in(key, n)


class Model(Module):
    def __init__(self, rngs):
        self.linear = Linear(3, 3, rngs=rngs)
        self.dropout = Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.linear(x))


# ------------------------------------------------------------------------- split_rngs


@pytest.mark.parametrize("splits, shape", [(4, (4,)), ((2, 3), (2, 3))])
def test_split_rngs_stacks_split_keys_in_place_and_restores_them(splits, shape):
    rngs = Rngs(params=0, dropout=1)
    rngs.params()
    backups = split_rngs(rngs, splits=splits)
    assert isinstance(backups, SplitBackups) and len(backups) == 2
    np.testing.assert_array_equal(
        data(rngs.params.key.value), data(jax.random.split(nth_key(0, 1), shape))
    )
    assert rngs.params.count.value.shape == shape and not rngs.params.count.value.any()
    restore_rngs(backups)
    # Back on the old key, one key further on: the split keys are never drawn again.
    np.testing.assert_array_equal(data(rngs.params.key.value), data(jax.random.key(0)))
    assert count(rngs.params) == 2 and count(rngs.dropout) == 1


def test_split_rngs_as_a_context_manager_restores_even_after_an_error():
    rngs = Rngs(0)
    with pytest.raises(RuntimeError), split_rngs(rngs, splits=3):
        assert rngs.default.key.value.shape == (3,)
        raise RuntimeError
    assert rngs.default.key.value.shape == () and count(rngs.default) == 1


@pytest.mark.parametrize(
    "only, split",
    [
        ("dropout", {"dropout"}),
        (["params", "noise"], {"params", "noise"}),
        (PathContains("params"), {"params"}),
        (RngState, {"params", "dropout", "noise"}),
        # A filter must match both Variables of a stream (its key and its count).
        (RngKey, set()),
    ],
)
def test_split_rngs_only_selects_streams_by_name_or_filter(only, split):
    rngs = Rngs(params=0, dropout=1, noise=2)
    with split_rngs(rngs, splits=2, only=only):
        assert {n for n in rngs.streams() if rngs[n].key.value.shape == (2,)} == split


def test_split_rngs_reaches_the_streams_inside_a_model_and_shared_ones_once():
    rngs = Rngs(0)
    model = Model(rngs)
    pair = [model, model.dropout.rngs]  # the dropout stream reached twice
    with split_rngs(pair, splits=2) as backups:
        assert len(backups) == 1 and model.dropout.rngs.default.key.value.shape == (2,)
    assert count(model.dropout.rngs.default) == 1


def test_an_ensemble_built_under_vmap_has_a_different_member_per_key():
    rngs = Rngs(0)
    with split_rngs(rngs, splits=5):
        ensemble = pg.vmap(Model)(rngs)
    kernels = np.asarray(ensemble.linear.kernel.value)
    assert kernels.shape == (5, 3, 3)
    assert len({member.tobytes() for member in kernels}) == 5
    # Member i is the model built from split key i.
    keys = jax.random.split(nth_key(0, 0), 5)
    np.testing.assert_allclose(kernels[3], Model(Rngs(keys[3])).linear.kernel.value, rtol=1e-6)
    # Each member holds its own dropout stream, and draws its own masks.
    assert ensemble.dropout.rngs.default.key.value.shape == (5,)
    out = np.asarray(pg.vmap(lambda m, x: m(x), in_axes=(0, None))(ensemble, jnp.ones(3)))
    assert len({row.tobytes() for row in out}) == 5
    assert count(ensemble.dropout.rngs.default) == [1] * 5 and count(rngs.default) == 1


def test_the_decorator_splits_every_argument_for_the_call_and_restores_them():
    @split_rngs(splits=4)
    def shapes(a, b, *, c, d):
        return a.default.key.value.shape, b.default.key.value.shape, c.params.key.value.shape

    first, second, third = Rngs(0), Rngs(1), Rngs(params=2)
    assert shapes(first, second, c=third, d=3) == ((4,), (4,), (4,))
    assert all(r.streams() and count(r[r.streams()[0]]) == 1 for r in (first, second, third))
    assert first.default.key.value.shape == ()

    @split_rngs(splits=5)
    @pg.vmap
    def create(rngs):
        return Model(rngs)

    rngs = Rngs(0)
    assert create(rngs).linear.kernel.value.shape == (5, 3, 3) and count(rngs.default) == 1


def test_scan_over_layers_with_a_stream_split_per_layer():
    layers = pg.vmap(lambda r: Linear(3, 3, rngs=r))(Rngs(0).split(4))
    rngs = Rngs(noise=1)

    def step(x, layer_and_rngs):
        layer, step_rngs = layer_and_rngs
        noise = step_rngs.noise.normal(x.shape)
        return layer(x) + noise, noise

    with split_rngs(rngs, splits=4):
        _, noises = pg.scan(step, jnp.ones(3), (layers, rngs))
    noises = np.asarray(noises)
    assert len({row.tobytes() for row in noises}) == 4  # a key of its own for each layer
    split = jax.random.split(nth_key(1, 0), 4)
    np.testing.assert_allclose(noises[2], jax.random.normal(nth_key(split[2], 0), (3,)))
    assert count(rngs.noise) == 1


def test_scan_over_a_stacked_model_advances_each_layers_dropout_stream():
    rngs = Rngs(0)
    with split_rngs(rngs, splits=3):
        stack = pg.vmap(Model)(rngs)
    y, _ = pg.scan(lambda x, layer: (layer(x), None), jnp.ones(3), stack)
    assert y.shape == (3,) and count(stack.dropout.rngs.default) == [1, 1, 1]


def test_split_rngs_splits_an_already_split_stream_for_nested_maps():
    rngs = Rngs(0)
    with split_rngs(rngs, splits=2), split_rngs(rngs, splits=3):
        assert rngs.default.key.value.shape == (3, 2)
        draws = pg.vmap(pg.vmap(lambda r: r.normal(())))(rngs)
        assert draws.shape == (3, 2) and len(set(np.asarray(draws).ravel().tolist())) == 6
    assert rngs.default.key.value.shape == () and count(rngs.default) == 1


def test_split_rngs_with_squeeze_forks_without_a_new_axis():
    rngs = Rngs(0)
    with split_rngs(rngs, splits=1, squeeze=True):
        assert rngs.default.key.value.shape == () and count(rngs.default) == 0
        np.testing.assert_array_equal(
            data(rngs.default.key.value), data(jax.random.split(nth_key(0, 0), 1)[0])
        )


def test_split_rngs_inside_jit_advances_the_callers_streams():
    rngs = Rngs(0)
    draw = pg.jit(split_rngs(splits=3)(pg.vmap(lambda r: r.normal(()))))
    first, second = draw(rngs), draw(rngs)
    assert first.shape == (3,) and not np.array_equal(first, second)
    assert count(rngs.default) == 2 and rngs.default.key.value.shape == ()


@pytest.mark.parametrize("splits", [-1, 1.5, "4", (2, -1), ()])
def test_split_rngs_rejects_a_bad_number_of_splits(splits):
    with pytest.raises(ValueError, match="number of splits"):
        split_rngs(Rngs(0), splits=splits)


def test_split_rngs_errors_change_nothing():
    rngs = Rngs(params=0, dropout=1)
    with pytest.raises(ValueError, match=r"no stream called 'dropuot'.*\['dropout', 'params'\]"):
        split_rngs(rngs, splits=2, only="dropuot")
    with pytest.raises(ValueError, match=r"squeeze=True.*splits=1"):
        split_rngs(rngs, splits=2, squeeze=True)
    with pytest.raises(TypeError, match=r"only=.*stream is selected by its name"):
        split_rngs(rngs, splits=2, only=3)
    assert count(rngs.params) == count(rngs.dropout) == 0
    assert rngs.params.key.value.shape == ()
    with pytest.raises(TypeError, match="split_rngs without a node is a decorator"):
        split_rngs(splits=2)(3)


# -------------------------------------------------------------------------- fork_rngs


def test_fork_rngs_gives_every_stream_its_next_key_and_restores():
    rngs = Rngs(params=0, dropout=1)
    rngs.dropout()
    with fork_rngs(rngs) as backups:
        assert len(backups) == 2
        np.testing.assert_array_equal(data(rngs.dropout.key.value), data(nth_key(1, 1)))
        assert count(rngs.dropout) == 0
    np.testing.assert_array_equal(data(rngs.dropout.key.value), data(jax.random.key(1)))
    assert count(rngs.dropout) == 2 and count(rngs.params) == 1


def test_fork_rngs_split_forks_and_splits_by_the_first_matching_entry():
    rngs = Rngs(params=0, dropout=1, noise=2)
    with fork_rngs(rngs, split=3):
        assert {rngs[n].key.value.shape for n in rngs.streams()} == {(3,)}
    with fork_rngs(rngs, split={"params": 4, "noise": None}):
        assert rngs.params.key.value.shape == (4,)
        np.testing.assert_array_equal(data(rngs.noise.key.value), data(nth_key(2, 1)))
        # Selected by no entry: left as it is.
        np.testing.assert_array_equal(data(rngs.dropout.key.value), data(jax.random.key(1)))
        assert count(rngs.dropout) == 1
    # The first entry that selects a stream wins (`...` last or first alike).
    with fork_rngs(rngs, split={"params": 2, ...: (2, 3)}):
        assert rngs.params.key.value.shape == (2,) and rngs.noise.key.value.shape == (2, 3)


def test_fork_rngs_as_a_decorator_and_its_errors():
    @fork_rngs()
    def root_key(rngs):
        return rngs.params.key.value

    rngs = Rngs(params=0)
    np.testing.assert_array_equal(data(root_key(rngs)), data(nth_key(0, 0)))
    assert count(rngs.params) == 1
    with pytest.raises(ValueError, match="no stream called 'dropout'"):
        fork_rngs(rngs, split={"dropout": 2})
    with pytest.raises(ValueError, match="number of splits"):
        fork_rngs(rngs, split={"params": -2})
    assert count(rngs.params) == 1


class Draws:
    """Every key drawn from a stream (each key of a stack counted apart)."""

    def __init__(self, stream):
        self.stream, self.keys = stream, []

    def __call__(self, n):
        for _ in range(n):
            self.keys += [tuple(row) for row in data(self.stream()).reshape(-1, 2).tolist()]

    def assert_no_key_twice(self):
        assert len(set(self.keys)) == len(self.keys), "a key was drawn twice"


def test_restoring_twice_never_repeats_a_key():
    rngs = Rngs(0)
    draws = Draws(rngs.default)
    draws(2)
    backups = split_rngs(rngs, splits=2)
    draws(2)
    restore_rngs(backups)
    draws(3)
    restore_rngs(backups)  # the same key (and shape) again, but not the same count
    assert rngs.default.key.value.shape == () and count(rngs.default) == 6
    draws(3)
    with split_rngs(rngs, splits=3) as backups:
        draws(1)
        restore_rngs(backups)
        draws(2)
    draws(2)  # restored twice: explicitly, then by the `with` block
    with fork_rngs(rngs) as backups:
        draws(1)
    restore_rngs(backups)
    draws(2)
    draws.assert_no_key_twice()


def test_restoring_nested_splits_out_of_order_never_repeats_a_key():
    rngs = Rngs(0)
    draws = Draws(rngs.default)
    outer = split_rngs(rngs, splits=2)
    draws(1)
    inner = split_rngs(rngs, splits=3)
    assert rngs.default.key.value.shape == (3, 2)
    draws(1)
    restore_rngs(outer)
    assert rngs.default.key.value.shape == ()
    draws(2)
    restore_rngs(inner)  # back onto the outer split's keys, one key further on
    assert rngs.default.key.value.shape == (2,)
    draws(2)
    restore_rngs(outer)
    draws(2)
    restore_rngs(inner)
    draws(2)
    restore_rngs(list(inner))  # the entries, out of their SplitBackups
    draws(1)
    draws.assert_no_key_twice()


def test_restore_rngs_rejects_what_is_not_a_backup():
    with pytest.raises(TypeError, match="restore_rngs expects"):
        restore_rngs([("params", 1, 2)])


# ----------------------------------------------------------------------------- reseed


def test_reseed_replays_a_dropout_layers_masks():
    model = Model(Rngs(params=0, dropout=42))
    x = jnp.ones(3)
    first = model(x)
    assert not np.array_equal(first, model(x))
    reseed(model, dropout=42)
    np.testing.assert_array_equal(first, model(x))


def test_reseed_gives_streams_of_one_name_the_keys_of_one_new_stream_in_graph_order():
    class Two(Module):
        def __init__(self, rngs):
            self.z = Dropout(0.5, rngs=rngs)
            self.a = Dropout(0.5, rngs=rngs)

    model = Two(Rngs(params=0, dropout=1))
    model.z(jnp.ones(2))
    reseed(model, dropout=jax.random.key(7))
    for n, layer in enumerate((model.a, model.z)):
        np.testing.assert_array_equal(data(layer.rngs.default.key.value), data(nth_key(7, n)))
        assert count(layer.rngs.default) == 0


def test_reseed_rejects_unknown_names_and_changes_nothing():
    rngs = Rngs(params=0, dropout=1)
    rngs.params()
    with pytest.raises(ValueError, match=r"no stream called 'dropuot'.*\['dropout', 'params'\]"):
        reseed(rngs, params=3, dropuot=4)
    assert count(rngs.params) == 1
    with pytest.raises(TypeError, match=r"reseed\(params=...\)"):
        reseed(rngs, params="3")


def test_reseed_of_a_stack_of_keys_follows_the_policy():
    rngs = Rngs(params=0, dropout=1)
    with split_rngs(rngs, splits=3, only="params"):
        rngs.params.count.value = rngs.params.count.value + 1
        with pytest.raises(ValueError, match=r"shape \(3,\).*match_shape"):
            reseed(rngs, dropout=5, params=1)
        assert count(rngs.params) == [1, 1, 1] and count(rngs.dropout) == 0
        reseed(rngs, params=1, policy="match_shape")
        np.testing.assert_array_equal(
            data(rngs.params.key.value), data(jax.random.split(nth_key(1, 0), 3))
        )
        assert count(rngs.params) == [0, 0, 0]
        reseed(rngs, params=2, policy=lambda path, key, shape: jnp.broadcast_to(key, shape))
        assert len({tuple(k) for k in data(rngs.params.key.value).tolist()}) == 1
    with pytest.raises(ValueError, match="policy"):
        reseed(rngs, params=1, policy="all")


# -------------------------------------------------------------------------- with_rngs


def test_with_rngs_returns_a_copy_with_split_and_forked_streams():
    rngs = Rngs(params=0, dropout=1, noise=2)
    new = with_rngs(rngs, split={"params": 4}, fork="dropout")
    assert new is not rngs and new.params.key.value.shape == (4,)
    np.testing.assert_array_equal(data(new.dropout.key.value), data(nth_key(1, 0)))
    # The original keeps its streams, each advanced by the key the copy's came from.
    assert rngs.params.key.value.shape == () and count(rngs.params) == count(rngs.dropout) == 1
    # A stream no rule selects is kept: the copy shares its Variables.
    assert new.noise.key is rngs.noise.key and count(rngs.noise) == 0


def test_with_rngs_broadcast_repeats_one_new_key():
    new = with_rngs(Rngs(0), broadcast=(2, 3))
    keys = data(new.default.key.value)
    assert keys.shape[:2] == (2, 3) and (keys == data(nth_key(0, 0))).all()


def test_with_rngs_a_named_rule_wins_over_a_catch_all_one():
    rngs = Rngs(params=0, dropout=1)
    new = with_rngs(rngs, split=2, broadcast={"params": 3}, fork=...)
    assert new.params.key.value.shape == (3,) and new.dropout.key.value.shape == (2,)
    new = with_rngs(rngs, split={"params": 4, ...: None}, fork=...)
    assert new.params.key.value.shape == (4,) and new.dropout.key.value.shape == ()


def test_with_rngs_only_limits_the_streams_the_rules_touch():
    rngs = Rngs(params=0, dropout=1)
    new = with_rngs(rngs, split=2, only="dropout")
    assert new.params.key is rngs.params.key and new.dropout.key.value.shape == (2,)


def test_with_rngs_as_a_decorator_gives_each_call_copies():
    @with_rngs(split=5)
    @pg.vmap
    def create(rngs):
        return Linear(2, 3, rngs=rngs)

    rngs = Rngs(0)
    assert create(rngs).kernel.value.shape == (5, 2, 3)
    assert rngs.default.key.value.shape == () and count(rngs.default) == 1


def test_with_rngs_errors_change_nothing():
    rngs = Rngs(params=0, dropout=1)
    with pytest.raises(
        ValueError,
        match=r"matches multiple rules: the stream 'params'.*more than one rule.*split by 'params'",
    ):
        with_rngs(rngs, split={"params": 4}, fork="params")
    with pytest.raises(ValueError, match="no stream called 'noise'"):
        with_rngs(rngs, fork=["dropout", "noise"])
    with pytest.raises(ValueError, match="number of splits"):
        with_rngs(rngs, broadcast={"params": 0.5})
    assert count(rngs.params) == count(rngs.dropout) == 0


# ---------------------------------------------------------------------- initializers


def test_initializer_shortcuts_draw_a_new_key_at_each_call():
    rngs = Rngs(0, params=1)
    init = rngs.lecun_normal()
    assert count(rngs.default) == 0  # making the initializer draws nothing
    first, second = init((3, 4)), init((3, 4))
    np.testing.assert_array_equal(first, initializers.lecun_normal()(nth_key(0, 0), (3, 4)))
    assert not np.array_equal(first, second) and count(rngs.default) == 2
    half = rngs.params.variance_scaling(2.0, "fan_out", "uniform")((2, 3), jnp.float16)
    expected = initializers.variance_scaling(2.0, "fan_out", "uniform")(
        nth_key(1, 0), (2, 3), jnp.float16
    )
    assert half.dtype == jnp.float16 and np.array_equal(half, expected)
    stream = RngStream(5, tag="init")
    np.testing.assert_array_equal(
        stream.xavier_uniform()((2, 2)), initializers.xavier_uniform()(nth_key(5, 0), (2, 2))
    )


def test_initializer_names_are_methods_not_stream_names():
    with pytest.raises(ValueError, match="cannot be called 'he_normal'"):
        Rngs(he_normal=0)


# ---------------------------------------------------------------------- distributions


@pytest.mark.parametrize("name", sorted(DISTRIBUTION_ARGS))
def test_distribution_shortcuts_sample_with_the_next_key(name):
    args = DISTRIBUTION_ARGS[name]
    sample = getattr(jax.random, name)
    rngs = Rngs(0, dropout=1)
    first, second = getattr(rngs, name)(*args), getattr(rngs, name)(*args)
    np.testing.assert_array_equal(first, sample(nth_key(0, 0), *args))
    np.testing.assert_array_equal(second, sample(nth_key(0, 1), *args))
    from_stream = getattr(rngs.dropout, name)(*args)
    np.testing.assert_array_equal(from_stream, sample(nth_key(1, 0), *args))
    assert count(rngs.default) == 2 and count(rngs.dropout) == 1


def test_distribution_names_are_methods_not_stream_names():
    for name in ("beta", "t", "poisson"):
        with pytest.raises(ValueError, match=f"cannot be called '{name}'"):
            Rngs(0, **{name: 1})


@pytest.mark.parametrize(
    "call",
    [
        lambda: split_rngs(5, splits=2),
        lambda: split_rngs(Linear(2, 3, rngs=0), splits=2),
        lambda: fork_rngs(None),
        lambda: fork_rngs(Linear(2, 3, rngs=0)),
    ],
    ids=["split-int", "split-no-streams", "fork-none", "fork-no-streams"],
)
def test_splitting_or_forking_a_node_without_streams_is_refused(call):
    with pytest.raises(ValueError, match=r"`node` holds no RngStream.*Pass the Rngs"):
        call()


def test_restore_rngs_of_what_is_not_iterable_names_what_it_expects():
    with pytest.raises(TypeError, match=r"restore_rngs expects .* got int 5"):
        restore_rngs(5)


@pytest.mark.parametrize(
    "decorate",
    [
        lambda f: split_rngs(splits=2, only="params")(f),
        lambda f: fork_rngs(split={"params": 2})(f),
        lambda f: with_rngs(split={"params": 2})(f),
    ],
    ids=["split_rngs", "fork_rngs", "with_rngs"],
)
def test_a_decorator_leaves_alone_what_a_calls_arguments_lack(decorate):
    # A decorator is written once for any call's arguments (as in NNX): a stream it
    # names that this call's arguments lack, or arguments with no stream at all, are
    # no error, and what they hold is not changed.
    seen = []

    @decorate
    def f(rngs, x):
        seen.append(rngs.dropout.key.value.shape if rngs is not None else None)
        return x

    rngs = Rngs(dropout=0)
    assert f(rngs, 1) == 1 and f(None, 2) == 2
    assert seen == [(), None]
    assert rngs.dropout.key.value.shape == ()
    with pytest.raises(ValueError, match="no stream called 'params'"):
        split_rngs(rngs, splits=2, only="params")  # given the node: a typo
