"""Check that package code imports only the siblings its layer allows, and never equinox/flax/refx.

Usage: python tools/check_layering.py [ROOT]

Walks every ``.py`` file under ``ROOT/packages/*/src/`` (ROOT defaults to the repository root),
reads its imports with ``ast`` (function-level, ``TYPE_CHECKING`` and relative imports included)
and exits with status 1, listing each offending import, when a package imports a sibling that is
not on its line of the layering table below or any forbidden library.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# The layering table: each package may import only the siblings listed on its line.
ALLOWED: dict[str, frozenset[str]] = {
    "pytree_filter": frozenset(),
    "pytree_module": frozenset({"pytree_filter"}),
    "pytree_transforms": frozenset({"pytree_module", "pytree_filter"}),
    "pytree_graph": frozenset({"pytree_transforms", "pytree_module", "pytree_filter"}),
    "pytree_nn": frozenset({"pytree_graph", "pytree_transforms", "pytree_module", "pytree_filter"}),
}
FORBIDDEN: frozenset[str] = frozenset({"equinox", "flax", "refx"})


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    package: str
    imported: str

    def __str__(self) -> str:
        if self.imported.split(".")[0] in FORBIDDEN:
            why = f"{', '.join(sorted(FORBIDDEN))} are never imported by package code"
        else:
            allowed = ", ".join(sorted(ALLOWED[self.package])) or "no sibling package"
            why = f"{self.package} may import only: {allowed}"
        return f"{self.path}:{self.line}: {self.package} imports {self.imported!r}; {why}"


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Yield (line, absolute dotted module name) for every absolute import in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def check_file(path: Path, package: str) -> list[Violation]:
    """Return the layering violations in one source file of `package`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    violations = []
    for line, module in imported_modules(tree):
        top = module.split(".")[0]
        if top == package:
            continue
        if top in FORBIDDEN or (top in ALLOWED and top not in ALLOWED[package]):
            violations.append(Violation(path, line, package, module))
    return violations


def check_tree(root: Path) -> list[Violation]:
    """Return the layering violations of every package under `root`/packages."""
    violations = []
    for src in sorted(root.glob("packages/*/src")):
        for package_dir in sorted(p for p in src.iterdir() if p.is_dir()):
            package = package_dir.name
            if not package.isidentifier() or package.startswith("__"):
                continue
            if package not in ALLOWED:
                raise LookupError(
                    f"{package_dir}: package {package!r} has no line in the layering table; "
                    f"add it to ALLOWED in {Path(__file__).name}"
                )
            for path in sorted(package_dir.rglob("*.py")):
                violations.extend(check_file(path, package))
    return violations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    if not any(args.root.glob("packages/*/src")):
        print(f"no packages/*/src folder under {args.root}", file=sys.stderr)
        return 2
    try:
        violations = check_tree(args.root)
    except LookupError as error:
        print(error, file=sys.stderr)
        return 2
    for violation in violations:
        print(violation, file=sys.stderr)
    if violations:
        print(f"layering check failed: {len(violations)} forbidden import(s)", file=sys.stderr)
        return 1
    print("layering check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
