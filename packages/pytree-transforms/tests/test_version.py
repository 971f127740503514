import re
from importlib.metadata import version
from importlib.resources import files

import pytree_transforms


def test_version_is_semver() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", pytree_transforms.__version__)


def test_version_matches_distribution_metadata() -> None:
    assert version("pytree-transforms") == pytree_transforms.__version__


def test_ships_py_typed_marker() -> None:
    assert files(pytree_transforms).joinpath("py.typed").is_file()
