"""Set the version of one or more packages and keep every sibling pin in step.

Usage: python tools/bump_version.py NEW_VERSION [--package NAME ...] [--root ROOT]

Writes ``__version__ = "NEW_VERSION"`` into each named package's ``__about__.py`` (all packages
under ``ROOT/packages`` by default) and rewrites every pin on those packages, in every
``pyproject.toml`` under ``ROOT/packages``, to ``>=NEW_VERSION,<NEXT``, where NEXT is the next
minor release before 1.0 (``0.3.1`` -> ``<0.4``) and the next major release from 1.0 on
(``1.2.0`` -> ``<2``). Prints each change. A version that is not ``X.Y.Z`` is refused and
nothing is written.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

VERSION = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
ABOUT_LINE = re.compile(r'^__version__ = "([^"]*)"$', re.MULTILINE)


def upper_bound(version: str) -> str:
    """Return the first release that is not compatible with `version`."""
    major, minor, _ = (int(part) for part in version.split("."))
    return f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"


def sibling_pins(names: list[str]) -> re.Pattern[str]:
    """Match a quoted requirement `"name[extras]>=A,<B"` on any package in `names`."""
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(rf'"((?:{alternatives})(?:\[[^\]]*\])?)\s*>=\s*[^,"\s]+\s*,\s*<\s*[^,";\s]+"')


def find_packages(root: Path) -> dict[str, Path]:
    """Map each package name under `root`/packages to its folder."""
    packages = {}
    for pyproject in sorted(root.glob("packages/*/pyproject.toml")):
        match = re.search(r'^name = "([^"]+)"', pyproject.read_text(encoding="utf-8"), re.MULTILINE)
        if match:
            packages[match.group(1)] = pyproject.parent
    return packages


def about_file(package_dir: Path) -> Path:
    """Return the `__about__.py` that holds a package's version."""
    [path] = package_dir.glob("src/*/__about__.py")
    return path


def plan_changes(root: Path, version: str, names: list[str]) -> dict[Path, tuple[str, list[str]]]:
    """Return {file: (new text, [description of each change])} without writing anything."""
    packages = find_packages(root)
    if not packages:
        raise ValueError(f"no packages/*/pyproject.toml under {root}")
    unknown = sorted(set(names) - set(packages))
    if unknown:
        known = ", ".join(packages) or "none"
        raise ValueError(f"unknown package(s): {', '.join(unknown)} (known: {known})")

    changes: dict[Path, tuple[str, list[str]]] = {}
    for name in names:
        path = about_file(packages[name])
        text = path.read_text(encoding="utf-8")
        found = ABOUT_LINE.findall(text)
        if len(found) != 1:
            raise ValueError(f'{path}: expected one line `__version__ = "..."`, found {len(found)}')
        if found[0] != version:
            new_text = ABOUT_LINE.sub(f'__version__ = "{version}"', text)
            changes[path] = (new_text, [f"{name} version {found[0]} -> {version}"])

    pin = f">={version},<{upper_bound(version)}"
    pattern = sibling_pins(names)
    for package_dir in packages.values():
        path = package_dir / "pyproject.toml"
        text = path.read_text(encoding="utf-8")
        pieces, notes, end = [], [], 0
        for match in pattern.finditer(text):
            new = f'"{match.group(1)}{pin}"'
            if new != match.group(0):
                notes.append(f"{match.group(0)} -> {new}")
            pieces += [text[end : match.start()], new]
            end = match.end()
        if notes:
            changes[path] = ("".join([*pieces, text[end:]]), notes)
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the new version, X.Y.Z")
    parser.add_argument(
        "--package",
        action="append",
        dest="packages",
        metavar="NAME",
        help="a package to bump (repeatable; default: every package)",
    )
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)

    if not VERSION.fullmatch(args.version):
        print(
            f"error: version {args.version!r} is not of the form X.Y.Z (e.g. 0.2.0); "
            "nothing was changed",
            file=sys.stderr,
        )
        return 2
    names = args.packages or list(find_packages(args.root))
    try:
        changes = plan_changes(args.root, args.version, names)
    except ValueError as error:
        print(f"error: {error}; nothing was changed", file=sys.stderr)
        return 2

    for path, (text, notes) in changes.items():
        path.write_text(text, encoding="utf-8")
        for note in notes:
            print(f"{path.relative_to(args.root)}: {note}")
    if not changes:
        print(f"nothing to change: {', '.join(names)} already at {args.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
