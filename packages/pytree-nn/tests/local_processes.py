"""Run one script as several JAX processes on this machine, joined into one set of devices.

What runs on several hosts (a mesh spanning processes, each feeding its own part of a batch,
each holding its own shards) is tested here on one machine: every process fakes a few CPU
devices, and `jax.distributed.initialize` joins them, so that two processes of four devices
see one mesh of eight. The tests import the helper by name (`from local_processes import
run_processes`; conftest.py puts this folder on `sys.path`).
"""

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

# Prepended to every script: the environment variables are run_processes's. A script that
# raises exits at once: after `jax.distributed.initialize`, a normal exit first waits in
# JAX's shutdown barrier for the other processes, which may be waiting for this one.
PRELUDE = """\
# Added by run_processes (local_processes.py): join the other processes.
import os
import sys
import traceback

import jax


def _exit_on_error(kind, error, trace):
    traceback.print_exception(kind, error, trace)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


sys.excepthook = _exit_on_error
# What the script prints keeps stdout to itself: the C++ libraries' own output (the
# collectives library announces each connection, in pieces that would interleave with the
# script's lines) goes to stderr instead.
sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
# The collectives between processes on CPU; within one process, unused.
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if int(os.environ["PYTREE_TEST_PROCESSES"]) > 1:
    jax.distributed.initialize(
        os.environ["PYTREE_TEST_COORDINATOR"],
        num_processes=int(os.environ["PYTREE_TEST_PROCESSES"]),
        process_id=int(os.environ["PYTREE_TEST_PROCESS_ID"]),
    )
# The test's script.
"""

# Shared with tests/test_example_sharding.py, whose two-process run takes it as well.
LOCK_FILE = os.path.join(tempfile.gettempdir(), "pytree-tests-jax-distributed.lock")
# Set for the test run (hatch.toml); a child gets its own device count and no pytest options.
_NOT_INHERITED = ("XLA_FLAGS", "PYTEST_ADDOPTS")
_POLL_SECONDS = 0.1
_SHOWN_CHARACTERS = 20_000  # of each process's stdout and stderr in a failure's message


def free_port() -> int:
    """A TCP port free on localhost now (another program may take it before it is used)."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def run_processes(
    source: str,
    *,
    processes: int = 2,
    devices: int = 4,
    args: Sequence[str] = (),
    timeout: float = 240,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Run the script `source` as `processes` processes of `devices` fake CPU devices each,
    joined by `jax.distributed`, and return what each printed.

    The script is `source` after a short prelude, which selects the gloo collectives for
    CPU and, with more than one process, calls `jax.distributed.initialize`: the script
    starts with `jax.devices()` spanning every process. Each process gets the test's
    environment without `XLA_FLAGS` and `PYTEST_ADDOPTS`, plus `XLA_FLAGS` asking for
    `devices` devices, `JAX_PLATFORMS=cpu`, `PYTREE_TEST_COORDINATOR` (localhost and a
    free port), `PYTREE_TEST_PROCESSES` and `PYTREE_TEST_PROCESS_ID` (from 0), then `env`.

    All processes are polled together: as soon as one fails, or the time limit passes, every
    process still running is killed (none is left holding the port), and the error shows
    each process's exit status, stdout and stderr.

    Arguments:
        source: the text of a Python script. It runs after the prelude, so it cannot start
            with `from __future__` imports, and its line numbers in tracebacks are shifted.
        processes: how many processes; with 1, no `jax.distributed.initialize`.
        devices: fake CPU devices per process.
        args: the script's `sys.argv[1:]`, the same for every process.
        timeout: seconds for all processes together, starting included.
        env: environment variables to set (or override) in every process.

    Returns:
        What each process's script printed, in process-id order (the libraries' own
        C-level output, such as the collectives library's "[Gloo] Rank 0 is connected ...",
        goes to stderr).

    Raises:
        AssertionError: a process exited with a nonzero status, or not all had finished
            within `timeout` seconds.
        ValueError: `processes` or `devices` is below 1.

    Examples:
        >>> outputs = run_processes(
        ...     "print(jax.process_index(), jax.device_count())", devices=2
        ... )  # doctest: +SKIP
        >>> outputs  # doctest: +SKIP
        ['0 4\\n', '1 4\\n']
    """
    if processes < 1 or devices < 1:
        raise ValueError(
            f"run_processes: processes and devices must be at least 1, got {processes} "
            f"and {devices}."
        )
    # One group of processes at a time across the test run's workers: two groups starting
    # together could take the same free port, and on a small machine their collectives
    # (gloo, which gives up after 30 s) would wait on each other's compiling.
    with one_group_at_a_time():
        return _run_group(source, processes, devices, args, timeout, env)


