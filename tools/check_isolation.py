"""Install each package's wheel alone in a fresh environment and run its tests against it.

Usage: python tools/check_isolation.py [--package NAME ...] [--python PYTHON] [--keep]

For every package under ``packages/`` (or those named), this:

1. builds its sdist and wheel (the wheel from the sdist) and those of the siblings it declares;
2. checks statically that every sibling its source imports is declared in its own
   ``dependencies``;
3. creates a fresh virtual environment holding only that wheel, the wheels of its declared
   siblings, what they require from the package index, and pytest (with pytest-xdist) + hypothesis;
4. checks that every module its source imports (outside ``try: ... except ImportError``) is
   the standard library, the package itself, installed in that environment, or named by one of
   its optional extras;
5. copies its ``tests/`` to a temporary folder and runs pytest there, against the installed
   wheel, never the source tree, with the environment variables of the cpu test variant (8 fake
   devices: the ``multi_device`` tests run too; those marked ``multi_process``, which start
   processes of their own, run only in the main test run).

Exits with status 1 if any step fails for any package. Needs ``uv`` (the ``isolation`` hatch
environment provides it: ``hatch run isolation:check``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_REQUIREMENTS = ["pytest", "pytest-xdist", "hypothesis"]
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}
CPU_TEST_ENVIRONMENT = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
}


@dataclass(frozen=True)
class Package:
    name: str
    folder: Path
    import_name: str
    siblings: tuple[str, ...]
    extras_projects: frozenset[str]

    @property
    def src(self) -> Path:
        return self.folder / "src" / self.import_name


def requirement_name(requirement: str) -> str:
    """Return the normalized project name of a PEP 508 requirement string."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def load_packages(root: Path) -> dict[str, Package]:
    """Read every packages/*/pyproject.toml."""
    pyprojects = sorted(root.glob("packages/*/pyproject.toml"))
    projects = {
        path.parent: tomllib.loads(path.read_text(encoding="utf-8"))["project"]
        for path in pyprojects
    }
    names = {requirement_name(project["name"]) for project in projects.values()}
    packages = {}
    for folder, project in projects.items():
        name = requirement_name(project["name"])
        dependencies = [requirement_name(r) for r in project.get("dependencies", [])]
        extras = project.get("optional-dependencies", {}).values()
        packages[name] = Package(
            name=name,
            folder=folder,
            import_name=name.replace("-", "_"),
            siblings=tuple(d for d in dependencies if d in names),
            extras_projects=frozenset(requirement_name(r) for reqs in extras for r in reqs),
        )
    return packages


def sibling_closure(package: Package, packages: dict[str, Package]) -> list[str]:
    """Return the siblings `package` declares, directly or through declared siblings."""
    seen: list[str] = []
    stack = list(package.siblings)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.append(name)
            stack.extend(packages[name].siblings)
    return seen


def guarded_by_import_error(node: ast.Try) -> bool:
    """Whether a try statement catches ImportError (an optional import with a fallback)."""
    for handler in node.handlers:
        caught = handler.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if any(isinstance(n, ast.Name) and n.id in IMPORT_ERRORS for n in names):
            return True
    return False


def imports(node: ast.AST) -> Iterator[tuple[int, str]]:
    """Yield (line, top-level module) of each absolute import not inside an ImportError guard."""
    if isinstance(node, ast.Try) and guarded_by_import_error(node):
        children: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
    else:
        children = list(ast.iter_child_nodes(node))
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield node.lineno, alias.name.split(".")[0]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        yield node.lineno, node.module.split(".")[0]
    for child in children:
        yield from imports(child)


def source_imports(package: Package) -> dict[str, list[str]]:
    """Map each top-level module imported by `package`'s source to the places importing it."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.src.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in imports(tree):
            if module != package.import_name and module not in sys.stdlib_module_names:
                found.setdefault(module, []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output as text."""
    return subprocess.run(command, text=True, capture_output=True, check=False, **kwargs)


def find_uv() -> list[str]:
    """Return the command that runs uv."""
    if path := shutil.which("uv"):
        return [path]
    if run([sys.executable, "-m", "uv", "--version"]).returncode == 0:
        return [sys.executable, "-m", "uv"]
    sys.exit("error: uv not found; run `hatch run isolation:check` or `pip install uv`")


def build(uv: list[str], package: Package, wheelhouse: Path) -> Path:
    """Build `package`'s sdist and, from it, its wheel; return the wheel."""
    result = run([*uv, "build", "--quiet", "--out-dir", str(wheelhouse), str(package.folder)])
    if result.returncode != 0:
        raise RuntimeError(f"building {package.name} failed:\n{result.stdout}{result.stderr}")
    [wheel] = wheelhouse.glob(f"{package.import_name}-*.whl")
    return wheel


