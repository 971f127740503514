import json
import re
from pathlib import Path

import check_install_from_clone as from_clone
import check_isolation
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = check_isolation.load_packages(REPO)
# A line of a code block installing from the clone: `pip install ./packages/...`, with or
# without an extra on its first path.
INSTALL_LINE = re.compile(r'^pip install (-e )?"?\./packages/', re.MULTILINE)


def direct_url(folder: Path) -> str:
    return json.dumps({"url": folder.resolve().as_uri(), "dir_info": {}})


def found_in_clone(*names: str) -> dict[str, list]:
    """What PROBE reports for siblings installed from the clone."""
    return {
        name: [from_clone.tree_version(PACKAGES[name].folder), direct_url(PACKAGES[name].folder)]
        for name in names
    }


def test_reads_the_command_of_each_package_and_skips_variations() -> None:
    text = (
        "```bash\n"
        "pip install ./packages/pytree-filter\n"
        "pip install ./packages/pytree-module ./packages/pytree-filter\n"
        'pip install "./packages/pytree-module[treescope]" ./packages/pytree-filter\n'
        "pip install -e ./packages/pytree-module -e ./packages/pytree-filter\n"
        "```\n"
        "`pip install ./packages/pytree-nn ...` in prose\n"
    )
    assert from_clone.documented_commands(text) == {
        "pytree-filter": "pip install ./packages/pytree-filter",
        "pytree-module": "pip install ./packages/pytree-module ./packages/pytree-filter",
    }
    assert from_clone.command_folders(
        'pip install -e "./packages/pytree-nn[orbax]" ./packages/pytree-graph   # comment'
    ) == ["pytree-nn", "pytree-graph"]


def test_braces_expand_as_the_shell_expands_them() -> None:
    command = 'pip install "./packages/pytree-nn[orbax]" ./packages/pytree-{graph,module}'
    assert from_clone.command_arguments(command) == [
        "pip",
        "install",
        "./packages/pytree-nn[orbax]",
        "./packages/pytree-graph",
        "./packages/pytree-module",
    ]
    assert from_clone.command_folders("pip install ./packages/pytree-{module,filter}") == [
        "pytree-module",
        "pytree-filter",
    ]


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_readme_and_getting_started_give_each_package_the_same_complete_command(name) -> None:
    command, problems = from_clone.command_problems(name, PACKAGES)
    assert problems == []
    assert from_clone.command_folders(command)[0] == PACKAGES[name].folder.name


def test_every_documented_install_from_the_clone_names_what_its_package_needs() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    checked = 0
    for page in pages:
        # A command continued on the next line (`\` at the end) is one command.
        text = page.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            if not INSTALL_LINE.match(line):
                continue
            first, *rest = from_clone.command_folders(line)
            needed = check_isolation.sibling_closure(PACKAGES[first], PACKAGES)
            assert sorted(rest) == sorted(needed), f"{page.relative_to(REPO)}: {line}"
            checked += 1
    assert checked >= 10


def test_a_command_missing_a_sibling_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    commands = {"pytree-module": "pip install ./packages/pytree-module"}
    monkeypatch.setattr(from_clone, "documented_commands", lambda text: commands)
    _, problems = from_clone.command_problems("pytree-module", PACKAGES)
    assert len(problems) == 1
    assert "pytree-filter" in problems[0]


def test_the_clone_s_siblings_and_nothing_else_pass() -> None:
    found = found_in_clone("pytree-module", "pytree-filter")
    assert from_clone.installed_problems("pytree-module", found, PACKAGES) == []


def test_a_sibling_from_an_index_elsewhere_or_of_another_version_is_reported(
    tmp_path: Path,
) -> None:
    found = found_in_clone("pytree-nn", "pytree-graph", "pytree-transforms", "pytree-module")
    found["pytree-filter"] = ["0.1.0", None]  # from an index
    found["pytree-module"][1] = direct_url(tmp_path)
    found["pytree-graph"][0] = "9.9.9"
    problems = from_clone.installed_problems("pytree-nn", found, PACKAGES)
    assert len(problems) == 3
    assert any("pytree-filter from a package index" in p for p in problems)
    assert any(f"pytree-module from {tmp_path.as_uri()}" in p for p in problems)
    assert any("pytree-graph 9.9.9" in p for p in problems)


def test_a_missing_or_unneeded_sibling_is_reported() -> None:
    found = found_in_clone("pytree-module", "pytree-transforms")
    problems = from_clone.installed_problems("pytree-module", found, PACKAGES)
    assert problems == [
        "did not install pytree-filter",
        "installed pytree-transforms, which pytree-module does not need",
    ]


def test_unknown_package_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert from_clone.main(["--package", "pytree-nope"]) == 2
    assert "pytree-nope" in capsys.readouterr().out
