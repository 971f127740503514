import json
import os
import stat
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import safetensors
import safetensors.numpy
from checkpoint_models import (
    FORMS,
    Everything,
    Two,
    assert_same_values,
    assert_unchanged,
    checkpoint_path,
    snapshot,
)
from hypothesis import given
from hypothesis import strategies as st

import pytree_graph as pg
from pytree_filter import filter, is_inexact_array
from pytree_graph import BatchStat, Param, Variable
from pytree_nn import (
    Dropout,
    Linear,
    Module,
    Optimizer,
    Rngs,
    load_checkpoint,
    save_checkpoint,
)
from pytree_nn._checkpoint import decode_key, encode_path
from pytree_transforms import apply_updates, filter_jit, filter_value_and_grad


@FORMS
def test_round_trip_keeps_values_dtypes_types_and_sharing(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "model")
    saved = Everything(0)
    saved.rngs()  # advance a stream: counts are state too
    save_checkpoint(path, saved)
    model = Everything(1)
    tied = model.w
    assert load_checkpoint(path, model) is model
    assert_same_values(model, saved)
    assert model.w is tied and model.tied is tied
    assert model.half.value.dtype == jnp.bfloat16
    assert model.small.value.dtype == jnp.float8_e4m3fn
    assert model.nibbles.value.dtype == jnp.int4
    assert isinstance(model.scale.value, float) and isinstance(model.steps.value, int)
    assert isinstance(model.raw, jax.Array)
    assert jax.dtypes.issubdtype(model.rngs.default.key.value.dtype, jax.dtypes.prng_key)
    assert int(model.rngs.default.count.value) == 1
    assert model.w.sharding == (None, "m")


def test_file_layout_keys_and_header(tmp_path):
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, Everything(0))
    with safetensors.safe_open(path, framework="np") as file:
        keys = set(file.keys())
        header = file.metadata()
    assert {"layers/0/kernel", "table/a~1b", "table/~20", "rngs/default/key"} <= keys
    assert len({"w", "tied"} & keys) == 1  # the shared Variable, once
    entries = json.loads(header["entries"])
    assert header["format"] == "pytree_nn.checkpoint"
    tied = "tied" if "tied" in keys else "w"
    assert entries[tied]["type"] == "Param"
    assert entries[tied]["metadata"] == {"sharding": [None, "m"]}
    assert entries["half"]["dtype"] == "bfloat16"
    assert entries["raw"].get("type") is None
    # bfloat16 is written as safetensors' own BF16, readable by other tools.
    raw = dict(safetensors.deserialize(path.read_bytes()))
    assert raw["half"]["dtype"] == "BF16"
    assert raw["layers/0/kernel"]["dtype"] == "F32"
    with open(path, "rb") as file:
        assert b"pickle" not in file.read()


@pytest.mark.parametrize(
    ("path", "key"),
    [
        (("layers", 0, "kernel"), "layers/0/kernel"),
        (("a/b", "c~d"), "a~1b/c~0d"),
        (("0", 0), "~20/0"),
        (("", -1), "~2/-1"),
        (("__metadata__",), "~2__metadata__"),
        (("~2x",), "~02x"),
    ],
)
def test_key_encoding(path, key):
    assert encode_path(path) == key
    assert decode_key(key) == path


@given(st.lists(st.one_of(st.text(), st.integers()), min_size=1, max_size=5).map(tuple))
def test_key_encoding_round_trips(path):
    key = encode_path(path)
    assert decode_key(key) == path
    assert key != "__metadata__"


@FORMS
def test_save_a_state_and_load_part_of_a_model(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "params")
    saved = Everything(0)
    save_checkpoint(path, pg.state(saved, Param))
    model = Everything(1)
    before = model.counts.value
    load_checkpoint(path, model, Param)
    np.testing.assert_array_equal(model.w.value, saved.w.value)
    np.testing.assert_array_equal(model.counts.value, before)  # not a Param: untouched
    with pytest.raises(ValueError, match=r"\.counts is in the model but not in the checkpoint"):
        load_checkpoint(path, model)


