"""What the tests of `examples/` share: import a script as a module, or run it as a user would.

`pytest.ini` puts this folder on `sys.path`, so the tests import these helpers by name.
"""

import contextlib
import importlib.util
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def example_path(name: str) -> pathlib.Path:
    """The script `examples/NAME.py`."""
    return EXAMPLES / f"{name}.py"


def load_example(name: str) -> ModuleType:
    """`examples/NAME.py` imported as a module (examples/ is not a package), without running
    its `main`. It is registered in `sys.modules`, where dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", example_path(name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _command(name: str, args: tuple[str, ...]) -> list[str]:
    # The test's own interpreter: the packages and the examples' dependencies are installed.
    return [sys.executable, str(example_path(name)), *args]


def run_example(
    name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `examples/NAME.py` with `args` (and `env`, by default this process's environment)
    and wait for it; its output is captured as text."""
    return subprocess.run(
        _command(name, args), capture_output=True, text=True, timeout=timeout, env=env
    )


@contextlib.contextmanager
def started_example(
    name: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """Start `examples/NAME.py` in the background (so it runs on the other core while the
    test goes on), with `env` as for `run_example`; read it with `.communicate()`. It is
    killed if still running at the end."""
    process = subprocess.Popen(
        _command(name, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        yield process
    finally:
        if process.poll() is None:  # a test failed before waiting for it
            process.kill()
            process.communicate()


def assert_refused(main: Callable[[list[str]], Any], args: list[str], message: str, capsys) -> None:
    """`main(args)` stops with exit status 2 before doing anything: `message` on stderr and
    nothing on stdout (`capsys` is the test's fixture)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err, captured.err
    assert captured.out == ""
