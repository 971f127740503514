"""Checkpoints: `save_checkpoint` and `load_checkpoint`, to one safetensors file (one host) or
to a directory written with orbax-checkpoint (any number of hosts), now or in the background."""

import atexit
import concurrent.futures.thread  # noqa: F401  (its exit hook first: see below)
import functools
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytree_graph
from pytree_filter import Path, path_text
from pytree_graph import State, Variable
from pytree_module import TraceContextError

from ._checkpoint_entries import (
    METADATA_DIFFERS,
    SAVED,
    decode_key,
    is_int,
    mismatch,
    placed,
)
from ._checkpoint_entries import encode_path as encode_path  # what the docs' doctest imports
from ._checkpoint_file import (
    FileReader,
    check_file_path,
    file_contents,
    spanned_processes,
    write_file,
)
from ._checkpoint_orbax import (
    DirectoryReader,
    directory_contents,
    directory_lock,
    start_save,
    steps,
)
from ._checks import check_graph

_SHOWN = 10  # problems listed in one error


class SaveHandle:
    """A checkpoint being written in the background, as `save_checkpoint(..., wait=False)`
    returns it.

    The values were taken when `save_checkpoint` returned (the arrays copied to the host):
    training can go on and change the model while they are written.

    Attributes:
        path: the path given to `save_checkpoint`.
        step: the step of a directory checkpoint; None for a single file.

    Examples:
        >>> import os, tempfile
        >>> from pytree_nn import Linear, save_checkpoint
        >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> handle = save_checkpoint(path, Linear(2, 3, rngs=0), wait=False)
        >>> handle.wait()  # written (or raises what went wrong)
        >>> handle.done()
        True
    """

    def __init__(self, path: str, step: int | None, finish: Callable[[], None]):
        self.path = path
        self.step = step
        self._error: BaseException | None = None
        self._reported = False
        self._thread = threading.Thread(
            target=self._run, args=(finish,), name=f"save_checkpoint {path}"
        )
        self._thread.start()

    def _run(self, finish: Callable[[], None]) -> None:
        try:
            finish()
        except BaseException as error:  # kept for `wait`, which raises it in the caller
            self._error = error

    def done(self) -> bool:
        """Whether the save has finished (written, or failed)."""
        return not self._thread.is_alive()

    def wait(self) -> None:
        """Block until the checkpoint is written.

        Raises:
            Exception: what went wrong while writing (each time `wait` is called); the
                checkpoint saved before at the same path is then still the one there.
        """
        self._thread.join()
        if self._error is not None:
            self._reported = True
            raise self._error

    def __repr__(self) -> str:
        state = "failed" if self._error else "written" if self.done() else "writing"
        step = "" if self.step is None else f", step={self.step}"
        return f"SaveHandle({self.path!r}{step}, {state})"


_pending: dict[str, SaveHandle] = {}
_pending_lock = threading.Lock()


def _settle(path: str) -> None:
    """Wait for the background save to `path`, if one is running: saves and loads of one path
    happen in the order they were asked for. A failure nobody waited for is warned about."""
    with _pending_lock:
        handle = _pending.pop(os.path.realpath(path), None)
    if handle is not None:
        _wait_or_warn(handle)


def _wait_or_warn(handle: SaveHandle) -> None:
    reported = handle._reported  # a failure its caller has seen already goes unwarned
    try:
        handle.wait()
    except Exception as error:
        if not reported:
            warnings.warn(
                f"save_checkpoint({handle.path!r}, ..., wait=False) failed and was never "
                f"waited for: {type(error).__name__}: {error}",
                RuntimeWarning,
                stacklevel=3,
            )


def _wait_for_every_save() -> None:
    """A program that ends right after `save_checkpoint(..., wait=False)` still saves."""
    with _pending_lock:
        handles = list(_pending.values())
        _pending.clear()
    for handle in handles:
        _wait_or_warn(handle)


# Run at the start of the interpreter's shutdown, before the thread pools that orbax writes
# with stop taking work (they stop in a hook registered when `concurrent.futures.thread` is
# first imported; such hooks run newest first, and plain `atexit` ones only afterwards): a
# background save then finishes, instead of failing with tracebacks of orbax's threads.
# (CPython's hook; elsewhere, a plain `atexit` one.)
getattr(threading, "_register_atexit", atexit.register)(_wait_for_every_save)


def _check_step(function: str, step: Any) -> None:
    if step is not None and not (is_int(step) and step >= 0):
        raise TypeError(f"{function}: `step` must be None or an int >= 0, got {step!r}.")


