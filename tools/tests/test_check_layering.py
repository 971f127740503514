from pathlib import Path

import check_layering
import pytest

REPO = Path(__file__).resolve().parents[2]


def write_module(root: Path, package: str, source: str, name: str = "_code.py") -> Path:
    package_dir = root / "packages" / package.replace("_", "-") / "src" / package
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / "__init__.py").touch()
    path = package_dir / name
    path.write_text(source)
    return path


def test_repository_passes() -> None:
    assert check_layering.main([str(REPO)]) == 0


def test_allowed_imports_pass(tmp_path: Path) -> None:
    write_module(
        tmp_path,
        "pytree_nn",
        "import jax\nimport pytree_graph\nfrom pytree_filter import is_array\nfrom . import _x\n",
    )
    write_module(tmp_path, "pytree_module", "from pytree_filter._predicates import is_array\n")
    assert check_layering.check_tree(tmp_path) == []


def test_catches_upward_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_module(tmp_path, "pytree_module", '"""Doc."""\n\nfrom pytree_graph import split\n')
    [violation] = check_layering.check_tree(tmp_path)
    assert (violation.path, violation.line, violation.imported) == (path, 3, "pytree_graph")

    assert check_layering.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:3: pytree_module imports 'pytree_graph'" in err
    assert "pytree_module may import only: pytree_filter" in err


def test_catches_sibling_import_in_package_without_siblings(tmp_path: Path) -> None:
    write_module(tmp_path, "pytree_filter", "def f():\n    import pytree_module.tree\n")
    [violation] = check_layering.check_tree(tmp_path)
    assert violation.line == 2
    assert "pytree_filter may import only: no sibling package" in str(violation)


def test_catches_forbidden_equinox_import(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "pytree_nn",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import equinox as eqx\n",
    )
    write_module(tmp_path, "pytree_graph", "from flax.nnx import split\n")
    violations = check_layering.check_tree(tmp_path)
    assert sorted(v.imported for v in violations) == ["equinox", "flax.nnx"]
    equinox = next(v for v in violations if v.imported == "equinox")
    assert (equinox.path, equinox.line) == (path, 4)
    assert "equinox, flax, refx are never imported by package code" in str(equinox)


def test_unknown_package_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_module(tmp_path, "pytree_extra", "import jax\n")
    assert check_layering.main([str(tmp_path)]) == 2
    assert "'pytree_extra' has no line in the layering table" in capsys.readouterr().err
