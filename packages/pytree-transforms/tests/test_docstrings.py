"""Every example in the public docstrings runs and prints what it shows."""

import doctest
import importlib
import importlib.util
import pkgutil
import subprocess
import sys

import pytest

import pytree_transforms

MODULES = [
    importlib.import_module(f"pytree_transforms.{info.name}")
    for info in pkgutil.iter_modules(pytree_transforms.__path__)
]

# Packages some examples need that this package does not depend on (the tqdm progress meter
# needs the optional `tqdm`), each
# with the text that marks such an example. Where one is not installed (the package's own
# environment), the docstrings whose examples show that text are not run.
OPTIONAL = {"tqdm": "TqdmProgressMeter"}


# Modules whose examples trace `jax.debug.breakpoint`: run in a process of their own, as
# test_debug_and_caches.py's `run_in_a_fresh_interpreter` explains.
OWN_PROCESS = {"pytree_transforms._breakpoint"}


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    if module.__name__ in OWN_PROCESS:
        script = (
            "import doctest, sys, importlib\n"
            f"module = importlib.import_module({module.__name__!r})\n"
            "flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE\n"
            "result = doctest.testmod(module, optionflags=flags)\n"
            "sys.exit(1 if result.failed or not result.attempted else 0)\n"
        )
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return
    missing = [mark for name, mark in OPTIONAL.items() if importlib.util.find_spec(name) is None]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(module):
        if not any(mark in example.source for example in test.examples for mark in missing):
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