def _is_directory(path: str, flat: dict[Path, Any]) -> bool:
    """Whether a save to `path` writes a directory: a path ending in a separator, naming a
    directory, or new and without a file extension (`ckpt`, `runs/step_100`) does; an
    existing file stays one. A path with another extension than `.safetensors` is a
    directory too when some array is spread over several processes (no one process could
    write it whole)."""
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return True
    if path.endswith(".safetensors") or os.path.exists(path):
        return False
    if not os.path.splitext(os.path.basename(path))[1]:
        return True
    return any(
        spanned_processes(leaf.value if isinstance(leaf, Variable) else leaf) > 1
        for leaf in flat.values()
    )


def save_checkpoint(
    path: str | os.PathLike,
    model_or_state: Any,
    *,
    wait: bool = True,
    step: int | None = None,
    keep: int | None = 1,
) -> SaveHandle | None:
    """Save a model's state (or a `State`): to one safetensors file, or to a directory.

    Every Variable and array is written under its path (see "Keys" below), keeping its
    dtype (`bfloat16` and PRNG keys included), with the Variable types and metadata. A
    Variable shared by several parts of the model is stored once. Nothing is pickled.

    **One file** (a path with a file extension, conventionally `.safetensors`, or naming an
    existing file): for one host. The file is written under a temporary name in the same
    directory, flushed to disk, and renamed over `path`: a failure part-way leaves any
    earlier file at `path` as it was, and a reader never sees half a file. Each array has
    a checksum. Arrays spread over the devices of several processes cannot be gathered
    into one file: that raises an error naming the directory form.

    **A directory** (a path ending in `/`, naming an existing directory, or new and without
    a file extension, such as `ckpt` or `runs/step_100`; also a path with another extension
    than `.safetensors` when arrays are spread over several processes): written with
    orbax-checkpoint (`pip install 'pytree-nn[orbax]'`). In a `jax.distributed` program
    every process calls `save_checkpoint` alike and writes only the shards it holds. Each
    save is a folder `path/<step>`, which appears whole or not at all: a save cut off
    leaves the earlier steps loadable, and the next save deletes what it left. `keep`
    says how many steps stay. Saves to one directory take turns within a process (a
    save waits for the one in progress), and another program saving to the directory
    at the same time is refused with a RuntimeError: the directory's lock file
    (`_pytree_nn.lock`) is held for the whole save. The processes of one
    `jax.distributed` job are one writer (their first process holds the lock).

    Keys: the keys of a path joined by `/`, ints in decimal (`layers/0/kernel`); in str
    keys `~` is written `~0` and `/` is written `~1`, and a str that is empty or reads as
    an int is prefixed with `~2`.

    Arguments:
        path: the file or directory to write.
        model_or_state: a Module (or any graph of Modules and Variables), whose whole
            state is saved; a `State`, e.g. `pytree_graph.state(model, Param)` to save
            the parameters only; or any pytree of arrays, such as an optax optimizer
            state (`tx.init(filter(model, is_inexact_array))`).
        wait: wait until the checkpoint is written (the default); with `wait=False`, take
            the values now (arrays copied to the host) and write them in the background,
            returning a `SaveHandle` (`.wait()`). A later save or load of the same path
            waits for it first; so does the end of the program (on Python 3.12 and
            later, a directory's save cannot finish once the program ends: Python then
            refuses the threads orbax starts; call `.wait()` first).
        step: directories only: the number of this save (a folder name); by default one
            more than the newest step there (0 in a new directory). It must be greater
            than every step already there.
        keep: directories only: how many of the newest steps to keep (older ones are
            deleted once the new one is written), or None to keep every step.

    Returns:
        None, or with `wait=False` a `SaveHandle`.

    Raises:
        TypeError: `path` is not a path, `model_or_state` is a single value (None, a
            number, an array) rather than something holding state, a Variable holds
            something that is not an array, a Python scalar or None, or a path has a
            key that is not a str or int. Nothing is written.
        ValueError: a Variable's metadata holds a NaN or an infinity (JSON has neither);
            an array spread over several processes is saved to one file; `step` or
            `keep` is given for a file, or `step` is not new; the directory holds other
            things than checkpoints.
        ImportError: a directory is asked for and orbax-checkpoint is not installed.
        RuntimeError: another program is saving to the same directory (named, with the
            process that holds its lock). Nothing is written.
        FileNotFoundError: the directory that would hold `path` does not exist.
        PermissionError: the directory of `path` cannot be written to.

    Examples:
        >>> import os, tempfile
        >>> from pytree_nn import Linear, load_checkpoint, save_checkpoint
        >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> save_checkpoint(path, Linear(2, 3, rngs=0))
        >>> restored = load_checkpoint(path, Linear(2, 3, rngs=1))
        >>> bool((restored.kernel.value == Linear(2, 3, rngs=0).kernel.value).all())
        True
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"save_checkpoint: `path` must be a str or os.PathLike (the file or directory to "
            f"write), got a {type(path).__name__} ({path!r})."
        )
    check_graph("save_checkpoint", "model_or_state", model_or_state, SAVED)
    if not isinstance(wait, bool):
        raise TypeError(f"save_checkpoint: `wait` must be True or False, got {wait!r}.")
    _check_step("save_checkpoint", step)
    if keep is not None and not (is_int(keep) and keep >= 1):
        raise TypeError(
            f"save_checkpoint: `keep` must be an int >= 1 (how many steps to keep) or None "
            f"(keep them all), got {keep!r}."
        )
    path = os.fspath(path)
    state = model_or_state if isinstance(model_or_state, State) else None
    if state is None:
        state = pytree_graph.state(model_or_state)
    flat = dict(state.flat_state())
    _settle(path)
    if _is_directory(path, flat):
        arrays, document = directory_contents(flat)
        step, finish = start_save(path, arrays, document, step, keep)
    else:
        if step is not None or keep != 1:
            raise ValueError(
                f"save_checkpoint: `step` and `keep` apply to checkpoint directories, and "
                f"{path!r} is a file. Save to a directory (a path ending in '/') to keep "
                "several steps."
            )
        tensors, header = file_contents(flat, copy=not wait)
        check_file_path(path)
        finish = functools.partial(write_file, path, tensors, header)
    if wait:
        finish()
        return None
    handle = SaveHandle(path, step, finish)
    with _pending_lock:
        _pending[os.path.realpath(path)] = handle
    return handle


def checkpoint_steps(path: str | os.PathLike) -> list[int]:
    """The steps saved in a checkpoint directory, oldest first.

    A save still being written (`wait=False`) is waited for first. Only whole steps are
    listed, each of which loads: a save that was cut off, a step whose deletion was cut off
    (a folder that lacks a part), and orbax's temporary folders are not (the next save
    deletes them).

    Arguments:
        path: a directory `save_checkpoint` wrote to.

    Returns:
        The steps, e.g. `[200, 300]` after saving steps 100, 200 and 300 with `keep=2`.

    Raises:
        NotADirectoryError: `path` is not a directory (a single-file checkpoint has no steps).

    Examples:
        >>> import os, tempfile
        >>> from pytree_nn import Linear, checkpoint_steps, save_checkpoint
        >>> directory = os.path.join(tempfile.mkdtemp(), "run") + "/"
        >>> for step in (100, 200, 300):
        ...     save_checkpoint(directory, Linear(2, 3, rngs=0), step=step, keep=2)
        >>> checkpoint_steps(directory)
        [200, 300]
    """
    path = os.fspath(path)
    _settle(path)
    if not os.path.isdir(path):
        raise NotADirectoryError(
            f"checkpoint_steps: {path!r} is not a directory; only checkpoint directories "
            "hold steps."
        )
    with directory_lock(path):
        return steps(path)


def load_checkpoint(
    path: str | os.PathLike,
    model: Any,
    *filters: Any,
    check_metadata: bool = True,
    step: int | None = None,
) -> Any:
    """Load a checkpoint written by `save_checkpoint` into `model`, in place where it can.

    The checkpoint must hold exactly the model's state (or, with filters, the part they
    select): the same paths, Variable types, metadata (other than the layout: `sharding`
    and `mesh`), shapes and dtypes. Everything is
    checked before any value is written (for a file, the checksums too), so a checkpoint
    that does not fit, or is cut off or damaged, raises and leaves the model as it was.
    Each value goes where the one it replaces is: its devices and sharding, on any mesh
    and across any number of processes (from a directory, each process reads only the
    shards it needs); a model of `jax.ShapeDtypeStruct`s (from `pytree_graph.eval_shape`)
    gets arrays laid out as their shardings say. A shared Variable is restored once, for
    all its references.

    Arguments:
        path: the checkpoint file, or directory (whose newest step is loaded).
        model: the model to restore into (a Module, or any graph of Modules and
            Variables, or any pytree of arrays such as an optax state), built with the
            same structure as the one saved.
        *filters: the part of the model the checkpoint holds, as for
            `pytree_graph.state` (e.g. `Param` for a checkpoint saved from
            `pytree_graph.state(model, Param)`); by default, all of it.
        check_metadata: require the Variables' metadata to match the checkpoint's (the
            model's own metadata is kept either way). The layout metadata (`sharding`,
            `mesh`) is never compared: it says where values live, and the model's own
            decides where the loaded arrays go (another mesh shape, FSDP instead of
            data parallelism).
        step: directories only: the step to load (see `checkpoint_steps`); by default
            the newest.

    Returns:
        `model`, restored in place; or, when it holds arrays directly in something that
        cannot change in place (a frozen Module, Equinox style: `class M(Module,
        frozen=True)` with `w: jax.Array`; a tuple or namedtuple, as in an optax state),
        a new model (or state) with the loaded values, and `model` unchanged.
        `model = load_checkpoint(path, model)` works either way.

    Raises:
        TypeError: `path` is not a path, or `model` is a single value (None, a number,
            an array) rather than something holding state.
        ValueError: the path is not a checkpoint, is cut off or damaged, or does not
            match the model (the message lists what differs); `step` is given for a
            file, or is not in the directory. `model` is left as it was.
        ImportError: `path` is a directory and orbax-checkpoint is not installed.

    Examples:
        >>> import os, tempfile
        >>> import jax.numpy as jnp
        >>> from pytree_graph import Param
        >>> from pytree_nn import Linear, load_checkpoint, save_checkpoint
        >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
        >>> save_checkpoint(path, Linear(2, 3, rngs=0))
        >>> load_checkpoint(path, Linear(2, 4, rngs=0))
        Traceback (most recent call last):
        ...
        ValueError: load_checkpoint: ... .bias is float32[4] in the model but float32[3] in ...
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"load_checkpoint: `path` must be a str or os.PathLike (the file or directory to "
            f"read), got a {type(path).__name__} ({path!r})."
        )
    check_graph("load_checkpoint", "model", model, SAVED)
    _check_step("load_checkpoint", step)
    path = os.fspath(path)
    _settle(path)
    states = pytree_graph.state(model, *filters)
    flat: dict[Path, Any] = {}
    for part in states if isinstance(states, tuple) else (states,):
        flat.update(part.flat_state())
    if os.path.isdir(path):
        reader = DirectoryReader(path, step)
    elif step is not None:
        raise ValueError(
            f"load_checkpoint: `step` applies to checkpoint directories, and {path!r} is a file."
        )
    else:
        reader = FileReader(path)
    try:
        values = _read_fitting(path, model, flat, reader, check_metadata)
    finally:
        reader.close()
    try:
        # `update` checks every path before it writes one, so when it refuses, nothing of
        # `model` has changed.
        pytree_graph.update(model, State.from_flat_path(values))
    except TraceContextError:
        raise  # a write refused inside a trace is the caller's error, not a form of model
    except ValueError:
        # Arrays held directly by frozen Modules, tuples or namedtuples (an Equinox-style
        # model, an optax state) cannot change in place: build a new graph with the
        # loaded values, which `model = load_checkpoint(...)` takes.
        graphdef, whole = pytree_graph.split(model)
        everything = dict(whole.flat_state())
        for leaf_path, value in values.items():
            leaf = everything[leaf_path]
            everything[leaf_path] = leaf.replace(value) if isinstance(leaf, Variable) else value
        return pytree_graph.merge(graphdef, State.from_flat_path(everything))
    return model


