"""Every example in the public docstrings runs and prints what it shows."""

import doctest
import importlib
import pkgutil

import pytest

import pytree_filter

MODULES = [
    importlib.import_module(f"pytree_filter.{info.name}")
    for info in pkgutil.iter_modules(pytree_filter.__path__)
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_importing_loads_no_sibling_package():
    import subprocess
    import sys

    code = (
        "import sys, pytree_filter; "
        "print([m for m in ('pytree_module', 'pytree_transforms', 'pytree_graph', "
        "'pytree_nn') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
