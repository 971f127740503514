import re
from importlib.metadata import version
from importlib.resources import files

import pytree_filter


def test_version_is_semver() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", pytree_filter.__version__)


def test_version_matches_distribution_metadata() -> None:
    assert version("pytree-filter") == pytree_filter.__version__


def test_ships_py_typed_marker() -> None:
    assert files(pytree_filter).joinpath("py.typed").is_file()
