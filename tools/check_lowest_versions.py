"""Test each package against the lowest versions of the siblings it pins.

Usage: python tools/check_lowest_versions.py [--package NAME ...] [--force] [--python PYTHON]
       [--keep]

A pin such as ``pytree-module>=0.1.0,<0.2`` promises that the package works with pytree-module
0.1.0, while the workspace and ``tools/check_isolation.py`` test only the versions in the
working tree. For every package that pins siblings (or those named), this:

1. reads the lowest version each sibling pin allows (``>=X`` or ``==X`` gives X); a pin with no
   lower bound, or one it cannot read, is refused with a message;
2. takes a sibling that only a pinned sibling pins at the lowest version that pin allows, and
   fails where a sibling at its lowest version pins another one to a range excluding the
   version chosen for it (that set would not install: the pins must agree);
3. finds each version: the working tree when its version there is that one, else the release's
   git tag ``<name>-v<version>`` (``pytree-module-v0.1.0``); a missing tag is a failure;
4. skips the package when every sibling comes from the working tree: those are the wheels the
   isolation check installs, so its tests already ran against them (``--force`` runs anyway);
5. otherwise builds the siblings' wheels from those sources and runs the isolation check's steps
   with them: a fresh environment, the import check and the package's tests.

Exits with status 1 if a pin cannot be read or resolved, or a check fails. Needs ``uv`` and
``git`` (the ``isolation`` hatch environment provides uv). Reads pins with ``packaging`` where it
is installed, else with a strict reader of ``NAME>=X.Y.Z,<X.Y``-style pins.
"""

from __future__ import annotations

import argparse
import io
import operator
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import check_isolation
from bump_version import ABOUT_LINE, about_file

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # the isolation environment holds uv alone: the strict reader serves there
    Requirement = None
    Version = None

# The operators a pin's lowest version is read from, and those that only bound it from above.
LOWER_BOUNDS = frozenset({">=", "=="})
OTHER_BOUNDS = frozenset({"<", "<=", "!="})
COMPARE: dict[str, Callable[[object, object], bool]] = {
    ">=": operator.ge,
    "==": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    "!=": operator.ne,
}
STRICT_PIN = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[A-Za-z0-9._,\s-]*\])?\s*(?P<clauses>.*)"
)
STRICT_CLAUSE = re.compile(r"(~=|===|==|!=|<=|>=|<|>)\s*(\d+(?:\.\d+)*)")
PIN_ADVICE = "write it as NAME>=LOWEST,<NEXT, as tools/bump_version.py does"


class PinError(ValueError):
    """A sibling pin that cannot be read, has no lowest version, or names a missing release."""


@dataclass(frozen=True)
class Pin:
    """One sibling requirement: the project it names and its (operator, version) clauses."""

    text: str
    name: str
    clauses: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Source:
    """Where a sibling's wheel is built from: the working tree (`tag` None) or a release tag."""

    name: str
    version: str
    tag: str | None = None

    def __str__(self) -> str:
        where = "working tree" if self.tag is None else f"tag {self.tag}"
        return f"{self.name} {self.version} ({where})"


def read_pin_strictly(text: str) -> Pin:
    """Read `NAME[extras] OP X.Y.Z, ...` with plain numeric versions; refuse anything else."""
    match = STRICT_PIN.fullmatch(text.strip())
    pieces = match.group("clauses").split(",") if match else []
    clauses = [STRICT_CLAUSE.fullmatch(piece.strip()) for piece in pieces if piece.strip()]
    if match is None or not all(clauses):
        raise PinError(
            f"cannot read the pin {text!r}: without the `packaging` library only pins of the "
            "form NAME>=X.Y.Z,<X.Y (operators >= == != <= <, versions of digits and dots, no "
            f"environment marker) can be read; {PIN_ADVICE}, or install `packaging`"
        )
    return Pin(
        text=text,
        name=check_isolation.requirement_name(match.group("name")),
        clauses=tuple((clause.group(1), clause.group(2)) for clause in clauses),
    )


