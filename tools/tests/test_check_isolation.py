import ast
import tomllib
from pathlib import Path

import check_isolation

REPO = Path(__file__).resolve().parents[2]


def imported(source: str) -> list[tuple[int, str]]:
    return list(check_isolation.imports(ast.parse(source)))


def test_finds_imports_at_every_depth() -> None:
    source = (
        "import jax.numpy as jnp\n"
        "from pytree_filter._filters import filter\n"
        "from . import _local\n"
        "def f():\n"
        "    import optax\n"
        "class C:\n"
        "    from wadler_lindig import pformat\n"
    )
    assert imported(source) == [
        (1, "jax"),
        (2, "pytree_filter"),
        (5, "optax"),
        (7, "wadler_lindig"),
    ]


def test_skips_imports_guarded_by_import_error() -> None:
    source = (
        "try:\n"
        "    import tomli\n"
        "except (ImportError, AttributeError):\n"
        "    import tomllib\n"
        "try:\n"
        "    import numpy\n"
        "except ValueError:\n"
        "    pass\n"
    )
    assert imported(source) == [(4, "tomllib"), (6, "numpy")]


def test_reads_declared_siblings_and_extras() -> None:
    packages = check_isolation.load_packages(REPO)
    assert set(packages) == {
        "pytree-filter",
        "pytree-module",
        "pytree-transforms",
        "pytree-graph",
        "pytree-nn",
    }
    assert packages["pytree-filter"].siblings == ()
    assert set(packages["pytree-transforms"].siblings) == {"pytree-module", "pytree-filter"}
    assert "treescope" in packages["pytree-module"].extras_projects
    closure = check_isolation.sibling_closure(packages["pytree-nn"], packages)
    assert sorted(closure) == [
        "pytree-filter",
        "pytree-graph",
        "pytree-module",
        "pytree-transforms",
    ]


def test_requirement_name_normalizes() -> None:
    assert check_isolation.requirement_name("Wadler_Lindig>=0.1.7") == "wadler-lindig"
    assert check_isolation.requirement_name("jax[cuda12]; python_version>'3'") == "jax"


def test_tests_run_with_the_environment_of_the_cpu_test_variant() -> None:
    # The same variables as `hatch test -i backend=cpu`: the multi_device tests run against the
    # wheels too, and JAX's persistent compilation cache (its key covers XLA_FLAGS) serves the
    # isolated runs the programs that the main run compiled.
    config = tomllib.loads((REPO / "hatch.toml").read_text(encoding="utf-8"))
    variables = config["envs"]["hatch-test"]["overrides"]["matrix"]["backend"]["env-vars"]
    cpu = {v["key"]: v["value"] for v in variables if v.get("if") == ["cpu"]}
    for name, value in check_isolation.CPU_TEST_ENVIRONMENT.items():
        assert cpu[name] == value, name