@FORMS
def test_load_into_an_abstract_model(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "linear")
    saved = Linear(2, 3, rngs=0)
    save_checkpoint(path, saved)
    abstract = pg.eval_shape(lambda: Linear(2, 3, rngs=1))
    assert isinstance(abstract.kernel.value, jax.ShapeDtypeStruct)
    model = load_checkpoint(path, abstract)
    np.testing.assert_array_equal(model.kernel.value, saved.kernel.value)
    assert isinstance(model.kernel.value, jax.Array)


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two devices")
@FORMS
def test_load_keeps_each_value_where_it_was(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "linear")
    save_checkpoint(path, Linear(2, 4, rngs=0))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("model",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "model"))
    model = Linear(2, 4, rngs=1)
    model.kernel.value = jax.device_put(model.kernel.value, sharding)
    load_checkpoint(path, model)
    assert model.kernel.value.sharding == sharding
    np.testing.assert_array_equal(model.kernel.value, Linear(2, 4, rngs=0).kernel.value)


@FORMS
def test_optimizer_training_resumes_from_a_checkpoint(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "optimizer")
    x = jnp.linspace(-1, 1, 16).reshape(8, 2)
    y = x.sum(axis=1, keepdims=True)

    @pg.jit
    def step(model, optimizer):
        grads = pg.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)

    model = Linear(2, 1, rngs=0)
    optimizer = Optimizer(model, optax.adam(0.1))
    for _ in range(3):
        step(model, optimizer)
    save_checkpoint(path, optimizer)
    resumed_model = Linear(2, 1, rngs=5)
    resumed = load_checkpoint(path, Optimizer(resumed_model, optax.adam(0.1)))
    assert int(resumed.step.value) == 3
    for _ in range(3):
        step(model, optimizer)
        step(resumed_model, resumed)
    np.testing.assert_array_equal(resumed_model.kernel.value, model.kernel.value)
    np.testing.assert_array_equal(
        resumed.opt_state[0]["nu"]["bias"].value, optimizer.opt_state[0]["nu"]["bias"].value
    )


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, Linear(2, 3, rngs=0))
    old = path.read_bytes()

    def failing_writer(tensors, filename, metadata=None):
        with open(filename, "wb") as file:
            file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", failing_writer)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, Linear(2, 3, rngs=1))
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_a_failed_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, Linear(2, 3, rngs=0))
    old = path.read_bytes()

    def interrupted(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, Linear(2, 3, rngs=1))
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_save_errors(tmp_path):
    class Holder(Module):
        def __init__(self):
            self.records = Variable((jnp.ones(2), jnp.ones(2)))

    with pytest.raises(TypeError, match=r"Variable at \.records holds a tuple"):
        save_checkpoint(tmp_path / "a.safetensors", Holder())
    with pytest.raises(TypeError, match="abstract array"):
        save_checkpoint(tmp_path / "a.safetensors", pg.eval_shape(lambda: Linear(2, 2, rngs=0)))
    with pytest.raises(TypeError, match="key of type tuple"):
        save_checkpoint(tmp_path / "a.safetensors", pg.State({(1, 2): jnp.ones(1)}))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_checkpoint(tmp_path / "missing" / "a.safetensors", Linear(2, 2, rngs=0))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (Two(extra=True), r"\.c is in the model but not in the checkpoint"),
        (Linear(2, 2, rngs=0), r"\.a is in the checkpoint but not in the model"),
        (Two(shape=(3,)), r"\.a is float32\[3\] in the model but float32\[2\]"),
        (Two(dtype=jnp.bfloat16), r"\.a is bfloat16\[2\] in the model but float32\[2\]"),
        (Two(kind=BatchStat), r"\.a is a BatchStat in the model but a Param in the checkpoint"),
        (Two(tag="x"), r"Param at \.a has metadata \{'tag': 'x'\}"),
    ],
    ids=["missing", "extra", "shape", "dtype", "type", "metadata"],
)
@FORMS
def test_a_model_of_another_structure_is_refused_and_unchanged(tmp_path, form, model, message):
    path = checkpoint_path(tmp_path, form, "two")
    save_checkpoint(path, Two())
    before = snapshot(model)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(path, model)
    assert_unchanged(before, model)