def read_pin_with_packaging(text: str) -> Pin:
    """Read any PEP 508 requirement with `packaging`."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement as error:
        raise PinError(f"cannot read the pin {text!r}: {error}") from None
    if requirement.marker is not None:
        raise PinError(
            f"the pin {text!r} has an environment marker: a sibling is needed everywhere, "
            f"so its pin has none; {PIN_ADVICE}"
        )
    clauses = sorted((spec.operator, spec.version) for spec in requirement.specifier)
    return Pin(
        text=text,
        name=check_isolation.requirement_name(requirement.name),
        clauses=tuple(clauses),
    )


def read_pin(text: str) -> Pin:
    """Read a sibling pin, with `packaging` where it is installed."""
    return read_pin_strictly(text) if Requirement is None else read_pin_with_packaging(text)


def version_key(version: str) -> object:
    """Return a key that orders and equates versions (`0.1` and `0.1.0` are equal)."""
    if Version is not None:
        try:
            return Version(version)
        except InvalidVersion:
            raise PinError(f"{version!r} is not a version") from None
    if not re.fullmatch(r"\d+(?:\.\d+)*", version):
        raise PinError(f"{version!r} is not a version of digits and dots")
    parts = [int(part) for part in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def lowest_version(pin: Pin) -> str:
    """Return the lowest version `pin` allows.

    Arguments:
        pin: a sibling pin, from `read_pin`.

    Returns:
        The version of its `>=` or `==` clause (the highest, if it has several), as written.

    Raises:
        PinError: the pin has no such lower bound, uses an operator whose lowest version is not
            one release (`>`, `~=`, `===`, a `*` wildcard), or excludes its own lowest version.

    Example:
        >>> lowest_version(read_pin("pytree-module>=0.1.0,<0.2"))
        '0.1.0'
    """
    for op, version in pin.clauses:
        if op not in LOWER_BOUNDS | OTHER_BOUNDS or "*" in version:
            raise PinError(
                f"the pin {pin.text!r} uses `{op}{version}`, which has no single lowest "
                f"release; {PIN_ADVICE}"
            )
    lower = [version for op, version in pin.clauses if op in LOWER_BOUNDS]
    if not lower:
        raise PinError(
            f"the pin {pin.text!r} has no lower bound, so no lowest version to test; {PIN_ADVICE}"
        )
    lowest = max(lower, key=version_key)
    if not admits(pin, lowest):
        raise PinError(f"the pin {pin.text!r} excludes its own lowest version {lowest}")
    return lowest


def admits(pin: Pin, version: str) -> bool:
    """Whether `version` satisfies every clause of `pin` (whose operators `lowest_version` read)."""
    return all(COMPARE[op](version_key(version), version_key(bound)) for op, bound in pin.clauses)


def tag_name(name: str, version: str) -> str:
    """Return the git tag of release `version` of package `name`: `pytree-module-v0.1.0`."""
    return f"{name}-v{version}"


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a git command in `root`."""
    return check_isolation.run(["git", "-C", str(root), *args])


def has_tag(root: Path, tag: str) -> bool:
    """Whether the repository at `root` has the tag `tag`."""
    return (
        git(root, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}").returncode == 0
    )


def tree_version(folder: Path) -> str:
    """Return the version in a package folder's `__about__.py`."""
    path = about_file(folder)
    found = ABOUT_LINE.findall(path.read_text(encoding="utf-8"))
    if len(found) != 1:
        raise PinError(f'{path}: expected one line `__version__ = "..."`, found {len(found)}')
    return found[0]


