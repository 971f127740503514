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
    write_module(
        tmp_path,
        "pytree_graph",
        "from pytree_module.extend import touch\nfrom pytree_transforms import extend\n"
        "def f(module):\n    return module.__dict__, module.__class__.__name__\n",
    )
    write_module(tmp_path, "pytree_module", "def f(m):\n    return m._pm_flat, m.__module_info__\n")
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


@pytest.mark.parametrize(
    ("source", "imported"),
    [
        ("from pytree_filter._predicates import is_array\n", "pytree_filter._predicates"),
        ("import pytree_module._module\n", "pytree_module._module"),
        ("from pytree_module import _trace\n", "pytree_module._trace"),
        ("def f():\n    from pytree_module.extend._x import y\n", "pytree_module.extend._x"),
        ("import pytree_module\nx = pytree_module._module\n", "pytree_module._module"),
    ],
)
def test_catches_reach_into_a_private_module(tmp_path: Path, source: str, imported: str) -> None:
    write_module(tmp_path, "pytree_graph", source)
    [violation] = check_layering.check_tree(tmp_path)
    assert violation.imported == imported
    assert f"{imported!r} is private to {imported.split('.')[0]}" in str(violation)
    assert f"`{imported.split('.')[0]}.extend`" in str(violation)


def test_catches_use_of_another_package_private_slot(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "pytree_nn",
        "def f(m, v):\n    return m._pm_flat, type(m).__module_frozen__, v._pg_flat\n",
    )
    violations = check_layering.check_tree(tmp_path)
    assert sorted(v.imported for v in violations) == [
        ".__module_frozen__",
        "._pg_flat",
        "._pm_flat",
    ]
    assert all((v.path, v.line) == (path, 2) for v in violations)
    message = str(next(v for v in violations if v.imported == "._pm_flat"))
    assert "'_pm_flat' is a private slot of pytree_module's objects" in message
    assert "`pytree_module.extend`" in message


def test_catches_an_import_cycle_even_through_a_late_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(tmp_path, "pytree_graph", "from ._b import g\n", name="_a.py")
    write_module(tmp_path, "pytree_graph", "def g():\n    from ._c import h\n", name="_b.py")
    write_module(tmp_path, "pytree_graph", "from . import _a\n", name="_c.py")
    write_module(tmp_path, "pytree_graph", "from ._a import f\n", name="_d.py")  # not in it
    [violation] = check_layering.check_tree(tmp_path)
    assert violation.imported == "pytree_graph._a, pytree_graph._b, pytree_graph._c"
    assert check_layering.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "pytree_graph has an import cycle among pytree_graph._a, pytree_graph._b" in err
    assert "move what they share into a module below them" in err


def test_importing_a_submodule_from_the_package_is_not_a_cycle(tmp_path: Path) -> None:
    # `__init__` imports every module; `from . import _a` inside `_b` loads `_a` only.
    write_module(
        tmp_path, "pytree_nn", "from ._a import f\nfrom ._b import g\n", name="__init__.py"
    )
    write_module(tmp_path, "pytree_nn", "def f():\n    pass\n", name="_a.py")
    write_module(tmp_path, "pytree_nn", "from . import _a\ng = _a.f\n", name="_b.py")
    assert check_layering.check_tree(tmp_path) == []
    # ... but importing a name from the package itself is: the package imports `_b` first.
    write_module(tmp_path, "pytree_nn", "from pytree_nn import f\ng = f\n", name="_b.py")
    [violation] = check_layering.check_tree(tmp_path)
    assert violation.imported == "pytree_nn, pytree_nn._b"