@FORMS
def test_bare_array_and_variable_differ(tmp_path, form):
    class Bare(Module):
        def __init__(self):
            self.a = jnp.ones(2)
            self.b = Param(jnp.zeros(2))

    path = checkpoint_path(tmp_path, form, "two")
    save_checkpoint(path, Two())
    with pytest.raises(ValueError, match=r"\.a is a bare array in the model but a Param"):
        load_checkpoint(path, Bare())
    save_checkpoint(path, Bare())
    with pytest.raises(ValueError, match=r"\.a is a Param in the model but a bare array"):
        load_checkpoint(path, Two())


@FORMS
def test_metadata_check_can_be_turned_off(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "two")
    save_checkpoint(path, Two(tag="saved"))
    model = Two(tag="mine")
    model.a.value = jnp.zeros(2)
    load_checkpoint(path, model, check_metadata=False)
    np.testing.assert_array_equal(model.a.value, jnp.ones(2))
    assert model.a.tag == "mine"


@FORMS
def test_every_problem_is_listed(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "two")
    save_checkpoint(path, Two())
    with pytest.raises(
        ValueError, match=r"\.c is in the model .*; \.a is float32\[3\] in the model"
    ):
        load_checkpoint(path, Two(shape=(3,), extra=True))


def corrupt_files(tmp_path):
    path = tmp_path / "good.safetensors"
    save_checkpoint(path, Everything(0))
    content = path.read_bytes()
    header_end = 8 + int.from_bytes(content[:8], "little")
    flipped = bytearray(content)
    flipped[header_end + 3] ^= 0xFF  # one byte of the first array
    files = {
        "truncated": content[:-7],
        "cut in the header": content[: header_end // 2],
        "flipped byte": bytes(flipped),
        "empty": b"",
        "garbage": b"not a checkpoint at all",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return files


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("truncated", "truncated or corrupt"),
        ("cut in the header", "truncated or corrupt"),
        ("flipped byte", "is corrupt"),
        ("empty", "truncated or corrupt"),
        ("garbage", "truncated or corrupt"),
    ],
)
def test_a_corrupt_file_is_refused_and_changes_nothing(tmp_path, name, message):
    corrupt_files(tmp_path)
    model = Everything(1)
    before = snapshot(model)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(tmp_path / name, model)
    assert_unchanged(before, model)


def test_other_safetensors_files_are_refused(tmp_path):
    plain = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, plain)
    with pytest.raises(ValueError, match="not one written by save_checkpoint"):
        load_checkpoint(plain, Two())
    newer = tmp_path / "newer.safetensors"
    header = {"format": "pytree_nn.checkpoint", "format_version": "99", "entries": "{}"}
    safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, newer, metadata=header)
    with pytest.raises(ValueError, match="format version '99'"):
        load_checkpoint(newer, Two())


def test_orbax_with_state_and_update(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    saved = Linear(2, 3, rngs=0)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "orbax", pg.state(saved).to_pure_dict())
    checkpointer.wait_until_finished()
    model = Linear(2, 3, rngs=1)
    state = pg.state(model)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state.to_pure_dict())
    restored = checkpointer.restore(tmp_path / "orbax", target)
    state.replace_by_pure_dict(restored)  # writes into the model's own Variables
    np.testing.assert_array_equal(model.kernel.value, saved.kernel.value)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_new_files_follow_the_umask_and_rewrites_keep_the_mode(tmp_path):
    path = tmp_path / "model.safetensors"
    previous = os.umask(0o022)
    try:
        save_checkpoint(path, Linear(2, 3, rngs=0))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    path.chmod(0o600)
    save_checkpoint(path, Linear(2, 3, rngs=1))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@FORMS