def resolve(root: Path, folder: Path, version: str, pinned_by: str, pin: str) -> Source:
    """Find where to build version `version` of the package in `folder` from.

    Arguments:
        root: the repository root (a git checkout).
        folder: the package's folder in the working tree.
        version: the version to build.
        pinned_by: the package whose pin asks for that version (named in the error message).
        pin: that pin, as written (quoted in the error message).

    Returns:
        The working tree when its version is `version`, else the tag `<name>-v<version>`.

    Raises:
        PinError: neither holds that version; the message names the missing tag and the fixes.

    Example:
        >>> root = Path(__file__).resolve().parents[1]
        >>> folder = root / "packages" / "pytree-module"
        >>> source = resolve(root, folder, tree_version(folder), "pytree-nn", "pytree-module")
        >>> source.tag is None
        True
    """
    name = check_isolation.requirement_name(
        tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
    )
    in_tree = tree_version(folder)
    if version_key(version) == version_key(in_tree):
        return Source(name, in_tree)
    tag = tag_name(name, version)
    if has_tag(root, tag):
        return Source(name, version, tag)
    if version_key(version) > version_key(in_tree):
        fix = f"lower the pin, or release {name} {version} first"
    else:
        fix = (
            f"tag the commit that released {name} {version} (`git tag {tag} COMMIT`; releases "
            f"are tagged so, see docs/versions.md), or raise the pin to the working tree's "
            f"version (`python tools/bump_version.py {in_tree} --package {name}` rewrites "
            f"every pin on {name})"
        )
    raise PinError(
        f"{pinned_by} pins {pin!r}, whose lowest version {name} {version} is neither in the "
        f"working tree ({name} {in_tree}) nor tagged (no git tag {tag}): {fix}"
    )


def sibling_pins(pyproject_text: str, siblings: set[str]) -> list[Pin]:
    """Return the pins on `siblings` among a pyproject.toml's dependencies."""
    dependencies = tomllib.loads(pyproject_text)["project"].get("dependencies", [])
    names = [check_isolation.requirement_name(text) for text in dependencies]
    return [
        read_pin(text) for text, name in zip(dependencies, names, strict=True) if name in siblings
    ]


def pyproject_text(root: Path, folder: Path, source: Source) -> str:
    """Return the pyproject.toml of `source`: from the working tree or from its tag."""
    if source.tag is None:
        return (folder / "pyproject.toml").read_text(encoding="utf-8")
    path = (folder / "pyproject.toml").relative_to(root).as_posix()
    result = git(root, "show", f"{source.tag}:{path}")
    if result.returncode != 0:
        raise PinError(f"tag {source.tag} has no {path}: {result.stderr.strip()}")
    return result.stdout


def plan_lowest(root: Path, folders: dict[str, Path], name: str) -> dict[str, Source]:
    """Return where to build each sibling of `name` at the lowest versions its pins allow.

    Arguments:
        root: the repository root (a git checkout).
        folders: every package's folder in the working tree, by project name.
        name: the package whose pins are read.

    Returns:
        {sibling: Source} for every sibling it pins, at the lowest version that pin allows, and
        for every sibling those pin that `name` does not, at the lowest version of the first
        pin on it.

    Raises:
        PinError: a pin cannot be read or has no lowest version, a version is neither in the
            working tree nor tagged, or a sibling at its chosen version pins another one to a
            range that excludes that one's chosen version (the set would not install).

    Example:
        >>> root = Path(__file__).resolve().parents[1]
        >>> folders = {path.parent.name: path.parent
        ...            for path in root.glob("packages/*/pyproject.toml")}
        >>> sorted(plan_lowest(root, folders, "pytree-transforms"))
        ['pytree-filter', 'pytree-module']
    """
    siblings = set(folders) - {name}
    text = (folders[name] / "pyproject.toml").read_text(encoding="utf-8")
    # Breadth first, so that `name`'s own pins choose the versions of the siblings it names.
    pending = [(name, pin) for pin in sibling_pins(text, siblings)]
    seen: list[tuple[str, Pin]] = []
    chosen_by: dict[str, str] = {}
    sources: dict[str, Source] = {}
    while pending:
        owner, pin = pending.pop(0)
        seen.append((owner, pin))
        if pin.name in sources:
            continue
        version = lowest_version(pin)
        source = resolve(root, folders[pin.name], version, owner, pin.text)
        sources[pin.name], chosen_by[pin.name] = source, owner
        text = pyproject_text(root, folders[pin.name], source)
        pending += [(str(source), p) for p in sibling_pins(text, siblings - {pin.name})]
    for owner, pin in seen:
        version = sources[pin.name].version
        if not admits(pin, version):
            raise PinError(
                f"{owner} pins {pin.text!r}, which excludes {pin.name} {version}, the lowest "
                f"version {chosen_by[pin.name]} pins: these lowest versions cannot be installed "
                f"together; make the pins agree (raise {chosen_by[pin.name]}'s lower bound on "
                f"{pin.name} to {lowest_version(pin)}, or widen the other pin)"
            )
    return sources


