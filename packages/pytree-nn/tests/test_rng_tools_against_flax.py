"""`split_rngs`, `fork_rngs`, `restore_rngs`, `reseed`, `with_rngs` and the initializer
shortcuts against Flax NNX's.

Runs in the bench environment only (it has flax); elsewhere the module is skipped. Both
libraries derive keys the same way (a stream's root key folded in with its count, split
with `jax.random.split`), so keys and the models built from them are compared exactly.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytree_graph as pg
import pytree_nn as pnn

nnx = pytest.importorskip("flax.nnx")


def data(key):
    return np.asarray(jax.random.key_data(key))


def value(variable):
    return variable.value if isinstance(variable, pg.Variable) else variable[...]


def same_streams(ours, theirs, names):
    for name in names:
        np.testing.assert_array_equal(data(value(ours[name].key)), data(value(theirs[name].key)))
        np.testing.assert_array_equal(value(ours[name].count), value(theirs[name].count))


class OurModel(pnn.Module):
    def __init__(self, rngs):
        self.linear = pnn.Linear(3, 3, rngs=rngs)
        self.dropout = pnn.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.linear(x))


class TheirModel(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(3, 3, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.linear(x))


@pytest.mark.parametrize("splits", [3, (2, 3)])
def test_split_rngs_splits_and_restores_the_same_keys_and_counts(splits):
    ours, theirs = pnn.Rngs(params=0, dropout=1), nnx.Rngs(params=0, dropout=1)
    ours.params(), theirs.params()
    our_backups = pnn.split_rngs(ours, splits=splits, only="params")
    their_backups = nnx.split_rngs(theirs, splits=splits, only="params")
    same_streams(ours, theirs, ["params", "dropout"])
    pnn.restore_rngs(our_backups), nnx.restore_rngs(their_backups)
    same_streams(ours, theirs, ["params", "dropout"])


def test_split_rngs_decorator_splits_every_argument_as_nnx():
    def shapes(a, b, *, c):
        return tuple(value(r.default.key).shape for r in (a, b, c))

    ours = pnn.split_rngs(splits=4)(shapes)(pnn.Rngs(0), pnn.Rngs(1), c=pnn.Rngs(2))
    theirs = nnx.split_rngs(splits=4)(shapes)(nnx.Rngs(0), nnx.Rngs(1), c=nnx.Rngs(2))
    assert ours == theirs == ((4,), (4,), (4,))


def test_a_vmapped_ensemble_has_nnxs_parameters_and_dropout_keys():
    @pnn.split_rngs(splits=5)
    @pg.vmap
    def our_create(rngs):
        return OurModel(rngs)

    @nnx.split_rngs(splits=5)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def their_create(rngs):
        return TheirModel(rngs)

    our_rngs, their_rngs = pnn.Rngs(0), nnx.Rngs(0)
    ours, theirs = our_create(our_rngs), their_create(their_rngs)
    np.testing.assert_array_equal(ours.linear.kernel.value, theirs.linear.kernel[...])
    np.testing.assert_array_equal(
        data(ours.dropout.rngs.default.key.value), data(theirs.dropout.rngs.key[...])
    )
    same_streams(our_rngs, their_rngs, ["default"])


def test_scan_over_the_layers_of_a_vmapped_stack_gives_nnxs_output():
    our_rngs, their_rngs = pnn.Rngs(params=0, dropout=1), nnx.Rngs(params=0, dropout=1)
    with pnn.split_rngs(our_rngs, splits=4):
        our_stack = pg.vmap(OurModel)(our_rngs)
    with nnx.split_rngs(their_rngs, splits=4):
        their_stack = nnx.vmap(TheirModel, in_axes=0, out_axes=0)(their_rngs)

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def their_forward(x, layer):
        return layer(x)

    x = jnp.linspace(-1.0, 1.0, 3)
    ours, _ = pg.scan(lambda x, layer: (layer(x), None), x, our_stack)
    theirs = their_forward(x, their_stack)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    np.testing.assert_array_equal(
        our_stack.dropout.rngs.default.count.value, their_stack.dropout.rngs.count[...]
    )


@pytest.mark.parametrize("split", [None, 3, {"params": 4}, {"params": 2, "dropout": None}])
def test_fork_rngs_forks_the_same_streams_as_nnx(split):
    ours, theirs = pnn.Rngs(params=0, dropout=1), nnx.Rngs(params=0, dropout=1)
    with warnings.catch_warnings():
        # NNX's fork_rngs(split=...) calls its deprecated RngStream.fork(split=...).
        warnings.simplefilter("ignore", DeprecationWarning)
        their_backups = nnx.fork_rngs(theirs, split=split)
    our_backups = pnn.fork_rngs(ours, split=split)
    same_streams(ours, theirs, ["params", "dropout"])
    pnn.restore_rngs(our_backups), nnx.restore_rngs(their_backups)
    same_streams(ours, theirs, ["params", "dropout"])


def test_fork_rngs_takes_the_first_matching_entry_where_nnx_fails():
    # NNX's in-place fork_rngs applies every entry that matches (here twice), and fails on
    # the second; ours takes the first, as NNX's Rngs.split and with_rngs do.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match="fold_in"):
            nnx.fork_rngs(nnx.Rngs(params=0), split={"params": 4, ...: None})
    rngs = pnn.Rngs(params=0)
    with pnn.fork_rngs(rngs, split={"params": 4, ...: None}):
        assert rngs.params.key.value.shape == (4,)


def test_reseed_gives_the_same_keys_as_nnx_in_the_same_order():
    class Ours(pnn.Module):
        def __init__(self, rngs):
            self.z = pnn.Dropout(0.5, rngs=rngs)
            self.a = [pnn.Dropout(0.5, rngs=rngs), pnn.Dropout(0.5, rngs=rngs)]

    class Theirs(nnx.Module):
        def __init__(self, rngs):
            self.z = nnx.Dropout(0.5, rngs=rngs)
            self.a = nnx.List([nnx.Dropout(0.5, rngs=rngs), nnx.Dropout(0.5, rngs=rngs)])

    ours, theirs = Ours(pnn.Rngs(dropout=3)), Theirs(nnx.Rngs(dropout=3))
    pnn.reseed(ours, dropout=9)
    nnx.reseed(theirs, dropout=9)
    for our_layer, their_layer in [(ours.z, theirs.z), *zip(ours.a, theirs.a, strict=True)]:
        np.testing.assert_array_equal(
            data(our_layer.rngs.default.key.value), data(their_layer.rngs.key[...])
        )
        assert int(our_layer.rngs.default.count.value) == int(their_layer.rngs.count[...]) == 0


def test_reseed_of_an_unknown_name_raises_where_nnx_ignores_it():
    theirs = nnx.Rngs(params=0)
    nnx.reseed(theirs, parmas=1)  # a typo: NNX changes nothing and says nothing
    with pytest.raises(ValueError, match="no stream called 'parmas'"):
        pnn.reseed(pnn.Rngs(params=0), parmas=1)


def test_reseed_match_shape_splits_as_nnx():
    ours, theirs = pnn.Rngs(params=0), nnx.Rngs(params=0)
    with pnn.split_rngs(ours, splits=3), nnx.split_rngs(theirs, splits=3):
        pnn.reseed(ours, params=4, policy="match_shape")
        nnx.reseed(theirs, params=4, policy="match_shape")
        same_streams(ours, theirs, ["params"])


@pytest.mark.parametrize(
    "rules",
    [
        {"split": 4},
        {"split": {"params": 4}, "fork": ...},
        {"split": {"params": 4, ...: (2, 4)}},
        {"broadcast": 3},
        {"split": 2, "only": "dropout"},
    ],
)
def test_with_rngs_makes_the_same_streams_as_nnx(rules):
    ours, theirs = pnn.Rngs(params=0, dropout=1), nnx.Rngs(params=0, dropout=1)
    our_new = pnn.with_rngs(ours, **rules)
    their_new = nnx.with_rngs(theirs, **rules, graph=False)
    same_streams(our_new, their_new, ["params", "dropout"])
    same_streams(ours, theirs, ["params", "dropout"])


def test_with_rngs_named_rules_win_where_nnx_lets_split_win():
    ours, theirs = pnn.Rngs(params=0), nnx.Rngs(params=0)
    rules = {"split": 2, "broadcast": {"params": 3}}
    assert value(nnx.with_rngs(theirs, **rules, graph=False).params.key).shape == (2,)
    assert pnn.with_rngs(ours, **rules).params.key.value.shape == (3,)


@pytest.mark.parametrize(
    "name, args, shape",
    [
        ("delta_orthogonal", (), (3, 3, 4, 4)),
        ("glorot_normal", (), (3, 4)),
        ("glorot_uniform", (), (3, 4)),
        ("he_normal", (), (3, 4)),
        ("he_uniform", (), (3, 4)),
        ("kaiming_normal", (), (3, 4)),
        ("kaiming_uniform", (), (3, 4)),
        ("lecun_normal", (), (3, 4)),
        ("lecun_uniform", (), (3, 4)),
        ("variance_scaling", (2.0, "fan_avg", "truncated_normal"), (3, 4)),
        ("xavier_normal", (), (3, 4)),
        ("xavier_uniform", (), (3, 4)),
    ],
)
def test_initializer_shortcuts_match_nnxs(name, args, shape):
    ours, theirs = pnn.Rngs(0, params=1), nnx.Rngs(0, params=1)
    for our_init, their_init in [
        (getattr(ours, name)(*args), getattr(theirs, name)(*args)),
        (getattr(ours.params, name)(*args), getattr(theirs.params, name)(*args)),
    ]:
        for _ in range(2):
            np.testing.assert_array_equal(our_init(shape), their_init(shape))
    same_streams(ours, theirs, ["default", "params"])


def test_a_second_restore_repeats_nnxs_keys_but_not_ours():
    # A deliberate difference: NNX puts back the saved count each time, so its stream
    # draws the same keys again; ours goes on from the furthest count it reached.
    def draws_after_two_restores(library):
        rngs = library.Rngs(0)
        backups = library.split_rngs(rngs, splits=2)
        library.restore_rngs(backups)
        first = data(rngs.default())
        library.restore_rngs(backups)
        return first, data(rngs.default())

    first, second = draws_after_two_restores(nnx)
    np.testing.assert_array_equal(first, second)
    first, second = draws_after_two_restores(pnn)
    assert not np.array_equal(first, second)


def test_a_split_rngs_decorator_naming_an_absent_stream_changes_nothing_as_nnx():
    ours, theirs = pnn.Rngs(dropout=0), nnx.Rngs(dropout=0)
    seen = {}
    for name, lib, rngs in (("ours", pnn, ours), ("theirs", nnx, theirs)):

        @lib.split_rngs(splits=5, only="params")
        def f(rngs, name=name):
            seen[name] = tuple(rngs.dropout.key[...].shape)

        f(rngs)
    assert seen["ours"] == seen["theirs"] == ()  # not split inside
    same_streams(ours, theirs, ["dropout"])  # nor changed after
