"""Install packages from this clone with the pip command the README gives, in fresh environments.

Usage: python tools/check_install_from_clone.py [--package NAME ...] [--python PYTHON] [--keep]

Until the packages are on PyPI, README.md (section "## Install") and docs/getting-started.md
give one pip command per package that installs it from a clone: the package's folder followed
by the folders of the siblings it builds on, so that pip takes those from the clone rather than
looking them up on the package index. For pytree-nn (all five packages) and pytree-module (with
pytree-filter only), or for the packages named, this:

1. reads the package's command from README.md and checks that docs/getting-started.md gives
   the same one, and that its folders are exactly the package and the siblings it declares,
   directly or through other siblings;
2. creates a fresh environment with ``python -m venv`` and runs that command in it, from the
   root of the clone, with the environment's pip (pip's cache is shared, so JAX comes from it);
3. checks that the package imports there, that every sibling installed is the clone's (its
   version is the one in the clone's ``__about__.py`` and its ``direct_url.json`` points to
   its folder in the clone), and that no sibling it does not need was installed.

The environments are checked side by side. Exits with status 1 if any check fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from check_isolation import (
    ROOT,
    Package,
    environment_arguments,
    report,
    run,
    sibling_closure,
)
from check_lowest_versions import tree_version

DEFAULT_PACKAGES = ("pytree-nn", "pytree-module")
PAGES = ("README.md", "docs/getting-started.md")
COMMAND_START = "pip install ./packages/"

# Run in the fresh environment: each sibling installed there, with its version and where it
# came from (the text of its direct_url.json, None for a package from an index).
PROBE = """
import importlib, importlib.metadata, json, re, sys
importlib.import_module(sys.argv[1])
found = {}
for dist in importlib.metadata.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    if name in sys.argv[2:]:
        found[name] = [dist.version, dist.read_text("direct_url.json")]
print(json.dumps(found))
"""


def documented_commands(text: str) -> dict[str, str]:
    """Map each package folder to the line `pip install ./packages/NAME ...` a page gives for it.

    A line installs the package whose folder it names first; lines with extras or options are
    variations the prose describes, not the commands checked.
    """
    commands = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(COMMAND_START) and "[" not in line and " -" not in line:
            commands.setdefault(command_folders(line)[0], line)
    return commands


def command_arguments(command: str) -> list[str]:
    """The words of a documented shell command, with `{a,b}` expanded as bash and zsh do
    (`./packages/pytree-{module,filter}` is `./packages/pytree-module ./packages/pytree-filter`),
    so that the command runs the same without a shell."""
    words = []
    for word in shlex.split(command.partition(" #")[0]):
        braces = re.fullmatch(r"(.*)\{([^{}]*,[^{}]*)\}(.*)", word)
        if braces is None:
            words.append(word)
        else:
            head, choices, tail = braces.groups()
            words.extend(head + choice + tail for choice in choices.split(","))
    return words


def command_folders(command: str) -> list[str]:
    """Return the package folders, in order, that a `pip install ./packages/...` line names."""
    paths = [arg for arg in command_arguments(command)[2:] if arg != "-e"]
    return [re.sub(r"\[[^\]]*\]$", "", Path(path).name) for path in paths]


def command_problems(name: str, packages: dict[str, Package]) -> tuple[str | None, list[str]]:
    """Return the command documented for `name`, and what is wrong with it or with its pages."""
    problems = []
    commands = {}
    folder = packages[name].folder.name
    for page in PAGES:
        command = documented_commands((ROOT / page).read_text(encoding="utf-8")).get(folder)
        if command is None:
            problems.append(f"{page} gives no command `{COMMAND_START}{folder} ...`")
        commands[page] = command
    readme, guide = (commands[page] for page in PAGES)
    if readme and guide and readme != guide:
        problems.append(f"{PAGES[0]} and {PAGES[1]} differ:\n  {readme}\n  {guide}")
    if readme:
        needed = {name, *sibling_closure(packages[name], packages)}
        if set(command_folders(readme)) != {packages[n].folder.name for n in needed}:
            problems.append(
                f"the command `{readme}` should name the folders of {name} and the siblings it "
                f"needs, {', '.join(sorted(needed - {name})) or 'none'}, and nothing else"
            )
    return readme, problems


def installed_problems(name: str, found: dict[str, list], packages: dict[str, Package]) -> list:
    """Compare the siblings an environment holds (`found`, from PROBE) with what `name` needs."""
    problems = []
    needed = {name, *sibling_closure(packages[name], packages)}
    if missing := sorted(needed - set(found)):
        problems.append(f"did not install {', '.join(missing)}")
    if extra := sorted(set(found) - needed):
        problems.append(f"installed {', '.join(extra)}, which {name} does not need")
    for sibling, (version, direct_url) in sorted(found.items()):
        folder = packages[sibling].folder
        expected = tree_version(folder)
        if version != expected:
            problems.append(f"installed {sibling} {version}, not the clone's {expected}")
        url = json.loads(direct_url)["url"] if direct_url else None
        source = Path(url2pathname(urlparse(url).path)) if url else None
        if source is None or source.resolve() != folder.resolve():
            problems.append(
                f"installed {sibling} from {url or 'a package index'}, not from the clone's "
                f"{folder.relative_to(ROOT)}"
            )
    return problems


def check_install(
    name: str, command: str, packages: dict[str, Package], python: str, workdir: Path
) -> list[str]:
    """Run `command` in a fresh environment under `workdir`; return what went wrong."""
    venv = workdir / "venv"
    venv_python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    result = run([python, "-m", "venv", str(venv)])
    if result.returncode != 0:
        return [f"creating the environment failed:\n{result.stdout}{result.stderr}"]
    # Neither the source folders on PYTHONPATH nor an active environment may stand in for
    # what the command installed.
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    pip = [str(venv_python), "-m", *command_arguments(command)]
    result = run(pip, cwd=ROOT, env=env)
    if result.returncode != 0:
        return [f"`{command}` failed:\n{result.stdout}{result.stderr}"]
    import_name = packages[name].import_name
    probe = [str(venv_python), "-c", PROBE, import_name, *packages]
    result = run(probe, cwd=workdir, env=env)
    if result.returncode != 0:
        return [f"`import {import_name}` failed after `{command}`:\n{result.stderr}"]
    return installed_problems(name, json.loads(result.stdout), packages)


def main(argv: list[str] | None = None) -> int:
    parsed = environment_arguments(argv, __doc__.splitlines()[0], DEFAULT_PACKAGES)
    if parsed is None:
        return 2
    args, packages, selected = parsed
    failures: dict[str, list[str]] = {}
    commands = {}
    for name in selected:
        command, problems = command_problems(name, packages)
        if problems:
            failures[name] = problems
        if command:
            commands[name] = command
            print(f"{name}: {command}", flush=True)

    temp = Path(tempfile.mkdtemp(prefix="check-install-from-clone-"))
    try:

        def check(name: str) -> list[str]:
            workdir = temp / name
            workdir.mkdir()
            return check_install(name, commands[name], packages, args.python, workdir)

        # Installing is mostly waiting on pip, one package at a time: check side by side.
        with ThreadPoolExecutor(max_workers=len(commands) or 1) as pool:
            for name, problems in zip(commands, pool.map(check, commands), strict=True):
                failures.setdefault(name, []).extend(problems)
    finally:
        if args.keep:
            print(f"kept {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)

    failures = {name: problems for name, problems in failures.items() if problems}
    return report(
        selected, failures, "install from the clone failed", "install from the clone works"
    )


if __name__ == "__main__":
    sys.exit(main())