def test_load_into_a_frozen_module_holding_arrays_returns_a_new_model(tmp_path, form):
    # Equinox style: arrays held directly by a frozen Module cannot change in place.
    class Frozen(Module, frozen=True):
        w: jax.Array
        scale: Param

    class Outer(Module):
        def __init__(self, inner):
            self.inner = inner
            self.b = Param(jnp.zeros(2))

    path = checkpoint_path(tmp_path, form, "frozen")
    saved = Outer(Frozen(jnp.arange(3.0), Param(jnp.array(2.0))))
    saved.b.value = jnp.ones(2)
    save_checkpoint(path, saved)
    like = Outer(Frozen(jnp.zeros(3), Param(jnp.array(0.0))))
    loaded = load_checkpoint(path, like)
    assert loaded is not like
    assert loaded.inner.w.tolist() == [0.0, 1.0, 2.0]
    assert float(loaded.inner.scale.value) == 2.0 and loaded.b.value.tolist() == [1.0, 1.0]
    assert like.inner.w.tolist() == [0.0, 0.0, 0.0]  # the model given is left as it was
    assert like.b.value.tolist() == [0.0, 0.0]
    # Where everything can change in place, the model given is the one restored.
    mutable = Outer(Param(jnp.zeros(3)))
    save_checkpoint(path, Outer(Param(jnp.ones(3))))
    assert load_checkpoint(path, mutable) is mutable
    assert mutable.inner.value.tolist() == [1.0, 1.0, 1.0]


# ------------------------------------------------------------- what save_checkpoint takes


@pytest.mark.parametrize("value", [None, 5, "model", jnp.ones(2)], ids=repr)
def test_a_single_value_is_refused_and_writes_nothing(tmp_path, value):
    with pytest.raises(TypeError, match=r"save_checkpoint: `model_or_state` must be a Module"):
        save_checkpoint(tmp_path / "a.safetensors", value)
    with pytest.raises(TypeError, match=r"load_checkpoint: `model` must be a Module"):
        load_checkpoint(tmp_path / "a.safetensors", value)
    with pytest.raises(TypeError, match=r"`path` must be a str or os.PathLike"):
        save_checkpoint(None, Linear(2, 2, rngs=0))
    assert os.listdir(tmp_path) == []


def test_metadata_holding_nan_is_refused_when_saving(tmp_path):
    model = Two(threshold=float("nan"))
    with pytest.raises(ValueError, match=r"Param at \.a has the metadata threshold=nan"):
        save_checkpoint(tmp_path / "a.safetensors", model)
    with pytest.raises(ValueError, match=r"Param at \.a has the metadata limits=\(1.0, inf\)"):
        save_checkpoint(tmp_path / "a.safetensors", Two(limits=(1.0, float("inf"))))
    assert os.listdir(tmp_path) == []


def test_an_unwritable_directory_is_reported_for_the_path_given(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    real_open = os.open

    def refusing_open(name, flags, *args):
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", name)
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(PermissionError) as error:
        save_checkpoint(path, Linear(2, 2, rngs=0))
    assert error.value.filename == str(path)
    assert f"cannot write {str(path)!r}" in str(error.value) and ".tmp" not in str(error.value)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="POSIX permissions, which bind non-root users"
)
def test_a_read_only_directory_is_reported_for_the_path_given(tmp_path):
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match=r"cannot write .*read-only/model\.safetensors"):
            save_checkpoint(directory / "model.safetensors", Linear(2, 2, rngs=0))
    finally:
        directory.chmod(0o755)
    assert os.listdir(directory) == []


# ------------------------------------------------------------------------ damaged headers


class Small(Module):
    """A little of every kind of state, for a checkpoint of a few kilobytes."""

    def __init__(self, seed):
        self.layer = Linear(2, 2, rngs=seed)
        self.tied = self.layer.kernel
        self.scale = Param(jnp.full((2,), seed + 0.5), sharding=(None,))
        self.steps = Variable(seed)
        self.raw = jnp.arange(2.0) + seed
        self.rngs = Rngs(seed)


def read_whole(path):
    """The safetensors metadata and the arrays of the file at `path`."""
    with safetensors.safe_open(path, framework="np") as file:
        header = file.metadata()
    return header, safetensors.numpy.load_file(path)


