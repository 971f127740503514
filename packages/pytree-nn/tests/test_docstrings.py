"""Every example in the public docstrings runs and prints what it shows."""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import pytree_nn

MODULES = [
    importlib.import_module(f"pytree_nn.{info.name}")
    for info in pkgutil.iter_modules(pytree_nn.__path__)
]
# Examples that save a checkpoint directory, which needs the orbax extra (the isolation
# check's wheels are installed without it).
NEEDS_ORBAX = {"pytree_nn._checkpoint.checkpoint_steps"}
HAS_ORBAX = importlib.util.find_spec("orbax") is not None


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(module):
        if HAS_ORBAX or test.name not in NEEDS_ORBAX:
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_the_examples_that_need_orbax_exist():
    names = {test.name for module in MODULES for test in doctest.DocTestFinder().find(module)}
    assert names >= NEEDS_ORBAX