def _read_fitting(
    path: str,
    model: Any,
    flat: dict[Path, Any],
    reader: FileReader | DirectoryReader,
    check_metadata: bool,
) -> dict[Path, Any]:
    """The checkpoint's values for the model's `flat` state, each in the form of the value
    it replaces; or a ValueError listing everything that does not fit."""
    saved = {decode_key(key): key for key in reader.entries}
    problems = [
        f"{path_text(p)} is in the model but not in the checkpoint" for p in flat if p not in saved
    ]
    problems += [
        f"{path_text(p)} is in the checkpoint but not in the model" for p in saved if p not in flat
    ]
    wanted: dict[str, tuple[Path, Any]] = {}
    for leaf_path, leaf in flat.items():
        key = saved.get(leaf_path)
        if key is None:
            continue
        problem = mismatch(leaf_path, leaf, reader.entries[key], check_metadata)
        if problem is not None:
            problems.append(problem)
            continue
        wanted[key] = (leaf_path, leaf.value if isinstance(leaf, Variable) else leaf)
    if not problems:  # read the arrays once the checkpoint fits: laid out as the model's
        values, problems = reader.values(wanted)
    if problems:
        listed = "; ".join(problems[:_SHOWN])
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise ValueError(
            f"load_checkpoint: {path!r} does not fit the {type(model).__name__}: "
            f"{listed}{more}. Nothing was loaded. Build the model as it was when saved"
            + (
                ", or pass check_metadata=False to ignore metadata."
                if any(METADATA_DIFFERS in problem for problem in problems)
                else "."
            )
        )
    return {
        leaf_path: placed(values[key], current, reader.entries[key]["kind"])
        for key, (leaf_path, current) in wanted.items()
    }