def rewrite_entries(path, change):
    """Rewrite the header entries of the checkpoint at `path` with `change(entries)`."""
    header, tensors = read_whole(path)
    entries = json.loads(header["entries"])
    change(entries)
    header["entries"] = json.dumps(entries)
    safetensors.numpy.save_file(tensors, path, metadata=header)


def _drop(name):
    def change(entries):
        del entries["layer/bias"][name]

    return change


def _set(name, value):
    def change(entries):
        entries["layer/bias"][name] = value

    return change


def _replace(value):
    def change(entries):
        entries["layer/bias"] = value

    return change


def _rename(entries):
    entries["~2layer/bias"] = entries.pop("layer/bias")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_drop("kind"), "has no kind"),
        (_drop("shape"), "has no shape"),
        (_drop("dtype"), "has no dtype"),
        (_drop("crc32"), "has no crc32"),
        (_replace([1, 2]), "is a list, not a mapping"),
        (_replace(None), "is a NoneType, not a mapping"),
        (_set("shape", None), "has the shape None"),
        (_set("shape", [2, -1]), r"has the shape \[2, -1\]"),
        (_set("shape", "2"), "has the shape '2'"),
        (_set("kind", "tensor"), "has the kind 'tensor'"),
        (_set("kind", "python"), "has the dtype 'float32' for a value of kind 'python'"),
        (_set("dtype", 3), "has the dtype 3"),
        (_set("crc32", "0"), "has the checksum '0'"),
        (_set("key_impl", 1), "has the PRNG implementation 1"),
        (_set("metadata", None), "a Variable type without metadata"),
        (_rename, r"'~2layer/bias' is not a key save_checkpoint writes"),
    ],
)
def test_a_malformed_header_entry_is_refused_and_changes_nothing(tmp_path, change, message):
    path = tmp_path / "small.safetensors"
    save_checkpoint(path, Small(0))
    if change is _rename:
        # Renamed in the arrays as well, so that only the key's spelling is wrong.
        header, tensors = read_whole(path)
        tensors["~2layer/bias"] = tensors.pop("layer/bias")
        safetensors.numpy.save_file(tensors, path, metadata=header)
    rewrite_entries(path, change)
    model = Small(1)
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"not a readable checkpoint .*{message}"):
        load_checkpoint(path, model)
    assert_unchanged(before, model)


def test_every_flipped_byte_is_refused_or_loaded_exactly(tmp_path):
    """Each byte of the header (and every third byte of the arrays) changed in two ways:
    loading raises the documented ValueError and leaves the model as it was, or succeeds
    with exactly the values saved."""
    path = tmp_path / "small.safetensors"
    saved = Small(0)
    save_checkpoint(path, saved)
    content = path.read_bytes()
    header_end = 8 + int.from_bytes(content[:8], "little")
    positions = [*range(header_end), *range(header_end, len(content), 3)]
    damaged = tmp_path / "damaged.safetensors"
    model = Small(1)
    before = snapshot(model)
    unexpected, loaded = [], 0
    for position in positions:
        for mask in (0x01, 0xFF):
            flipped = bytearray(content)
            flipped[position] ^= mask
            damaged.write_bytes(bytes(flipped))
            try:
                load_checkpoint(damaged, model)
            except ValueError:
                assert_unchanged(before, model)
                continue
            except Exception as error:  # anything else is a failure, listed below
                unexpected.append((position, mask, type(error).__name__, str(error)[:80]))
                assert_unchanged(before, model)
                continue
            loaded += 1
            assert_same_values(model, saved)
            model = Small(1)
    assert unexpected == []
    assert loaded < len(positions)  # almost every change is caught


# ------------------------------------------------------------- the functional style's state


class Net(Module):
    def __init__(self, rngs):
        self.hidden = Linear(2, 8, rngs=rngs)
        self.dropout = Dropout(0.2, rngs=rngs)
        self.out = Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(jax.nn.relu(self.hidden(x))))