def _run_group(
    source: str,
    processes: int,
    devices: int,
    args: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None,
) -> list[str]:
    """`run_processes` once the lock is held."""
    common = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    common |= {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTREE_TEST_COORDINATOR": f"localhost:{free_port()}",
        "PYTREE_TEST_PROCESSES": str(processes),
    }
    with tempfile.TemporaryDirectory(prefix="run_processes-") as folder:
        folder = pathlib.Path(folder)
        script = folder / "script.py"
        script.write_text(PRELUDE + source)
        outputs = [(folder / f"{i}.stdout", folder / f"{i}.stderr") for i in range(processes)]
        started: list[subprocess.Popen] = []
        killed: set[int] = set()
        timed_out = False
        try:
            for i, (stdout, stderr) in enumerate(outputs):
                # Files, not pipes: a process blocked on a full pipe would never finish.
                with stdout.open("wb") as out, stderr.open("wb") as err:
                    started.append(
                        subprocess.Popen(
                            [sys.executable, str(script), *args],
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=err,
                            env=common | {"PYTREE_TEST_PROCESS_ID": str(i)} | dict(env or {}),
                        )
                    )
            deadline = time.monotonic() + timeout
            while True:
                statuses = [process.poll() for process in started]
                if None not in statuses or any(statuses):  # all done, or one failed
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(_POLL_SECONDS)
        finally:
            # Also on any exception, KeyboardInterrupt included: no process outlives the call.
            for i, process in enumerate(started):
                if process.poll() is None:
                    process.kill()
                    killed.add(i)
            for process in started:
                process.wait()
        texts = [(_read(stdout), _read(stderr)) for stdout, stderr in outputs]
    statuses = [process.returncode for process in started]
    if timed_out or any(statuses):
        raise AssertionError(_report(statuses, killed, texts, timed_out, timeout))
    return [stdout for stdout, _ in texts]


@contextlib.contextmanager
def one_group_at_a_time() -> Iterator[None]:
    """Hold a lock that every group of `jax.distributed` processes the tests start takes
    (tests/test_example_sharding.py takes it too): a file lock, so it holds across the
    processes of pytest-xdist."""
    if fcntl is None:  # not POSIX: no lock, the groups may overlap
        yield
        return
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: pathlib.Path) -> str:
    """A process's output (stdout holds only the script's: see PRELUDE)."""
    return path.read_text(errors="replace")


def _tail(text: str) -> str:
    """The end of a long output (where a traceback is), saying how much was left out."""
    if len(text) <= _SHOWN_CHARACTERS:
        return text
    left_out = len(text) - _SHOWN_CHARACTERS
    return f"[... {left_out} characters left out ...]\n{text[-_SHOWN_CHARACTERS:]}"


def _report(
    statuses: list[int],
    killed: set[int],
    texts: list[tuple[str, str]],
    timed_out: bool,
    timeout: float,
) -> str:
    """The failure's message: what went wrong, then each process's status and output."""
    if timed_out:
        headline = (
            f"run_processes: not every process finished within the time limit of "
            f"{timeout:g} s; those still running were killed."
        )
    else:
        failed = [i for i, status in enumerate(statuses) if status and i not in killed]
        which = f"process{'es' if len(failed) > 1 else ''} {', '.join(map(str, failed))}"
        headline = f"run_processes: {which} failed; the others still running were killed."
    sections = [headline]
    for i, (status, (stdout, stderr)) in enumerate(zip(statuses, texts, strict=True)):
        state = "killed by run_processes" if i in killed else f"exit status {status}"
        sections.append(
            f"===== process {i}: {state} =====\n"
            f"----- stdout -----\n{_tail(stdout)}\n"
            f"----- stderr -----\n{_tail(stderr)}"
        )
    return "\n".join(sections)
