import re
import shutil
import tomllib
from pathlib import Path

import bump_version
import pytest

REPO = Path(__file__).resolve().parents[2]
NAMES = ["pytree-filter", "pytree-module", "pytree-transforms", "pytree-graph", "pytree-nn"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(
        REPO / "packages",
        tmp_path / "packages",
        ignore=shutil.ignore_patterns("tests", "__pycache__", "*.py[cod]"),
    )
    return tmp_path


def about_version(root: Path, name: str) -> str:
    text = (root / "packages" / name / "src" / name.replace("-", "_") / "__about__.py").read_text()
    return re.search(r'__version__ = "([^"]*)"', text).group(1)


def sibling_pins(root: Path) -> dict[str, dict[str, str]]:
    """Map each package to {sibling: specifier} for its sibling requirements."""
    pins = {}
    for name in NAMES:
        config = tomllib.loads((root / "packages" / name / "pyproject.toml").read_text())
        pins[name] = {
            match.group(1): match.group(2)
            for dependency in config["project"]["dependencies"]
            if (match := re.fullmatch(r"(pytree-[a-z]+)(.*)", dependency))
        }
    return pins


def snapshot(root: Path) -> dict[Path, str]:
    return {path: path.read_text() for path in sorted(root.rglob("*")) if path.is_file()}


def test_repository_pins_admit_current_versions() -> None:
    for pins in sibling_pins(REPO).values():
        for sibling, specifier in pins.items():
            version = about_version(REPO, sibling)
            upper = bump_version.upper_bound(version)
            assert specifier == f">={version},<{upper}", (sibling, specifier)


def test_bumps_every_package_and_pin(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = about_version(root, "pytree-module")
    old_pin = sibling_pins(root)["pytree-transforms"]["pytree-filter"]
    assert bump_version.main(["7.8.9", "--root", str(root)]) == 0
    assert {name: about_version(root, name) for name in NAMES} == dict.fromkeys(NAMES, "7.8.9")
    pins = sibling_pins(root)
    assert pins["pytree-nn"] == {
        "pytree-graph": ">=7.8.9,<8",
        "pytree-transforms": ">=7.8.9,<8",
        "pytree-module": ">=7.8.9,<8",
        "pytree-filter": ">=7.8.9,<8",
    }
    assert pins["pytree-filter"] == {}
    out = capsys.readouterr().out
    assert f"pytree-module version {old} -> 7.8.9" in out
    assert f'"pytree-filter{old_pin}" -> "pytree-filter>=7.8.9,<8"' in out


def test_bumps_only_named_package(root: Path) -> None:
    filter_pin = sibling_pins(root)["pytree-transforms"]["pytree-filter"]
    filter_version = about_version(root, "pytree-filter")
    assert bump_version.main(["0.42.0", "--package", "pytree-module", "--root", str(root)]) == 0
    assert about_version(root, "pytree-module") == "0.42.0"
    assert about_version(root, "pytree-filter") == filter_version
    pins = sibling_pins(root)
    assert pins["pytree-transforms"] == {
        "pytree-filter": filter_pin,
        "pytree-module": ">=0.42.0,<0.43",
    }
    assert pins["pytree-graph"]["pytree-module"] == ">=0.42.0,<0.43"
    assert pins["pytree-nn"]["pytree-module"] == ">=0.42.0,<0.43"


def test_upper_bound() -> None:
    assert bump_version.upper_bound("0.1.7") == "0.2"
    assert bump_version.upper_bound("0.10.0") == "0.11"
    assert bump_version.upper_bound("1.0.0") == "2"
    assert bump_version.upper_bound("2.5.3") == "3"


@pytest.mark.parametrize("version", ["1.0", "v1.0.0", "1.0.0rc1", "01.0.0", "1.0.0.0", ""])
def test_refuses_bad_version(root: Path, version: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(root)
    assert bump_version.main([version, "--root", str(root)]) == 2
    assert "is not of the form X.Y.Z" in capsys.readouterr().err
    assert snapshot(root) == before


def test_refuses_unknown_package(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(root)
    assert bump_version.main(["7.8.9", "--package", "pytree-nope", "--root", str(root)]) == 2
    assert "unknown package(s): pytree-nope" in capsys.readouterr().err
    assert snapshot(root) == before


def test_same_version_changes_nothing(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(root)
    version = about_version(root, "pytree-nn")
    assert bump_version.main([version, "--package", "pytree-nn", "--root", str(root)]) == 0
    assert snapshot(root) == before
    assert "nothing to change" in capsys.readouterr().out