@FORMS
def test_an_optax_state_saves_and_loads_as_a_new_state(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "opt_state")
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1))
    model = Net(Rngs(0))
    params = filter(model, is_inexact_array)  # None where the dropout keys are
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state, params)  # a count of 1, moments not zero
    save_checkpoint(path, opt_state)
    template = tx.init(filter(Net(Rngs(1)), is_inexact_array))
    before = jax.tree.leaves(template)
    loaded = load_checkpoint(path, template)
    # A tuple of namedtuples cannot change in place: a new state, the template as it was.
    assert loaded is not template
    assert jax.tree.structure(loaded) == jax.tree.structure(opt_state)
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(opt_state), strict=True):
        np.testing.assert_array_equal(got, want)
    assert int(loaded[1][0].count) == 1
    assert loaded[1][0].mu.dropout.rngs.default.key.value is None
    for got, kept in zip(jax.tree.leaves(template), before, strict=True):
        assert got is kept


tx = optax.adam(0.05)


def loss_and_model(model, x, y):
    return jnp.mean((model(x) - y) ** 2), model  # the model whose dropout counter moved on


@filter_jit
def functional_step(model, opt_state, x, y):
    (loss, model), grads = filter_value_and_grad(loss_and_model, has_aux=True)(model, x, y)
    updates, opt_state = tx.update(grads, opt_state, filter(model, is_inexact_array))
    return apply_updates(model, updates), opt_state, loss


@FORMS
def test_functional_training_resumes_from_a_checkpoint_with_identical_results(tmp_path, form):
    x = jnp.linspace(-1, 1, 32).reshape(16, 2)
    y = jnp.sin(3 * x[:, :1]) + x[:, 1:]
    model = Net(Rngs(0))
    opt_state = tx.init(filter(model, is_inexact_array))
    for _ in range(3):
        model, opt_state, _ = functional_step(model, opt_state, x, y)
    save_checkpoint(checkpoint_path(tmp_path, form, "model"), model)
    save_checkpoint(checkpoint_path(tmp_path, form, "opt_state"), opt_state)

    resumed = Net(Rngs(7))  # another initialisation: everything comes from the files
    resumed = load_checkpoint(checkpoint_path(tmp_path, form, "model"), resumed)
    resumed_state = tx.init(filter(resumed, is_inexact_array))
    resumed_state = load_checkpoint(checkpoint_path(tmp_path, form, "opt_state"), resumed_state)
    for _ in range(3):
        model, opt_state, loss = functional_step(model, opt_state, x, y)
        resumed, resumed_state, resumed_loss = functional_step(resumed, resumed_state, x, y)
        assert float(resumed_loss) == float(loss)
    assert_same_values(resumed, model)
    for got, want in zip(jax.tree.leaves(resumed_state), jax.tree.leaves(opt_state), strict=True):
        np.testing.assert_array_equal(got, want)