def check_package(
    uv: list[str],
    package: Package,
    packages: dict[str, Package],
    wheels: dict[str, Path],
    python: str,
    workdir: Path,
) -> list[str]:
    """Run every isolation check on one package; return its problems."""
    problems = []
    imported = source_imports(package)
    declared = ", ".join(package.siblings) or "none"
    undeclared = set()
    for name, other in packages.items():
        if other.import_name in imported and name not in package.siblings:
            undeclared.add(other.import_name)
            problems.append(
                f"imports {other.import_name} ({', '.join(imported[other.import_name])}) but "
                f"does not declare {name} in its dependencies (declared siblings: {declared})"
            )

    venv = workdir / "venv"
    venv_python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    result = run([*uv, "venv", "--quiet", "--python", python, str(venv)])
    if result.returncode != 0:
        return [*problems, f"creating the environment failed:\n{result.stderr}"]
    wheel_files = [str(wheels[n]) for n in [package.name, *sibling_closure(package, packages)]]
    install = ["pip", "install", "--quiet", "--python", str(venv_python)]
    result = run([*uv, *install, *wheel_files, *TEST_REQUIREMENTS])
    if result.returncode != 0:
        return [*problems, f"installing the wheel failed:\n{result.stdout}{result.stderr}"]

    probe = (
        "import importlib.util, json, sys; "
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))"
    )
    result = run([str(venv_python), "-c", probe, *imported], cwd=workdir)
    if result.returncode != 0:
        return [*problems, f"probing its imports failed:\n{result.stderr}"]
    for module in json.loads(result.stdout):
        if module in undeclared or requirement_name(module) in package.extras_projects:
            continue
        problems.append(
            f"imports {module} ({', '.join(imported[module])}), which its declared dependencies "
            "do not install: add it to `dependencies` (or to an optional extra, imported lazily)"
        )

    tests = package.folder / "tests"
    if not tests.is_dir():
        return [*problems, f"has no tests folder at {tests.relative_to(ROOT)}"]
    rundir = workdir / "run"
    shutil.copytree(tests, rundir / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    # The settings of the cpu test variant (hatch.toml): 8 fake devices, so that the tests
    # marked `multi_device` run here too, and so that JAX's persistent compilation cache, when
    # one is set (`.ci/run` sets one), serves the programs the main test run compiled: its key
    # covers XLA_FLAGS.
    for name, value in CPU_TEST_ENVIRONMENT.items():
        env.setdefault(name, value)
    result = subprocess.run(
        [
            str(venv_python),
            "-m",
            "pytest",
            "tests",
            "-q",
            # Two processes, each test file whole on one (as in the main test run).
            "-n",
            "2",
            "--dist",
            "loadfile",
            "--import-mode=importlib",
            # The tests that start several JAX processes check how the code behaves across
            # processes, which the main test run does with the same code; here, where what is
            # checked is the wheel, they would only double the step's time.
            "-m",
            "not multi_process",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(rundir),
        ],
        cwd=rundir,
        env=env,
        check=False,
    )
    if result.returncode == 5:
        problems.append(f"has no tests in {tests.relative_to(ROOT)} (pytest exit 5)")
    elif result.returncode != 0:
        problems.append(
            f"tests failed against the installed wheel (pytest exit {result.returncode})"
        )
    return problems


def environment_arguments(
    argv: list[str] | None, description: str, default: tuple[str, ...] | None = None
) -> tuple[argparse.Namespace, dict[str, Package], list[str]] | None:
    """The command line of the checks that make fresh environments (`--package NAME ...`,
    `--python`, `--keep`).

    Returns:
        The parsed arguments, the clone's packages and the names selected (those named, else
        `default`, else every package); None, after printing why, if a name is unknown.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--package", action="append", dest="packages", metavar="NAME")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the environments")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    packages = load_packages(ROOT)
    selected = [requirement_name(n) for n in args.packages or default or packages]
    if unknown := [n for n in selected if n not in packages]:
        print(f"error: unknown package(s) {', '.join(unknown)}; known: {', '.join(packages)}")
        return None
    return args, packages, selected


def main(argv: list[str] | None = None) -> int:
    parsed = environment_arguments(argv, __doc__.splitlines()[0])
    if parsed is None:
        return 2
    args, packages, selected = parsed
    uv = find_uv()
    temp = Path(tempfile.mkdtemp(prefix="check-isolation-"))
    failures: dict[str, list[str]] = {}
    try:
        wheelhouse = temp / "wheelhouse"
        needed = {
            n for name in selected for n in [name, *sibling_closure(packages[name], packages)]
        }
        wheels = {}
        for name in sorted(needed):
            print(f"building {name}", flush=True)
            try:
                wheels[name] = build(uv, packages[name], wheelhouse)
            except RuntimeError as error:
                print(error)
                return 1
        for name in selected:
            print(f"\n=== {name}: fresh environment with {wheels[name].name} ===", flush=True)
            workdir = temp / name
            workdir.mkdir()
            problems = check_package(uv, packages[name], packages, wheels, args.python, workdir)
            if problems:
                failures[name] = problems
    finally:
        if args.keep:
            print(f"kept {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)

    return report(selected, failures, "isolation check failed", "isolation check passed")


def report(selected: list[str], failures: dict[str, list[str]], failed: str, passed: str) -> int:
    """Print each package's outcome and its problems, then a summary line; the exit status.

    `failed` and `passed` open the summary ("isolation check failed"), followed by the
    count of packages.
    """
    print()
    for name in selected:
        print(f"{'FAIL' if name in failures else 'ok  '} {name}")
        for problem in failures.get(name, []):
            print(f"     {name} {problem}")
    if failures:
        print(f"{failed} for {len(failures)} of {len(selected)} package(s)")
        return 1
    print(f"{passed} for {len(selected)} package(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