def covered_by_isolation(sources: dict[str, Source]) -> bool:
    """Whether every sibling comes from the working tree, as in `check_isolation.py`."""
    return all(source.tag is None for source in sources.values())


def export_tag(root: Path, tag: str, destination: Path) -> dict[str, check_isolation.Package]:
    """Write the `packages/` folder of `tag` under `destination`; return its packages."""
    result = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", tag, "packages"],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise PinError(f"git archive of tag {tag} failed: {result.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        archive.extractall(destination, filter="data")
    return check_isolation.load_packages(destination)


def check_lowest(
    root: Path,
    uv: list[str],
    package: check_isolation.Package,
    packages: dict[str, check_isolation.Package],
    sources: dict[str, Source],
    python: str,
    workdir: Path,
) -> list[str]:
    """Build the siblings from `sources` and run the isolation check's steps; return problems."""
    at_lowest = dict(packages)
    for name, source in sources.items():
        if source.tag is not None:
            at_lowest[name] = export_tag(root, source.tag, workdir / source.tag)[name]
    wheels = {}
    for name in [package.name, *sources]:
        print(f"building {sources.get(name, name)}", flush=True)
        try:
            wheels[name] = check_isolation.build(uv, at_lowest[name], workdir / "wheels" / name)
        except RuntimeError as error:
            return [str(error)]
    return check_isolation.check_package(uv, package, at_lowest, wheels, python, workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", action="append", dest="packages", metavar="NAME")
    parser.add_argument(
        "--force", action="store_true", help="run even where the isolation check covers it"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter for the environments")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)

    root = check_isolation.ROOT
    packages = check_isolation.load_packages(root)
    selected = [check_isolation.requirement_name(n) for n in args.packages or packages]
    if unknown := [n for n in selected if n not in packages]:
        print(f"error: unknown package(s) {', '.join(unknown)}; known: {', '.join(packages)}")
        return 2
    folders = {name: package.folder for name, package in packages.items()}

    results: dict[str, str] = {}
    failures: dict[str, list[str]] = {}
    temp = Path(tempfile.mkdtemp(prefix="check-lowest-versions-"))
    try:
        for name in selected:
            try:
                sources = plan_lowest(root, folders, name)
            except PinError as error:  # its message names the package: listed below
                failures[name] = [str(error)]
                continue
            if not sources:
                results[name] = "pins no sibling: nothing to check"
                continue
            listed = ", ".join(str(source) for source in sources.values())
            print(f"\n=== {name}: lowest pins {listed} ===", flush=True)
            if covered_by_isolation(sources) and not args.force:
                results[name] = "same wheels as the isolation check: covered there"
                print(f"{results[name]} (--force runs it anyway)", flush=True)
                continue
            workdir = temp / name
            workdir.mkdir()
            uv = check_isolation.find_uv()
            problems = check_lowest(
                root, uv, packages[name], packages, sources, args.python, workdir
            )
            if problems:
                failures[name] = [f"{name} {problem}" for problem in problems]
            else:
                results[name] = f"tests pass with {listed}"
    finally:
        if args.keep:
            print(f"kept {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)

    print()
    for name in selected:
        if name in failures:
            print(f"FAIL {name}")
            for problem in failures[name]:
                print(f"     {problem}")
        else:
            print(f"ok   {name}: {results[name]}")
    if failures:
        print(f"lowest-versions check failed for {len(failures)} of {len(selected)} package(s)")
        return 1
    print(f"lowest-versions check passed for {len(selected)} package(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