def test_importing_pytree_nn_does_not_import_orbax():
    """orbax-checkpoint (the orbax extra) is imported when a directory is saved or loaded."""
    code = (
        "import sys, pytree_nn; print(sorted(m for m in sys.modules if m.split('.')[0] == 'orbax'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


class Layered(Module):
    """A model whose Variables carry layout metadata (`sharding`, and `mesh` when given)."""

    def __init__(self, kernel_axes, bias_axes, mesh=None, seed=0, **metadata):
        placement = {} if mesh is None else {"mesh": mesh}
        rng = np.random.default_rng(seed)
        kernel = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
        self.kernel = Param(kernel, sharding=kernel_axes, **placement, **metadata)
        self.bias = Param(jnp.full(16, float(seed)), sharding=bias_axes, **placement)


@pytest.mark.multi_device
@FORMS
def test_a_checkpoint_loads_onto_another_layout(tmp_path, form):
    """Saved from a model laid out for data parallelism on a mesh of (8,), loaded into the
    same model annotated for FSDP and tensor parallelism on a (2, 4) mesh: the values load,
    the model keeps its annotation, and its arrays are laid out as it says."""
    from jax.sharding import Mesh, PartitionSpec

    path = checkpoint_path(tmp_path, form, "layout")
    devices = np.array(jax.devices()[:8])
    rows = Mesh(devices, ("data",))
    saved = pg.create_sharded(lambda: Layered((None, None), (None,), seed=0), rows)
    save_checkpoint(path, saved)
    grid = Mesh(devices.reshape(2, 4), ("fsdp", "model"))
    model = pg.create_sharded(lambda: Layered(("fsdp", "model"), ("model",), seed=1), grid)
    loaded = load_checkpoint(path, model)
    assert loaded is model
    np.testing.assert_array_equal(model.kernel.value, saved.kernel.value)
    np.testing.assert_array_equal(model.bias.value, saved.bias.value)
    assert model.kernel.sharding == ("fsdp", "model") and model.bias.sharding == ("model",)
    assert model.kernel.value.sharding.mesh.shape == {"fsdp": 2, "model": 4}
    assert model.kernel.value.sharding.spec == PartitionSpec("fsdp", "model")
    assert model.bias.value.sharding.spec == PartitionSpec("model")

    # `mesh` metadata (with_partitioning(..., mesh=...)) is layout too, on either side.
    placed = Layered(("model", "fsdp"), (None,), mesh=grid, seed=2)
    load_checkpoint(path, placed)
    np.testing.assert_array_equal(placed.kernel.value, saved.kernel.value)
    assert placed.kernel.mesh is grid
    assert placed.kernel.value.sharding.spec == PartitionSpec("model", "fsdp")
    save_checkpoint(path, placed)
    plain = Layered((None, None), (None,), seed=3)
    load_checkpoint(path, plain)
    np.testing.assert_array_equal(plain.kernel.value, saved.kernel.value)
    assert "mesh" not in plain.kernel.metadata


@FORMS
def test_metadata_other_than_the_layout_is_still_checked(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "units")
    save_checkpoint(path, Layered((None, None), (None,), units="m"))
    for other in ({"units": "cm"}, {}):
        model = Layered(("x", None), ("x",), seed=1, **other)
        before = snapshot(model)
        with pytest.raises(ValueError, match=r"Param at \.kernel has metadata") as error:
            load_checkpoint(path, model)
        assert "sharding" not in str(error.value)  # the layout is not what differs
        assert_unchanged(before, model)
    model = Layered(("x", None), ("x",), seed=1, units="cm")
    load_checkpoint(path, model, check_metadata=False)
    assert model.kernel.units == "cm" and model.kernel.sharding == ("x", None)


class Noisy(Module):
    """A model with a dropout stream (Rngs): its PRNG keys are part of its state."""

    def __init__(self, seed):
        self.linear = Linear(4, 4, rngs=seed)
        self.dropout = Dropout(0.5, rngs=Rngs(seed))

    def __call__(self, x):
        return self.dropout(self.linear(x))


def _draws(model, count=3):
    x = jnp.ones((2, 4))
    return [np.asarray(model(x)) for _ in range(count)]


def _assert_same_stream(a, b):
    for x, y in zip(_draws(a), _draws(b), strict=True):
        np.testing.assert_array_equal(x, y)


@FORMS
def test_a_model_with_rngs_saves_and_its_stream_goes_on(tmp_path, form):
    path = checkpoint_path(tmp_path, form, "noisy")
    saved = Noisy(0)
    _draws(saved, 2)  # the stream has moved on
    save_checkpoint(path, saved)
    loaded = load_checkpoint(path, Noisy(1))
    assert jax.dtypes.issubdtype(loaded.dropout.rngs.default.key.value.dtype, jax.dtypes.prng_key)
    _assert_same_stream(saved, loaded)


def test_orbax_with_pure_dicts_of_a_model_with_rngs(tmp_path):
    """`to_pure_dict` of a model with Rngs keeps its typed PRNG keys, which orbax saves and
    restores; `replace_by_pure_dict` writes them back, and the stream goes on alike."""
    ocp = pytest.importorskip("orbax.checkpoint")
    saved = Noisy(0)
    _draws(saved, 1)
    pure = pg.to_pure_dict(pg.state(saved))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "orbax", pure)
        checkpointer.wait_until_finished()
        model = Noisy(1)
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, pg.to_pure_dict(pg.state(model)))
        restored = checkpointer.restore(tmp_path / "orbax", target)
    pg.replace_by_pure_dict(pg.state(model), restored)
    _assert_same_stream(saved, model)
