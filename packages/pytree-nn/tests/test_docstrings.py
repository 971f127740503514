"""Every example in the public docstrings runs and prints what it shows."""

import doctest
import importlib
import pkgutil

import pytest

import pytree_nn

MODULES = [
    importlib.import_module(f"pytree_nn.{info.name}")
    for info in pkgutil.iter_modules(pytree_nn.__path__)
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
