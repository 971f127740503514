"""Check the seams between the packages and inside each one.

Usage: python tools/check_layering.py [ROOT]

Walks every ``.py`` file under ``ROOT/packages/*/src/`` (ROOT defaults to the repository root),
reads it with ``ast`` and exits with status 1, listing each offence, when package code

1. imports a sibling that is not on its line of the layering table below, or equinox, flax
   or refx (function-level, ``TYPE_CHECKING`` and relative imports included);
2. reaches into a sibling's private parts: imports one of its underscore modules (only the
   public top level and the declared ``extend`` module are open to siblings), reads an
   underscore attribute of a sibling module object (``pytree_graph._traverse``), or uses a
   private slot name another package owns (``module._pm_flat``, ``cls.__module_frozen__``);
3. has an import cycle between modules of one package. Every import counts, wherever it is
   written: an import moved into a function hides a cycle from Python, not from a reader,
   who still cannot understand either module without the other.
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
# The one module besides the top level that a package declares for the packages above it.
EXTENSION_MODULE = "extend"
# Attribute names that are one package's private slots on its objects and classes.
PRIVATE_SLOTS: dict[str, tuple[str, ...]] = {
    "pytree_module": ("_pm_", "__module_"),
    "pytree_graph": ("_pg_",),
}


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    package: str
    imported: str
    reason: str = ""

    def __str__(self) -> str:
        if self.line == 0:  # a cycle: `imported` lists its modules
            return (
                f"{self.path}: {self.package} has an import cycle among {self.imported}; "
                f"{self.reason}"
            )
        if self.reason:
            why = self.reason
        elif self.imported.split(".")[0] in FORBIDDEN:
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
            for alias in node.names:
                # `from pytree_graph import _traverse` imports a private module too.
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield node.lineno, f"{node.module}.{alias.name}"


def _private_part(module: str) -> str | None:
    """The first underscore part of a dotted sibling module name below its top level."""
    for part in module.split(".")[1:]:
        if part.startswith("_"):
            return part
    return None


def _private_reach(module: str, package: str) -> str:
    top = module.split(".")[0]
    return (
        f"{module!r} is private to {top}: use its public top level, or its declared "
        f"`{top}.{EXTENSION_MODULE}` module (add the name there, with a docstring and a test, "
        f"if {package} needs it)"
    )


def check_file(path: Path, package: str) -> list[Violation]:
    """Return the layering and seam violations in one source file of `package`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    violations = []
    for line, module in imported_modules(tree):
        top = module.split(".")[0]
        if top == package:
            continue
        if top in FORBIDDEN or (top in ALLOWED and top not in ALLOWED[package]):
            violations.append(Violation(path, line, package, module))
        elif top in ALLOWED and _private_part(module) is not None:
            violations.append(
                Violation(path, line, package, module, _private_reach(module, package))
            )
    violations.extend(_private_attributes(tree, path, package))
    return violations


def _private_attributes(tree: ast.AST, path: Path, package: str) -> Iterator[Violation]:
    """Underscore attributes of sibling module objects, and other packages' private slots."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in ALLOWED
            and node.value.id != package
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            module = f"{node.value.id}.{node.attr}"
            yield Violation(path, node.lineno, package, module, _private_reach(module, package))
        for owner, prefixes in PRIVATE_SLOTS.items():
            if owner != package and node.attr.startswith(prefixes):
                yield Violation(
                    path,
                    node.lineno,
                    package,
                    f".{node.attr}",
                    f"{node.attr!r} is a private slot of {owner}'s objects: use the functions "
                    f"of `{owner}.{EXTENSION_MODULE}` (or its public API) instead",
                )


# ----------------------------------------------------------------------- cycles in a package


def package_imports(tree: ast.AST, module: str, package: str, known: set[str]) -> set[str]:
    """The modules of `package` that `module` (dotted, inside it) imports, wherever written.

    `known` holds the dotted names of the package's modules, to tell `from . import name`
    of a submodule from that of an attribute.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == package)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, package)
            if base is None or base.split(".")[0] != package:
                continue
            # `from . import _x` imports the submodule `_x` (the package itself is already
            # loading); `from ._x import f` imports `_x`; `from pkg import f` imports `pkg`.
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            found.update(submodules or {base})
    return found


def _absolute(node: ast.ImportFrom, module: str, package: str) -> str | None:
    if node.level == 0:
        return node.module
    # `module` names a package's `__init__` as `package.__init__`, so that for every module
    # the relative imports start from the folder it sits in.
    base = module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    if not base:
        return None
    return ".".join([*base, node.module] if node.module else base)


def find_cycles(package_dir: Path) -> list[list[str]]:
    """Import cycles between the modules of one package, each a list of module names."""
    package = package_dir.name
    names: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent).with_suffix("")
        dotted = ".".join(relative.parts)
        names[dotted.removesuffix(".__init__") if dotted.endswith("__init__") else dotted] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        loading = name + ".__init__" if path.name == "__init__.py" else name
        targets = package_imports(tree, loading, package, set(names))
        graph[name] = {t for t in targets if t in names and t != name}
    return [sorted(c) for c in _strongly_connected(graph) if len(c) > 1]


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the strongly connected components of `graph`."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(component)
    return components


def check_tree(root: Path) -> list[Violation]:
    """Return the layering, seam and cycle violations of every package under `root`/packages."""
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
            for cycle in find_cycles(package_dir):
                violations.append(
                    Violation(
                        package_dir,
                        0,
                        package,
                        ", ".join(cycle),
                        "these modules import each other (in a circle); move what they "
                        "share into a module below them, so that imports point one way",
                    )
                )
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
        print(f"layering check failed: {len(violations)} violation(s)", file=sys.stderr)
        return 1
    print("layering check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
